//! The teacher-forced pass of `cxlkv eval`: an exact dense prefill recorded once, loaded into
//! each mode's backend, then one decode step per scored token under the mode, with the
//! next-token distribution compared against dense's.

use super::super::{Error, Result};
use cxlkv::model::{argmax, Attention, AttentionStats, Model};
use std::time::{Duration, Instant};

/// The keys and values a prefill appended, per forward chunk and layer, head-major as the model
/// hands them over (`[kv_heads][t][head_dim]`), so that any backend can be loaded with them.
#[derive(Default)]
pub struct Prefix {
    /// `[chunk][layer]` → (K, V).
    chunks: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
    /// Tokens in the prefix.
    pub tokens: usize,
}

impl Prefix {
    /// Appends the whole prefix to `attn`, chunk by chunk, every layer (no attention computed).
    pub fn load_into(&self, attn: &mut dyn Attention) -> Result<()> {
        for chunk in &self.chunks {
            for (layer, (k, v)) in chunk.iter().enumerate() {
                attn.append(layer, k, v).map_err(model_err)?;
            }
        }
        Ok(())
    }
}

/// A backend that passes everything to `inner` and keeps a copy of what is appended.
struct Recorder<'a> {
    inner: &'a mut dyn Attention,
    chunks: &'a mut Vec<Vec<(Vec<f32>, Vec<f32>)>>,
}

impl Attention for Recorder<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn len(&self, layer: usize) -> usize {
        self.inner.len(layer)
    }
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> cxlkv::model::Result<()> {
        self.inner.append(layer, k, v)?;
        if layer == 0 {
            self.chunks.push(Vec::new());
        }
        if let Some(chunk) = self.chunks.last_mut() {
            chunk.push((k.to_vec(), v.to_vec()));
        }
        Ok(())
    }
    fn attend(&mut self, layer: usize, q: &[f32], out: &mut [f32]) -> cxlkv::model::Result<()> {
        self.inner.attend(layer, q, out)
    }
    fn clear(&mut self) {
        self.inner.clear();
        self.chunks.clear();
    }
    fn stats(&self) -> AttentionStats {
        self.inner.stats()
    }
}

/// Prefill chunk: progress shows between chunks, and a chunk's activations stay small.
pub const PREFILL_CHUNK: usize = 256;

/// Runs `tokens` through `model` into `attn` (exact, whatever `attn` is: the caller passes a
/// dense backend) in chunks, keeping what was appended. `attn` holds the prefix afterwards.
pub fn prefill(
    model: &Model,
    attn: &mut dyn Attention,
    tokens: &[u32],
    label: &str,
) -> Result<Prefix> {
    let mut prefix = Prefix {
        tokens: tokens.len(),
        ..Prefix::default()
    };
    let mut progress = Progress::new(format!("{label}: exact dense prefill"), tokens.len());
    let mut rec = Recorder {
        inner: attn,
        chunks: &mut prefix.chunks,
    };
    for (i, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
        model.forward(chunk, &mut rec).map_err(model_err)?;
        progress.tick(i * PREFILL_CHUNK + chunk.len());
    }
    progress.done();
    Ok(prefix)
}

/// Dense's next-token log-probabilities at every scored position, `[scored][vocab]`.
pub struct Reference {
    logp: Vec<f32>,
    vocab: usize,
}

impl Reference {
    fn row(&self, i: usize) -> &[f32] {
        &self.logp[i * self.vocab..(i + 1) * self.vocab]
    }
}

/// What one mode's scored pass measured.
#[derive(Clone, Debug)]
pub struct Scored {
    /// exp(mean negative log-likelihood of the targets).
    pub perplexity: f64,
    /// Fraction of steps whose greedy token equals dense's.
    pub top1_agreement: f64,
    /// Mean KL(dense ‖ mode) of the next-token distributions, nats.
    pub kl: f64,
    /// The backend's counters over the scored steps only (the load excluded).
    pub stats: AttentionStats,
    /// Wall time of the scored steps.
    pub wall: Duration,
    /// Steps run.
    pub steps: usize,
}

