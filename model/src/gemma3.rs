//! The Gemma 3 forward (llama.cpp's `gemma3` graph): the token embedding scaled by
//! `sqrt(d_model)`; per block RMSNorm, Q/K/V, per-head RMSNorm of Q and K, RoPE in NEOX mode
//! (pairs `(i, i + rope_dims/2)`) with base `rope.freq_base` on global layers and 10,000 on
//! sliding-window layers, attention (scale from [`Config::attention_scale`]), the output
//! projection, `post_attention_norm`, residual; RMSNorm, `GELU(tanh)(gate) ⊙ up`, down,
//! `post_ffw_norm`, residual; the final RMSNorm and the tied output head. The norms' `+1` of the
//! Hugging Face checkpoint is already in the GGUF's weights (the converter adds it).
//!
//! Sliding-window layers (every layer but each `swa_pattern`-th, llama.cpp's rule) see only the
//! last `sliding_window` positions. Their keys and values stay in the model, on the host (a
//! layer reads at most the window, so it never needs the pool or the near-data device): only
//! the global layers go through the [`Attention`] backend, whose layer `g` is the `g`-th global
//! layer. The host cache belongs to the sequence the backend holds: a forward from position 0
//! starts it afresh; a forward at position `p` continues it, or rewinds it to `p` when it holds
//! more (`cxlkv eval` restores each mode's backend to the same prefix), so it keeps every
//! position of the sequence, not only the window (`kv_heads · head_dim · 8` bytes per position
//! and sliding-window layer; 30 KiB a position for Gemma 3 270M).

use crate::attention::Attention;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::ops::{add, head_major, rms_norm};
use crate::weights::Weights;
use std::sync::Mutex;

/// The RoPE base of sliding-window layers (llama.cpp: `rope_freq_base_train_swa`).
const LOCAL_ROPE_BASE: f64 = 10_000.0;

/// Gemma 3's extra tensors and the sliding-window state.
pub(crate) struct Gemma3 {
    q_norm: Vec<Vec<f32>>,
    k_norm: Vec<Vec<f32>>,
    post_attn_norm: Vec<Vec<f32>>,
    post_ffw_norm: Vec<Vec<f32>>,
    /// For each layer, its index among the global layers, or `None` for a sliding-window layer.
    global: Vec<Option<usize>>,
    inv_freq_global: Vec<f64>,
    inv_freq_local: Vec<f64>,
    local: Mutex<Ring>,
}

/// Keys and values of the sliding-window layers, token-major `[pos][kv_heads][head_dim]`,
/// positions `first .. next`.
#[derive(Default)]
struct Ring {
    next: usize,
    first: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

fn inv_freq(base: f64, dims: usize) -> Vec<f64> {
    (0..dims / 2)
        .map(|i| base.powf(-2.0 * i as f64 / dims as f64))
        .collect()
}

impl Gemma3 {
    pub(crate) fn load(gguf: &mut Gguf, cfg: &Config) -> Result<Gemma3> {
        let hd = cfg.head_dim;
        let mut v = |name: &str, len: usize| -> Result<Vec<Vec<f32>>> {
            (0..cfg.layers)
                .map(|l| {
                    let t = gguf.tensor(&format!("blk.{l}.{name}.weight"), &[len])?;
                    Ok(t.dequantize(&candle_core::Device::Cpu)?.to_vec1::<f32>()?)
                })
                .collect()
        };
        let q_norm = v("attn_q_norm", hd)?;
        let k_norm = v("attn_k_norm", hd)?;
        let post_attn_norm = v("post_attention_norm", cfg.d_model)?;
        let post_ffw_norm = v("post_ffw_norm", cfg.d_model)?;
        let mut g = 0;
        let global = (0..cfg.layers)
            .map(|l| {
                cfg.is_global(l).then(|| {
                    g += 1;
                    g - 1
                })
            })
            .collect();
        if g == 0 {
            return Err(Error::BadMetadata {
                key: "gemma3.block_count".into(),
                reason: format!("{} layers hold no global-attention layer", cfg.layers),
            });
        }
        Ok(Gemma3 {
            q_norm,
            k_norm,
            post_attn_norm,
            post_ffw_norm,
            global,
            inv_freq_global: inv_freq(cfg.rope_base as f64, cfg.rope_dims),
            inv_freq_local: inv_freq(LOCAL_ROPE_BASE, cfg.rope_dims),
            local: Mutex::new(Ring::default()),
        })
    }

