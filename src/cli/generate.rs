//! `cxlkv generate`: greedy text generation with a real GGUF model and a chosen attention mode
//! (private memory, the pool, or the near-data device); the text streams to stdout, the
//! statistics go to stderr.

use super::{human, Error, Result};
use clap::Args;
use cxlkv::decode::{find_ndpd, DeviceChoice, Env, EnvOptions, ModeSpec, Modes, Phased};
use cxlkv::model::{generate, AttentionStats, Model, WeightFormat};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `cxlkv generate`.
#[derive(Args)]
pub struct GenerateArgs {
    /// The model: a Llama-architecture GGUF file (scripts/fetch-model.sh fetches SmolLM2-135M).
    #[arg(long)]
    model: PathBuf,
    /// The prompt text.
    #[arg(
        long,
        required_unless_present = "prompt_file",
        conflicts_with = "prompt_file"
    )]
    prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Attention mode: dense, dense-f16, pool, ndp-exact, topk:K, topp:P[:KMAX], each optionally
    /// `+denseL` / `+denseA-B` to keep layers exact.
    #[arg(long, default_value = "dense")]
    attention: String,
    /// Layers kept exact in private memory whatever the mode (`0`, `0,3-5`).
    #[arg(long)]
    dense_layers: Option<String>,
    /// An existing pool for the K/V blocks (`shm:NAME`, `file:PATH`, `dax:PATH`; see `cxlkv pool
    /// create`); default: a private shared-memory pool sized for the run, removed after it.
    #[arg(long)]
    pool: Option<String>,
    /// The near-data device: `thread` (in this process), `ndpd` (a `cxlkv-ndpd` process) or
    /// `host` (none: the client computes every command on the host).
    #[arg(long, default_value = "thread")]
    device: String,
    /// The `cxlkv-ndpd` binary for `--device ndpd` (default: `$CXLKV_NDPD`, or next to `cxlkv`).
    #[arg(long)]
    ndpd: Option<PathBuf>,
    /// Positions per K/V block stored in the pool.
    #[arg(long, default_value_t = 256)]
    block_tokens: usize,
    /// Attention sinks of topk/topp: the first N positions are always attended.
    #[arg(long, default_value_t = 4)]
    sinks: u64,
    /// Local window of topk/topp: the last N positions are always attended.
    #[arg(long, default_value_t = 64)]
    window: u64,
    /// Tokens to generate at most (stops earlier at the end-of-sequence token).
    #[arg(short = 'n', long = "tokens", default_value_t = 128)]
    n: usize,
    /// Weights: `f32` (dequantized at load, exact) or `quantized` (as stored, 8-bit activations).
    #[arg(long, default_value = "f32")]
    weights: String,
    /// Wrap the prompt as a ChatML user turn (`<|im_start|>user ... <|im_start|>assistant`), for
    /// instruction-tuned models whose vocabulary has those markers.
    #[arg(long)]
    chat: bool,
}

/// The mode named by `--attention` and `--dense-layers`.
fn mode_of(a: &GenerateArgs) -> Result<ModeSpec> {
    let modes = Modes::builtin();
    let mut spec = modes
        .parse(&a.attention)
        .map_err(|e| Error::Usage(format!("{e}\nmodes:\n{}", modes.help())))?;
    if let Some(l) = &a.dense_layers {
        let layers = cxlkv::decode::parse_layers(l)
            .map_err(|e| Error::Usage(format!("--dense-layers {l}: {e}")))?;
        spec.add_dense_layers(&layers);
    }
    Ok(spec)
}

/// The device named by `--device` (`thread`, `host` or `ndpd`, whose binary is `ndpd`, else found
/// next to `cxlkv`); `cxlkv eval` takes it the same way.
pub(super) fn device_choice(name: &str, ndpd: Option<PathBuf>) -> Result<DeviceChoice> {
    match name {
        "thread" => Ok(DeviceChoice::Thread),
        "host" => Ok(DeviceChoice::Host),
        "ndpd" => ndpd
            .or_else(find_ndpd)
            .map(DeviceChoice::Ndpd)
            .ok_or_else(|| {
                Error::Usage(
                    "--device ndpd: cxlkv-ndpd not found next to cxlkv; give --ndpd PATH or set \
                     CXLKV_NDPD"
                        .into(),
                )
            }),
        other => Err(Error::Usage(format!(
            "--device {other:?}: use thread, ndpd or host"
        ))),
    }
}

