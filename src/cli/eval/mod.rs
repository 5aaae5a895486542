//! `cxlkv eval`: what each attention mode loses against dense, and what it moves over the link.
//!
//! The text is tokenized and its first `--context` tokens taken (the window). The window's first
//! `context − scored − 1` positions are prefilled ONCE with exact dense attention and their keys
//! and values kept; each mode's backend is loaded with them (appended in the prefill's chunks),
//! then the last `scored` tokens are teacher-forced one decode step each under the mode: step
//! `i` runs window token `context − scored − 1 + i` and predicts the next one. That is the
//! serving setting: exact prefill, approximate decode. Dense's next-token log-probabilities at
//! the scored positions are kept for KL divergence and top-1 agreement.

mod passkey;
mod report;
// `cxlkv demo` decodes from the same recorded prefill.
pub(super) mod score;

use super::{Error, Result};
use clap::Args;
use cxlkv::decode::{Env, EnvOptions, ModeSpec};
use cxlkv::model::{Attention, AttentionShape, Config, Gguf, Model, Tokenizer, WeightFormat};
use report::{ModeResult, Setting};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `cxlkv eval`.
#[derive(Args)]
pub struct EvalArgs {
    /// The model: a Llama-architecture GGUF file (scripts/fetch-model.sh fetches SmolLM2-135M).
    #[arg(long)]
    model: PathBuf,
    /// The text to score (UTF-8); its first --context tokens are the window.
    #[arg(long)]
    text: PathBuf,
    /// Tokens in the window (at most the model's context).
    #[arg(long, default_value_t = 8192)]
    context: usize,
    /// Tokens scored at the end of the window, one decode step each.
    #[arg(long, default_value_t = 512)]
    scored: usize,
    /// Attention modes, comma-separated: dense, dense-f16, pool, ndp-exact, topk:K,
    /// topp:P[:KMAX], ndp-topk:K, ndp-topp:P[:KMAX], pull-topk:K, each optionally +denseL /
    /// +denseA-B and an element type of its blocks (+int8, +int4, ...; default --dtype).
    #[arg(long, default_value = "dense,pool,ndp-exact,topk:256,topp:0.95")]
    modes: String,
    /// Layers kept exact (dense) in every non-dense mode, e.g. `0` or `0,1` or `0-2`.
    #[arg(long)]
    dense_layers: Option<String>,
    /// Add a retrieval test of N synthetic pass-key prompts (lengths up to --context).
    #[arg(long, value_name = "N")]
    passkey: Option<usize>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Write an SVG plot of quality against link bytes per token.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Weights: `f32` (dequantized at load, exact) or `quantized`.
    #[arg(long, default_value = "f32")]
    weights: String,
    /// Pool of the pool modes (`shm:NAME`, `file:PATH`, ...); default: a private shared-memory
    /// pool sized for the run, removed at the end.
    #[arg(long, value_name = "SPEC")]
    pool: Option<String>,
    /// The near-data device: `thread` (in this process), `ndpd` (a `cxlkv-ndpd` process) or
    /// `host` (none: the client computes every command on the host).
    #[arg(long, default_value = "thread")]
    device: String,
    /// The `cxlkv-ndpd` binary for `--device ndpd` (default: `$CXLKV_NDPD`, or next to `cxlkv`).
    #[arg(long)]
    ndpd: Option<PathBuf>,
    /// Tokens per pool block.
    #[arg(long, default_value_t = 256)]
    block_tokens: usize,
    /// Element type of K/V in the pool: f32 (exact against dense), f16, bf16, int8 or int4
    /// (quantized when a block is sealed: K per channel, V per token).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Tokens at the start of the sequence that top-k / top-p modes always include.
    #[arg(long, default_value_t = 4)]
    sinks: u64,
    /// Most recent tokens that top-k / top-p modes always include.
    #[arg(long, default_value_t = 64)]
    window: u64,
    /// Key sketch stored with every block: `none`, `int4[:C]` (4-bit keys per channel) or
    /// `sign[:C]` (sign bits, per-channel scales); `ndp-topk`/`ndp-topp` score it and re-score
    /// the C best candidates per query exactly (default 1024).
    #[arg(long, default_value = "none", value_name = "SKETCH")]
    sketch: String,
    /// The cost model's link bandwidth in GB/s (default: PCIe 5.0 x8's datasheet 31.5; a
    /// measured figure, e.g. from `cxlkv bench gpu`, goes here).
    #[arg(long, value_name = "GB/S", default_value_t = report::LINK_BYTES_PER_S / 1e9)]
    link_gbps: f64,
    /// The cost model's round trip of one device command across the link, in microseconds
    /// (default: the datasheet-based 1 = 4 CXL.mem accesses of 250 ns).
    #[arg(long, value_name = "US", default_value_t = report::COMMAND_ROUND_TRIP_S * 1e6)]
    link_latency_us: f64,
}