    /// Global layers: the backend's layer count.
    pub(crate) fn global_layers(&self) -> usize {
        self.global.iter().flatten().count()
    }

    /// The final hidden states `[t][d_model]` (before the output norm) of `tokens`.
    pub(crate) fn hidden(
        &self,
        cfg: &Config,
        w: &Weights,
        tokens: &[u32],
        attn: &mut dyn Attention,
    ) -> Result<Vec<f32>> {
        let t = tokens.len();
        let start = attn.len(0);
        if start + t > cfg.context {
            return Err(Error::ContextTooLong {
                requested: start + t,
                max: cfg.context,
            });
        }
        let mut ring = self.local.lock().unwrap_or_else(|e| e.into_inner());
        if start == 0 {
            let layers = cfg.layers;
            *ring = Ring {
                k: vec![Vec::new(); layers],
                v: vec![Vec::new(); layers],
                ..Ring::default()
            };
        } else if ring.next == usize::MAX {
            return Err(Error::Attention {
                backend: attn.name().into(),
                reason: "a failed forward left the sliding-window layers incomplete: start the \
                         sequence again from position 0"
                    .into(),
            });
        } else if start > ring.next || start < ring.first {
            return Err(Error::Attention {
                backend: attn.name().into(),
                reason: format!(
                    "the backend holds {start} positions but the sliding-window layers hold \
                     {} .. {}: one Gemma 3 model runs one sequence at a time",
                    ring.first, ring.next
                ),
            });
        } else {
            // A rewind (the caller restored its backend to `start` positions of the same
            // prefix, as `cxlkv eval` does for each mode): forget the later positions.
            let keep = (start - ring.first) * cfg.kv_heads * cfg.head_dim;
            for l in 0..cfg.layers {
                ring.k[l].truncate(keep);
                ring.v[l].truncate(keep);
            }
        }
        // Poisoned until this forward completes.
        ring.next = usize::MAX;
        let d = cfg.d_model;
        let mut x = w.embed(tokens)?;
        let scale = (d as f32).sqrt();
        x.iter_mut().for_each(|v| *v *= scale);
        let mut h = vec![0f32; x.len()];
        let window = cfg.sliding_window.unwrap_or(usize::MAX);
        for (l, block) in w.blocks.iter().enumerate() {
            rms_norm(&x, &block.attn_norm, cfg.eps, &mut h);
            let mut q = block.q.forward(&h)?;
            let mut k = block.k.forward(&h)?;
            let v = block.v.forward(&h)?;
            let mut tmp = vec![0f32; q.len()];
            rms_norm(&q, &self.q_norm[l], cfg.eps, &mut tmp);
            std::mem::swap(&mut q, &mut tmp);
            let mut tmp = vec![0f32; k.len()];
            rms_norm(&k, &self.k_norm[l], cfg.eps, &mut tmp);
            std::mem::swap(&mut k, &mut tmp);
            let freqs = match self.global[l] {
                Some(_) => &self.inv_freq_global,
                None => &self.inv_freq_local,
            };
            rope_neox(&mut q, cfg.heads, cfg.head_dim, freqs, start);
            rope_neox(&mut k, cfg.kv_heads, cfg.head_dim, freqs, start);
            let mut out = vec![0f32; q.len()];
            match self.global[l] {
                Some(g) => {
                    if attn.len(g) != start {
                        return Err(Error::Attention {
                            backend: attn.name().into(),
                            reason: format!(
                                "global layer {g} holds {} positions, layer 0 holds {start}",
                                attn.len(g)
                            ),
                        });
                    }
                    let kh = head_major(&k, t, cfg.kv_heads, cfg.head_dim);
                    let vh = head_major(&v, t, cfg.kv_heads, cfg.head_dim);
                    attn.append(g, &kh, &vh)?;
                    attn.attend(g, &q, &mut out)?;
                }
                None => {
                    let r = &mut *ring;
                    let (ks, vs) = (&mut r.k[l], &mut r.v[l]);
                    local_attention(cfg, ks, vs, r.first, start, window, &k, &v, &q, &mut out);
                }
            }
            let o = block.o.forward(&out)?;
            let mut normed = vec![0f32; o.len()];
            rms_norm(&o, &self.post_attn_norm[l], cfg.eps, &mut normed);
            add(&mut x, &normed);
            rms_norm(&x, &block.ffn_norm, cfg.eps, &mut h);
            let mut gate = block.gate.forward(&h)?;
            let up = block.up.forward(&h)?;
            for (g, u) in gate.iter_mut().zip(&up) {
                *g = gelu_tanh(*g) * u;
            }
            let down = block.down.forward(&gate)?;
            let mut normed = vec![0f32; down.len()];
            rms_norm(&down, &self.post_ffw_norm[l], cfg.eps, &mut normed);
            add(&mut x, &normed);
        }
        let end = start + t;
        ring.next = end;
        Ok(x)
    }
}

/// Causal attention of `t` new tokens over the ring of one sliding-window layer: appends the new
/// keys/values (token-major) to `ks`/`vs`, which hold positions `first ..`, and lets the query at
/// position `p` see positions `p − window + 1 ..= p`.
#[allow(clippy::too_many_arguments)]
fn local_attention(
    cfg: &Config,
    ks: &mut Vec<f32>,
    vs: &mut Vec<f32>,
    first: usize,
    start: usize,
    window: usize,
    k: &[f32],
    v: &[f32],
    q: &[f32],
    out: &mut [f32],
) {
    let (hd, kvh, heads) = (cfg.head_dim, cfg.kv_heads, cfg.heads);
    let group = cfg.group();
    let scale = cfg.attention_scale();
    ks.extend_from_slice(k);
    vs.extend_from_slice(v);
    let t = q.len() / (heads * hd);
    let mut scores = Vec::new();
    for i in 0..t {
        let p = start + i;
        let lo = (p + 1).saturating_sub(window).max(first);
        for h in 0..heads {
            let kv = h / group;
            let qh = &q[(i * heads + h) * hd..][..hd];
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for pos in lo..=p {
                let kr = &ks[((pos - first) * kvh + kv) * hd..][..hd];
                let s = qh.iter().zip(kr).map(|(a, b)| a * b).sum::<f32>() * scale;
                max = max.max(s);
                scores.push(s);
            }
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let o = &mut out[(i * heads + h) * hd..][..hd];
            o.iter_mut().for_each(|x| *x = 0.0);
            for (j, pos) in (lo..=p).enumerate() {
                let vr = &vs[((pos - first) * kvh + kv) * hd..][..hd];
                let wgt = scores[j] / sum;
                for (a, b) in o.iter_mut().zip(vr) {
                    *a += wgt * b;
                }
            }
        }
    }
}

/// RoPE in NEOX mode on rows `[t][heads][head_dim]` at positions `start ..`: element `i` and
/// `i + dims/2` of each head rotate by `pos · inv_freq[i]`.
fn rope_neox(x: &mut [f32], heads: usize, hd: usize, inv_freq: &[f64], start: usize) {
    let half = inv_freq.len();
    for (i, token) in x.chunks_exact_mut(heads * hd).enumerate() {
        let pos = (start + i) as f64;
        let angles: Vec<(f32, f32)> = inv_freq
            .iter()
            .map(|&f| {
                let (s, c) = (pos * f).sin_cos();
                (c as f32, s as f32)
            })
            .collect();
        for head in token.chunks_exact_mut(hd) {
            for (j, &(c, s)) in angles.iter().enumerate() {
                let (a, b) = (head[j], head[j + half]);
                head[j] = a * c - b * s;
                head[j + half] = a * s + b * c;
            }
        }
    }
}

/// GELU, tanh approximation (ggml's `gelu`).
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(window: usize) -> Config {
        Config {
            architecture: "gemma3".into(),
            name: None,
            layers: 1,
            d_model: 4,
            heads: 2,
            kv_heads: 1,
            head_dim: 2,
            ffn: 4,
            vocab: 4,
            context: 16,
            rope_base: 10_000.0,
            rope_dims: 2,
            eps: 1e-6,
            sliding_window: Some(window),
            swa_pattern: 6,
        }
    }

