//! Per-block key bounds (Quest-style) and upper bounds of `q·k` over a block.
//!
//! For a block of `T` consecutive tokens of one KV head, [`BlockBounds`] stores the element-wise
//! minimum and maximum of the keys. For any key `k` of the block, `q·k = Σ_d q_d k_d ≤
//! Σ_d max(q_d·min_d, q_d·max_d)`.
//!
//! **Rounding.** Pruning compares the bound with *computed* scores, which carry rounding error,
//! so the exact bound alone could fall a few ulps below a computed score and prune a block that
//! holds a tie or a winner. [`upper_bound`] therefore evaluates the sum in f64 (every product of
//! two f32 is exact there) and adds `(m + 1)·2⁻²³·A + dim·2⁻¹²⁶`, where `m = dim/16 + 4` is the
//! number of roundings on any term's path in the canonical f32 order, and `A = Σ_d |q_d|·
//! max(|min_d|, |max_d|)` bounds `Σ_d |q_d k_d|`. The classic bound `|fl(Σ) − Σ| ≤ γ_m Σ|q_d k_d|`
//! (γ_m ≈ m·2⁻²⁴) plus the final rounding to f32 fit inside that slack, with a factor of about two
//! to spare; the absolute term covers underflow. The result is a true upper bound of every
//! computed score of the block, at the price of pruning a hair less.

use crate::rows::{KeyRows, MAX_ROW_BYTES};

/// Element-wise key minimum and maximum per block of `block_tokens` tokens of one KV head.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockBounds {
    block_tokens: usize,
    dim: usize,
    tokens: usize,
    /// `blocks * dim` minima, block-major.
    min: Vec<f32>,
    /// `blocks * dim` maxima, block-major.
    max: Vec<f32>,
}

impl BlockBounds {
    /// Tokens per block (the last block may hold fewer).
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Head dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Tokens covered.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.min.len() / self.dim.max(1)
    }

    /// Token range `start..end` of block `b`.
    pub fn block_range(&self, b: usize) -> (usize, usize) {
        let start = b * self.block_tokens;
        (start, (start + self.block_tokens).min(self.tokens))
    }

    /// Element-wise minimum of block `b`.
    pub fn min(&self, b: usize) -> &[f32] {
        &self.min[b * self.dim..(b + 1) * self.dim]
    }

    /// Element-wise maximum of block `b`.
    pub fn max(&self, b: usize) -> &[f32] {
        &self.max[b * self.dim..(b + 1) * self.dim]
    }

    /// Upper bound of every computed score `q·k` of block `b` (see [`upper_bound`]).
    pub fn upper_bound(&self, q: &[f32], b: usize) -> f32 {
        upper_bound(q, self.min(b), self.max(b))
    }
}

/// Bounds of `keys` in blocks of `block_tokens` tokens (`block_tokens > 0`).
pub fn block_bounds(keys: &KeyRows<'_>, block_tokens: usize) -> BlockBounds {
    assert!(block_tokens > 0, "blocks hold at least one token");
    let dim = keys.dim();
    let blocks = keys.len().div_ceil(block_tokens);
    let mut min = vec![f32::INFINITY; blocks * dim];
    let mut max = vec![f32::NEG_INFINITY; blocks * dim];
    let mut buf = [0u8; MAX_ROW_BYTES];
    for i in 0..keys.len() {
        let b = i / block_tokens;
        let row = keys.copy_row(i, &mut buf);
        let (lo, hi) = (
            &mut min[b * dim..(b + 1) * dim],
            &mut max[b * dim..(b + 1) * dim],
        );
        for d in 0..dim {
            let x = keys.dtype().load(row, d);
            lo[d] = lo[d].min(x);
            hi[d] = hi[d].max(x);
        }
    }
    BlockBounds {
        block_tokens,
        dim,
        tokens: keys.len(),
        min,
        max,
    }
}

