//! Parts 2 and 3 of `cxlkv demo`: a real model decodes over a real text with its attention
//! computed next to the memory (`ndp-exact`), its tokens checked against `dense`, and the link
//! bytes and the device's own numbers read from the run.
//!
//! The text's first `context` tokens are the window. Its first `context − 1` positions are
//! prefilled once with exact dense attention (`cxlkv eval`'s recorded prefill); `dense`, `pool`
//! and `ndp-exact` are each loaded with those keys and values, run the window's last token under
//! the mode (which chooses the first generated token and completes the window's stored blocks),
//! then greedy-decode the rest: every generated token is chosen by the mode's attention over the
//! whole window. That is the serving setting (exact prefill, decode against a stored cache), the
//! one `cxlkv eval` measures.
//!
//! Every figure comes from the backends' counters over the decode steps ([`AttentionStats`]):
//! link bytes (read + write) per token for `pool` (every stored key and value pulled across) and
//! `ndp-exact` (commands out, one partial per query back), their ratio, and the device's commands,
//! bytes read in place and execution time. Tokens that differ from `dense` are reported and make
//! the demo fail.

use super::super::eval::score::{prefill, Prefix};
use super::super::{human, Error, Result};
use super::kv_dir;
use cxlkv::decode::{DeviceChoice, Env, EnvOptions, ModeSpec};
use cxlkv::model::{argmax, Attention, AttentionStats, Model, WeightFormat};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The mode the demo is about, and the one it is compared with on link bytes.
pub const MODE: &str = "ndp-exact";
const BASELINE: &str = "pool";

/// What part 2 runs.
pub struct DecodeOptions {
    /// The GGUF model.
    pub model: PathBuf,
    /// A UTF-8 text; `None`: the token ids of `kv_dir`'s text (they are the bundled SmolLM2's).
    pub text: Option<PathBuf>,
    /// The folder whose `tokens.npy` is the default text.
    pub kv_dir: PathBuf,
    /// Tokens in the window.
    pub context: usize,
    /// Tokens each mode generates.
    pub steps: usize,
    /// The near-data device.
    pub device: DeviceChoice,
}

/// One mode's generation: its tokens, and what its decode steps moved and took.
struct ModeRun {
    mode: &'static str,
    tokens: Vec<u32>,
    /// The decode steps: one per generated token but the last (each runs one and chooses the
    /// next), the window's last token not counted.
    steps: usize,
    stats: AttentionStats,
    wall: Duration,
}

impl ModeRun {
    /// `x` per decode step (a step runs one token and chooses the next).
    fn per_token(&self, x: u64) -> f64 {
        x as f64 / self.steps.max(1) as f64
    }

    fn link_per_token(&self) -> f64 {
        self.per_token(self.stats.link_read_bytes + self.stats.link_write_bytes)
    }

    fn ms_per_token(&self) -> f64 {
        self.wall.as_secs_f64() * 1e3 / self.steps.max(1) as f64
    }
}

/// What parts 2 and 3 measured.
pub struct DecodeReport {
    model: String,
    model_file: PathBuf,
    text: String,
    context: usize,
    prefill: Duration,
    environment: String,
    runs: Vec<ModeRun>,
    window_tail: String,
    generated_text: String,
}

impl DecodeReport {
    fn run(&self, mode: &str) -> &ModeRun {
        self.runs
            .iter()
            .find(|r| r.mode == mode)
            .expect("every mode ran")
    }

    /// Index of the first generated token where `mode` differs from dense.
    fn first_difference(&self, mode: &str) -> Option<usize> {
        let (d, m) = (&self.run("dense").tokens, &self.run(mode).tokens);
        (0..d.len().max(m.len())).find(|&i| d.get(i) != m.get(i))
    }

    /// True when `ndp-exact` and `pool` generated exactly dense's tokens.
    pub fn identical(&self) -> bool {
        self.first_difference(MODE).is_none() && self.first_difference(BASELINE).is_none()
    }

    fn link_ratio(&self) -> f64 {
        self.run(BASELINE).link_per_token() / self.run(MODE).link_per_token().max(1.0)
    }

