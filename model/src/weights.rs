//! The model's tensors: matrices behind candle's [`QMatMul`] (kept quantized, or dequantized to
//! f32 once at load), norms and the embedding table as plain f32. This is the only module that
//! touches candle tensors; everything else sees `&[f32]`.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use candle_core::quantized::QMatMul;
use candle_core::{Device, Module, Tensor};
use std::sync::Arc;

/// How the weight matrices are kept in memory and multiplied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightFormat {
    /// Dequantized to f32 at load (about 4 bytes a parameter), multiplied in f32 with candle's
    /// `gemm`: the numerically exact reading of the file, and the reference the tests compare.
    #[default]
    F32,
    /// Kept as stored (Q4_1, Q8_0, ...) and multiplied with candle's quantized dot products,
    /// which quantize the activations to 8 bits first, as llama.cpp does.
    Quantized,
}

impl std::str::FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(WeightFormat::F32),
            "quantized" | "q" => Ok(WeightFormat::Quantized),
            other => Err(format!(
                "unknown weight format {other:?} (known: f32, quantized)"
            )),
        }
    }
}

/// `y = x Wᵀ` for a GGUF matrix `W` of `rows` outputs and `cols` inputs.
pub(crate) struct Linear {
    w: QMatMul,
    rows: usize,
    cols: usize,
}

impl Linear {
    fn load(
        gguf: &mut Gguf,
        name: &str,
        rows: usize,
        cols: usize,
        f: WeightFormat,
    ) -> Result<Self> {
        let q = gguf.tensor(name, &[rows, cols])?;
        let w = match f {
            WeightFormat::F32 => QMatMul::Tensor(q.dequantize(&Device::Cpu)?),
            WeightFormat::Quantized => QMatMul::QTensor(Arc::new(q)),
        };
        Ok(Linear { w, rows, cols })
    }

    /// Outputs per row of input.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// `x` holds `x.len() / cols` rows of `cols` inputs; returns as many rows of `rows` outputs.
    pub(crate) fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        debug_assert!(x.len().is_multiple_of(self.cols));
        let t = Tensor::from_slice(x, (x.len() / self.cols, self.cols), &Device::Cpu)?;
        Ok(self.w.forward(&t)?.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// One transformer block.
pub(crate) struct Block {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    pub(crate) ffn_norm: Vec<f32>,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

/// All tensors of a Llama-architecture model.
pub(crate) struct Weights {
    /// `[vocab, d_model]`, f32.
    embedding: Tensor,
    pub(crate) blocks: Vec<Block>,
    pub(crate) output_norm: Vec<f32>,
    /// `output.weight`, or the embedding table when the file ties them.
    pub(crate) output: Linear,
    pub(crate) tied_output: bool,
}

impl Weights {
    pub(crate) fn load(gguf: &mut Gguf, cfg: &Config, f: WeightFormat) -> Result<Weights> {
        let (d, hd) = (cfg.d_model, cfg.head_dim);
        let embd = gguf.tensor("token_embd.weight", &[cfg.vocab, d])?;
        let embedding = embd.dequantize(&Device::Cpu)?;
        let mut blocks = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            blocks.push(Block {
                attn_norm: vector(gguf, &n("attn_norm"), d)?,
                q: Linear::load(gguf, &n("attn_q"), cfg.heads * hd, d, f)?,
                k: Linear::load(gguf, &n("attn_k"), cfg.kv_heads * hd, d, f)?,
                v: Linear::load(gguf, &n("attn_v"), cfg.kv_heads * hd, d, f)?,
                o: Linear::load(gguf, &n("attn_output"), d, cfg.heads * hd, f)?,
                ffn_norm: vector(gguf, &n("ffn_norm"), d)?,
                gate: Linear::load(gguf, &n("ffn_gate"), cfg.ffn, d, f)?,
                up: Linear::load(gguf, &n("ffn_up"), cfg.ffn, d, f)?,
                down: Linear::load(gguf, &n("ffn_down"), d, cfg.ffn, f)?,
            });
        }
        let output_norm = vector(gguf, "output_norm.weight", d)?;
        let tied_output = !gguf.has_tensor("output.weight");
        let output = if tied_output {
            match f {
                WeightFormat::F32 => Linear {
                    w: QMatMul::Tensor(embedding.clone()),
                    rows: cfg.vocab,
                    cols: d,
                },
                WeightFormat::Quantized => Linear {
                    w: QMatMul::QTensor(Arc::new(embd)),
                    rows: cfg.vocab,
                    cols: d,
                },
            }
        } else {
            Linear::load(gguf, "output.weight", cfg.vocab, d, f)?
        };
        Ok(Weights {
            embedding,
            blocks,
            output_norm,
            output,
            tied_output,
        })
    }

    /// The embedding rows of `tokens`, `[tokens.len()][d_model]`.
    pub(crate) fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let vocab = self.embedding.dims()[0];
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::BadToken { id, vocab });
        }
        let ids = Tensor::from_slice(tokens, tokens.len(), &Device::Cpu)?;
        Ok(self
            .embedding
            .index_select(&ids, 0)?
            .flatten_all()?
            .to_vec1::<f32>()?)
    }
}

/// A one-dimensional f32 tensor of `len` elements (norm weights).
fn vector(gguf: &mut Gguf, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = gguf.tensor(name, &[len])?.dequantize(&Device::Cpu)?;
    Ok(t.to_vec1::<f32>()?)
}
