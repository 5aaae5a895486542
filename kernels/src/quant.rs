//! Symmetric integer quantization of keys and values ([`DType::I8`], [`DType::I4`]), as KIVI
//! does it: keys scaled per channel, values per token.
//!
//! The rule, for a scale `s` over a set of elements (a key column or a value row):
//! `s = max |x| / qmax` (`qmax` 127 for `I8`, 7 for `I4`), `code = round_half_even(x / s)` clamped
//! to `-qmax..=qmax`; a set of zeros gets `s = 0` and codes 0. Dequantized, an element is
//! `code * s` (one f32 multiply), within `s / 2` of the input (plus the rounding of that multiply
//! and of `x / s`, a few ulp).
//!
//! The kernels never dequantize. A score against quantized keys is defined as
//! `score(fold_key_scales(q, scales), codes)`: the query multiplied by the key scales once
//! (one f32 multiply per element), then the canonical dot product with the codes, which widen to
//! f32 exactly ([`crate::score`]). Value scales enter the attention as a per-row factor of the
//! weight ([`crate::attend::attend_block_scaled`]). Every engine (the SIMD kernels, the device,
//! the host fallback) computes exactly these operations, so results stay bit-identical.

use crate::dtype::DType;

/// The largest code of a quantized `dtype`; panics (naming the caller) for a float type.
fn qmax_of(dtype: DType, what: &str) -> f32 {
    match dtype.qmax() {
        Some(q) => q as f32,
        None => panic!("{what}: {} is not a quantized dtype", dtype.name()),
    }
}

/// Rows of `x` (`dim` floats each); panics on a ragged length or zero `dim`.
fn rows_of(x: &[f32], dim: usize, what: &str) -> usize {
    assert!(
        dim > 0 && x.len().is_multiple_of(dim),
        "{what}: {} floats is not a whole number of rows of {dim}",
        x.len()
    );
    x.len() / dim
}

/// The scale that maps `max_abs` to `qmax`; panics on a non-finite input.
fn scale_for(max_abs: f32, qmax: f32, what: &str) -> f32 {
    assert!(max_abs.is_finite(), "{what}: input holds {max_abs}");
    max_abs / qmax
}

/// The code of `x` under scale `s` (0 for a zero scale).
#[inline]
fn code_of(x: f32, s: f32, qmax: f32) -> i8 {
    if s == 0.0 {
        return 0;
    }
    (x / s).round_ties_even().clamp(-qmax, qmax) as i8
}

/// Appends one row of codes to `out` in `dtype`'s layout (`I4`: two per byte, the even element
/// in the low nibble; an odd row length leaves the last high nibble 0).
fn pack_row(codes: &[i8], dtype: DType, out: &mut Vec<u8>) {
    match dtype {
        DType::I4 => out.extend(codes.chunks(2).map(|p| {
            let lo = (p[0] as u8) & 0x0f;
            let hi = p.get(1).map_or(0, |&c| (c as u8) & 0x0f);
            lo | (hi << 4)
        })),
        _ => out.extend(codes.iter().map(|&c| c as u8)),
    }
}

/// Quantizes rows of `dim` keys per channel: `scales[d] = max_i |x[i][d]| / qmax`. Returns the
/// codes (row-major, `dtype.bytes(dim)` bytes a row) and the `dim` scales. Panics if `dtype` is
/// not quantized, `x` is not whole rows, or an input is not finite.
pub fn quantize_keys(x: &[f32], dim: usize, dtype: DType) -> (Vec<u8>, Vec<f32>) {
    let qmax = qmax_of(dtype, "quantize_keys");
    let n = rows_of(x, dim, "quantize_keys");
    let mut max_abs = vec![0f32; dim];
    for row in x.chunks_exact(dim) {
        for (m, &v) in max_abs.iter_mut().zip(row) {
            *m = m.max(v.abs());
        }
    }
    let scales: Vec<f32> = max_abs
        .iter()
        .map(|&m| scale_for(m, qmax, "quantize_keys"))
        .collect();
    let mut out = Vec::with_capacity(n * dtype.bytes(dim));
    let mut codes = vec![0i8; dim];
    for row in x.chunks_exact(dim) {
        for ((c, &v), &s) in codes.iter_mut().zip(row).zip(&scales) {
            *c = code_of(v, s, qmax);
        }
        pack_row(&codes, dtype, &mut out);
    }
    (out, scales)
}

