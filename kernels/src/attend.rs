//! Fused attention over one block: the scores of the `G` queries of a GQA group against the
//! block's keys (the crate's [`ScoreKernel`], canonical order), their maximum, the exponentials and
//! the weighted sum of the value rows, as one [`Partial`] per query — the computation of the NDP
//! `ATTEND` command. It equals [`Partial::over_group`] over the same scores within f32 rounding
//! (the maxima exactly).
//!
//! One pass over the rows in chunks of [`CHUNK`]: each chunk's keys are scored in place, then each
//! query's partial is folded online: one maximum update per chunk and query (a larger chunk
//! maximum rescales the running sum and output by `exp(old − new)`), the chunk's weights
//! `exp(scale · s − max)` and their sums, and the weighted sum of the chunk's value rows. The
//! exponential is [`exp_neg`], a polynomial in plain IEEE operations (within 2 ulp of `exp`), and
//! every sum runs in row order (the weighted value sum as one fused multiply-add per element, the
//! canonical dot product's rounding), so every implementation returns bit-identical partials
//! (the HLS engine of `fpga/` computes the same operations in the same order; fpga/README.md,
//! *Tolerance*).
//!
//! Implementations, chosen with the score kernel's [`Isa`]: AVX-512 (`attend_simd`) and AVX2 +
//! F16C + FMA (`attend_avx2`), the same design at 16 and 8 lanes: the chunk's values prefetched
//! while its keys are scored, maxima and sums in vector registers, the value rows widened in
//! registers straight from the view and summed into register tiles of queries × columns (tiles
//! sized for 32 zmm and 16 ymm registers); and the portable scalar code (the value rows copied
//! into private memory and widened, then summed by code the compiler vectorizes).

use crate::dtype::DType;
use crate::partial::Partial;
use crate::rows::{KeyRows, QueryGroup};
use crate::score::{Isa, ScoreKernel};

/// Rows per chunk: the chunk's f32 values (`CHUNK × dim`) stay in L1/L2.
pub const CHUNK: usize = 64;

/// `exp(x)` for `x <= 0` (inputs below −87 give about 1.6e-38 instead of less), within 2 ulp:
/// Cephes' `expf` reduction and polynomial, without fused operations, so that scalar and
/// vectorized code agree bit for bit.
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // 1.5 × 2^23: adding and subtracting it rounds to the nearest integer (ties to even).
    const MAGIC: f32 = 12_582_912.0;
    let x = if x > -87.0 { x } else { -87.0 };
    let t = x * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = (x - n * C1) - n * C2;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // n is an integer in [-126, 0], held in the low bits of `t`: 2^n is a normal float, built
    // with wrapping integer operations (which vectorize, unlike a float-to-int cast).
    let biased = t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127);
    y * f32::from_bits(biased << 23)
}

/// The partials of the `G` queries over `keys` / `values` (the same number of rows), each score
/// scaled by `scale` before `exp`. Panics if the shapes differ. This is
/// [`attend_block_scaled`] without value scales.
pub fn attend_block(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    values: &KeyRows<'_>,
    scale: f32,
) -> Vec<Partial> {
    attend_block_scaled(kernel, queries, keys, values, None, scale)
}

