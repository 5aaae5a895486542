//! The Llama forward: embedding, then per block RMSNorm → Q/K/V projections → RoPE → the
//! attention backend → output projection (residual), RMSNorm → SwiGLU MLP (residual), and a
//! final RMSNorm and the output head. Activations are f32 rows, `[tokens][width]`.

use crate::attention::{Attention, AttentionShape};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::gemma3::Gemma3;
use crate::gguf::Gguf;
use crate::ops::{add, head_major, rms_norm};
use crate::tokenizer::Tokenizer;
use crate::weights::{Block, WeightFormat, Weights};
use std::path::Path;

/// A loaded model: configuration, tokenizer and weights. Immutable; the per-sequence state (the
/// KV cache) lives in the [`Attention`] backend passed to each call.
pub struct Model {
    cfg: Config,
    tokenizer: Tokenizer,
    weights: Weights,
    format: WeightFormat,
    /// `base^(−2i/rope_dims)` for `i < rope_dims / 2`.
    inv_freq: Vec<f64>,
    /// Gemma 3's extra tensors and sliding-window state (`gemma3` architecture).
    gemma3: Option<Gemma3>,
}

/// Which logits a forward returns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Logits {
    Last,
    All,
}

impl Model {
    /// Loads the GGUF file at `path`, keeping its matrices as `format` says.
    pub fn load(path: impl AsRef<Path>, format: WeightFormat) -> Result<Model> {
        let mut gguf = Gguf::open(path)?;
        let cfg = Config::from_gguf(&gguf)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        if tokenizer.vocab_size() != cfg.vocab {
            return Err(Error::BadMetadata {
                key: "tokenizer.ggml.tokens".into(),
                reason: format!(
                    "{} tokens for a vocabulary of {}",
                    tokenizer.vocab_size(),
                    cfg.vocab
                ),
            });
        }
        let weights = Weights::load(&mut gguf, &cfg, format)?;
        let gemma3 = match cfg.architecture.as_str() {
            "gemma3" => Some(Gemma3::load(&mut gguf, &cfg)?),
            _ => None,
        };
        let half = cfg.rope_dims / 2;
        let inv_freq = (0..half)
            .map(|i| (cfg.rope_base as f64).powf(-2.0 * i as f64 / cfg.rope_dims as f64))
            .collect();
        Ok(Model {
            cfg,
            tokenizer,
            weights,
            format,
            inv_freq,
            gemma3,
        })
    }

    /// The configuration read from the file.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The tokenizer read from the file.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// How the matrices are kept.
    pub fn weight_format(&self) -> WeightFormat {
        self.format
    }

    /// True if the output head is the embedding table (no `output.weight` in the file).
    pub fn tied_output(&self) -> bool {
        self.weights.tied_output
    }

    /// The shape an attention backend for this model needs.
    pub fn attention_shape(&self) -> AttentionShape {
        let mut shape = AttentionShape::of(&self.cfg);
        if let Some(g) = &self.gemma3 {
            // Sliding-window layers stay in the model (see `gemma3.rs`).
            shape.layers = g.global_layers();
        }
        shape
    }

    /// Runs `tokens` at the positions after those `attn` holds, appending their keys and values
    /// to it, and returns the logits after the last token (`[vocab]`).
    pub fn forward(&self, tokens: &[u32], attn: &mut dyn Attention) -> Result<Vec<f32>> {
        self.run(tokens, attn, Logits::Last)
    }

    /// As [`forward`](Model::forward), returning the logits after every token
    /// (`[tokens.len()][vocab]`): for scoring a text (perplexity).
    pub fn forward_all(&self, tokens: &[u32], attn: &mut dyn Attention) -> Result<Vec<f32>> {
        self.run(tokens, attn, Logits::All)
    }