/// Quantizes rows of `dim` values per token: `scales[i] = max_d |x[i][d]| / qmax`. Returns the
/// codes (row-major) and one scale per row. Panics as [`quantize_keys`].
pub fn quantize_values(x: &[f32], dim: usize, dtype: DType) -> (Vec<u8>, Vec<f32>) {
    let qmax = qmax_of(dtype, "quantize_values");
    let n = rows_of(x, dim, "quantize_values");
    let mut out = Vec::with_capacity(n * dtype.bytes(dim));
    let mut scales = Vec::with_capacity(n);
    let mut codes = vec![0i8; dim];
    for row in x.chunks_exact(dim) {
        let m = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = scale_for(m, qmax, "quantize_values");
        for (c, &v) in codes.iter_mut().zip(row) {
            *c = code_of(v, s, qmax);
        }
        pack_row(&codes, dtype, &mut out);
        scales.push(s);
    }
    (out, scales)
}

/// Rows of codes (`dtype.bytes(dim)` bytes each) as f32 codes, row-major.
fn codes_f32(codes: &[u8], dim: usize, dtype: DType, what: &str) -> Vec<f32> {
    qmax_of(dtype, what);
    let rb = dtype.bytes(dim);
    assert!(
        dim > 0 && codes.len().is_multiple_of(rb),
        "{what}: {} bytes is not a whole number of {rb}-byte rows",
        codes.len()
    );
    codes
        .chunks_exact(rb)
        .flat_map(|row| (0..dim).map(move |d| dtype.load(row, d)))
        .collect()
}

/// Keys back from per-channel codes: `x[i][d] = code * scales[d]`. Panics on mismatched shapes.
pub fn dequantize_keys(codes: &[u8], dim: usize, dtype: DType, scales: &[f32]) -> Vec<f32> {
    assert_eq!(scales.len(), dim, "dequantize_keys: one scale per channel");
    let mut x = codes_f32(codes, dim, dtype, "dequantize_keys");
    for row in x.chunks_exact_mut(dim) {
        for (v, &s) in row.iter_mut().zip(scales) {
            *v *= s;
        }
    }
    x
}

/// Values back from per-token codes: `x[i][d] = code * scales[i]`. Panics on mismatched shapes.
pub fn dequantize_values(codes: &[u8], dim: usize, dtype: DType, scales: &[f32]) -> Vec<f32> {
    let mut x = codes_f32(codes, dim, dtype, "dequantize_values");
    assert_eq!(
        scales.len(),
        x.len() / dim,
        "dequantize_values: one scale per row"
    );
    for (row, &s) in x.chunks_exact_mut(dim).zip(scales) {
        for v in row.iter_mut() {
            *v *= s;
        }
    }
    x
}

