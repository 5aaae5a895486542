//! The contract between the model and a backend: the [`Attention`] trait, the
//! [`AttentionShape`] a backend is built for, and checks of the slices the model hands over.
//! Layouts and causality are described in the parent module.

use crate::config::Config;
use crate::error::{Error, Result};

/// What a backend needs to know about the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Layers (each has its own keys and values).
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Factor applied to `q·k` before the softmax (`1/sqrt(head_dim)`).
    pub scale: f32,
}

impl AttentionShape {
    /// The shape of `cfg`'s attention.
    pub fn of(cfg: &Config) -> AttentionShape {
        AttentionShape {
            layers: cfg.layers,
            heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            scale: cfg.attention_scale(),
        }
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// Where K and V live and how queries attend to them. One instance holds one sequence.
///
/// A backend that splits the keys (say, old positions in the pool, scored by the near-data
/// device, and recent ones in private memory) computes a [`Partial`](super::Partial) over each share and merges
/// them: the merged output is exact, not an approximation.
pub trait Attention {
    /// A short name for messages (`dense`, `dense-f16`).
    fn name(&self) -> &str;

    /// Positions held for `layer`.
    fn len(&self, layer: usize) -> usize;

    /// True if `layer` holds no position.
    fn is_empty(&self, layer: usize) -> bool {
        self.len(layer) == 0
    }

    /// Appends the keys and values of `t` new positions of `layer`, `[kv_heads][t][head_dim]`
    /// each (`t = k.len() / (kv_heads · head_dim)`).
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()>;

    /// Attention of the last `t` positions' queries `q` (`[t][heads][head_dim]`) into `out`
    /// (same layout), each over the positions up to its own (causal).
    fn attend(&mut self, layer: usize, q: &[f32], out: &mut [f32]) -> Result<()>;

    /// Forgets every position of every layer (a new sequence).
    fn clear(&mut self);
}

/// Checks the lengths handed to a backend: `t` whole positions of K and V, `out` as long as `q`.
/// Returns `t`. For backends' use.
pub fn check_append(shape: &AttentionShape, name: &str, k: &[f32], v: &[f32]) -> Result<usize> {
    let row = shape.kv_heads * shape.head_dim;
    if k.len() != v.len() || k.is_empty() || !k.len().is_multiple_of(row) {
        return Err(Error::Attention {
            backend: name.into(),
            reason: format!(
                "K ({}) and V ({}) must be equal, non-empty multiples of kv_heads × head_dim = {row}",
                k.len(),
                v.len()
            ),
        });
    }
    Ok(k.len() / row)
}

/// Checks a query block against what the layer holds; returns `t`, the number of queries.
pub fn check_attend(
    shape: &AttentionShape,
    name: &str,
    held: usize,
    q: &[f32],
    out: &[f32],
) -> Result<usize> {
    let row = shape.heads * shape.head_dim;
    let t = q.len() / row;
    if q.is_empty() || !q.len().is_multiple_of(row) || out.len() != q.len() || t > held {
        return Err(Error::Attention {
            backend: name.into(),
            reason: format!(
                "queries ({}) must be a non-empty multiple of heads × head_dim = {row}, output \
                 ({}) as long, and at most the {held} positions held",
                q.len(),
                out.len()
            ),
        });
    }
    Ok(t)
}