    fn run(&self, tokens: &[u32], attn: &mut dyn Attention, which: Logits) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let t = tokens.len();
        if t == 0 {
            return Err(Error::EmptyInput);
        }
        if let Some(g) = &self.gemma3 {
            let x = g.hidden(cfg, &self.weights, tokens, attn)?;
            return self.head(x, t, which);
        }
        let start = attn.len(0);
        if start + t > cfg.context {
            return Err(Error::ContextTooLong {
                requested: start + t,
                max: cfg.context,
            });
        }
        let rope = self.rope_table(start, t);
        let mut x = self.weights.embed(tokens)?;
        let mut h = vec![0f32; x.len()];
        for (l, block) in self.weights.blocks.iter().enumerate() {
            if attn.len(l) != start {
                return Err(Error::Attention {
                    backend: attn.name().into(),
                    reason: format!(
                        "layer {l} holds {} positions, layer 0 holds {start}",
                        attn.len(l)
                    ),
                });
            }
            rms_norm(&x, &block.attn_norm, cfg.eps, &mut h);
            self.attention(block, l, &h, &rope, attn, &mut x)?;
            rms_norm(&x, &block.ffn_norm, cfg.eps, &mut h);
            mlp(block, &h, &mut x)?;
        }
        self.head(x, t, which)
    }

    /// The output norm and head over the last row of `x` or all `t` rows.
    fn head(&self, x: Vec<f32>, t: usize, which: Logits) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let d = cfg.d_model;
        let x = match which {
            Logits::All => x,
            Logits::Last => x[(t - 1) * d..].to_vec(),
        };
        let mut normed = vec![0f32; x.len()];
        rms_norm(&x, &self.weights.output_norm, cfg.eps, &mut normed);
        let logits = self.weights.output.forward(&normed)?;
        debug_assert_eq!(logits.len(), (x.len() / d) * self.weights.output.rows());
        Ok(logits)
    }

    /// `x += W_o · attention(RoPE(W_q h), RoPE(W_k h), W_v h)` for one block.
    fn attention(
        &self,
        block: &Block,
        layer: usize,
        h: &[f32],
        rope: &[(f32, f32)],
        attn: &mut dyn Attention,
        x: &mut [f32],
    ) -> Result<()> {
        let cfg = &self.cfg;
        let t = h.len() / cfg.d_model;
        let mut q = block.q.forward(h)?;
        let mut k = block.k.forward(h)?;
        let v = block.v.forward(h)?;
        self.apply_rope(&mut q, cfg.heads, rope);
        self.apply_rope(&mut k, cfg.kv_heads, rope);
        let k = head_major(&k, t, cfg.kv_heads, cfg.head_dim);
        let v = head_major(&v, t, cfg.kv_heads, cfg.head_dim);
        attn.append(layer, &k, &v)?;
        let mut out = vec![0f32; q.len()];
        attn.attend(layer, &q, &mut out)?;
        add(x, &block.o.forward(&out)?);
        Ok(())
    }

    /// `(cos, sin)` of `pos · inv_freq[i]` for positions `start .. start + t`, `[t][rope_dims/2]`.
    fn rope_table(&self, start: usize, t: usize) -> Vec<(f32, f32)> {
        (start..start + t)
            .flat_map(|pos| {
                self.inv_freq.iter().map(move |&f| {
                    let (s, c) = (pos as f64 * f).sin_cos();
                    (c as f32, s as f32)
                })
            })
            .collect()
    }

    /// RoPE in llama.cpp's "normal" mode on rows `[t][heads][head_dim]`: the pairs `(2i, 2i+1)`
    /// of the first `rope_dims` elements of each head rotate by `pos · inv_freq[i]`. (GGUF
    /// converters permute the Q and K weights so that this equals Hugging Face's half-split
    /// rotation in the original order.)
    fn apply_rope(&self, x: &mut [f32], heads: usize, rope: &[(f32, f32)]) {
        let hd = self.cfg.head_dim;
        let half = self.inv_freq.len();
        for (i, token) in x.chunks_exact_mut(heads * hd).enumerate() {
            let angles = &rope[i * half..(i + 1) * half];
            for head in token.chunks_exact_mut(hd) {
                for (pair, &(c, s)) in head.chunks_exact_mut(2).zip(angles) {
                    let (a, b) = (pair[0], pair[1]);
                    pair[0] = a * c - b * s;
                    pair[1] = a * s + b * c;
                }
            }
        }
    }
}

/// `x += W_down · (silu(W_gate h) ⊙ W_up h)`.
fn mlp(block: &Block, h: &[f32], x: &mut [f32]) -> Result<()> {
    let mut gate = block.gate.forward(h)?;
    let up = block.up.forward(h)?;
    for (g, u) in gate.iter_mut().zip(&up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
    add(x, &block.down.forward(&gate)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_major_transposes() {
        // t = 2 tokens, 3 heads, d = 2: token-major values are (token, head, elem) digits.
        let x: Vec<f32> = (0..2)
            .flat_map(|i| {
                (0..3).flat_map(move |h| (0..2).map(move |e| (i * 100 + h * 10 + e) as f32))
            })
            .collect();
        let y = head_major(&x, 2, 3, 2);
        assert_eq!(&y[..4], &[0.0, 1.0, 100.0, 101.0]);
        assert_eq!(&y[8..], &[20.0, 21.0, 120.0, 121.0]);
    }

    #[test]
    fn rms_norm_scales_to_unit_rms() {
        let x = [3.0f32, 4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let mut out = [0f32; 8];
        rms_norm(&x, &[1.0, 1.0, 2.0, 2.0], 0.0, &mut out);
        assert!((out[0] - 1.2).abs() < 1e-6 && (out[1] - 1.6).abs() < 1e-6);
        assert_eq!(&out[4..], &[1.0, 1.0, 2.0, 2.0]);
    }
}
