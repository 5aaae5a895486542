//! AVX-512F scoring: one 16-lane register per query holds the canonical lane accumulators.

use crate::dtype::DType;
use crate::rows::{KeyRows, QueryGroup, LANES};
use std::arch::x86_64::*;

const F16: u8 = DType::F16 as u8;
const BF16: u8 = DType::Bf16 as u8;
const F32: u8 = DType::F32 as u8;

/// Scores a tile of at most 8 queries into `out[i * stride + first + g]`.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, F16C and FMA.
pub(super) unsafe fn score_tile(
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    out: &mut [f32],
    stride: usize,
    first: usize,
) {
    let g = queries.count();
    assert!(g <= 8 && first + g <= stride && out.len() >= keys.len() * stride);
    assert_eq!(queries.dim(), keys.dim());
    let args = TileArgs {
        q: queries.data().as_ptr(),
        dim: keys.dim(),
        keys: keys.bytes().as_ptr(),
        n: keys.len(),
        out: out[first..].as_mut_ptr(),
        stride,
    };
    // Keys per block: G * KB accumulators fill (at most) the 16 lanes of one transposed reduction.
    macro_rules! dispatch {
        ($dt:expr) => {
            match g {
                1 => blocked::<1, 16, { $dt }>(&args),
                2 => blocked::<2, 8, { $dt }>(&args),
                3 => blocked::<3, 4, { $dt }>(&args),
                4 => blocked::<4, 4, { $dt }>(&args),
                5 => blocked::<5, 2, { $dt }>(&args),
                6 => blocked::<6, 2, { $dt }>(&args),
                7 => blocked::<7, 2, { $dt }>(&args),
                _ => blocked::<8, 2, { $dt }>(&args),
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

/// Sixteen f32 lanes of key row chunk `c` at `row`.
///
/// # Safety
/// AVX-512F and F16C present; the chunk (16 elements of `DT`) is readable.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
unsafe fn load16<const DT: u8>(row: *const u8, c: usize) -> __m512 {
    // SAFETY: the caller guarantees the 16 elements at chunk `c` of `row` are readable.
    unsafe {
        if DT == F16 {
            _mm512_cvtph_ps(_mm256_loadu_si256(row.add(c * 32) as *const __m256i))
        } else if DT == BF16 {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.add(c * 32) as *const __m256i));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        } else {
            _mm512_loadu_ps(row.add(c * 64) as *const f32)
        }
    }
}

/// Scores blocks of `KB` keys for `G` queries with one transposed reduction per block
/// (`G * KB <= 16`), then the leftover keys one by one.
///
/// # Safety
/// AVX-512F, AVX2, F16C, FMA present; `a` describes valid memory as documented on [`TileArgs`].
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
unsafe fn blocked<const G: usize, const KB: usize, const DT: u8>(a: &TileArgs) {
    debug_assert!(G * KB <= 16);
    let elem = if DT == F32 { 4 } else { 2 };
    let row_bytes = a.dim * elem;
    let chunks = a.dim / LANES;
    let full = a.n - a.n % KB;
    // Natural order of the transposed reduction's output lanes (a 4x4 transpose).
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut scores = [0f32; 16];
    // SAFETY: rows `i..i + KB` with `i + KB <= n` span whole rows at `keys + i * row_bytes`;
    // chunk `c < dim/16` stays inside a row; query `g < G` chunk `c` is inside the `G * dim`
    // query block; outputs `(i + kb) * stride + g` are in range by the TileArgs contract. The
    // leftover rows `full..n` are handed to `tile` with the same contract shifted by `full`.
    unsafe {
        let mut i = 0;
        let block_bytes = KB * row_bytes;
        while i < full {
            let base = a.keys.add(i * row_bytes);
            // Keep more cache misses in flight than the out-of-order window alone would: ask
            // for the lines `PREFETCH_BYTES` ahead. The address may lie past the keys (wrapping
            // arithmetic, no dereference); prefetches never fault.
            let mut off = 0;
            while off < block_bytes {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH_BYTES + off) as *const i8);
                off += 64;
            }
            let mut acc = [_mm512_setzero_ps(); 16];
            for c in 0..chunks {
                let mut q = [_mm512_setzero_ps(); G];
                for (g, qv) in q.iter_mut().enumerate() {
                    *qv = _mm512_loadu_ps(a.q.add(g * a.dim + c * LANES));
                }
                for kb in 0..KB {
                    let kv = load16::<DT>(base.add(kb * row_bytes), c);
                    for g in 0..G {
                        acc[kb * G + g] = _mm512_fmadd_ps(q[g], kv, acc[kb * G + g]);
                    }
                }
            }
            let sums = _mm512_permutexvar_ps(order, reduce_transposed(&acc));
            if G * KB == 16 && a.stride == G {
                _mm512_storeu_ps(a.out.add(i * G), sums);
            } else {
                _mm512_storeu_ps(scores.as_mut_ptr(), sums);
                for kb in 0..KB {
                    for g in 0..G {
                        *a.out.add((i + kb) * a.stride + g) = scores[kb * G + g];
                    }
                }
            }
            i += KB;
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

/// How far ahead of the block being scored lines are prefetched. Measured on a Xeon with cold
/// keys (d = 128, f16): 1-2 KiB ahead lifts one-thread key bandwidth from ~75 % to ~90 % of a
/// plain streaming read; much further ahead (8 KiB+) is worse again.
const PREFETCH_BYTES: usize = 2048;

/// Reduces 16 accumulators at once, each in the canonical tree, by three rounds of
/// shuffle-and-add that pair lanes `j + j+8`, `j + j+4`, `j + j+2`, `j + j+1` across registers.
/// Output lane `L` holds accumulator `[0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15][L]`.
///
/// # Safety
/// AVX-512F present.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
#[allow(unused_unsafe)] // register-only intrinsics are safe here from Rust 1.87 on
unsafe fn reduce_transposed(acc: &[__m512; 16]) -> __m512 {
    // SAFETY: register-only intrinsics; the features are enabled on this function.
    unsafe {
        // j + j+8: quarters 0,1 of x (and of y) meet quarters 2,3.
        let mut l1 = [_mm512_setzero_ps(); 8];
        for (p, v) in l1.iter_mut().enumerate() {
            let (x, y) = (acc[2 * p], acc[2 * p + 1]);
            *v = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
            );
        }
        // j + j+4: quarters 0 and 1 of each item meet.
        let mut l2 = [_mm512_setzero_ps(); 4];
        for (p, v) in l2.iter_mut().enumerate() {
            let (x, y) = (l1[2 * p], l1[2 * p + 1]);
            *v = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
            );
        }
        // j + j+2 inside each quarter.
        let mut l3 = [_mm512_setzero_ps(); 2];
        for (p, v) in l3.iter_mut().enumerate() {
            let (x, y) = (l2[2 * p], l2[2 * p + 1]);
            *v = _mm512_add_ps(
                _mm512_shuffle_ps::<0b01_00_01_00>(x, y),
                _mm512_shuffle_ps::<0b11_10_11_10>(x, y),
            );
        }
        // j + j+1.
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(l3[0], l3[1]),
            _mm512_shuffle_ps::<0b11_01_11_01>(l3[0], l3[1]),
        )
    }
}