/// The cost model's link from the command line.
fn link(a: &EvalArgs) -> Result<report::Link> {
    let ok = |x: f64| x.is_finite() && x >= 0.0;
    if !ok(a.link_gbps) || a.link_gbps == 0.0 || !ok(a.link_latency_us) {
        return Err(Error::Usage(format!(
            "--link-gbps {} must be positive and --link-latency-us {} not negative",
            a.link_gbps, a.link_latency_us
        )));
    }
    Ok(report::Link {
        bytes_per_s: a.link_gbps * 1e9,
        round_trip_s: a.link_latency_us * 1e-6,
    })
}

/// The pool modes' environment from the command line (as `cxlkv generate` takes it).
fn env_options(a: &EvalArgs) -> Result<EnvOptions> {
    let device = super::generate::device_choice(&a.device, a.ndpd.clone())?;
    let dtype = a
        .dtype
        .parse()
        .map_err(|e| Error::Usage(format!("--dtype: {e}")))?;
    if a.block_tokens == 0 {
        return Err(Error::Usage("--block-tokens must be at least 1".into()));
    }
    let sketch = a
        .sketch
        .parse()
        .map_err(|e| Error::Usage(format!("--sketch: {e}")))?;
    Ok(EnvOptions {
        pool: a.pool.clone(),
        device,
        block_tokens: a.block_tokens,
        dtype,
        sinks: a.sinks,
        window: a.window,
        sketch,
    })
}

/// Builds the backend of each mode through the decode crate's one factory, on the pool and
/// device of its [`Env`], opened only if some mode needs it.
struct Backends {
    env: Option<Env>,
    shape: AttentionShape,
    next_sequence: std::cell::Cell<u64>,
}

impl Backends {
    fn open(
        opts: &EnvOptions,
        specs: &[ModeSpec],
        shape: AttentionShape,
        max_tokens: usize,
    ) -> Result<Backends> {
        Ok(Backends {
            env: Env::open_for(specs, opts, shape, max_tokens).map_err(decode_err)?,
            shape,
            next_sequence: std::cell::Cell::new(1),
        })
    }

    fn describe(&self) -> String {
        match &self.env {
            Some(env) => env.describe(),
            None => "K/V in private memory".into(),
        }
    }

    /// A fresh backend for `spec`, on a sequence of its own.
    fn backend(&self, spec: &ModeSpec) -> Result<Box<dyn Attention + '_>> {
        let seq = self.next_sequence.get();
        self.next_sequence.set(seq + 1);
        spec.backend(self.shape, self.env.as_ref(), seq)
            .map_err(decode_err)
    }
}

fn decode_err(e: cxlkv::decode::Error) -> Error {
    Error::Other(e.to_string())
}

