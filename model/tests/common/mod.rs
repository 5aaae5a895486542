//! Shared by the tests against the real model: where the GGUF and the reference tensors are,
//! and a backend that records what the model hands to it.

#![allow(dead_code)]

use cxlkv_model::{Attention, Result};
use std::path::PathBuf;

/// The reference tensors of `data/kv/smollm2_devil_2048` (see its README).
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/kv/smollm2_devil_2048")
}

/// The SmolLM2 GGUF: `$CXLKV_MODEL`, else the cache `scripts/fetch-model.sh` fills. `None`, with
/// a message, when it is absent (CI before the fetch).
pub fn model_path(test: &str) -> Option<PathBuf> {
    cxlkv_test_support::smollm2(test)
}

/// `meta.json` of the reference data.
pub fn meta() -> serde_json::Value {
    let text = std::fs::read_to_string(data_dir().join("meta.json")).expect("meta.json");
    serde_json::from_str(&text).expect("meta.json parses")
}

/// The reference tokens.
pub fn tokens() -> Vec<u32> {
    cxlkv_bench_support::npy::read_npy(data_dir().join("tokens.npy"))
        .expect("tokens.npy")
        .to_i32()
        .expect("int32 tokens")
        .into_iter()
        .map(|t| t as u32)
        .collect()
}

/// A reference array as f32 and its shape.
pub fn array(name: &str) -> (Vec<f32>, Vec<usize>) {
    let a = cxlkv_bench_support::npy::read_npy(data_dir().join(name)).expect(name);
    (a.to_f32().expect("float array"), a.shape.clone())
}

/// Largest `|a − b|`.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Keys, values and queries of some layers, as the model hands them to the backend:
/// `[head][position][dim]` each.
#[derive(Default)]
pub struct Recorded {
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
    pub q: Vec<Vec<f32>>,
}

/// A backend that records the K, V and Q of chosen layers and leaves the work to another.
pub struct Recorder<A> {
    pub inner: A,
    pub layers: Vec<usize>,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// `[layer index in layers]`: per head, the rows seen so far.
    pub seen: Vec<Recorded>,
}

impl<A: Attention> Recorder<A> {
    pub fn new(inner: A, layers: &[usize], heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        let seen = layers
            .iter()
            .map(|_| Recorded {
                k: vec![Vec::new(); kv_heads],
                v: vec![Vec::new(); kv_heads],
                q: vec![Vec::new(); heads],
            })
            .collect();
        Recorder {
            inner,
            layers: layers.to_vec(),
            heads,
            kv_heads,
            head_dim,
            seen,
        }
    }
}

impl<A: Attention> Attention for Recorder<A> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn len(&self, layer: usize) -> usize {
        self.inner.len(layer)
    }

    fn stats(&self) -> cxlkv_model::AttentionStats {
        self.inner.stats()
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        if let Some(i) = self.layers.iter().position(|&l| l == layer) {
            let per_head = k.len() / self.kv_heads;
            for h in 0..self.kv_heads {
                let r = h * per_head..(h + 1) * per_head;
                self.seen[i].k[h].extend_from_slice(&k[r.clone()]);
                self.seen[i].v[h].extend_from_slice(&v[r]);
            }
        }
        self.inner.append(layer, k, v)
    }

    fn attend(&mut self, layer: usize, q: &[f32], out: &mut [f32]) -> Result<()> {
        if let Some(i) = self.layers.iter().position(|&l| l == layer) {
            let d = self.head_dim;
            for token in q.chunks_exact(self.heads * d) {
                for h in 0..self.heads {
                    self.seen[i].q[h].extend_from_slice(&token[h * d..(h + 1) * d]);
                }
            }
        }
        self.inner.attend(layer, q, out)
    }

    fn clear(&mut self) {
        self.inner.clear()
    }
}

/// Rows `0..n` of a `[heads][total][dim]` reference as `[heads][n][dim]`.
pub fn prefix(reference: &[f32], heads: usize, total: usize, dim: usize, n: usize) -> Vec<f32> {
    (0..heads)
        .flat_map(|h| {
            reference[h * total * dim..(h * total + n) * dim]
                .iter()
                .copied()
        })
        .collect()
}
