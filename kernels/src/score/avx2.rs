//! AVX2 + F16C + FMA scoring: two 8-lane registers per (key, query) pair (lanes 0..8 and 8..16)
//! hold the canonical lane accumulators.
//!
//! Keys are scored in blocks of two half-blocks of `SK` rows for the tile's `G` queries, at most
//! four pairs per half-block (`G * SK <= 4`: 4 rows at G = 1, 1 row at G = 4), so that one
//! half-block's accumulators fit in the 16 vector registers. When a half-block's rows are done,
//! each pair's two registers are added lane by lane (the canonical `j + j+8` step); the block's
//! eight 8-lane sums are then reduced together into one register of eight scores by shuffles
//! that pair lanes `j + j+4`, `j + j+2`, `j + j+1` across registers (the canonical tree,
//! transposed): about 4 instructions per score instead of 8 for a horizontal reduction of each
//! pair. Leftover rows (`N % (2 * SK)`) are reduced one pair at a time.

use crate::dtype::DType;
use crate::rows::{KeyRows, QueryGroup, LANES};
use crate::widen::{load8, span, BF16, F16, F32, I4, I8};
use std::arch::x86_64::*;

/// Scores a tile of at most 4 queries into `out[i * stride + first + g]`.
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA.
pub(super) unsafe fn score_tile(
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    out: &mut [f32],
    stride: usize,
    first: usize,
) {
    let g = queries.count();
    assert!(g <= 4 && first + g <= stride && out.len() >= keys.len() * stride);
    assert_eq!(queries.dim(), keys.dim());
    let args = TileArgs {
        q: queries.data().as_ptr(),
        dim: keys.dim(),
        keys: keys.as_ptr(),
        n: keys.len(),
        out: out[first..].as_mut_ptr(),
        stride,
    };
    // Rows per half-block `SK`: at most four (row, query) pairs accumulate at a time.
    macro_rules! dispatch {
        ($dt:expr) => {
            match g {
                1 => blocked::<1, 4, { $dt }>(&args),
                2 => blocked::<2, 2, { $dt }>(&args),
                3 => blocked::<3, 1, { $dt }>(&args),
                _ => blocked::<4, 1, { $dt }>(&args),
            }
        };
    }
    // SAFETY: the caller guarantees the CPU features; the asserts above and the KeyRows /
    // QueryGroup invariants (whole rows of `dim` elements, `g * dim` query floats, `dim` a
    // multiple of 16) keep every pointer `tile` forms inside its operand (the
    // key view's readable bytes, the query slice, `out`).
    unsafe {
        match keys.dtype() {
            DType::F16 => dispatch!(F16),
            DType::Bf16 => dispatch!(BF16),
            DType::F32 => dispatch!(F32),
            DType::I8 => dispatch!(I8),
            DType::I4 => dispatch!(I4),
        }
    }
}

/// Raw view of one tile's operands: `g * dim` query floats at `q`, `n` rows of `dim` elements at
/// `keys`, and `out[i * stride + g]` valid for `i < n`, `g < G`.
struct TileArgs {
    q: *const f32,
    dim: usize,
    keys: *const u8,
    n: usize,
    out: *mut f32,
    stride: usize,
}

