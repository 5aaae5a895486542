//! Partial attention: softmax attention over a subset of the keys, kept unnormalized so that
//! partials over disjoint subsets merge exactly (the log-sum-exp rule).
//!
//! For one query and keys `i ∈ S` with scaled scores `s_i = scale · q·k_i`, the partial is
//! `m = max s_i`, `l = Σ exp(s_i − m)`, `o = Σ exp(s_i − m) · v_i`. Two partials over disjoint
//! sets merge into the partial over their union:
//! `m = max(m₁, m₂)`, `l = l₁e^{m₁−m} + l₂e^{m₂−m}`, `o = o₁e^{m₁−m} + o₂e^{m₂−m}`,
//! and the attention output is `o / l`. This is the shape in which a near-data device returns
//! its share of the keys for the host to combine with its own (the NDP `ATTEND` command), and
//! the decoder's dense reference computes the same partials, so both sides share this code.

use crate::rows::KeyRows;

/// Unnormalized attention of one query over a set of keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Partial {
    /// `Σ exp(s_i − max) · v_i`, one value vector wide.
    pub out: Vec<f32>,
    /// The largest scaled score `max s_i` (−∞ over no keys).
    pub max: f32,
    /// `Σ exp(s_i − max)` (0 over no keys).
    pub sum: f32,
}

impl Partial {
    /// The partial over no keys: the identity of [`merge`](Partial::merge).
    pub fn empty(dim: usize) -> Partial {
        Partial {
            out: vec![0.0; dim],
            max: f32::NEG_INFINITY,
            sum: 0.0,
        }
    }

    /// The partial over `values.len()` keys whose *scaled* scores `scores(i)` are given:
    /// `values` row `i` is the value of key `i`.
    pub fn over(values: &KeyRows<'_>, scores: impl Fn(usize) -> f32) -> Partial {
        let dim = values.dim();
        let n = values.len();
        let max = (0..n).map(&scores).fold(f32::NEG_INFINITY, f32::max);
        let mut p = Partial::empty(dim);
        if n == 0 {
            return p;
        }
        let mut row = vec![0f32; dim];
        for i in 0..n {
            let w = (scores(i) - max).exp();
            p.sum += w;
            load_row(values, i, &mut row);
            for (o, x) in p.out.iter_mut().zip(&row) {
                *o += w * x;
            }
        }
        p.max = max;
        p
    }

    /// The partials of the `g` queries of a GQA group over the same keys, from their *unscaled*
    /// scores, key-major (`scores[i * g + j]` is query `j` on key `i`, as
    /// `cxlkv_kernels::ScoreKernel::score` writes them). Each value row is read once for the
    /// whole group.
    pub fn over_group(values: &KeyRows<'_>, scores: &[f32], g: usize, scale: f32) -> Vec<Partial> {
        let (dim, n) = (values.dim(), values.len());
        assert_eq!(scores.len(), n * g, "one score per key and query");
        let mut parts: Vec<Partial> = (0..g).map(|_| Partial::empty(dim)).collect();
        for row in scores.chunks_exact(g) {
            for (p, &s) in parts.iter_mut().zip(row) {
                p.max = p.max.max(scale * s);
            }
        }
        let mut v = vec![0f32; dim];
        for (i, row) in scores.chunks_exact(g).enumerate() {
            load_row(values, i, &mut v);
            for (p, &s) in parts.iter_mut().zip(row) {
                let w = (scale * s - p.max).exp();
                p.sum += w;
                for (o, x) in p.out.iter_mut().zip(&v) {
                    *o += w * x;
                }
            }
        }
        parts
    }

    /// Folds `other` (over keys disjoint from this one's) into `self`.
    pub fn merge(&mut self, other: &Partial) {
        debug_assert_eq!(self.out.len(), other.out.len());
        if other.sum == 0.0 {
            return;
        }
        if self.sum == 0.0 {
            self.clone_from(other);
            return;
        }
        let max = self.max.max(other.max);
        let (a, b) = ((self.max - max).exp(), (other.max - max).exp());
        for (o, x) in self.out.iter_mut().zip(&other.out) {
            *o = *o * a + x * b;
        }
        self.sum = self.sum * a + other.sum * b;
        self.max = max;
    }

    /// The attention output `out / sum` into `dst` (zeros over no keys).
    pub fn finish_into(&self, dst: &mut [f32]) {
        let inv = if self.sum > 0.0 { 1.0 / self.sum } else { 0.0 };
        for (d, o) in dst.iter_mut().zip(&self.out) {
            *d = o * inv;
        }
    }

    /// The attention output `out / sum`.
    pub fn finish(&self) -> Vec<f32> {
        let mut v = vec![0.0; self.out.len()];
        self.finish_into(&mut v);
        v
    }
}

/// Row `i` of `rows` as f32 into `dst` (`dst.len()` elements, at most the row's).
pub fn load_row(rows: &KeyRows<'_>, i: usize, dst: &mut [f32]) {
    let mut buf = [0u8; crate::rows::MAX_ROW_BYTES];
    let bytes = rows.copy_row(i, &mut buf);
    let dt = rows.dtype();
    match dt {
        crate::dtype::DType::F32 => {
            for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        _ => {
            for (j, d) in dst.iter_mut().enumerate() {
                *d = dt.load(bytes, j);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{dense_attention, relative_error};
    use crate::rng::SplitMix64;
    use crate::DType;

    #[test]
    fn merged_partials_are_the_whole() {
        let mut rng = SplitMix64::new(7);
        let (n, dim, scale) = (50, 16, 0.25f32);
        let kb = rng.key_bytes(n, dim, DType::F32);
        let vb = rng.key_bytes(n, dim, DType::F32);
        let keys = KeyRows::new(&kb, DType::F32, dim).unwrap();
        let vals = KeyRows::new(&vb, DType::F32, dim).unwrap();
        let q = rng.normal_vec(dim);
        let score = |i: usize| scale * (0..dim).map(|d| q[d] * keys.get(i, d)).sum::<f32>();
        let whole = Partial::over(&vals, score);
        let reference = dense_attention(&q, &keys, &vals, scale);
        assert!(relative_error(&whole.finish(), &reference) < 1e-5);
        for split in [0, 1, 17, 49, 50] {
            let mut a = Partial::over(&vals.slice(0, split), score);
            let b = Partial::over(&vals.slice(split, n), |i| score(split + i));
            a.merge(&b);
            assert!(
                relative_error(&a.finish(), &whole.finish()) < 1e-5,
                "split {split}"
            );
            assert!((a.max - whole.max).abs() == 0.0);
        }
        // A group of three queries at once is three single partials.
        let qs: Vec<f32> = (0..3).flat_map(|_| rng.normal_vec(dim)).collect();
        let mut raw = vec![0f32; n * 3];
        crate::ScoreKernel::scalar().score(
            &crate::QueryGroup::new(&qs, dim).unwrap(),
            &keys,
            &mut raw,
        );
        let group = Partial::over_group(&vals, &raw, 3, scale);
        for (j, p) in group.iter().enumerate() {
            let single = Partial::over(&vals, |i| scale * raw[i * 3 + j]);
            assert_eq!(p.max, single.max);
            assert!(relative_error(&p.finish(), &single.finish()) < 1e-6);
        }
        let mut e = Partial::empty(dim);
        e.merge(&Partial::empty(dim));
        assert_eq!(e.finish(), vec![0.0; dim]);
    }
}