    /// Every figure, as the `decode` object of `cxlkv demo --json`.
    pub fn to_json(&self) -> serde_json::Value {
        let per_mode = |f: &dyn Fn(&ModeRun) -> serde_json::Value| {
            serde_json::Value::Object(self.runs.iter().map(|r| (r.mode.into(), f(r))).collect())
        };
        let ndp = self.run(MODE);
        let st = ndp.stats;
        json!({
            "mode": MODE,
            "model": self.model,
            "model_file": self.model_file,
            "text": self.text,
            "context_tokens": self.context,
            "prefill_tokens": self.context - 1,
            "prefill": "exact (dense), once; its K/V loaded into each mode",
            "prefill_seconds": self.prefill.as_secs_f64(),
            "environment": self.environment,
            "generated_tokens": ndp.tokens.len(),
            "decode_steps": ndp.steps,
            "per_token": "per decode step over the stored window: each runs one generated token \
                          and chooses the next",
            "tokens_identical_to_dense": self.first_difference(MODE).is_none(),
            "first_difference": self.first_difference(MODE),
            "pool_tokens_identical_to_dense": self.first_difference(BASELINE).is_none(),
            "tokens": per_mode(&|r| json!(r.tokens)),
            "generated_text": self.generated_text,
            "link_bytes_per_token": per_mode(&|r| json!(r.link_per_token())),
            "link_read_bytes_per_token": per_mode(&|r| json!(r.per_token(r.stats.link_read_bytes))),
            "link_write_bytes_per_token":
                per_mode(&|r| json!(r.per_token(r.stats.link_write_bytes))),
            "link_ratio": self.link_ratio(),
            "value_rows_per_query_head": per_mode(&|r| json!(
                r.stats.value_rows as f64 / r.stats.query_heads.max(1) as f64
            )),
            "ms_per_token": per_mode(&|r| json!(r.ms_per_token())),
            "device": {
                "commands": st.device_commands,
                "scan_bytes": st.device_scan_bytes,
                "device_ns": st.device_ns,
                "commands_per_token": ndp.per_token(st.device_commands),
                "scan_bytes_per_token": ndp.per_token(st.device_scan_bytes),
                "device_ms_per_token": ndp.per_token(st.device_ns) / 1e6,
            },
        })
    }

    /// The report for people: parts 2 and 3.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![
            format!(
                "model {} ({}); text: {}",
                self.model,
                self.model_file.display(),
                self.text
            ),
            format!(
                "context {} tokens, ending \"…{}\"",
                grouped(self.context as f64),
                self.window_tail.escape_debug()
            ),
            format!(
                "exact dense prefill of {} positions in {:.1} s, its K/V loaded into each mode; {}",
                grouped((self.context - 1) as f64),
                self.prefill.as_secs_f64(),
                self.environment
            ),
            format!(
                "   {:<10} {:>7} {:>18} {:>13} {:>24} {:>9}",
                "mode", "tokens", "vs dense", "link B/token", "(read + write)", "ms/token"
            ),
        ];
        for r in &self.runs {
            let same = match (r.mode, self.first_difference(r.mode)) {
                ("dense", _) => "(the reference)".to_string(),
                (_, None) => "identical".to_string(),
                (_, Some(i)) => format!("DIFFER at token {}", i + 1),
            };
            out.push(format!(
                "   {:<10} {:>7} {:>18} {:>13} {:>24} {:>9.1}",
                r.mode,
                r.tokens.len(),
                same,
                grouped(r.link_per_token()),
                format!(
                    "({} + {})",
                    grouped(r.per_token(r.stats.link_read_bytes)),
                    grouped(r.per_token(r.stats.link_write_bytes))
                ),
                r.ms_per_token()
            ));
        }
        let ndp = self.run(MODE);
        out.push(format!(
            "generated: \"{}\"",
            self.generated_text.escape_debug()
        ));
        out.push(match self.first_difference(MODE) {
            None => format!(
                "{MODE} moves {}x fewer link bytes per token than {BASELINE} ({} against {}) at a \
                 {}-token context, with its {} tokens identical to dense",
                grouped(self.link_ratio()),
                human(ndp.link_per_token() as u64),
                human(self.run(BASELINE).link_per_token() as u64),
                grouped(self.context as f64),
                ndp.tokens.len()
            ),
            Some(i) => format!(
                "{MODE}'s tokens DIFFER from dense's at generated token {} of {}: the demo fails",
                i + 1,
                ndp.tokens.len()
            ),
        });
        let st = ndp.stats;
        out.push(String::new());
        out.push(format!(
            "== part 3: the near-data device's own numbers ({MODE}, {} decode steps)",
            ndp.steps
        ));
        out.push(format!(
            "   {:.0} commands per token ({} in all), {} read in place per token ({} in all), \
             device time {:.2} ms per token ({:.1} ms in all)",
            ndp.per_token(st.device_commands),
            st.device_commands,
            human(ndp.per_token(st.device_scan_bytes) as u64),
            human(st.device_scan_bytes),
            ndp.per_token(st.device_ns) / 1e6,
            st.device_ns as f64 / 1e6
        ));
        out
    }
}

