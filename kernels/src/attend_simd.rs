//! AVX-512 parts of the fused attention kernel ([`crate::attend`]): the weighted value sum of one
//! tile with the value rows widened in registers straight from the view (no private copy), and
//! the software prefetches that keep the memory busy while the tile computes.
//!
//! The weighted sum keeps, for a tile of up to four queries and a block of `NK` 16-lane column
//! chunks, the `G × NK` accumulators in registers over a group of [`ROW_GROUP`] rows, then stores
//! them back to the running output; each value row is loaded (and widened) once per column chunk
//! and multiplied into every query's accumulator. The tile's value rows are prefetched while its
//! keys are scored ([`SCORE_SUB`]). The arithmetic is the reference's: for every
//! output element `o = fma(w, v, o)` (one rounding), rows in order, so the result is
//! bit-identical to [`crate::attend`]'s portable code. The fused form halves the sum's
//! arithmetic against a multiply then an add: measured with `cargo bench --bench ndp -- attend`
//! (1M tokens, d = 128, f16, G = 4) it took the kernel from 0.76x to 0.87x of the read bandwidth.

use crate::dtype::DType;
use crate::rows::{KeyRows, LANES};
use std::arch::x86_64::*;

use crate::widen::{load16, span, BF16, F16, F32, I4, I8};

/// Rows whose value lines stay in L1 while every column block of the output passes over them.
pub(crate) const ROW_GROUP: usize = 16;

/// Rows scored per call of the score kernel while the same rows' values are prefetched (2 KiB of
/// f16 rows of 128 elements): the tile's values stream in during its key pass, in bursts small
/// enough for the line-fill buffers. Measured on a loaded 2-core Xeon VM (1M tokens, d = 128, f16,
/// G = 4), as a fraction of the streaming read: ~0.71 with no prefetch, ~0.80 with this; adding
/// prefetches of the next tile's keys during the value pass, or of values a few rows ahead of
/// the weighted sum, did not help (0.75-0.77).
pub(crate) const SCORE_SUB: usize = 8;

/// Operands of one tile's weighted sum: `rows` value rows of `dim` elements at `vals`, weights
/// `w[i * stride + j]`, and the running output `out[j * dim + d]` of the query tile. Shared by
/// the AVX-512 and the AVX2 (`attend_avx2`) sums.
#[derive(Clone, Copy)]
pub(crate) struct SumArgs {
    pub(crate) vals: *const u8,
    pub(crate) rows: usize,
    pub(crate) dim: usize,
    pub(crate) w: *const f32,
    pub(crate) stride: usize,
    pub(crate) out: *mut f32,
}

impl SumArgs {
    /// The operands of `out[j * dim + d] += w[i * g + j] · v_i[d]` over every row of `vals`.
    /// Panics unless `out` holds `g` rows of `dim` and `w` a weight per row and query.
    pub(crate) fn new(out: &mut [f32], vals: &KeyRows<'_>, w: &[f32], g: usize) -> SumArgs {
        let (dim, rows) = (vals.dim(), vals.len());
        assert!(out.len() == g * dim && w.len() >= rows * g && g > 0);
        SumArgs {
            vals: vals.as_ptr(),
            rows,
            dim,
            w: w.as_ptr(),
            stride: g,
            out: out.as_mut_ptr(),
        }
    }

    /// Calls `sum(tile, gt)` for the queries in tiles of at most four, `tile` the operands of
    /// the `gt` queries from `j0` on (weights and outputs shifted to them).
    pub(crate) fn query_tiles(&self, mut sum: impl FnMut(&SumArgs, usize)) {
        let mut j0 = 0;
        while j0 < self.stride {
            let gt = (self.stride - j0).min(4);
            // Queries `j0..j0 + gt` are inside the group, so the shifted pointers address rows
            // of `stride` weights and `dim` outputs inside the caller's `w` and `out` (checked by
            // `new`); `wrapping_add` forms them without asserting that here.
            let tile = SumArgs {
                w: self.w.wrapping_add(j0),
                out: self.out.wrapping_add(j0 * self.dim),
                ..*self
            };
            sum(&tile, gt);
            j0 += gt;
        }
    }
}

/// The weighted sum of one tile (see the module documentation): `out[j * dim + d] +=
/// w[i * g + j] · v_i[d]` for every row `i` in order.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, F16C and FMA.
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
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
                        2 => columns::<2, 8, { $dt }>(a),
                        3 => columns::<3, 4, { $dt }>(a),
                        _ => columns::<4, 4, { $dt }>(a),
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