/// The partials of the `G` queries over `keys` / `values` of any dtypes, with per-row value
/// scales for quantized values ([`crate::quant::quantize_values`]).
///
/// For row `i` the weight `w = exp_neg(scale · s − max)` is added to the query's sum unscaled,
/// and the value row (its elements, or its integer codes) is accumulated with weight
/// `w · value_scales[i]` (one f32 multiply, then the same fused multiply-adds as without
/// scales). With `None` the value rows are accumulated with weight `w`, as [`attend_block`].
/// Keys that are quantized are scored as they are: the caller passes queries already folded
/// with the key scales ([`crate::quant::fold_key_scales`]). Panics if the shapes differ or
/// `value_scales` does not hold one scale per row.
pub fn attend_block_scaled(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    values: &KeyRows<'_>,
    value_scales: Option<&[f32]>,
    scale: f32,
) -> Vec<Partial> {
    let (g, dim, n) = (queries.count(), keys.dim(), keys.len());
    assert_eq!(queries.dim(), dim, "query and key dimensions differ");
    assert_eq!(values.dim(), dim, "key and value dimensions differ");
    assert_eq!(values.len(), n, "one value row per key");
    if let Some(vs) = value_scales {
        assert_eq!(vs.len(), n, "one value scale per row");
    }
    // The AVX-512 and AVX2 forms read the value rows in place: no private copies.
    let in_place = matches!(kernel.isa(), Isa::Avx512 | Isa::Avx2);
    let copies = if in_place { 0 } else { CHUNK };
    let mut st = State {
        max: vec![f32::NEG_INFINITY; g],
        sum: vec![0f32; g],
        out: vec![0f32; g * dim],
        scores: vec![0f32; CHUNK * g],
        maxes: vec![0f32; CHUNK * g],
        weights: vec![0f32; CHUNK * g],
        value_weights: vec![0f32; if value_scales.is_some() { CHUNK * g } else { 0 }],
        raw: vec![0u8; copies * values.row_bytes()],
        vals: vec![0f32; copies * dim],
    };
    let mut r0 = 0;
    while r0 < n {
        let r1 = (r0 + CHUNK).min(n);
        let c = r1 - r0;
        let vtile = values.slice(r0, r1);
        #[cfg(target_arch = "x86_64")]
        if in_place {
            // The tile's values stream in while its keys are scored, a few rows at a time: at
            // least one of the AVX-512 score kernel's row blocks (16 keys at G = 1, 8 or fewer
            // above), so that no key falls to its one-row path.
            let sub = if g == 1 && kernel.isa() == Isa::Avx512 {
                2 * crate::attend_simd::SCORE_SUB
            } else {
                crate::attend_simd::SCORE_SUB
            };
            let mut s0 = r0;
            while s0 < r1 {
                let s1 = (s0 + sub).min(r1);
                crate::attend_simd::prefetch_rows(&values.slice(s0, s1), sub);
                let out = &mut st.scores[(s0 - r0) * g..(s1 - r0) * g];
                kernel.score(queries, &keys.slice(s0, s1), out);
                s0 = s1;
            }
        } else {
            kernel.score(queries, &keys.slice(r0, r1), &mut st.scores[..c * g]);
        }
        #[cfg(not(target_arch = "x86_64"))]
        kernel.score(queries, &keys.slice(r0, r1), &mut st.scores[..c * g]);
        let vscales = value_scales.map(|vs| &vs[r0..r1]);
        st.fold(kernel.isa(), &vtile, vscales, g, dim, scale);
        r0 = r1;
    }
    (0..g)
        .map(|j| Partial {
            out: st.out[j * dim..(j + 1) * dim].to_vec(),
            max: st.max[j],
            sum: st.sum[j],
        })
        .collect()
}

/// A SIMD fold of one chunk: maxima, rescale and weights (vectorized by the compiler for the
/// function's target features), then the sums and the weighted value sum of `$m`'s kernels,
/// which read the value rows in place.
macro_rules! simd_fold {
    ($(#[$doc:meta])* $name:ident, $features:literal, $m:path) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(
            &mut self,
            vrows: &KeyRows<'_>,
            vscales: Option<&[f32]>,
            g: usize,
            dim: usize,
            scale: f32,
        ) {
            use $m::{add_sums, chunk_max, weighted_sum};
            let c = vrows.len();
            let mut cmax = [f32::NEG_INFINITY; crate::rows::MAX_DIM];
            // SAFETY: this function runs only with the features `chunk_max` needs.
            unsafe { chunk_max(&self.scores[..c * g], g, scale, &mut cmax) };
            self.rescale_and_weigh(&cmax[..g], c, g, dim, scale);
            // SAFETY: as above, for `add_sums`.
            unsafe { add_sums(&mut self.sum, &self.weights[..c * g], g) };
            self.scale_weights(vscales, c, g);
            let w = match vscales {
                Some(_) => &self.value_weights[..c * g],
                None => &self.weights[..c * g],
            };
            // SAFETY: as above, for `weighted_sum`.
            unsafe { weighted_sum(&mut self.out, vrows, w, g) }
        }
    };
}

/// Scratch and running partials of [`attend_block`].
struct State {
    /// Running maximum, sum and output (`[G][dim]`) per query.
    max: Vec<f32>,
    sum: Vec<f32>,
    out: Vec<f32>,
    scores: Vec<f32>,
    maxes: Vec<f32>,
    weights: Vec<f32>,
    /// The weights times the rows' value scales (empty without value scales).
    value_weights: Vec<f32>,
    raw: Vec<u8>,
    vals: Vec<f32>,
}