/// Runs `cxlkv generate`.
pub fn run(a: &GenerateArgs) -> Result<ExitCode> {
    let spec = mode_of(a)?;
    let device = device_choice(&a.device, a.ndpd.clone())?;
    let format: WeightFormat = a.weights.parse().map_err(Error::Usage)?;
    let prompt = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| Error::Other(format!("read {}: {e}", f.display())))?,
        (None, None) => return Err(Error::Usage("--prompt or --prompt-file is needed".into())),
    };
    let model_err = |e: cxlkv::model::Error| Error::Other(e.to_string());
    let t = Instant::now();
    let model = Model::load(&a.model, format).map_err(model_err)?;
    let load = t.elapsed();
    let tk = model.tokenizer();
    let ids = if a.chat {
        if tk.token_id("<|im_start|>").is_none() || tk.token_id("<|im_end|>").is_none() {
            return Err(Error::Usage(
                "--chat needs a ChatML vocabulary (<|im_start|>, <|im_end|>)".into(),
            ));
        }
        tk.encode_with_specials(&format!(
            "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        ))
    } else {
        tk.encode(&prompt)
    };
    if ids.is_empty() {
        return Err(Error::Usage("the prompt encodes to no token".into()));
    }
    let cfg = model.config();
    let shape = model.attention_shape();
    let decode_err = |e: cxlkv::decode::Error| Error::Other(e.to_string());
    let opts = EnvOptions {
        pool: a.pool.clone(),
        device,
        block_tokens: a.block_tokens,
        sinks: a.sinks,
        window: a.window,
        ..EnvOptions::default()
    };
    let env = Env::open_for(std::slice::from_ref(&spec), &opts, shape, ids.len() + a.n)
        .map_err(decode_err)?;
    if let Some(env) = &env {
        eprintln!("{}", env.describe());
    }
    let mut attn = spec.backend(shape, env.as_ref(), 1).map_err(decode_err)?;
    eprintln!(
        "model: {} ({} layers, d_model {}, {} heads / {} KV heads of {}, vocab {}, context {}), \
         weights {:?}, loaded in {:.2?}; attention {}",
        cfg.name.as_deref().unwrap_or(&cfg.architecture),
        cfg.layers,
        cfg.d_model,
        cfg.heads,
        cfg.kv_heads,
        cfg.head_dim,
        cfg.vocab,
        cfg.context,
        format,
        load,
        attn.name()
    );
    let mut stream = tk.stream();
    let mut out = std::io::stdout().lock();
    let mut phases = Phased::new(attn.as_mut());
    let stats = generate(&model, &mut phases, &ids, a.n, |id| {
        let text = stream.push(id)?;
        // A closed stdout (`| head`) ends the run; it is not a model error.
        let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
        Ok(())
    })
    .map_err(model_err)?;
    let _ = writeln!(out, "{}", stream.finish());
    eprintln!(
        "prefill: {} tokens in {:.3} s ({:.1} tokens/s); decode: {} tokens in {:.3} s ({:.1} \
         tokens/s){}",
        stats.prompt_tokens,
        stats.prefill.as_secs_f64(),
        stats.prefill_tokens_per_s(),
        stats.generated,
        stats.decode.as_secs_f64(),
        stats.decode_tokens_per_s(),
        if stats.stopped_at_eos {
            "; stopped at end of sequence"
        } else {
            ""
        }
    );
    let (prefill, decode) = (phases.prefill(), phases.decode());
    eprintln!("{}", describe_traffic("prefill", &prefill, 1));
    // Each decode step runs one token: every generated token but the last.
    let steps = stats.generated.saturating_sub(1);
    if steps > 0 {
        eprintln!("{}", describe_traffic("decode, per token", &decode, steps));
    }
    Ok(ExitCode::SUCCESS)
}

/// One line of what `s` moved, divided by `per` (steps).
fn describe_traffic(what: &str, s: &AttentionStats, per: usize) -> String {
    let per = per.max(1) as u64;
    let rows = if s.query_heads == 0 {
        0.0
    } else {
        // Value rows per query head per layer-attention: what one head of one layer attended.
        s.value_rows as f64 / s.query_heads as f64
    };
    let mut line = format!(
        "{what}: link read {}, link write {}; {:.1} value rows per query head and layer",
        human(s.link_read_bytes / per),
        human(s.link_write_bytes / per),
        rows,
    );
    if s.device_commands > 0 {
        line += &format!(
            "; {:.1} device commands, device read {} in place, device time {:.3} ms",
            s.device_commands as f64 / per as f64,
            human(s.device_scan_bytes / per),
            s.device_ns as f64 / per as f64 / 1e6
        );
    }
    line
}