/// # Safety
/// AVX-512F, AVX2, F16C, FMA present; `a` describes valid memory as documented on [`TileArgs`].
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
unsafe fn tile<const G: usize, const DT: u8>(a: &TileArgs) {
    let elem = if DT == F32 { 4 } else { 2 };
    let row_bytes = a.dim * elem;
    let chunks = a.dim / LANES;
    // SAFETY: row `i < n` spans `row_bytes` bytes at `keys + i * row_bytes`; chunk `c < dim/16`
    // reads 16 elements inside that row; query `g < G` chunk `c` reads 16 floats inside the
    // `G * dim` query block; the output index is in range by the TileArgs contract. Unaligned
    // loads are used throughout.
    unsafe {
        for i in 0..a.n {
            let row = a.keys.add(i * row_bytes);
            let mut acc = [_mm512_setzero_ps(); G];
            for c in 0..chunks {
                let kv = if DT == F16 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(row.add(c * 32) as *const __m256i))
                } else if DT == BF16 {
                    let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.add(c * 32) as *const _));
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
                } else {
                    _mm512_loadu_ps(row.add(c * 64) as *const f32)
                };
                for (g, acc) in acc.iter_mut().enumerate() {
                    let qv = _mm512_loadu_ps(a.q.add(g * a.dim + c * LANES));
                    *acc = _mm512_fmadd_ps(qv, kv, *acc);
                }
            }
            for (g, acc) in acc.iter().enumerate() {
                *a.out.add(i * a.stride + g) = reduce(*acc);
            }
        }
    }
}

/// Canonical lane reduction: `j + j+8`, `j + j+4`, `j + j+2`, `j + j+1`.
///
/// # Safety
/// AVX-512F present.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
#[allow(unused_unsafe)] // register-only intrinsics are safe here from Rust 1.87 on
unsafe fn reduce(v: __m512) -> f32 {
    // SAFETY: register-only intrinsics; the features are enabled on this function.
    unsafe {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        let s = _mm256_add_ps(lo, hi);
        let t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
        _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps::<1>(u, u)))
    }
}