impl State {
    /// Folds the chunk of rows whose scores are in `scores`, values are `vrows` and value scales
    /// (if any) `vscales`.
    fn fold(
        &mut self,
        isa: Isa,
        vrows: &KeyRows<'_>,
        vscales: Option<&[f32]>,
        g: usize,
        dim: usize,
        scale: f32,
    ) {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a ScoreKernel holds Isa::Avx512 only if the CPU reported AVX-512F, AVX2,
            // F16C and FMA (`Isa::is_available`).
            Isa::Avx512 => unsafe { self.fold_avx512(vrows, vscales, g, dim, scale) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a ScoreKernel holds Isa::Avx2 only if the CPU reported AVX2, F16C and FMA.
            Isa::Avx2 => unsafe { self.fold_avx2(vrows, vscales, g, dim, scale) },
            _ => {
                self.weigh(vrows.len(), g, dim, scale);
                self.scale_weights(vscales, vrows.len(), g);
                self.sum_copied(vrows, vscales.is_some(), g, dim);
            }
        }
    }

    /// With value scales, `value_weights[i * g + j] = weights[i * g + j] · vscales[i]` for the
    /// chunk's `c` rows (one multiply each); without, nothing.
    #[inline(always)]
    fn scale_weights(&mut self, vscales: Option<&[f32]>, c: usize, g: usize) {
        let Some(vs) = vscales else { return };
        let w = &self.weights[..c * g];
        let vw = &mut self.value_weights[..c * g];
        for ((vrow, wrow), &s) in vw.chunks_exact_mut(g).zip(w.chunks_exact(g)).zip(vs) {
            for (v, &x) in vrow.iter_mut().zip(wrow) {
                *v = x * s;
            }
        }
    }

    simd_fold!(
        /// # Safety
        /// The CPU must support AVX-512F, AVX2, F16C and FMA.
        fold_avx512,
        "avx512f,avx2,f16c,fma",
        crate::attend_simd
    );

    simd_fold!(
        /// # Safety
        /// The CPU must support AVX2, F16C and FMA.
        fold_avx2,
        "avx2,f16c,fma",
        crate::attend_avx2
    );

    /// The chunk's new running maxima (a larger one rescales what was accumulated), its weights
    /// `exp(scale · s − max)` and their sums, for the chunk of `c` rows whose scores are in
    /// `scores`. Written so that the compiler vectorizes it for the caller's target features;
    /// every element sees the same IEEE operations in the same order whatever the width.
    #[inline(always)]
    fn weigh(&mut self, c: usize, g: usize, dim: usize, scale: f32) {
        let scores = &self.scores[..c * g];
        let mut cmax = [f32::NEG_INFINITY; crate::rows::MAX_DIM];
        let cmax = &mut cmax[..g];
        for row in scores.chunks_exact(g) {
            for (m, &s) in cmax.iter_mut().zip(row) {
                let x = scale * s;
                // Inputs are NaN-free: a plain compare (no NaN handling) suffices.
                if x > *m {
                    *m = x;
                }
            }
        }
        self.rescale_and_weigh(cmax, c, g, dim, scale);
        let w = &self.weights[..c * g];
        for row in w.chunks_exact(g) {
            for (sum, &wj) in self.sum.iter_mut().zip(row) {
                *sum += wj;
            }
        }
    }

    /// Given the chunk's maxima `cmax`, rescales the running sums and outputs where the maximum
    /// grows and writes the chunk's weights `exp(scale · s − max)`.
    #[inline(always)]
    fn rescale_and_weigh(&mut self, cmax: &[f32], c: usize, g: usize, dim: usize, scale: f32) {
        let scores = &self.scores[..c * g];
        let running = self
            .max
            .iter_mut()
            .zip(self.sum.iter_mut())
            .zip(self.out.chunks_exact_mut(dim));
        let mut grew = false;
        for (((max, sum), out), &m) in running.zip(cmax.iter()) {
            if m > *max {
                if *sum > 0.0 {
                    let f = exp_neg(*max - m);
                    *sum *= f;
                    for o in out.iter_mut() {
                        *o *= f;
                    }
                }
                *max = m;
                grew = true;
            }
        }
        // `maxes` holds the running maxima once per row of a whole chunk; it changes only when a
        // maximum grows (rarely, after the first chunks).
        if grew {
            for row in self.maxes.chunks_exact_mut(g) {
                row.copy_from_slice(&self.max);
            }
        }
        let maxes = &self.maxes[..c * g];
        let w = &mut self.weights[..c * g];
        for ((w, &s), &m) in w.iter_mut().zip(scores).zip(maxes.iter()) {
            *w = exp_neg(scale * s - m);
        }
    }

