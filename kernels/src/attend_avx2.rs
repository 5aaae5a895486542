//! AVX2 (+ F16C + FMA) parts of the fused attention kernel ([`crate::attend`]), the counterpart of
//! the AVX-512 ones in `attend_simd` for CPUs without AVX-512: the weighted value sum of one tile
//! with the value rows widened in 8-lane registers straight from the view (no private copy), the
//! chunk's per-query score maxima and the sums of its weights in vector registers. The tile's
//! value rows are prefetched while its keys are scored (`attend_simd::prefetch_rows`, plain SSE).
//!
//! The weighted sum keeps, for a tile of up to four queries and a block of `NK` 8-lane column
//! chunks, the `G × NK` accumulators in registers over a group of [`ROW_GROUP`] rows, then stores
//! them back to the running output; each value row is loaded (and widened, f16 by
//! `_mm256_cvtph_ps`, bf16 by a 16-bit shift, int8/int4 codes as in `widen`) once per column chunk and multiplied into every
//! query's accumulator. With 16 ymm registers the tiles are chosen so that the accumulators, the
//! `G` broadcast weights and one value register fit (`G × NK + G + 1 <= 16`): 1 × 8, 2 × 4, 3 × 2
//! and 4 × 2 chunks. The arithmetic is the reference's: for every output element
//! `o = fma(w, v, o)` (one rounding), rows in order, so the result is bit-identical to
//! [`crate::attend`]'s portable code.

use crate::attend_simd::{SumArgs, ROW_GROUP};
use crate::dtype::DType;
use crate::rows::KeyRows;
use std::arch::x86_64::*;

use crate::widen::{load8, span, BF16, F16, F32, I4, I8};

/// f32 lanes of a ymm register.
const W: usize = 8;

/// The weighted sum of one tile (see the module documentation): `out[j * dim + d] +=
/// w[i * g + j] · v_i[d]` for every row `i` in order.
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA.
#[target_feature(enable = "avx2,f16c,fma")]
pub(crate) unsafe fn weighted_sum(out: &mut [f32], vals: &KeyRows<'_>, w: &[f32], g: usize) {
    let args = SumArgs::new(out, vals, w, g);
    macro_rules! tiles {
        ($dt:expr) => {
            args.query_tiles(|a, gt| {
                // SAFETY: the features are the caller's contract; `a` addresses the tile's
                // weights and outputs inside `w` and `out` and the view's readable value rows.
                unsafe {
                    match gt {
                        1 => columns::<1, 8, { $dt }>(a),
                        2 => columns::<2, 4, { $dt }>(a),
                        3 => columns::<3, 2, { $dt }>(a),
                        _ => columns::<4, 2, { $dt }>(a),
                    }
                }
            })
        };
    }
    match vals.dtype() {
        DType::F16 => tiles!(F16),
        DType::Bf16 => tiles!(BF16),
        DType::F32 => tiles!(F32),
        DType::I8 => tiles!(I8),
        DType::I4 => tiles!(I4),
    }
}

/// Every 8-lane column chunk of a query tile of `G` queries, in blocks of `NK` chunks (the
/// leftover chunks in pairs, then one at a time), row group by row group.
///
/// # Safety
/// AVX2, F16C, FMA present; `a` describes readable values, `G` queries' weights at stride
/// `a.stride` and `G` output rows of `a.dim` floats.
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn columns<const G: usize, const NK: usize, const DT: u8>(a: &SumArgs) {
    let chunks = a.dim / W;
    let mut r0 = 0;
    while r0 < a.rows {
        let r1 = (r0 + ROW_GROUP).min(a.rows);
        // SAFETY: rows `r0..r1` lie inside the tile; chunks `c0..c0 + NK <= chunks` inside each
        // row and each output row (the callee's contract).
        unsafe {
            let mut c0 = 0;
            while c0 + NK <= chunks {
                group::<G, NK, DT>(a, r0, r1, c0);
                c0 += NK;
            }
            while c0 + 2 <= chunks {
                group::<G, 2, DT>(a, r0, r1, c0);
                c0 += 2;
            }
            while c0 < chunks {
                group::<G, 1, DT>(a, r0, r1, c0);
                c0 += 1;
            }
        }
        r0 = r1;
    }
}