/// Scores blocks of `2 * SK` rows for `G` queries with one transposed reduction per block
/// (`G * SK <= 4`), then the leftover rows one by one.
///
/// # Safety
/// AVX2, F16C, FMA present; `a` describes valid memory as documented on [`TileArgs`].
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn blocked<const G: usize, const SK: usize, const DT: u8>(a: &TileArgs) {
    debug_assert!(G * SK <= 4);
    let kb = 2 * SK;
    let row_bytes = span::<DT>(a.dim);
    let full = a.n - a.n % kb;
    // Natural order of the transposed reduction's output lanes.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut scores = [0f32; 8];
    // SAFETY: rows `i..i + kb` with `i + kb <= n` span whole rows at `keys + i * row_bytes`;
    // `pair_sums` stays inside them and the `G * dim` query block; outputs
    // `(i + r) * stride + g` for `r < kb` are in range by the TileArgs contract. The leftover
    // rows `full..n` are handed to `tile` with the same contract shifted by `full`.
    unsafe {
        let mut i = 0;
        while i < full {
            let base = a.keys.add(i * row_bytes);
            let first = pair_sums::<G, SK, DT>(a.q, a.dim, base, row_bytes);
            let second = pair_sums::<G, SK, DT>(a.q, a.dim, base.add(SK * row_bytes), row_bytes);
            let sums = _mm256_permutevar8x32_ps(reduce_transposed(&first, &second), order);
            if G * SK == 4 && a.stride == G {
                _mm256_storeu_ps(a.out.add(i * G), sums);
            } else {
                _mm256_storeu_ps(scores.as_mut_ptr(), sums);
                for half in 0..2 {
                    for r in 0..SK {
                        for g in 0..G {
                            *a.out.add((i + half * SK + r) * a.stride + g) =
                                scores[half * 4 + r * G + g];
                        }
                    }
                }
            }
            i += kb;
        }
        if full < a.n {
            let rest = TileArgs {
                q: a.q,
                dim: a.dim,
                keys: a.keys.add(full * row_bytes),
                n: a.n - full,
                out: a.out.add(full * a.stride),
                stride: a.stride,
            };
            tile::<G, DT>(&rest);
        }
    }
}

/// How far beyond the next block a line is prefetched (see the AVX-512 kernel). Here one
/// prefetch goes with every chunk, two per line for 16-bit keys: testing for the line start in
/// the loop cost ~10 % at G = 4 (keys in L2), the duplicate requests nothing measurable.
const PREFETCH_BYTES: usize = 1024;

/// The `G * SK` pairs of `SK` consecutive rows at `rows` and the `G` queries, each pair's 16
/// canonical lane accumulators folded to 8 lanes (`j + j+8`), row-major: entry `r * G + g` is
/// row `r` against query `g`; entries past `G * SK` are zero.
///
/// # Safety
/// AVX2, F16C, FMA present; `SK` rows of `dim` elements readable at `rows`, `G * dim` floats at
/// `q`.
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn pair_sums<const G: usize, const SK: usize, const DT: u8>(
    q: *const f32,
    dim: usize,
    rows: *const u8,
    row_bytes: usize,
) -> [__m256; 4] {
    let chunk_bytes = span::<DT>(LANES);
    // A row's line is prefetched where the same row of the next block (two half-blocks on),
    // `PREFETCH_BYTES` further, will need it.
    let ahead = 2 * SK * row_bytes + PREFETCH_BYTES;
    // One FMA step over chunk `c` for every row and query.
    let step = |lo: &mut [[__m256; G]; SK], hi: &mut [[__m256; G]; SK], c: usize| {
        // SAFETY: chunk `c < dim/16` of row `r < SK` (two loads of 8 elements) and of query
        // `g < G` lie inside the operands the caller guarantees. The prefetch address may lie
        // past the keys (wrapping arithmetic, no dereference); prefetches never fault.
        unsafe {
            for r in 0..SK {
                let row = rows.add(r * row_bytes + c * chunk_bytes);
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(ahead) as *const i8);
                let k_lo = load8::<DT>(row);
                let k_hi = load8::<DT>(row.add(span::<DT>(8)));
                for g in 0..G {
                    let qp = q.add(g * dim + c * LANES);
                    lo[r][g] = _mm256_fmadd_ps(_mm256_loadu_ps(qp), k_lo, lo[r][g]);
                    hi[r][g] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(8)), k_hi, hi[r][g]);
                }
            }
        }
    };
    let mut lo = [[_mm256_setzero_ps(); G]; SK];
    let mut hi = [[_mm256_setzero_ps(); G]; SK];
    for c in 0..dim / LANES {
        step(&mut lo, &mut hi, c);
    }
    let mut sums = [_mm256_setzero_ps(); 4];
    for r in 0..SK {
        for g in 0..G {
            sums[r * G + g] = _mm256_add_ps(lo[r][g], hi[r][g]);
        }
    }
    sums
}