/// `x` rounded, with thousands separated: 94,794,240.
fn grouped(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The window's token ids and a description of the text.
fn window(o: &DecodeOptions, model: &Model) -> Result<(Vec<u32>, String)> {
    let tk = model.tokenizer();
    let (ids, what) = match &o.text {
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .map_err(|e| Error::Usage(format!("--text {}: {e}", f.display())))?;
            (tk.encode(&text), f.display().to_string())
        }
        None => {
            let ids = kv_dir::tokens(&o.kv_dir)?;
            let meta = kv_dir::meta(&o.kv_dir)?;
            let head = meta["text_head"].as_str().unwrap_or_default();
            // The ids are one tokenizer's: they must spell the text under this model's.
            let spelled = tk
                .decode(&ids[..ids.len().min(24)])
                .map_err(|e| Error::Other(e.to_string()))?;
            if head.is_empty() || !head.starts_with(&spelled) {
                return Err(Error::Usage(format!(
                    "the bundled text is token ids of the model named in {}/meta.json; under \
                     this model they spell {spelled:?}, not the text: give --text FILE",
                    o.kv_dir.display()
                )));
            }
            let what = format!(
                "{} ({}/tokens.npy)",
                meta["text"].as_str().unwrap_or("tokens.npy"),
                o.kv_dir.display()
            );
            (ids, what)
        }
    };
    if ids.len() < o.context {
        return Err(Error::Usage(format!(
            "the text {what} has {} tokens; --context {} needs at least that many",
            ids.len(),
            o.context
        )));
    }
    Ok((ids[..o.context].to_vec(), what))
}

/// Runs the window's `last` token on `attn` (which holds the rest of the window), then greedy
/// decode steps until `n` tokens are generated; the statistics cover the decode steps only.
fn decode(
    model: &Model,
    mode: &'static str,
    attn: &mut dyn Attention,
    last: u32,
    n: usize,
) -> Result<ModeRun> {
    let step = |token: u32, attn: &mut dyn Attention| {
        model
            .forward(&[token], attn)
            .map(|logits| argmax(&logits) as u32)
            .map_err(|e| Error::Other(format!("{mode}: {e}")))
    };
    let mut tokens = vec![step(last, attn)?];
    let before = attn.stats();
    let t0 = Instant::now();
    while tokens.len() < n {
        let next = step(*tokens.last().expect("one token"), attn)?;
        tokens.push(next);
    }
    Ok(ModeRun {
        mode,
        steps: tokens.len() - 1,
        tokens,
        stats: attn.stats().since(&before),
        wall: t0.elapsed(),
    })
}

/// Loads `prefix` into a fresh `mode` backend on `env` and decodes.
fn pooled(
    model: &Model,
    env: &Env,
    mode: &'static str,
    sequence: u64,
    prefix: &Prefix,
    last: u32,
    n: usize,
) -> Result<ModeRun> {
    let decode_err = |e: cxlkv::decode::Error| Error::Other(format!("{mode}: {e}"));
    let spec = ModeSpec::parse(mode).map_err(decode_err)?;
    let mut attn = env.backend(&spec, sequence).map_err(decode_err)?;
    prefix.load_into(attn.as_mut())?;
    decode(model, mode, attn.as_mut(), last, n)
}

