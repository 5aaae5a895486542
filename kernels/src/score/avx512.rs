//! AVX-512F scoring: one 16-lane register per (key, query) pair holds the pair's canonical lane
//! accumulators.
//!
//! Keys are scored in blocks of `KB` rows for the tile's `G` queries, `G * KB <= 16` pairs (16
//! rows at G = 1, 4 at G = 4). Each row chunk is loaded and converted once and multiplied into
//! every query's accumulator, so conversion is paid once per key whatever `G`. The block's
//! sixteen accumulators are then reduced together into one register of sixteen scores by
//! shuffles that pair lanes `j + j+8`, `j + j+4`, `j + j+2`, `j + j+1` across registers (the
//! canonical tree, transposed): 45 instructions per 16 scores instead of about 8 per score for a
//! horizontal reduction of each pair. Leftover rows (`N % KB`) are reduced one pair at a time.
//!
//! With one query (G = 1) the block's rows are read one after the other rather than in step:
//! sixteen rows read chunk by chunk are sixteen interleaved streams with a stride of a row, which
//! Zen 4's prefetchers follow badly (see [`PREFETCH_BYTES`]).

use crate::dtype::DType;
use crate::rows::{KeyRows, QueryGroup, LANES};
use std::arch::x86_64::*;

use crate::widen::{span, BF16, F16, F32, I4, I8};

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
        keys: keys.as_ptr(),
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

/// Sixteen f32 lanes of key row chunk `c` at `row`.
///
/// # Safety
/// AVX-512F and F16C present; the chunk (16 elements of `DT`) is readable.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
unsafe fn load16<const DT: u8>(row: *const u8, c: usize) -> __m512 {
    // SAFETY: the caller guarantees the 16 elements at chunk `c` of `row` are readable.
    unsafe { crate::widen::load16::<DT>(row.add(span::<DT>(c * LANES))) }
}