/// Teacher-forces `inputs` one decode step each on `attn` (which already holds the prefix);
/// step `i` predicts `targets[i]`. With `reference`, compares each step's distribution with
/// dense's; without, returns dense's for later modes (the reference pass).
pub fn score(
    model: &Model,
    attn: &mut dyn Attention,
    inputs: &[u32],
    targets: &[u32],
    reference: Option<&Reference>,
    label: &str,
) -> Result<(Scored, Option<Reference>)> {
    let vocab = model.config().vocab;
    let mut keep = match reference {
        None => Some(Reference {
            logp: Vec::with_capacity(inputs.len() * vocab),
            vocab,
        }),
        Some(_) => None,
    };
    let before = attn.stats();
    let (mut nll, mut agree, mut kl) = (0f64, 0usize, 0f64);
    let mut logp = vec![0f32; vocab];
    let mut progress = Progress::new(format!("{label}: scoring"), inputs.len());
    let t0 = Instant::now();
    for (i, (&input, &target)) in inputs.iter().zip(targets).enumerate() {
        let logits = model.forward(&[input], attn).map_err(model_err)?;
        log_softmax(&logits, &mut logp);
        let lp = logp.get(target as usize).copied().ok_or_else(|| {
            Error::Other(format!("token {target} outside the vocabulary of {vocab}"))
        })?;
        nll -= lp as f64;
        if let Some(r) = reference {
            let dense = r.row(i);
            if argmax(dense) == argmax(&logp) {
                agree += 1;
            }
            kl += kl_divergence(dense, &logp);
        } else if let Some(k) = keep.as_mut() {
            // The reference pass agrees with itself.
            k.logp.extend_from_slice(&logp);
            agree += 1;
        }
        progress.tick(i + 1);
    }
    let wall = t0.elapsed();
    progress.done();
    let n = inputs.len().max(1) as f64;
    Ok((
        Scored {
            perplexity: (nll / n).exp(),
            top1_agreement: agree as f64 / n,
            kl: kl / n,
            stats: attn.stats().since(&before),
            wall,
            steps: inputs.len(),
        },
        keep,
    ))
}

/// `out = logits − logsumexp(logits)`, summed in f64.
pub fn log_softmax(logits: &[f32], out: &mut [f32]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    for (o, &x) in out.iter_mut().zip(logits) {
        *o = (x as f64 - lse) as f32;
    }
}

/// KL(p ‖ q) in nats of two distributions given as log-probabilities; never negative.
pub fn kl_divergence(logp: &[f32], logq: &[f32]) -> f64 {
    let kl: f64 = logp
        .iter()
        .zip(logq)
        .filter(|(&p, _)| p > f32::NEG_INFINITY)
        .map(|(&p, &q)| (p as f64).exp() * (p as f64 - q as f64))
        .sum();
    kl.max(0.0)
}

pub(super) fn model_err(e: cxlkv::model::Error) -> Error {
    Error::Other(e.to_string())
}

/// Progress lines on stderr: done/total, elapsed, ETA; at most one every 2 s.
pub struct Progress {
    label: String,
    total: usize,
    start: Instant,
    last: Instant,
}

impl Progress {
    /// Starts timing `label` over `total` units.
    pub fn new(label: String, total: usize) -> Progress {
        let now = Instant::now();
        Progress {
            label,
            total,
            start: now,
            last: now,
        }
    }

    /// `done` units are done.
    pub fn tick(&mut self, done: usize) {
        if self.last.elapsed() < Duration::from_secs(2) || done >= self.total {
            return;
        }
        self.last = Instant::now();
        let el = self.start.elapsed().as_secs_f64();
        let eta = el / done.max(1) as f64 * (self.total - done) as f64;
        eprintln!(
            "eval: {} {done}/{} tokens, {el:.1} s, ETA {eta:.0} s",
            self.label, self.total
        );
    }

    /// The end line, with the total time.
    pub fn done(&self) {
        let el = self.start.elapsed().as_secs_f64();
        eprintln!(
            "eval: {} {}/{} tokens in {el:.1} s ({:.1} ms/token)",
            self.label,
            self.total,
            self.total,
            el * 1e3 / self.total.max(1) as f64
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalizes_and_kl_is_zero_on_itself() {
        let mut lp = [0f32; 4];
        log_softmax(&[1.0, 2.0, 3.0, 1000.0], &mut lp);
        let total: f64 = lp.iter().map(|&x| (x as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert_eq!(kl_divergence(&lp, &lp), 0.0);
        let mut lq = [0f32; 4];
        log_softmax(&[1.0, 2.0, 3.0, 4.0], &mut lq);
        assert!(kl_divergence(&lq, &[(0.25f32).ln(); 4]) > 0.1);
    }
}