    /// The weighted value sum of the chunk through a widened private copy of its rows, with the
    /// scaled weights if `scaled`.
    #[inline(always)]
    fn sum_copied(&mut self, vrows: &KeyRows<'_>, scaled: bool, g: usize, dim: usize) {
        let c = vrows.len();
        let vals = &mut self.vals[..c * dim];
        widen_copy(vrows, &mut self.raw, vals);
        let w = if scaled {
            &self.value_weights[..c * g]
        } else {
            &self.weights[..c * g]
        };
        for (j, out) in self.out.chunks_exact_mut(dim).enumerate() {
            accumulate(out, vals, w, g, j);
        }
    }
}

/// `out[d] += w[i * g + j] * vals[i * dim + d]` for every row `i` in order, `d < dim =
/// out.len()`: the portable form of the weighted value sum (one fused multiply-add per element,
/// like the SIMD form in [`crate::attend_simd`], so every form rounds alike); the compiler
/// vectorizes it for the caller's target features (a library call per element where the target
/// has no FMA, as the canonical dot product's scalar form).
#[inline(always)]
fn accumulate(out: &mut [f32], vals: &[f32], w: &[f32], g: usize, j: usize) {
    for (v, row) in vals.chunks_exact(out.len()).zip(w.chunks_exact(g)) {
        let wj = row[j];
        for (o, &x) in out.iter_mut().zip(v) {
            *o = wj.mul_add(x, *o);
        }
    }
}

/// Raw little-endian elements of `dtype` to f32 (exact), portable code.
#[inline(always)]
fn widen_scalar(raw: &[u8], dtype: DType, out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::Bf16 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        DType::I8 => {
            for (o, &b) in out.iter_mut().zip(raw) {
                *o = f32::from(b as i8);
            }
        }
        DType::F16 | DType::I4 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = dtype.load(raw, i);
            }
        }
    }
}