/// Runs parts 2 and 3; `say` prints progress for people.
pub fn run(o: &DecodeOptions, say: &dyn Fn(&str)) -> Result<DecodeReport> {
    if o.context < 2 || o.steps < 2 {
        return Err(Error::Usage(format!(
            "--context {} and --generate {} must be at least 2 each",
            o.context, o.steps
        )));
    }
    let model_err = |e: cxlkv::model::Error| Error::Other(format!("{}: {e}", o.model.display()));
    let t = Instant::now();
    let model = Model::load(&o.model, WeightFormat::F32).map_err(model_err)?;
    let cfg = model.config();
    let name = cfg.name.clone().unwrap_or_else(|| cfg.architecture.clone());
    if o.context + o.steps > cfg.context {
        return Err(Error::Usage(format!(
            "--context {} + --generate {} exceeds the model's context of {} tokens",
            o.context, o.steps, cfg.context
        )));
    }
    let (ids, text) = window(o, &model)?;
    say(&format!(
        "loaded {name} in {:.1} s; {} tokens of {text}",
        t.elapsed().as_secs_f64(),
        ids.len()
    ));
    let shape = model.attention_shape();
    let (prefix_ids, last) = (&ids[..ids.len() - 1], ids[ids.len() - 1]);

    let t = Instant::now();
    let mut dense = ModeSpec::dense()
        .backend(shape, None, 0)
        .map_err(|e| Error::Other(format!("dense: {e}")))?;
    let prefix = prefill(&model, dense.as_mut(), prefix_ids, "demo: the window")?;
    let prefill_time = t.elapsed();
    let mut runs = vec![decode(&model, "dense", dense.as_mut(), last, o.steps)?];
    drop(dense);
    say(&format!(
        "dense: {} decode steps in {:.1} s",
        runs[0].steps,
        runs[0].wall.as_secs_f64()
    ));

    let env_opts = EnvOptions {
        device: o.device.clone(),
        ..EnvOptions::default()
    };
    let env = Env::open(&env_opts, shape, o.context + o.steps)
        .map_err(|e| Error::Other(e.to_string()))?;
    for (i, mode) in [BASELINE, MODE].into_iter().enumerate() {
        let r = pooled(&model, &env, mode, i as u64 + 1, &prefix, last, o.steps)?;
        say(&format!(
            "{mode}: {} decode steps in {:.1} s",
            r.steps,
            r.wall.as_secs_f64()
        ));
        runs.push(r);
    }
    let tk = model.tokenizer();
    let spell = |ids: &[u32]| tk.decode(ids).map_err(|e| Error::Other(e.to_string()));
    let tail = spell(&prefix_ids[prefix_ids.len().saturating_sub(12)..])? + &spell(&[last])?;
    Ok(DecodeReport {
        model: name,
        model_file: o.model.clone(),
        text,
        context: o.context,
        prefill: prefill_time,
        environment: env.describe(),
        generated_text: spell(&runs[0].tokens)?,
        window_tail: tail,
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(mode: &'static str, tokens: &[u32], link_read: u64) -> ModeRun {
        ModeRun {
            mode,
            tokens: tokens.to_vec(),
            steps: tokens.len() - 1,
            stats: AttentionStats {
                link_read_bytes: link_read,
                device_commands: 6,
                ..AttentionStats::default()
            },
            wall: Duration::from_millis(30),
        }
    }

    fn report(ndp_tokens: &[u32]) -> DecodeReport {
        DecodeReport {
            model: "m".into(),
            model_file: "m.gguf".into(),
            text: "t".into(),
            context: 2048,
            prefill: Duration::from_secs(1),
            environment: "e".into(),
            runs: vec![
                run("dense", &[1, 2, 3, 4], 0),
                run("pool", &[1, 2, 3, 4], 3000),
                run(MODE, ndp_tokens, 6),
            ],
            window_tail: "w".into(),
            generated_text: "g".into(),
        }
    }

    #[test]
    fn figures_are_per_decode_step_and_the_ratio_is_pool_over_ndp_exact() {
        let r = report(&[1, 2, 3, 4]);
        assert!(r.identical());
        let j = r.to_json();
        assert_eq!(j["tokens_identical_to_dense"], true);
        assert_eq!(j["link_bytes_per_token"]["pool"], 1000.0);
        assert_eq!(j["link_bytes_per_token"][MODE], 2.0);
        assert_eq!(j["link_ratio"], 500.0);
        assert_eq!(j["device"]["commands_per_token"], 2.0);
        assert!(r
            .lines()
            .iter()
            .any(|l| l.contains("500x fewer link bytes")));
    }

    #[test]
    fn tokens_that_differ_from_dense_are_said_and_fail() {
        let r = report(&[1, 2, 9, 4]);
        assert!(!r.identical());
        let j = r.to_json();
        assert_eq!(j["tokens_identical_to_dense"], false);
        assert_eq!(j["first_difference"], 2);
        let lines = r.lines();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("DIFFER from dense's at generated token 3")),
            "{lines:?}"
        );
        assert!(
            !lines.iter().any(|l| l.contains("fewer link bytes")),
            "{lines:?}"
        );
    }

    #[test]
    fn grouped_separates_thousands() {
        assert_eq!(super::grouped(0.0), "0");
        assert_eq!(super::grouped(999.4), "999");
        assert_eq!(super::grouped(2048.0), "2,048");
        assert_eq!(super::grouped(94_794_240.0), "94,794,240");
        assert_eq!(super::grouped(531.24), "531");
    }
}