/// The queries (`dim` floats each) multiplied by the per-channel key scales:
/// `q'[g][d] = q[g][d] * scales[d]`. Scoring `q'` against the codes is the score of `q` against
/// quantized keys (module documentation). Panics on mismatched shapes.
pub fn fold_key_scales(queries: &[f32], dim: usize, scales: &[f32]) -> Vec<f32> {
    rows_of(queries, dim, "fold_key_scales");
    assert_eq!(scales.len(), dim, "fold_key_scales: one scale per channel");
    queries
        .chunks_exact(dim)
        .flat_map(|q| q.iter().zip(scales).map(|(&x, &s)| x * s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use crate::rows::{KeyRows, QueryGroup};
    use crate::score::{dot_canonical, ScoreKernel};

    /// Inputs with an outlier channel, a zero channel and a zero row.
    fn sample(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = SplitMix64::new(seed);
        let mut x = rng.normal_vec(n * dim);
        for (i, row) in x.chunks_exact_mut(dim).enumerate() {
            row[1] *= 40.0;
            row[2] = 0.0;
            if i == 3 {
                row.fill(0.0);
            }
        }
        x
    }

    #[test]
    fn nibble_order_is_pinned() {
        // Two rows of 4: row 0 holds 7 (the column max), row 1 -7, 3, ...
        let x = [7.0, 1.0, 0.0, -2.0, -7.0, 3.0, 0.0, 2.0];
        let (codes, scales) = quantize_keys(&x, 4, DType::I4);
        assert_eq!(scales, [1.0, 3.0 / 7.0, 0.0, 2.0 / 7.0]);
        // Row 0 codes [7, 2, 0, -7]: 1 / (3/7) = 2.33 -> 2. Row 1 codes [-7, 7, 0, 7].
        assert_eq!(codes, [0x27, 0x90, 0x79, 0x70]);
        let (codes, scales) = quantize_values(&x, 4, DType::I8);
        assert_eq!(scales, [7.0 / 127.0, 7.0 / 127.0]);
        assert_eq!(
            codes,
            [127, 18, 0, (-36i8) as u8, (-127i8) as u8, 54, 0, 36]
        );
    }

    #[test]
    fn round_half_even() {
        // Scale 1 (max 7 over qmax 7): 2.5 -> 2, 3.5 -> 4, -0.5 -> 0.
        let (codes, _) = quantize_values(&[2.5, 3.5, -0.5, 7.0], 4, DType::I4);
        assert_eq!(codes, [0x42, 0x70]);
    }

    #[test]
    fn round_trip_within_half_a_step() {
        for dtype in [DType::I8, DType::I4] {
            let (n, dim) = (37, 48);
            let x = sample(n, dim, 11);
            let qmax = dtype.qmax().unwrap() as f32;
            let (kc, ks) = quantize_keys(&x, dim, dtype);
            let (vc, vs) = quantize_values(&x, dim, dtype);
            assert_eq!(
                (kc.len(), vc.len()),
                (n * dtype.bytes(dim), n * dtype.bytes(dim))
            );
            assert_eq!((ks[2], ks.len(), vs[3], vs.len()), (0.0, dim, 0.0, n));
            let kx = dequantize_keys(&kc, dim, dtype, &ks);
            let vx = dequantize_values(&vc, dim, dtype, &vs);
            let rows = KeyRows::new(&kc, dtype, dim).unwrap();
            for i in 0..n {
                for d in 0..dim {
                    let (v, k, w) = (x[i * dim + d], kx[i * dim + d], vx[i * dim + d]);
                    // Half a step, plus a few ulp for `x / s` and `code * s`.
                    let tol = |s: f32| s / 2.0 * (1.0 + 1e-5) + v.abs() * 1e-6;
                    assert!((k - v).abs() <= tol(ks[d]), "{dtype:?} key {i},{d}");
                    assert!((w - v).abs() <= tol(vs[i]), "{dtype:?} value {i},{d}");
                    let c = rows.get(i, d);
                    assert!(c.abs() <= qmax && c == c.round());
                }
            }
            // Every channel's extreme reaches qmax.
            for d in (0..dim).filter(|&d| d != 2) {
                let m = (0..n).map(|i| rows.get(i, d).abs()).fold(0f32, f32::max);
                assert_eq!(m, qmax, "{dtype:?} channel {d}");
            }
        }
    }

    #[test]
    fn four_bit_codes_stay_in_range() {
        let mut rng = SplitMix64::new(2);
        let x: Vec<f32> = rng.normal_vec(64 * 32).iter().map(|v| v * 1e3).collect();
        let (codes, _) = quantize_values(&x, 32, DType::I4);
        for b in codes {
            for c in [
                crate::dtype::i4_code(b, false),
                crate::dtype::i4_code(b, true),
            ] {
                assert!((-7..=7).contains(&c), "{c}");
            }
        }
    }

    #[test]
    fn folded_scores_equal_dequantized_dot_products() {
        let (n, dim, g) = (29, 64, 3);
        let x = sample(n, dim, 5);
        let mut rng = SplitMix64::new(6);
        let q = rng.normal_vec(g * dim);
        for dtype in [DType::I8, DType::I4] {
            let (codes, scales) = quantize_keys(&x, dim, dtype);
            let folded = fold_key_scales(&q, dim, &scales);
            let keys = KeyRows::new(&codes, dtype, dim).unwrap();
            let mut got = vec![0f32; n * g];
            ScoreKernel::scalar().score(&QueryGroup::new(&folded, dim).unwrap(), &keys, &mut got);
            let deq = dequantize_keys(&codes, dim, dtype, &scales);
            for i in 0..n {
                let rb = dtype.bytes(dim);
                for j in 0..g {
                    let qj = &q[j * dim..(j + 1) * dim];
                    let want: f64 = qj
                        .iter()
                        .zip(&deq[i * dim..(i + 1) * dim])
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum();
                    let mag: f64 = qj
                        .iter()
                        .zip(&deq[i * dim..(i + 1) * dim])
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum();
                    // Stated tolerance: (dim + 2) half-ulps of the sum of |q_d k_d|: the f32
                    // products `q * s` and `code * s` round once each, the f32 sum of `dim`
                    // terms at most `dim` times.
                    let s = got[i * g + j];
                    let tol = (dim + 2) as f64 * f64::from(f32::EPSILON) / 2.0 * mag;
                    assert!(
                        (s as f64 - want).abs() <= tol,
                        "{dtype:?} {i} {j}: {s} vs {want}"
                    );
                    let row = &codes[i * rb..(i + 1) * rb];
                    let fj = &folded[j * dim..(j + 1) * dim];
                    assert_eq!(s.to_bits(), dot_canonical(fj, row, dtype).to_bits());
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "f16 is not a quantized dtype")]
    fn float_types_are_refused() {
        quantize_keys(&[1.0; 16], 16, DType::F16);
    }
}