    /// Attention over exactly the positions `lo ..= p` of token-major K/V, by definition.
    fn reference(c: &Config, ks: &[f32], vs: &[f32], q: &[f32], lo: usize, p: usize) -> Vec<f32> {
        let hd = c.head_dim;
        let mut out = Vec::new();
        for h in 0..c.heads {
            let qh = &q[h * hd..][..hd];
            let w: Vec<f32> = (lo..=p)
                .map(|j| {
                    let s: f32 = qh.iter().zip(&ks[j * hd..][..hd]).map(|(a, b)| a * b).sum();
                    (s * c.attention_scale()).exp()
                })
                .collect();
            let z: f32 = w.iter().sum();
            for e in 0..hd {
                out.push(
                    (lo..=p)
                        .zip(&w)
                        .map(|(j, wj)| wj / z * vs[j * hd + e])
                        .sum(),
                );
            }
        }
        out
    }

    #[test]
    fn sliding_window_sees_only_the_last_window_positions_across_calls() {
        let c = cfg(3);
        let n = 7;
        let val = |i: usize, s: f32| ((i * 7 + 3) as f32 * s).sin();
        let k: Vec<f32> = (0..n * 2).map(|i| val(i, 0.37)).collect();
        let v: Vec<f32> = (0..n * 2).map(|i| val(i, 0.91)).collect();
        let q: Vec<f32> = (0..n * 4).map(|i| val(i, 1.3)).collect();
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        let mut out = vec![0f32; n * 4];
        // A prefill of 4 positions, then 3 decode steps.
        local_attention(
            &c,
            &mut ks,
            &mut vs,
            0,
            0,
            3,
            &k[..8],
            &v[..8],
            &q[..16],
            &mut out[..16],
        );
        for p in 4..n {
            let (kr, vr, qr) = (&k[p * 2..][..2], &v[p * 2..][..2], &q[p * 4..][..4]);
            local_attention(
                &c,
                &mut ks,
                &mut vs,
                0,
                p,
                3,
                kr,
                vr,
                qr,
                &mut out[p * 4..][..4],
            );
        }
        for p in 0..n {
            let want = reference(&c, &k, &v, &q[p * 4..][..4], (p + 1).saturating_sub(3), p);
            for (a, b) in out[p * 4..][..4].iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "position {p}: {a} vs {b}");
            }
        }
        // Layer pattern: with a window, only every 6th layer is global.
        let mut c = cfg(3);
        c.layers = 12;
        let global: Vec<usize> = (0..12).filter(|&l| c.is_global(l)).collect();
        assert_eq!(global, [5, 11]);
    }

    #[test]
    fn neox_rope_rotates_halves() {
        // One head of 4, dims 4: pairs (0, 2) and (1, 3); position 1, inv_freq [1, 0.01].
        let mut x = [1.0f32, 1.0, 0.0, 0.0];
        rope_neox(&mut x, 1, 4, &[1.0, 0.01], 1);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6);
        assert!((x[1] - 0.01f32.cos()).abs() < 1e-6 && (x[3] - 0.01f32.sin()).abs() < 1e-6);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
    }
}