/// The rows of `rows` as f32 into `out`, through a private copy in `raw` (portable).
#[inline(always)]
fn widen_copy(rows: &KeyRows<'_>, raw: &mut [u8], out: &mut [f32]) {
    let raw = &mut raw[..rows.byte_len()];
    rows.copy_to(raw);
    widen_scalar(raw, rows.dtype(), out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::relative_error;
    use crate::rng::SplitMix64;

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn exp_neg_is_close_to_exp() {
        let mut worst = 0f64;
        for i in 0..190_000 {
            let x = -(i as f32) * 4.5e-4;
            let (a, b) = (exp_neg(x) as f64, (x as f64).exp());
            worst = worst.max(((a - b) / b).abs());
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp_neg(0.0), 1.0);
        assert!(exp_neg(-200.0) < 1e-37);
        assert!(exp_neg(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn fused_partials_equal_over_group_on_every_isa() {
        let mut rng = SplitMix64::new(5);
        for dtype in [DType::F16, DType::Bf16, DType::F32] {
            for (dim, n, g) in [
                (16, 1, 1),
                (48, 77, 2),
                (64, 200, 3),
                (128, 130, 4),
                (128, 100, 8),
                (256, 64, 9),
                (32, 70, 16),
                (64, 33, 17),
            ] {
                let kb = rng.key_bytes(n, dim, dtype);
                let vb = rng.key_bytes(n, dim, dtype);
                let keys = KeyRows::new(&kb, dtype, dim).unwrap();
                let vals = KeyRows::new(&vb, dtype, dim).unwrap();
                let q: Vec<f32> = rng.normal_vec(g * dim).iter().map(|x| 2.0 * x).collect();
                let q = QueryGroup::new(&q, dim).unwrap();
                let scale = crate::attention::default_scale(dim);
                let mut raw = vec![0f32; n * g];
                ScoreKernel::scalar().score(&q, &keys, &mut raw);
                let want = Partial::over_group(&vals, &raw, g, scale);
                let oracle = attend_block(ScoreKernel::scalar(), &q, &keys, &vals, scale);
                for kernel in ScoreKernel::all_available() {
                    let got = attend_block(kernel, &q, &keys, &vals, scale);
                    assert_eq!(got, oracle, "{kernel:?} {dtype:?} bit-identical to scalar");
                    for (a, b) in got.iter().zip(&want) {
                        assert_eq!(a.max, b.max);
                        assert!(
                            ((a.sum - b.sum) / b.sum).abs() < 1e-6,
                            "{} {}",
                            a.sum,
                            b.sum
                        );
                        assert!(relative_error(&a.out, &b.out) < 1e-6, "{dtype:?} {dim} {g}");
                    }
                }
            }
        }
        let e = attend_block(
            ScoreKernel::scalar(),
            &QueryGroup::new(&[0.0; 16], 16).unwrap(),
            &KeyRows::new(&[], DType::F16, 16).unwrap(),
            &KeyRows::new(&[], DType::F16, 16).unwrap(),
            1.0,
        );
        assert_eq!(e, vec![Partial::empty(16)]);
    }

    /// `sum_i softmax weight · code_i · vs_i` in f64, for the quantized attention test.
    fn scaled_reference(
        raw: &[f32],
        vals: &KeyRows<'_>,
        vs: &[f32],
        g: usize,
        j: usize,
        scale: f32,
    ) -> Vec<f64> {
        let n = vals.len();
        let m = (0..n)
            .map(|i| scale as f64 * raw[i * g + j] as f64)
            .fold(f64::NEG_INFINITY, f64::max);
        let mut out = vec![0f64; vals.dim()];
        let mut sum = 0f64;
        for i in 0..n {
            let w = (scale as f64 * raw[i * g + j] as f64 - m).exp();
            sum += w;
            for (o, v) in out.iter_mut().zip(vals.row_f32(i)) {
                *o += w * v as f64 * vs[i] as f64;
            }
        }
        out.iter().map(|o| o / sum).collect()
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn quantized_partials_agree_on_every_isa() {
        let mut rng = SplitMix64::new(17);
        let shapes = [
            (16, 1, 1),
            (48, 77, 2),
            (64, 200, 3),
            (128, 131, 4),
            (128, 65, 8),
            (256, 64, 9),
            (32, 70, 16),
        ];
        for (kdt, vdt) in [
            (DType::I8, DType::I8),
            (DType::I4, DType::I4),
            (DType::F16, DType::I8),
            (DType::I8, DType::F32),
        ] {
            for (dim, n, g) in shapes {
                let kx = rng.normal_vec(n * dim);
                let vx = rng.normal_vec(n * dim);
                let q = rng.normal_vec(g * dim);
                let (kb, q) = if kdt.is_quantized() {
                    let (codes, ks) = crate::quant::quantize_keys(&kx, dim, kdt);
                    (codes, crate::quant::fold_key_scales(&q, dim, &ks))
                } else {
                    (rng.key_bytes(n, dim, kdt), q)
                };
                let (vb, vs) = if vdt.is_quantized() {
                    crate::quant::quantize_values(&vx, dim, vdt)
                } else {
                    (
                        rng.key_bytes(n, dim, vdt),
                        (0..n).map(|i| 0.5 + i as f32 / 64.0).collect(),
                    )
                };
                let keys = KeyRows::new(&kb, kdt, dim).unwrap();
                let vals = KeyRows::new(&vb, vdt, dim).unwrap();
                let q = QueryGroup::new(&q, dim).unwrap();
                let scale = crate::attention::default_scale(dim);
                let oracle =
                    attend_block_scaled(ScoreKernel::scalar(), &q, &keys, &vals, Some(&vs), scale);
                let plain = attend_block(ScoreKernel::scalar(), &q, &keys, &vals, scale);
                let ones = vec![1.0; n];
                let unit = attend_block_scaled(
                    ScoreKernel::scalar(),
                    &q,
                    &keys,
                    &vals,
                    Some(&ones),
                    scale,
                );
                assert_eq!(unit, plain, "scales of one change nothing");
                let mut raw = vec![0f32; n * g];
                ScoreKernel::scalar().score(&q, &keys, &mut raw);
                for (j, p) in oracle.iter().enumerate() {
                    assert_eq!(p.max, plain[j].max);
                    assert_eq!(p.sum, plain[j].sum, "the sum of weights is unscaled");
                    let want = scaled_reference(&raw, &vals, &vs, g, j, scale);
                    let got = p.finish();
                    let err = got
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| (*a as f64 - b).abs())
                        .fold(0f64, f64::max);
                    let mag = want.iter().fold(0f64, |m, b| m.max(b.abs()));
                    assert!(
                        err <= 1e-5 * mag.max(1e-3),
                        "{kdt:?}/{vdt:?} {dim} {n} {g}: {err} of {mag}"
                    );
                }
                for kernel in ScoreKernel::all_available() {
                    let got = attend_block_scaled(kernel, &q, &keys, &vals, Some(&vs), scale);
                    assert_eq!(got, oracle, "{kernel:?} {kdt:?}/{vdt:?} {dim} {n} {g}");
                    let got = attend_block(kernel, &q, &keys, &vals, scale);
                    assert_eq!(got, plain, "{kernel:?} {kdt:?}/{vdt:?} unscaled");
                }
            }
        }
    }
}
