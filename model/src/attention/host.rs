//! The one attention loop over rows the host holds. [`Dense`](super::Dense) runs it over its
//! private rows; the pool backends (`cxlkv-decode`) run it over rows read back from the pool, and
//! take [`HostAttention::group`] for the host's share of a split attention. One loop, so `pool`
//! gives `dense`'s outputs bit for bit by construction, not by two copies kept in step.
//!
//! Arithmetic: scores from `cxlkv_kernels`' Q·K kernel, one GQA group at a time; the softmax and
//! the value sum from [`Partial::over_group`], finished in place.

use super::contract::{AttentionShape, AttentionStats};
use cxlkv_kernels::{DType, KeyRows, Partial, QueryGroup, ScoreKernel, ShapeError};

/// One KV head's rows: keys and values, position `i` at row `i` of each.
#[derive(Clone, Copy, Debug)]
pub struct HeadRows<'a> {
    /// The keys.
    pub keys: KeyRows<'a>,
    /// The values, as many rows as the keys.
    pub values: KeyRows<'a>,
}

impl<'a> HeadRows<'a> {
    /// Views `k` and `v`, little-endian elements of `dtype`, as rows of `dim`.
    pub fn new(k: &'a [u8], v: &'a [u8], dtype: DType, dim: usize) -> Result<Self, ShapeError> {
        Ok(HeadRows {
            keys: KeyRows::new(k, dtype, dim)?,
            values: KeyRows::new(v, dtype, dim)?,
        })
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True if no position is held.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Positions `start .. end`. Panics if out of range.
    pub fn slice(&self, start: usize, end: usize) -> HeadRows<'a> {
        HeadRows {
            keys: self.keys.slice(start, end),
            values: self.values.slice(start, end),
        }
    }
}

/// Attention computed on the host: the score kernel and its scratch scores.
pub struct HostAttention {
    kernel: ScoreKernel,
    scores: Vec<f32>,
}

impl Default for HostAttention {
    fn default() -> Self {
        HostAttention::new()
    }
}

impl HostAttention {
    /// The fastest score kernel this CPU runs.
    pub fn new() -> HostAttention {
        HostAttention {
            kernel: ScoreKernel::detect(),
            scores: Vec::new(),
        }
    }

    /// The partials of one GQA group (`group`: `G × head_dim` queries) over every row of `rows`
    /// (an empty partial per query if there is none).
    pub fn group(
        &mut self,
        shape: &AttentionShape,
        rows: HeadRows<'_>,
        group: &[f32],
    ) -> Vec<Partial> {
        let (d, g) = (shape.head_dim, shape.group());
        if rows.is_empty() {
            return (0..g).map(|_| Partial::empty(d)).collect();
        }
        let group = QueryGroup::new(group, d).expect("dimension checked by the backend");
        self.scores.resize(rows.len() * g, 0.0);
        self.kernel.score(&group, &rows.keys, &mut self.scores);
        Partial::over_group(&rows.values, &self.scores, g, shape.scale)
    }

    /// Causal attention of the last `t` positions' queries `q` (`[t][heads][head_dim]`) over
    /// `heads` (one per KV head, every position held) into `out`: query `i` sees the positions
    /// up to `held − t + i`. Adds the query heads and value rows to `stats`. The caller has
    /// checked the lengths ([`check_attend`](super::check_attend)).
    pub fn causal(
        &mut self,
        shape: &AttentionShape,
        heads: &[HeadRows<'_>],
        q: &[f32],
        out: &mut [f32],
        stats: &mut AttentionStats,
    ) {
        let (d, g) = (shape.head_dim, shape.group());
        let row = shape.heads * d;
        let t = q.len() / row;
        for i in 0..t {
            for (kv, rows) in heads.iter().enumerate() {
                let visible = rows.len() - t + i + 1;
                let group = &q[i * row + kv * g * d..i * row + (kv + 1) * g * d];
                let parts = self.group(shape, rows.slice(0, visible), group);
                for (j, p) in parts.iter().enumerate() {
                    let at = i * row + (kv * g + j) * d;
                    p.finish_into(&mut out[at..at + d]);
                }
                stats.query_heads += g as u64;
                stats.value_rows += (g * visible) as u64;
            }
        }
    }
}