/// Reduces eight 8-lane pair sums (`first` then `second`), each in the canonical tree after its
/// `j + j+8` step: lanes `j + j+4`, then `j + j+2`, then `j + j+1`, paired across registers.
/// Output lane `L` holds pair `[0, 2, 4, 6, 1, 3, 5, 7][L]`.
///
/// # Safety
/// AVX present.
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
#[allow(unused_unsafe)] // register-only intrinsics are safe here from Rust 1.87 on
unsafe fn reduce_transposed(first: &[__m256; 4], second: &[__m256; 4]) -> __m256 {
    // SAFETY: register-only intrinsics; the features are enabled on this function.
    unsafe {
        let s = [
            first[0], first[1], first[2], first[3], second[0], second[1], second[2], second[3],
        ];
        // j + j+4: the low half of x meets its high half, and so does y's; the result holds x's
        // four sums in the low half and y's in the high half.
        let mut l2 = [_mm256_setzero_ps(); 4];
        for (p, v) in l2.iter_mut().enumerate() {
            let (x, y) = (s[2 * p], s[2 * p + 1]);
            *v = _mm256_add_ps(
                _mm256_blend_ps::<0b1111_0000>(x, y),
                _mm256_permute2f128_ps::<0x21>(x, y),
            );
        }
        // j + j+2 inside each half: 64-bit pairs of x and y interleave.
        let mut l3 = [_mm256_setzero_ps(); 2];
        for (p, v) in l3.iter_mut().enumerate() {
            let (x, y) = (_mm256_castps_pd(l2[2 * p]), _mm256_castps_pd(l2[2 * p + 1]));
            *v = _mm256_add_ps(
                _mm256_castpd_ps(_mm256_unpacklo_pd(x, y)),
                _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)),
            );
        }
        // j + j+1.
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b10_00_10_00>(l3[0], l3[1]),
            _mm256_shuffle_ps::<0b11_01_11_01>(l3[0], l3[1]),
        )
    }
}

/// Scores rows one at a time, each pair reduced on its own: the rows left over by `blocked`.
///
/// # Safety
/// AVX2, F16C, FMA present; `a` describes valid memory as documented on [`TileArgs`].
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn tile<const G: usize, const DT: u8>(a: &TileArgs) {
    let row_bytes = span::<DT>(a.dim);
    let chunks = a.dim / LANES;
    // SAFETY: row `i < n` spans `row_bytes` bytes at `keys + i * row_bytes`; chunk `c < dim/16`
    // covers 16 elements inside that row (two loads of 8); query `g < G` chunk `c` reads 16
    // floats inside the `G * dim` query block; the output index is in range by the TileArgs
    // contract.
    unsafe {
        for i in 0..a.n {
            let row = a.keys.add(i * row_bytes);
            let mut lo = [_mm256_setzero_ps(); G];
            let mut hi = [_mm256_setzero_ps(); G];
            for c in 0..chunks {
                let k_lo = load8::<DT>(row.add(span::<DT>(c * LANES)));
                let k_hi = load8::<DT>(row.add(span::<DT>(c * LANES + 8)));
                for g in 0..G {
                    let q = a.q.add(g * a.dim + c * LANES);
                    lo[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q), k_lo, lo[g]);
                    hi[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(8)), k_hi, hi[g]);
                }
            }
            for g in 0..G {
                *a.out.add(i * a.stride + g) = reduce(lo[g], hi[g]);
            }
        }
    }
}

/// Canonical lane reduction of lanes `lo` (0..8) and `hi` (8..16).
///
/// # Safety
/// AVX present.
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
#[allow(unused_unsafe)] // register-only intrinsics are safe here from Rust 1.87 on
unsafe fn reduce(lo: __m256, hi: __m256) -> f32 {
    // SAFETY: register-only intrinsics; the features are enabled on this function.
    unsafe {
        let s = _mm256_add_ps(lo, hi);
        let t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
        _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps::<1>(u, u)))
    }
}
