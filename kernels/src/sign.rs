//! Sign-bit key sketches: each key channel kept as its sign, with one scale per channel (the mean
//! `|k|` over the rows encoded together), so a key reads as `±scale[c]` per channel, as
//! LongSight's in-memory filter does. A row of `dim` channels is `dim / 8` bytes: bit `c % 8` of
//! byte `c / 8` is set when `k[c] >= 0`.
//!
//! **The score** of a query `q` (already folded with the scales, `q'[c] = q[c] · scale[c]`, as
//! [`crate::quant::fold_key_scales`] does) against a row is defined by a table per byte position
//! `b`: `T_b[0] = −q'[8b] − … − q'[8b + 7]` (f32, in channel order), `T_b[m] = T_b[m & (m − 1)] +
//! 2·q'[8b + i]` with `i` the lowest set bit of `m`; the score is `T_0[byte_0] + T_1[byte_1] + …`
//! in byte order. Plain scalar f32 arithmetic without fused operations, so every caller on every
//! machine computes the same bits; one table lookup and one add per byte instead of eight.

/// Encodes rows of `dim` keys (`x.len()` a multiple of `dim`, `dim` a multiple of 8): the sign
/// bits (`dim / 8` bytes a row) and the `dim` scales (mean `|x|` per channel, f32). Panics on a
/// shape that is not whole rows.
pub fn encode(x: &[f32], dim: usize) -> (Vec<u8>, Vec<f32>) {
    assert!(
        dim > 0 && dim.is_multiple_of(8) && x.len().is_multiple_of(dim),
        "sign sketch of {} elements in rows of {dim}",
        x.len()
    );
    let rows = x.len() / dim;
    let mut bits = vec![0u8; rows * dim / 8];
    let mut sum = vec![0f64; dim];
    for (r, row) in x.chunks_exact(dim).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            if v >= 0.0 {
                bits[r * dim / 8 + c / 8] |= 1 << (c % 8);
            }
            sum[c] += f64::from(v.abs());
        }
    }
    let scales = sum
        .iter()
        .map(|&s| (s / rows.max(1) as f64) as f32)
        .collect();
    (bits, scales)
}

/// The byte tables of `g` folded queries (`[g][dim]`): `[g][dim / 8][256]` f32 (module docs).
fn tables(folded: &[f32], g: usize, dim: usize) -> Vec<f32> {
    let bytes = dim / 8;
    let mut t = vec![0f32; g * bytes * 256];
    for j in 0..g {
        for b in 0..bytes {
            let q = &folded[j * dim + 8 * b..j * dim + 8 * b + 8];
            let tb = &mut t[(j * bytes + b) * 256..(j * bytes + b + 1) * 256];
            tb[0] = q.iter().fold(0f32, |a, &x| a - x);
            for m in 1..256usize {
                let i = m.trailing_zeros() as usize;
                tb[m] = tb[m & (m - 1)] + 2.0 * q[i];
            }
        }
    }
    t
}

/// Scores `g` folded queries (`[g][dim]` f32) against every row of `bits` (`dim / 8` bytes a
/// row) into `out`, key-major (`out[i * g + j]`), as the other score kernels write them.
pub fn score(folded: &[f32], g: usize, dim: usize, bits: &[u8], out: &mut Vec<f32>) {
    assert!(
        dim.is_multiple_of(8) && folded.len() == g * dim,
        "queries of [{g}][{dim}]"
    );
    let bytes = dim / 8;
    assert!(
        bits.len().is_multiple_of(bytes.max(1)),
        "whole rows of bits"
    );
    let rows = bits.len() / bytes.max(1);
    let t = tables(folded, g, dim);
    out.clear();
    out.resize(rows * g, 0.0);
    for (i, row) in bits.chunks_exact(bytes).enumerate() {
        for j in 0..g {
            let tj = &t[j * bytes * 256..(j + 1) * bytes * 256];
            let mut s = 0f32;
            for (b, &byte) in row.iter().enumerate() {
                s += tj[b * 256 + usize::from(byte)];
            }
            out[i * g + j] = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn scores_are_the_signed_sums_of_the_folded_queries() {
        let mut rng = SplitMix64::new(3);
        for dim in [8usize, 64, 256] {
            let rows = 37;
            let x = rng.normal_vec(rows * dim);
            let (bits, scales) = encode(&x, dim);
            assert_eq!((bits.len(), scales.len()), (rows * dim / 8, dim));
            for (c, s) in scales.iter().enumerate() {
                let mean = (0..rows).map(|r| x[r * dim + c].abs()).sum::<f32>() / rows as f32;
                assert!((s - mean).abs() <= 1e-5 * mean.max(1.0));
            }
            let g = 3;
            let q = rng.normal_vec(g * dim);
            let folded = crate::quant::fold_key_scales(&q, dim, &scales);
            let mut out = Vec::new();
            score(&folded, g, dim, &bits, &mut out);
            for i in 0..rows {
                for j in 0..g {
                    // The sketch's key: ±scale per channel, by the sign of x.
                    let want: f64 = (0..dim)
                        .map(|c| {
                            let v = f64::from(folded[j * dim + c]);
                            if x[i * dim + c] >= 0.0 {
                                v
                            } else {
                                -v
                            }
                        })
                        .sum();
                    let got = f64::from(out[i * g + j]);
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{got} {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_sketch_ranks_like_the_keys() {
        // Clustered keys: the sketch's best rows are mostly the exact best.
        let mut rng = SplitMix64::new(9);
        let (dim, rows) = (64usize, 2048usize);
        let x = rng.normal_vec(rows * dim);
        let (bits, scales) = encode(&x, dim);
        let q: Vec<f32> = x[5 * dim..6 * dim].to_vec(); // a query equal to row 5
        let folded = crate::quant::fold_key_scales(&q, dim, &scales);
        let mut s = Vec::new();
        score(&folded, 1, dim, &bits, &mut s);
        let best = (0..rows).max_by(|&a, &b| s[a].total_cmp(&s[b])).unwrap();
        assert_eq!(best, 5, "the row itself scores best on its own signs");
    }
}
