//! The reference backend: every key and value in private memory (f32, or f16 to halve it), exact
//! softmax attention over all positions, computed by the one host attention loop
//! ([`HostAttention::causal`]: `cxlkv_kernels`' Q·K kernel, the one the near-data path uses, and
//! [`Partial`](cxlkv_kernels::Partial)'s softmax and value sum), so that a backend splitting the
//! keys differs from this one only by the merge.

use super::contract::{check_append, check_attend, Attention, AttentionShape, AttentionStats};
use super::host::{HeadRows, HostAttention};
use crate::error::{Error, Result};
use cxlkv_kernels::{DType, KeyRows};

/// Keys and values of one KV head of one layer, rows of `head_dim` elements, little-endian.
#[derive(Default)]
struct HeadCache {
    k: Vec<u8>,
    v: Vec<u8>,
}

/// Dense attention over keys and values in private memory.
pub struct Dense {
    shape: AttentionShape,
    dtype: DType,
    host: HostAttention,
    /// `[layer][kv_head]`.
    heads: Vec<Vec<HeadCache>>,
    /// Positions held per layer.
    len: Vec<usize>,
    stats: AttentionStats,
}

impl Dense {
    /// An empty cache for a model of `shape`, storing K and V as `dtype`.
    pub fn new(shape: AttentionShape, dtype: DType) -> Result<Dense> {
        let name = Dense::name_of(dtype);
        if dtype.is_quantized() {
            return Err(Error::Attention {
                backend: name.into(),
                reason: format!(
                    "dense attention keeps float rows (f32, f16 or bf16), not {}: quantized \
                     K/V live in the pool's blocks",
                    dtype.name()
                ),
            });
        }
        if shape.kv_heads == 0 || !shape.heads.is_multiple_of(shape.kv_heads) {
            return Err(Error::Attention {
                backend: name.into(),
                reason: format!(
                    "{} KV heads do not divide {} query heads",
                    shape.kv_heads, shape.heads
                ),
            });
        }
        if shape.head_dim == 0
            || !shape.head_dim.is_multiple_of(16)
            || shape.head_dim > cxlkv_kernels::MAX_DIM
        {
            return Err(Error::Attention {
                backend: name.into(),
                reason: format!(
                    "head dimension {} is not a multiple of 16 up to {} (the Q·K kernel's rows)",
                    shape.head_dim,
                    cxlkv_kernels::MAX_DIM
                ),
            });
        }
        let heads = (0..shape.layers)
            .map(|_| (0..shape.kv_heads).map(|_| HeadCache::default()).collect())
            .collect();
        Ok(Dense {
            shape,
            dtype,
            host: HostAttention::new(),
            heads,
            len: vec![0; shape.layers],
            stats: AttentionStats::default(),
        })
    }

    fn name_of(dtype: DType) -> &'static str {
        match dtype {
            DType::F16 => "dense-f16",
            DType::Bf16 => "dense-bf16",
            DType::F32 => "dense",
            DType::I8 => "dense-int8",
            DType::I4 => "dense-int4",
        }
    }

    fn layer_error(&self, layer: usize) -> Error {
        Error::Attention {
            backend: self.name().into(),
            reason: format!("layer {layer} of {}", self.shape.layers),
        }
    }

    /// The keys of `layer`, KV head `h` (its values if `values`), as rows.
    pub fn rows(&self, layer: usize, h: usize, values: bool) -> Option<KeyRows<'_>> {
        let c = self.heads.get(layer)?.get(h)?;
        let bytes = if values { &c.v } else { &c.k };
        KeyRows::new(bytes, self.dtype, self.shape.head_dim).ok()
    }
}

fn push_row(dst: &mut Vec<u8>, row: &[f32], dtype: DType) {
    for &x in row {
        match dtype {
            DType::F32 => dst.extend_from_slice(&x.to_le_bytes()),
            DType::F16 => dst.extend_from_slice(&cxlkv_kernels::f32_to_f16(x).to_le_bytes()),
            DType::Bf16 => dst.extend_from_slice(&cxlkv_kernels::f32_to_bf16(x).to_le_bytes()),
            DType::I8 | DType::I4 => unreachable!("Dense::new refuses quantized dtypes"),
        }
    }
}

impl Attention for Dense {
    fn name(&self) -> &str {
        Dense::name_of(self.dtype)
    }