/// Every column chunk of a query tile of `G` queries, in blocks of `NK` chunks (the leftover
/// chunks one at a time), row group by row group.
///
/// # Safety
/// AVX-512F, AVX2, F16C, FMA present; `a` describes readable values, `G` queries' weights at
/// stride `a.stride` and `G` output rows of `a.dim` floats.
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
unsafe fn columns<const G: usize, const NK: usize, const DT: u8>(a: &SumArgs) {
    let chunks = a.dim / LANES;
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
/// AVX-512F, AVX2, F16C, FMA present; `r1 <= a.rows`, `c0 + NK <= a.dim / 16`, and `a` as on
/// [`columns`].
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
unsafe fn group<const G: usize, const NK: usize, const DT: u8>(
    a: &SumArgs,
    r0: usize,
    r1: usize,
    c0: usize,
) {
    let row_bytes = span::<DT>(a.dim);
    let chunk_bytes = span::<DT>(LANES);
    // SAFETY: output rows `j < G` hold `dim` floats at `out + j * dim`, of which chunks
    // `c0..c0 + NK` are read and written; weights `w[i * stride + j]` exist for `i < rows`,
    // `j < G`; value row `i < rows` spans `row_bytes` readable bytes, chunk `c < dim / 16` inside
    // it. Loads and stores are unaligned.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NK]; G];
        for (j, accj) in acc.iter_mut().enumerate() {
            for (k, v) in accj.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(a.out.add(j * a.dim + (c0 + k) * LANES));
            }
        }
        for i in r0..r1 {
            let row = a.vals.add(i * row_bytes);
            let mut wv = [_mm512_setzero_ps(); G];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = _mm512_set1_ps(*a.w.add(i * a.stride + j));
            }
            #[allow(clippy::needless_range_loop)] // `k` indexes the rows of `acc` and the columns
            for k in 0..NK {
                let p = row.add((c0 + k) * chunk_bytes);
                let v = load16::<DT>(p);
                for (accj, wj) in acc.iter_mut().zip(&wv) {
                    accj[k] = _mm512_fmadd_ps(*wj, v, accj[k]);
                }
            }
        }
        for (j, accj) in acc.iter().enumerate() {
            for (k, v) in accj.iter().enumerate() {
                _mm512_storeu_ps(a.out.add(j * a.dim + (c0 + k) * LANES), *v);
            }
        }
    }
}

/// Requests the first `rows` rows of `v` into the caches.
#[inline]
pub(crate) fn prefetch_rows(v: &KeyRows<'_>, rows: usize) {
    let bytes = (rows * v.row_bytes()).min(v.byte_len());
    let mut off = 0;
    while off < bytes {
        // SAFETY: a prefetch never faults and reads nothing architecturally; the address is
        // inside the view.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(v.as_ptr().wrapping_add(off) as *const i8) };
        off += 64;
    }
}

/// The largest scaled score `scale · s` of each of the `g` queries over the chunk's key-major
/// scores (`scores[i * g + j]`), into `cmax[..g]` (which must hold −∞): the same values as the
/// portable row-by-row `if x > m { m = x }`; where a maximum is a zero present with both signs,
/// which sign is kept may differ, which no later operation distinguishes (`x − (+0) = x − (−0)`
/// and `exp_neg(±0) = 1`).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, F16C and FMA.
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
pub(crate) unsafe fn chunk_max(scores: &[f32], g: usize, scale: f32, cmax: &mut [f32]) {
    assert!(g > 0 && cmax.len() >= g && scores.len().is_multiple_of(g));
    if !LANES.is_multiple_of(g) {
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
    // Lane `l` of every vector holds query `l % g` (16 is a multiple of g).
    let n = scores.len();
    let full = n - n % LANES;
    let p = scores.as_ptr();
    // SAFETY: register operations and loads of `scores[i..i + 16]` with `i + 16 <= full <= n`,
    // and a masked load of the `n - full` floats from `full` (masked-off lanes are not read).
    let lanes = unsafe {
        let sv = _mm512_set1_ps(scale);
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < full {
            // `max(x, m)` is `x > m ? x : m`: the portable compare.
            m = _mm512_max_ps(_mm512_mul_ps(sv, _mm512_loadu_ps(p.add(i))), m);
            i += LANES;
        }
        if full < n {
            let k: __mmask16 = (1u32 << (n - full)) as u16 - 1;
            let x = _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(k, p.add(full)));
            m = _mm512_mask_max_ps(m, k, x, m);
        }
        let mut lanes = [0f32; LANES];
        _mm512_storeu_ps(lanes.as_mut_ptr(), m);
        lanes
    };
    for (l, &x) in lanes.iter().enumerate() {
        if x > cmax[l % g] {
            cmax[l % g] = x;
        }
    }
}

/// `sum[j] += w[i * g + j]` for every row `i` in order (the `g` sums as lanes of one register
/// when `g <= 16`, each lane adding in row order as the portable code does).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, F16C and FMA.
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
pub(crate) unsafe fn add_sums(sum: &mut [f32], w: &[f32], g: usize) {
    assert!(g > 0 && sum.len() == g && w.len().is_multiple_of(g));
    if g > LANES {
        for (j, s) in sum.iter_mut().enumerate() {
            for row in w.chunks_exact(g) {
                *s += row[j];
            }
        }
        return;
    }
    let k: __mmask16 = ((1u32 << g) - 1) as u16;
    // SAFETY: masked loads and stores of the first `g` floats at `sum` and at `w + i * g` for
    // rows `i < w.len() / g` (inside `w`); masked-off lanes are not accessed.
    unsafe {
        let mut s = _mm512_maskz_loadu_ps(k, sum.as_ptr());
        let mut p = w.as_ptr();
        for _ in 0..w.len() / g {
            s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(k, p));
            p = p.add(g);
        }
        _mm512_mask_storeu_ps(sum.as_mut_ptr(), k, s);
    }
}