/// Scores blocks of `KB` keys for `G` queries with one transposed reduction per block
/// (`G * KB <= 16`), then the leftover keys one by one.
///
/// # Safety
/// AVX-512F, AVX2, F16C, FMA present; `a` describes valid memory as documented on [`TileArgs`].
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
unsafe fn blocked<const G: usize, const KB: usize, const DT: u8>(a: &TileArgs) {
    debug_assert!(G * KB <= 16);
    let row_bytes = span::<DT>(a.dim);
    let full = a.n - a.n % KB;
    // Natural order of the transposed reduction's output lanes (a 4x4 transpose).
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut scores = [0f32; 16];
    // SAFETY: rows `i..i + KB` with `i + KB <= n` are whole rows at `keys + i * row_bytes` and
    // `q` holds the `G * dim` query floats, as `accumulate` requires; outputs
    // `(i + kb) * stride + g` are in range by the TileArgs contract. The leftover rows
    // `full..n` are handed to `tile` with the same contract shifted by `full`.
    unsafe {
        let mut i = 0;
        while i < full {
            let base = a.keys.add(i * row_bytes);
            let acc = accumulate::<G, KB, DT>(a.q, a.dim, base, row_bytes);
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

/// The `G * KB` canonical lane accumulators of `KB` consecutive rows at `rows` (key-major:
/// accumulator `kb * G + g` is row `kb` against query `g`); entries past `G * KB` stay zero.
///
/// # Safety
/// AVX-512F, AVX2, F16C, FMA present; `KB` rows of `dim` elements readable at `rows`, `G * dim`
/// floats at `q`.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
unsafe fn accumulate<const G: usize, const KB: usize, const DT: u8>(
    q: *const f32,
    dim: usize,
    rows: *const u8,
    row_bytes: usize,
) -> [__m512; 16] {
    let chunk_bytes = span::<DT>(LANES);
    // The block's rows are read in step, chunk by chunk: a row's line is prefetched where the
    // same row of the next block, `PREFETCH_BYTES` further on, will need it.
    let ahead = KB * row_bytes + PREFETCH_BYTES;
    // One FMA step over chunk `c` for every row and query.
    let step = |acc: &mut [__m512; 16], c: usize| {
        // SAFETY: chunk `c < dim/16` of row `kb < KB` and of query `g < G` lie inside the
        // operands the caller guarantees. The prefetch address may lie past the keys (wrapping
        // arithmetic, no dereference); prefetches never fault.
        unsafe {
            let mut qv = [_mm512_setzero_ps(); G];
            for (g, v) in qv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(q.add(g * dim + c * LANES));
            }
            for kb in 0..KB {
                let row = rows.add(kb * row_bytes);
                if (c * chunk_bytes).is_multiple_of(64) {
                    let line = row.wrapping_add(c * chunk_bytes + ahead);
                    _mm_prefetch::<_MM_HINT_T0>(line as *const i8);
                }
                let kv = load16::<DT>(row, c);
                for (g, qv) in qv.iter().enumerate() {
                    acc[kb * G + g] = _mm512_fmadd_ps(*qv, kv, acc[kb * G + g]);
                }
            }
        }
    };
    // The first step is peeled so that the zeroed registers flow straight into FMAs. With the
    // loop starting from zeros, rustc 1.95 kept the accumulators in zmm0-15 and spilled four of
    // them to the stack inside the loop at G = 4 (13 ns per key instead of 10, keys in L2).
    let mut acc = [_mm512_setzero_ps(); 16];
    if G == 1 {
        // One query: row by row, each row's chunks in turn. The reads are then sequential, which
        // the hardware prefetchers follow on their own (see `PREFETCH_BYTES`); the query's chunks
        // come from L1. Each accumulator sees the same operations in the same order as in `step`.
        for (kb, acc) in acc.iter_mut().take(KB).enumerate() {
            // SAFETY: row `kb < KB` and the query's `dim` floats lie inside the operands the
            // caller guarantees; chunk `c < dim / 16` inside each.
            unsafe {
                let row = rows.add(kb * row_bytes);
                for c in 0..dim / LANES {
                    let qv = _mm512_loadu_ps(q.add(c * LANES));
                    *acc = _mm512_fmadd_ps(qv, load16::<DT>(row, c), *acc);
                }
            }
        }
        return acc;
    }
    step(&mut acc, 0);
    for c in 1..dim / LANES {
        step(&mut acc, c);
    }
    acc
}

/// How far beyond the next block a line is prefetched, to keep more cache misses in flight than
/// the out-of-order window alone would. One prefetch is issued per 64 bytes of row, beside the
/// load of the chunk at their start, so the requests are spread evenly over the compute rather
/// than issued in a burst per block. Measured on a Xeon with cold keys (d = 128, f16, one
/// thread), as a fraction of a plain streaming read: at G = 4 ~65 % without prefetch, ~80 % with
/// the lines 2 KiB ahead requested in a burst per block, ~90 % spread per chunk; at G = 1 (blocks
/// of 4 KiB) a fixed 2 KiB ahead gave ~90 %, the next block plus 0.5-1 KiB ~107 %, plus 2 KiB
/// ~100 %.
///
/// On the 2-core Zen 4 VM (AMD EPYC, 2.6 GHz; `cargo run --release -p cxlkv-kernels --example
/// qk_once -- --tokens 4194304 --dtype f16 --group 1`, three runs each) the same G = 1 loop gave
/// 0.41-0.48 of the read with these prefetches at any distance tried (the next block, plus 256
/// bytes, 1 KiB or 4 KiB), 0.66-0.70 without them, and 0.83-0.86 with the rows read one after
/// the other and no software prefetch, which is what G = 1 does now; at G = 4 the prefetches
/// stay (0.67-0.70 with, 0.57-0.61 without; reading rows one after the other, reloading the
/// queries for each row, gave 0.51-0.58).
const PREFETCH_BYTES: usize = 1024;

/// Reduces 16 accumulators at once, each in the canonical tree, by four rounds of
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

/// Scores rows one at a time, each pair reduced on its own: the rows left over by `blocked`.
///
/// # Safety
/// AVX-512F, AVX2, F16C, FMA present; `a` describes valid memory as documented on [`TileArgs`].
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
unsafe fn tile<const G: usize, const DT: u8>(a: &TileArgs) {
    let row_bytes = span::<DT>(a.dim);
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
                let kv = load16::<DT>(row, c);
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
