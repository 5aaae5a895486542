//! AVX2 + F16C + FMA scoring: two 8-lane registers per query (lanes 0..8 and 8..16) hold the
//! canonical lane accumulators.

use crate::dtype::DType;
use crate::rows::{KeyRows, QueryGroup, LANES};
use std::arch::x86_64::*;

const F16: u8 = DType::F16 as u8;
const BF16: u8 = DType::Bf16 as u8;
const F32: u8 = DType::F32 as u8;

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
        keys: keys.bytes().as_ptr(),
        n: keys.len(),
        out: out[first..].as_mut_ptr(),
        stride,
    };
    macro_rules! dispatch {
        ($dt:expr) => {
            match g {
                1 => tile::<1, { $dt }>(&args),
                2 => tile::<2, { $dt }>(&args),
                3 => tile::<3, { $dt }>(&args),
                _ => tile::<4, { $dt }>(&args),
            }
        };
    }
    // SAFETY: the caller guarantees the CPU features; the asserts above and the KeyRows /
    // QueryGroup invariants (whole rows of `dim` elements, `g * dim` query floats, `dim` a
    // multiple of 16) keep every pointer `tile` forms inside its slice.
    unsafe {
        match keys.dtype() {
            DType::F16 => dispatch!(F16),
            DType::Bf16 => dispatch!(BF16),
            DType::F32 => dispatch!(F32),
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

/// Eight elements starting at byte `p` of a row, as f32.
///
/// # Safety
/// AVX2 and F16C present; 8 elements of type `DT` readable at `p`.
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn load8<const DT: u8>(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 8 readable elements at `p` (16 or 32 bytes); loads are
    // unaligned.
    unsafe {
        if DT == F16 {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        } else if DT == BF16 {
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
        } else {
            _mm256_loadu_ps(p as *const f32)
        }
    }
}

/// # Safety
/// AVX2, F16C, FMA present; `a` describes valid memory as documented on [`TileArgs`].
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn tile<const G: usize, const DT: u8>(a: &TileArgs) {
    let elem = if DT == F32 { 4 } else { 2 };
    let row_bytes = a.dim * elem;
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
                let k_lo = load8::<DT>(row.add(c * LANES * elem));
                let k_hi = load8::<DT>(row.add(c * LANES * elem + 8 * elem));
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