/// Rows `r0..r1` of the tile into column chunks `c0..c0 + NK` of the `G` output rows.
///
/// # Safety
/// AVX2, F16C, FMA present; `r1 <= a.rows`, `c0 + NK <= a.dim / 8`, and `a` as on [`columns`].
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn group<const G: usize, const NK: usize, const DT: u8>(
    a: &SumArgs,
    r0: usize,
    r1: usize,
    c0: usize,
) {
    let row_bytes = span::<DT>(a.dim);
    let chunk_bytes = span::<DT>(W);
    // SAFETY: output rows `j < G` hold `dim` floats at `out + j * dim`, of which chunks
    // `c0..c0 + NK` are read and written; weights `w[i * stride + j]` exist for `i < rows`,
    // `j < G`; value row `i < rows` spans `row_bytes` readable bytes, chunk `c < dim / 8` inside
    // it. Loads and stores are unaligned.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); NK]; G];
        for (j, accj) in acc.iter_mut().enumerate() {
            for (k, v) in accj.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(a.out.add(j * a.dim + (c0 + k) * W));
            }
        }
        for i in r0..r1 {
            let row = a.vals.add(i * row_bytes);
            let mut wv = [_mm256_setzero_ps(); G];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = _mm256_broadcast_ss(&*a.w.add(i * a.stride + j));
            }
            #[allow(clippy::needless_range_loop)] // `k` indexes the rows of `acc` and the columns
            for k in 0..NK {
                let p = row.add((c0 + k) * chunk_bytes);
                let v = load8::<DT>(p);
                for (accj, wj) in acc.iter_mut().zip(&wv) {
                    accj[k] = _mm256_fmadd_ps(*wj, v, accj[k]);
                }
            }
        }
        for (j, accj) in acc.iter().enumerate() {
            for (k, v) in accj.iter().enumerate() {
                _mm256_storeu_ps(a.out.add(j * a.dim + (c0 + k) * W), *v);
            }
        }
    }
}

/// The largest scaled score `scale · s` of each of the `g` queries over the chunk's key-major
/// scores (`scores[i * g + j]`), into `cmax[..g]` (which must hold −∞): the same values as the
/// portable row-by-row `if x > m { m = x }`; where a maximum is a zero present with both signs,
/// which sign is kept may differ, which no later operation distinguishes (`x − (+0) = x − (−0)`
/// and `exp_neg(±0) = 1`).
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA.
#[target_feature(enable = "avx2,f16c,fma")]
pub(crate) unsafe fn chunk_max(scores: &[f32], g: usize, scale: f32, cmax: &mut [f32]) {
    assert!(g > 0 && cmax.len() >= g && scores.len().is_multiple_of(g));
    if !W.is_multiple_of(g) {
        // Queries per vector would not line up with the lanes: one query at a time, its running
        // maximum in a register.
        for (j, m) in cmax[..g].iter_mut().enumerate() {
            for row in scores.chunks_exact(g) {
                let x = scale * row[j];
                if x > *m {
                    *m = x;
                }
            }
        }
        return;
    }
    // Lane `l` of every vector holds query `l % g` (8 is a multiple of g), and so does element
    // `i` of the tail (`i % g`, the vectors starting at multiples of 8).
    let n = scores.len();
    let full = n - n % W;
    let p = scores.as_ptr();
    // SAFETY: register operations and loads of `scores[i..i + 8]` with `i + 8 <= full <= n`.
    let lanes = unsafe {
        let sv = _mm256_set1_ps(scale);
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < full {
            // `max(x, m)` is `x > m ? x : m`: the portable compare.
            m = _mm256_max_ps(_mm256_mul_ps(sv, _mm256_loadu_ps(p.add(i))), m);
            i += W;
        }
        let mut lanes = [0f32; W];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        lanes
    };
    for (l, &x) in lanes.iter().enumerate() {
        if x > cmax[l % g] {
            cmax[l % g] = x;
        }
    }
    for (i, &s) in scores.iter().enumerate().skip(full) {
        let x = scale * s;
        if x > cmax[i % g] {
            cmax[i % g] = x;
        }
    }
}

/// `sum[j] += w[i * g + j]` for every row `i` in order (the `g` sums as lanes of one register
/// when `g <= 8`, each lane adding in row order as the portable code does).
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA.
#[target_feature(enable = "avx2,f16c,fma")]
pub(crate) unsafe fn add_sums(sum: &mut [f32], w: &[f32], g: usize) {
    assert!(g > 0 && sum.len() == g && w.len().is_multiple_of(g));
    if g > W {
        for (j, s) in sum.iter_mut().enumerate() {
            for row in w.chunks_exact(g) {
                *s += row[j];
            }
        }
        return;
    }
    // SAFETY: masked loads and stores of the first `g` floats at `sum` and at `w + i * g` for
    // rows `i < w.len() / g` (inside `w`); masked-off lanes are not accessed and do not fault.
    unsafe {
        let k = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(g as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let mut s = _mm256_maskload_ps(sum.as_ptr(), k);
        let mut p = w.as_ptr();
        for _ in 0..w.len() / g {
            s = _mm256_add_ps(s, _mm256_maskload_ps(p, k));
            p = p.add(g);
        }
        _mm256_maskstore_ps(sum.as_mut_ptr(), k, s);
    }
}
