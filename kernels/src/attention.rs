//! Softmax attention over selected rows, and the dense reference over all rows.
//!
//! Scores are the unscaled `q·k` of [`Hit`]s; the softmax uses `scale · score` (usually
//! `1/sqrt(dim)`, see [`default_scale`]) with the maximum subtracted. Sums run in f64: these are
//! references and the output of a sparse step, not the hot loop.

use crate::rows::{KeyRows, QueryGroup, MAX_ROW_BYTES};
use crate::score::ScoreKernel;
use crate::topk::Hit;

/// The usual attention scale `1/sqrt(dim)`.
pub fn default_scale(dim: usize) -> f32 {
    1.0 / (dim as f32).sqrt()
}

/// `softmax(scale · s_i) · V_i` over the selected hits: the attention output restricted to (and
/// renormalised over) those rows. `values` row `hit.index` is the value of that token. Returns
/// zeros if `hits` is empty.
pub fn softmax_attention_selected(hits: &[Hit], values: &KeyRows<'_>, scale: f32) -> Vec<f32> {
    let dim = values.dim();
    let mut out = vec![0f64; dim];
    if hits.is_empty() {
        return vec![0.0; dim];
    }
    let max = hits
        .iter()
        .map(|h| scale as f64 * h.score as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0f64;
    let mut buf = [0u8; MAX_ROW_BYTES];
    for h in hits {
        let w = (scale as f64 * h.score as f64 - max).exp();
        total += w;
        let row = values.copy_row(h.index as usize, &mut buf);
        for (d, o) in out.iter_mut().enumerate() {
            *o += w * values.dtype().load(row, d) as f64;
        }
    }
    out.iter().map(|o| (o / total) as f32).collect()
}

/// Dense attention of one query over every row: `softmax(scale · q·K) · V`, the reference.
/// Scores come from the scalar oracle, so they are the same numbers the fast kernels rank.
pub fn dense_attention(
    q: &[f32],
    keys: &KeyRows<'_>,
    values: &KeyRows<'_>,
    scale: f32,
) -> Vec<f32> {
    assert_eq!(keys.len(), values.len(), "one value row per key");
    let scores = dense_scores(q, keys);
    let all: Vec<Hit> = scores
        .iter()
        .enumerate()
        .map(|(i, &score)| Hit {
            index: i as u32,
            score,
        })
        .collect();
    softmax_attention_selected(&all, values, scale)
}

/// Scores of one query against every row with the scalar oracle.
pub fn dense_scores(q: &[f32], keys: &KeyRows<'_>) -> Vec<f32> {
    let group = QueryGroup::new(q, keys.dim()).expect("query of the keys' dimension");
    let mut scores = vec![0f32; keys.len()];
    ScoreKernel::scalar().score(&group, keys, &mut scores);
    scores
}

/// Softmax mass (`scale · score`) of all scores that the `selected` hits hold: how much of the
/// dense attention a top-k keeps.
pub fn softmax_mass(all_scores: &[f32], selected: &[Hit], scale: f32) -> f64 {
    let max = all_scores
        .iter()
        .map(|&s| scale as f64 * s as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let total: f64 = all_scores
        .iter()
        .map(|&s| (scale as f64 * s as f64 - max).exp())
        .sum();
    let kept: f64 = selected
        .iter()
        .map(|h| (scale as f64 * all_scores[h.index as usize] as f64 - max).exp())
        .sum();
    kept / total
}

/// `‖a − b‖ / ‖b‖` (Euclidean), 0 if both are zero.
pub fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::rng::SplitMix64;
    use crate::scan::scan_topk;
    use crate::topk::TopK;

    #[test]
    fn selecting_every_row_is_dense_attention_and_mass_one() {
        let mut rng = SplitMix64::new(2);
        let (n, dim) = (40, 16);
        let kb = rng.key_bytes(n, dim, DType::Bf16);
        let vb = rng.key_bytes(n, dim, DType::Bf16);
        let keys = KeyRows::new(&kb, DType::Bf16, dim).unwrap();
        let vals = KeyRows::new(&vb, DType::Bf16, dim).unwrap();
        let qv = rng.normal_vec(dim);
        let q = QueryGroup::new(&qv, dim).unwrap();
        let scale = default_scale(dim);
        let dense = dense_attention(&qv, &keys, &vals, scale);
        let all = scan_topk(ScoreKernel::detect(), &q, &keys, TopK::per_query(n)).remove(0);
        let sel = softmax_attention_selected(&all, &vals, scale);
        assert!(relative_error(&sel, &dense) < 1e-6);
        let scores = dense_scores(&qv, &keys);
        assert!((softmax_mass(&scores, &all, scale) - 1.0).abs() < 1e-12);
        let top = &all[..5];
        let m = softmax_mass(&scores, top, scale);
        assert!(m > 0.0 && m < 1.0);
    }

    #[test]
    fn one_dominant_key_takes_the_output() {
        let dim = 16;
        let mut kb = Vec::new();
        let mut vb = Vec::new();
        for i in 0..4 {
            for d in 0..dim {
                crate::rng::push_elem(&mut kb, DType::F32, if i == 2 { 10.0 } else { 0.0 });
                crate::rng::push_elem(&mut vb, DType::F32, (i * 100 + d) as f32);
            }
        }
        let keys = KeyRows::new(&kb, DType::F32, dim).unwrap();
        let vals = KeyRows::new(&vb, DType::F32, dim).unwrap();
        let out = dense_attention(&[1.0; 16], &keys, &vals, 1.0);
        assert!((out[3] - 203.0).abs() < 1e-3, "{out:?}");
    }
}