/// `Σ_d max(q_d·min_d, q_d·max_d)` plus the rounding slack described in the module
/// documentation: an upper bound of every computed score `q·k` with `min ≤ k ≤ max`.
pub fn upper_bound(q: &[f32], min: &[f32], max: &[f32]) -> f32 {
    assert!(q.len() == min.len() && q.len() == max.len());
    let dim = q.len();
    let mut sum = 0f64;
    let mut abs = 0f64;
    for d in 0..dim {
        let (qd, lo, hi) = (q[d] as f64, min[d] as f64, max[d] as f64);
        sum += (qd * lo).max(qd * hi);
        abs += qd.abs() * lo.abs().max(hi.abs());
    }
    let roundings = (dim / 16 + 4) as f64;
    let slack = (roundings + 1.0) * f64::powi(2.0, -23) * abs + dim as f64 * f64::powi(2.0, -126);
    (sum + slack) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::rng::SplitMix64;
    use crate::rows::QueryGroup;
    use crate::score::ScoreKernel;

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn bounds_every_computed_score() {
        let mut rng = SplitMix64::new(5);
        for dtype in [DType::F16, DType::Bf16, DType::F32] {
            let (n, dim, t) = (203, 64, 16);
            let kb = rng.key_bytes(n, dim, dtype);
            let keys = KeyRows::new(&kb, dtype, dim).unwrap();
            let bounds = block_bounds(&keys, t);
            assert_eq!(bounds.blocks(), 13);
            assert_eq!(bounds.block_range(12), (192, 203));
            for _ in 0..20 {
                let qv = rng.normal_vec(dim);
                let q = QueryGroup::new(&qv, dim).unwrap();
                let mut s = vec![0.0; n];
                ScoreKernel::scalar().score(&q, &keys, &mut s);
                for (i, &si) in s.iter().enumerate() {
                    assert!(si <= bounds.upper_bound(&qv, i / t), "{dtype:?} key {i}");
                }
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn code_bounds_bound_every_folded_score() {
        let mut rng = SplitMix64::new(12);
        for dtype in [DType::I8, DType::I4] {
            let (n, dim, t) = (203, 128, 16);
            let x = rng.normal_vec(n * dim);
            let (codes, scales) = crate::quant::quantize_keys(&x, dim, dtype);
            let keys = KeyRows::new(&codes, dtype, dim).unwrap();
            let bounds = block_bounds(&keys, t);
            let qmax = dtype.qmax().unwrap() as f32;
            for b in 0..bounds.blocks() {
                // The bounds are codes: integers inside the code range.
                for &v in bounds.min(b).iter().chain(bounds.max(b)) {
                    assert!(v == v.round() && v.abs() <= qmax, "{dtype:?} {v}");
                }
            }
            for (single, t) in [(false, t), (true, 1)] {
                let bounds = block_bounds(&keys, t);
                for _ in 0..20 {
                    let qv = rng.normal_vec(dim);
                    let folded = crate::quant::fold_key_scales(&qv, dim, &scales);
                    let q = QueryGroup::new(&folded, dim).unwrap();
                    let mut s = vec![0.0; n];
                    ScoreKernel::scalar().score(&q, &keys, &mut s);
                    for (i, &si) in s.iter().enumerate() {
                        let b = bounds.upper_bound(&folded, i / t);
                        assert!(si <= b, "{dtype:?} key {i}: {si} > {b}");
                        if single {
                            // One key per block: the bound is the score plus only the slack,
                            // a small multiple of 2^-23 of the sum of |q'_d c_d|.
                            let abs: f32 = folded
                                .iter()
                                .zip(keys.row_f32(i))
                                .map(|(q, c)| (q * c).abs())
                                .sum();
                            assert!(b - si <= 1e-5 * abs, "{si} {b} {abs}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn a_single_key_block_bound_is_tight_but_not_below() {
        // One key per block: the bound is the score itself plus slack, never below it.
        let mut rng = SplitMix64::new(9);
        let dim = 256;
        let kb = rng.key_bytes(50, dim, DType::F32);
        let keys = KeyRows::new(&kb, DType::F32, dim).unwrap();
        let bounds = block_bounds(&keys, 1);
        for _ in 0..50 {
            let qv: Vec<f32> = rng.normal_vec(dim).iter().map(|x| x * 1e3).collect();
            let q = QueryGroup::new(&qv, dim).unwrap();
            let mut s = vec![0.0; 50];
            ScoreKernel::scalar().score(&q, &keys, &mut s);
            for (i, &si) in s.iter().enumerate() {
                let b = bounds.upper_bound(&qv, i);
                let abs: f32 = qv
                    .iter()
                    .zip(keys.row_f32(i))
                    .map(|(q, k)| (q * k).abs())
                    .sum();
                assert!(si <= b && b - si <= 1e-5 * abs, "{si} {b} {abs}");
            }
        }
    }
}