/// Runs `cxlkv eval`.
pub fn run(a: &EvalArgs) -> Result<ExitCode> {
    // Everything that needs no model is checked first.
    let link = link(a)?;
    let usage = |e: cxlkv::decode::Error| Error::Usage(e.to_string());
    let mut specs = ModeSpec::parse_list(&a.modes).map_err(usage)?;
    if let Some(l) = &a.dense_layers {
        let layers = cxlkv::decode::parse_layers(l)
            .map_err(|e| Error::Usage(format!("--dense-layers {l:?}: {e}")))?;
        for s in specs.iter_mut().filter(|s| s.uses_pool()) {
            s.add_dense_layers(&layers);
        }
    }
    // Dense is always a row: the baseline of the ratios, the plot and the pass-key test.
    if !specs.iter().any(|s| s.name() == ModeSpec::dense().name()) {
        specs.insert(0, ModeSpec::dense());
    }
    if a.scored == 0 {
        return Err(Error::Usage("--scored must be at least 1".into()));
    }
    if a.context < a.scored + 1 {
        return Err(Error::Usage(format!(
            "--context {} must exceed --scored {} (the scored tokens follow at least one \
             position)",
            a.context, a.scored
        )));
    }
    if a.passkey == Some(0) {
        return Err(Error::Usage("--passkey needs at least 1 prompt".into()));
    }
    let env = env_options(a)?;
    let format: WeightFormat = a.weights.parse().map_err(Error::Usage)?;
    let text = std::fs::read_to_string(&a.text)
        .map_err(|e| Error::Usage(format!("--text {}: {e}", a.text.display())))?;

    // The header, the configuration and the tokenizer decide the rest before the weights load.
    let model_err =
        |e: cxlkv::model::Error| Error::Other(format!("--model {}: {e}", a.model.display()));
    let gguf = Gguf::open(&a.model).map_err(model_err)?;
    let cfg = Config::from_gguf(&gguf).map_err(model_err)?;
    let tokens = Tokenizer::from_gguf(&gguf)
        .map_err(model_err)?
        .encode(&text);
    drop(gguf);
    if a.context > cfg.context {
        return Err(Error::Usage(format!(
            "--context {} is longer than the model's context of {} tokens",
            a.context, cfg.context
        )));
    }
    if let Some(bad) = specs
        .iter()
        .flat_map(|s| s.dense_layers.iter())
        .find(|&&l| l >= cfg.layers)
    {
        return Err(Error::Usage(format!(
            "dense layer {bad} does not exist: the model has layers 0-{}",
            cfg.layers - 1
        )));
    }
    if tokens.len() < a.context {
        return Err(Error::Usage(format!(
            "--text {} has {} tokens; --context {} needs at least that many",
            a.text.display(),
            tokens.len(),
            a.context
        )));
    }
    let t = std::time::Instant::now();
    let model = Model::load(&a.model, format).map_err(model_err)?;
    eprintln!(
        "eval: model {} ({} layers, {} heads / {} KV heads of {}, context {}) loaded in {:.1?}",
        cfg.name.as_deref().unwrap_or(&cfg.architecture),
        cfg.layers,
        cfg.heads,
        cfg.kv_heads,
        cfg.head_dim,
        cfg.context,
        t.elapsed()
    );
    // The backends hold the layers with full attention (all of a Llama; a Gemma 3's global
    // ones, numbered from 0): a `+denseL` past them fails here, before the prefill.
    let held = model.attention_shape().layers;
    if let Some(bad) = specs
        .iter()
        .flat_map(|s| s.dense_layers.iter())
        .find(|&&l| l >= held)
    {
        return Err(Error::Usage(format!(
            "dense layer {bad} does not exist: the attention backends hold {held} layers \
             (0-{}), the model's layers with full attention",
            held - 1
        )));
    }
    let window = &tokens[..a.context];
    let start = a.context - a.scored - 1;
    let (prefix_tokens, inputs, targets) = (
        &window[..start],
        &window[start..a.context - 1],
        &window[start + 1..],
    );
    let prompts = match a.passkey {
        Some(n) => passkey::prompts(model.tokenizer(), n, a.context)?,
        None => Vec::new(),
    };
    let shape = model.attention_shape();
    let backends = Backends::open(&env, &specs, shape, a.context)?;

    // The reference: an exact dense prefill, recorded, then dense decode steps.
    let mut dense = backends.backend(&ModeSpec::dense())?;
    let prefix = score::prefill(&model, dense.as_mut(), prefix_tokens, "reference")?;
    let (ref_scored, reference) = score::score(
        &model,
        dense.as_mut(),
        inputs,
        targets,
        None,
        "reference dense",
    )?;
    drop(dense);
    let reference = reference.ok_or_else(|| Error::Other("no reference kept".into()))?;
    let dense_ms = ref_scored.wall.as_secs_f64() * 1e3 / ref_scored.steps.max(1) as f64;
    let dense_ppl = ref_scored.perplexity;

    let mut results = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let label = format!("mode {}/{} {spec}", i + 1, specs.len());
        let mut attn = backends.backend(spec)?;
        let t = std::time::Instant::now();
        prefix.load_into(attn.as_mut())?;
        eprintln!(
            "eval: {label}: {} prefix positions loaded into {} in {:.1?}",
            prefix.tokens,
            attn.name(),
            t.elapsed()
        );
        let (scored, _) = score::score(
            &model,
            attn.as_mut(),
            inputs,
            targets,
            Some(&reference),
            &label,
        )?;
        eprintln!(
            "eval: {label}: perplexity {:.4} (dense {dense_ppl:.4}), top-1 {:.4}, KL {:.3e}",
            scored.perplexity, scored.top1_agreement, scored.kl
        );
        results.push(ModeResult {
            mode: spec.to_string(),
            scored,
            uses_pool: spec.uses_pool(),
            passkey: Vec::new(),
        });
    }
    drop(reference);
    drop(prefix);

    if !prompts.is_empty() {
        for (pi, p) in prompts.iter().enumerate() {
            let label = format!(
                "passkey {}/{} ({} tokens, depth {:.0} %)",
                pi + 1,
                prompts.len(),
                p.length,
                p.depth * 100.0
            );
            let mut dense = backends.backend(&ModeSpec::dense())?;
            let prefix = passkey::prefill_prompt(&model, dense.as_mut(), p, &label)?;
            drop(dense);
            for (spec, r) in specs.iter().zip(results.iter_mut()) {
                let mut attn = backends.backend(spec)?;
                prefix.load_into(attn.as_mut())?;
                let (ok, answer) = passkey::answer(&model, attn.as_mut(), p)?;
                eprintln!(
                    "eval: {label}: {spec}: {} (key {}, answered {answer:?})",
                    if ok { "right" } else { "wrong" },
                    p.key
                );
                r.passkey.push((p.depth, p.length, ok, answer));
            }
        }
    }

    let setting = Setting {
        model: format!(
            "{} ({})",
            cfg.name.as_deref().unwrap_or(&cfg.architecture),
            a.model.display()
        ),
        model_name: cfg.name.clone().unwrap_or_else(|| cfg.architecture.clone()),
        text: a.text.display().to_string(),
        text_tokens: tokens.len(),
        context: a.context,
        scored: a.scored,
        prefill: start,
        environment: backends.describe(),
        link,
    };
    if let Some(path) = &a.plot {
        std::fs::write(path, report::plot(&setting, &results, dense_ppl))
            .map_err(|e| Error::Other(format!("write {}: {e}", path.display())))?;
        eprintln!("eval: plot written to {}", path.display());
    }
    if a.json {
        println!("{}", report::json(&setting, &results, dense_ms, dense_ppl));
    } else {
        print!("{}", report::table(&setting, &results, dense_ms, dense_ppl));
    }
    Ok(ExitCode::SUCCESS)
}
