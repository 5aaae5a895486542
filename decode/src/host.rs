//! Attention computed on the host over rows it holds: the arithmetic of `cxlkv_model::Dense`
//! (the same Q·K kernel, the same [`Partial`] math, the same order), so a backend that reads its
//! rows back from the pool gives the reference's outputs bit for bit.

use cxlkv_kernels::{DType, KeyRows, Partial, QueryGroup, ScoreKernel};
use cxlkv_model::{AttentionShape, AttentionStats};

/// Causal attention of the last `t` positions' queries (`[t][heads][d]`) over `held` rows per KV
/// head (`k[h]`, `v[h]`, rows of `dtype`), into `out`. Adds query heads and value rows to
/// `stats`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense_attend(
    shape: &AttentionShape,
    kernel: &ScoreKernel,
    dtype: DType,
    k: &[Vec<u8>],
    v: &[Vec<u8>],
    held: usize,
    q: &[f32],
    out: &mut [f32],
    scores: &mut Vec<f32>,
    stats: &mut AttentionStats,
) {
    let (d, g) = (shape.head_dim, shape.group());
    let row = shape.heads * d;
    let rb = d * dtype.size();
    let t = q.len() / row;
    for i in 0..t {
        let visible = held - t + i + 1;
        for kv in 0..shape.kv_heads {
            let keys = KeyRows::new(&k[kv][..visible * rb], dtype, d).expect("whole rows");
            let values = KeyRows::new(&v[kv][..visible * rb], dtype, d).expect("whole rows");
            let group = &q[i * row + kv * g * d..i * row + (kv + 1) * g * d];
            let group = QueryGroup::new(group, d).expect("dimension checked by the model");
            scores.resize(visible * g, 0.0);
            kernel.score(&group, &keys, scores);
            let parts = Partial::over_group(&values, scores, g, shape.scale);
            for (j, p) in parts.iter().enumerate() {
                let at = i * row + (kv * g + j) * d;
                p.finish_into(&mut out[at..at + d]);
            }
            stats.query_heads += g as u64;
            stats.value_rows += (g * visible) as u64;
        }
    }
}

/// The partials of one GQA group (`group`: `G × d` queries) over rows `k`, `v` held on the host
/// (possibly none).
pub(crate) fn group_partials(
    shape: &AttentionShape,
    kernel: &ScoreKernel,
    dtype: DType,
    k: &[u8],
    v: &[u8],
    group: &[f32],
    scores: &mut Vec<f32>,
) -> Vec<Partial> {
    let (d, g) = (shape.head_dim, shape.group());
    let keys = KeyRows::new(k, dtype, d).expect("whole rows");
    let values = KeyRows::new(v, dtype, d).expect("whole rows");
    if keys.is_empty() {
        return (0..g).map(|_| Partial::empty(d)).collect();
    }
    let group = QueryGroup::new(group, d).expect("dimension checked by the model");
    scores.resize(keys.len() * g, 0.0);
    kernel.score(&group, &keys, scores);
    Partial::over_group(&values, scores, g, shape.scale)
}