    fn len(&self, layer: usize) -> usize {
        self.len.get(layer).copied().unwrap_or(0)
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let t = check_append(&self.shape, self.name(), k, v)?;
        if layer >= self.shape.layers {
            return Err(self.layer_error(layer));
        }
        let d = self.shape.head_dim;
        let dtype = self.dtype;
        for (h, cache) in self.heads[layer].iter_mut().enumerate() {
            let head = h * t * d..(h + 1) * t * d;
            push_row(&mut cache.k, &k[head.clone()], dtype);
            push_row(&mut cache.v, &v[head], dtype);
        }
        self.len[layer] += t;
        Ok(())
    }

    fn attend(&mut self, layer: usize, q: &[f32], out: &mut [f32]) -> Result<()> {
        if layer >= self.shape.layers {
            return Err(self.layer_error(layer));
        }
        let held = self.len[layer];
        check_attend(&self.shape, self.name(), held, q, out)?;
        let (dtype, d) = (self.dtype, self.shape.head_dim);
        let heads: Vec<HeadRows<'_>> = self.heads[layer]
            .iter()
            .map(|c| HeadRows::new(&c.k, &c.v, dtype, d).expect("rows checked at construction"))
            .collect();
        self.host
            .causal(&self.shape, &heads, q, out, &mut self.stats);
        Ok(())
    }

    fn clear(&mut self) {
        for layer in &mut self.heads {
            for c in layer {
                c.k.clear();
                c.v.clear();
            }
        }
        self.len.iter_mut().for_each(|n| *n = 0);
    }

    fn stats(&self) -> AttentionStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cxlkv_kernels::attention::{dense_attention, relative_error};
    use cxlkv_kernels::rng::SplitMix64;

    fn shape() -> AttentionShape {
        AttentionShape {
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            scale: cxlkv_kernels::attention::default_scale(16),
        }
    }

    /// Appending in pieces and attending token by token gives the prefill's outputs, and each
    /// matches the kernels' dense reference over the visible rows.
    #[test]
    fn causal_outputs_match_the_reference() {
        let s = shape();
        let (t, d) = (9, s.head_dim);
        let mut rng = SplitMix64::new(3);
        let k = rng.normal_vec(s.kv_heads * t * d);
        let v = rng.normal_vec(s.kv_heads * t * d);
        let q = rng.normal_vec(t * s.heads * d);
        let mut whole = Dense::new(s, DType::F32).unwrap();
        whole.append(1, &k, &v).unwrap();
        let mut out = vec![0.0; q.len()];
        whole.attend(1, &q, &mut out).unwrap();

        let mut steps = Dense::new(s, DType::F32).unwrap();
        let head_major =
            |x: &[f32], h: usize, i: usize| x[(h * t + i) * d..(h * t + i + 1) * d].to_vec();
        for i in 0..t {
            let ki: Vec<f32> = (0..s.kv_heads).flat_map(|h| head_major(&k, h, i)).collect();
            let vi: Vec<f32> = (0..s.kv_heads).flat_map(|h| head_major(&v, h, i)).collect();
            steps.append(1, &ki, &vi).unwrap();
            let qi = &q[i * s.heads * d..(i + 1) * s.heads * d];
            let mut oi = vec![0.0; qi.len()];
            steps.attend(1, qi, &mut oi).unwrap();
            assert!(relative_error(&oi, &out[i * s.heads * d..(i + 1) * s.heads * d]) < 1e-6);
            for h in 0..s.heads {
                let kv = h / s.group();
                let keys = steps.rows(1, kv, false).unwrap();
                let vals = steps.rows(1, kv, true).unwrap();
                let r = dense_attention(&qi[h * d..(h + 1) * d], &keys, &vals, s.scale);
                assert!(
                    relative_error(&oi[h * d..(h + 1) * d], &r) < 1e-5,
                    "token {i} head {h}"
                );
            }
        }
        assert_eq!((steps.len(0), steps.len(1)), (0, t));
        steps.clear();
        assert!(steps.is_empty(1));
    }

    #[test]
    fn bad_input_is_an_error() {
        let mut a = Dense::new(shape(), DType::F16).unwrap();
        assert!(a.append(0, &[0.0; 31], &[0.0; 31]).is_err());
        assert!(a.append(2, &[0.0; 32], &[0.0; 32]).is_err());
        let mut out = vec![0.0; 64];
        assert!(
            a.attend(0, &[0.0; 64], &mut out).is_err(),
            "no position held yet"
        );
        a.append(0, &[0.0; 32], &[0.0; 32]).unwrap();
        a.attend(0, &[0.0; 64], &mut out).unwrap();
        let odd = AttentionShape {
            head_dim: 24,
            ..shape()
        };
        assert!(Dense::new(odd, DType::F32).is_err());
    }
}
