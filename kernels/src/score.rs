//! Q·K scoring: the scores of the `G` queries of one GQA group against `N` keys, in one pass over
//! the keys (each key row is read from memory once for all `G` queries).
//!
//! Three implementations compute bit-identical scores in the crate's canonical summation order
//! (see the crate documentation): [`Isa::Avx512`] (`vcvtph2ps` for f16, a shift for bf16,
//! sign extension for int8 and nibble shifts for int4 codes, all in registers: `widen`),
//! [`Isa::Avx2`] (AVX2 + F16C + FMA) and [`Isa::Scalar`], the portable oracle. A [`ScoreKernel`]
//! holds an `Isa` that the running CPU supports; it is the only way into the SIMD code.
//!
//! Output layout is key-major: the score of query `g` against key `i` is `out[i * G + g]`.

use crate::dtype::DType;
use crate::rows::{KeyRows, QueryGroup, LANES};
use std::fmt;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// An implementation of the scoring kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable scalar code: the oracle, and the fallback everywhere.
    Scalar,
    /// AVX2 with F16C and FMA (x86-64).
    Avx2,
    /// AVX-512F with F16C (x86-64).
    Avx512,
}

impl Isa {
    /// Every implementation, fastest last.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// Short name (`scalar`, `avx2`, `avx512`).
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether the running CPU supports this implementation.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("f16c")
                    && is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("f16c")
                    && is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
        }
    }

    /// Queries scored together per key row before the next tile of queries re-reads the row
    /// (from L1): bounded by the vector registers that hold the accumulators.
    const fn query_tile(self) -> usize {
        match self {
            Isa::Scalar => usize::MAX,
            Isa::Avx2 => 4,
            Isa::Avx512 => 8,
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Isa {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "scalar" => Ok(Isa::Scalar),
            "avx2" => Ok(Isa::Avx2),
            "avx512" => Ok(Isa::Avx512),
            other => Err(format!(
                "unknown isa {other:?} (expected scalar, avx2 or avx512)"
            )),
        }
    }
}

/// A scoring implementation that the running CPU supports.
///
/// Invariant: `isa.is_available()` was true when this value was built, so the SIMD functions it
/// calls only execute instructions the CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoreKernel {
    isa: Isa,
}

impl ScoreKernel {
    /// The fastest implementation this CPU supports. `CXLKV_ISA=scalar|avx2|avx512` in the
    /// environment caps the choice (for comparisons); an unavailable request falls back to the
    /// best available.
    pub fn detect() -> ScoreKernel {
        if let Some(k) = std::env::var("CXLKV_ISA")
            .ok()
            .and_then(|s| s.parse::<Isa>().ok())
            .and_then(ScoreKernel::new)
        {
            return k;
        }
        ScoreKernel::best()
    }

    /// The fastest implementation this CPU supports, ignoring the environment.
    pub fn best() -> ScoreKernel {
        Isa::ALL
            .iter()
            .rev()
            .find_map(|&isa| ScoreKernel::new(isa))
            .unwrap_or_else(ScoreKernel::scalar)
    }

    /// The portable scalar oracle.
    pub const fn scalar() -> ScoreKernel {
        ScoreKernel { isa: Isa::Scalar }
    }

    /// `isa` if this CPU supports it.
    pub fn new(isa: Isa) -> Option<ScoreKernel> {
        isa.is_available().then_some(ScoreKernel { isa })
    }

    /// Every implementation this CPU supports, the scalar oracle first.
    pub fn all_available() -> Vec<ScoreKernel> {
        Isa::ALL
            .iter()
            .filter_map(|&isa| ScoreKernel::new(isa))
            .collect()
    }

    /// The implementation.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Scores of every query of `queries` against every row of `keys`, key-major:
    /// `out[i * G + g] = q_g · k_i`. Panics if dimensions differ or `out.len() != N * G`.
    pub fn score(&self, queries: &QueryGroup<'_>, keys: &KeyRows<'_>, out: &mut [f32]) {
        let g = queries.count();
        assert_eq!(queries.dim(), keys.dim(), "query and key dimensions differ");
        assert_eq!(out.len(), keys.len() * g, "output must hold N * G scores");
        let tile = self.isa.query_tile();
        if g <= tile {
            self.score_tile(queries, keys, out, g, 0);
            return;
        }
        // More queries than accumulators fit in registers: walk the keys in L1-sized chunks and
        // score each chunk for every tile of queries, so memory is still read once.
        const CHUNK_KEYS: usize = 64;
        let mut start = 0;
        while start < keys.len() {
            let end = (start + CHUNK_KEYS).min(keys.len());
            let chunk = keys.slice(start, end);
            let out_chunk = &mut out[start * g..end * g];
            let mut g0 = 0;
            while g0 < g {
                let g1 = (g0 + tile).min(g);
                self.score_tile(&queries.subgroup(g0, g1), &chunk, out_chunk, g, g0);
                g0 = g1;
            }
            start = end;
        }
    }

    /// Scores of `queries` (a tile of at most `query_tile()` queries of a larger group of
    /// `stride` queries, the first being query `first`) into `out[i * stride + first + g]`.
    fn score_tile(
        &self,
        queries: &QueryGroup<'_>,
        keys: &KeyRows<'_>,
        out: &mut [f32],
        stride: usize,
        first: usize,
    ) {
        debug_assert!(first + queries.count() <= stride);
        debug_assert!(out.len() >= keys.len() * stride);
        match self.isa {
            Isa::Scalar => scalar::score_tile(queries, keys, out, stride, first),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a ScoreKernel holds Isa::Avx2 only if `is_available` saw AVX2, F16C and FMA.
            Isa::Avx2 => unsafe { avx2::score_tile(queries, keys, out, stride, first) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a ScoreKernel holds Isa::Avx512 only if `is_available` saw AVX-512F, AVX2,
            // F16C and FMA.
            Isa::Avx512 => unsafe { avx512::score_tile(queries, keys, out, stride, first) },
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => unreachable!("SIMD kernel on a non-x86 target"),
        }
    }
}

impl Default for ScoreKernel {
    fn default() -> Self {
        ScoreKernel::detect()
    }
}

/// Scores of the `G` queries against the `N` keys with `kernel`, key-major (`out[i * G + g]`).
/// See [`ScoreKernel::score`].
pub fn score_group(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    out: &mut [f32],
) {
    kernel.score(queries, keys, out)
}

/// Adds 16 lane accumulators in the canonical tree: `j + j+8`, `j + j+4`, `j + j+2`, `j + j+1`.
#[inline]
pub fn reduce_lanes(l: &[f32; LANES]) -> f32 {
    let mut s = [0f32; 8];
    for j in 0..8 {
        s[j] = l[j] + l[j + 8];
    }
    let t = [s[0] + s[4], s[1] + s[5], s[2] + s[6], s[3] + s[7]];
    let u = [t[0] + t[2], t[1] + t[3]];
    u[0] + u[1]
}

/// `q · row` in the canonical order, `row` being one row of `dtype` elements (little-endian).
/// This is the definition every implementation reproduces bit for bit.
pub fn dot_canonical(q: &[f32], row: &[u8], dtype: DType) -> f32 {
    let dim = q.len();
    debug_assert_eq!(dim % LANES, 0);
    let mut lanes = [0f32; LANES];
    for c in 0..dim / LANES {
        for (j, lane) in lanes.iter_mut().enumerate() {
            let d = c * LANES + j;
            *lane = q[d].mul_add(dtype.load(row, d), *lane);
        }
    }
    reduce_lanes(&lanes)
}

mod scalar {
    use super::dot_canonical;
    use crate::rows::{KeyRows, QueryGroup, MAX_ROW_BYTES};

    pub(super) fn score_tile(
        queries: &QueryGroup<'_>,
        keys: &KeyRows<'_>,
        out: &mut [f32],
        stride: usize,
        first: usize,
    ) {
        let mut buf = [0u8; MAX_ROW_BYTES];
        for i in 0..keys.len() {
            let row = keys.copy_row(i, &mut buf);
            for g in 0..queries.count() {
                out[i * stride + first + g] = dot_canonical(queries.query(g), row, keys.dtype());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{f32_to_bf16, f32_to_f16};

    #[test]
    fn canonical_dot_of_exact_values() {
        let q: Vec<f32> = (0..32).map(|i| i as f32).collect();
        let k: Vec<u8> = (0..32)
            .flat_map(|_| f32_to_f16(0.5).to_le_bytes())
            .collect();
        assert_eq!(dot_canonical(&q, &k, DType::F16), 248.0);
        let kb: Vec<u8> = (0..32)
            .flat_map(|i| f32_to_bf16(if i % 2 == 0 { 1.0 } else { -1.0 }).to_le_bytes())
            .collect();
        assert_eq!(dot_canonical(&q, &kb, DType::Bf16), -16.0);
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn every_available_isa_matches_scalar_bitwise() {
        let mut rng = crate::rng::SplitMix64::new(7);
        for dtype in [DType::F16, DType::Bf16, DType::F32] {
            for dim in [16, 64, 128, 256] {
                for g in [1, 3, 9] {
                    let n = 37;
                    let keys = rng.key_bytes(n, dim, dtype);
                    let q = rng.normal_vec(g * dim);
                    let keys = KeyRows::new(&keys, dtype, dim).unwrap();
                    let q = QueryGroup::new(&q, dim).unwrap();
                    let mut want = vec![0.0; n * g];
                    ScoreKernel::scalar().score(&q, &keys, &mut want);
                    for kernel in ScoreKernel::all_available() {
                        let mut got = vec![f32::NAN; n * g];
                        kernel.score(&q, &keys, &mut got);
                        for (a, b) in got.iter().zip(&want) {
                            assert_eq!(a.to_bits(), b.to_bits(), "{kernel:?} {dtype:?} {dim} {g}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn quantized_keys_score_bitwise_alike_on_every_isa() {
        let mut rng = crate::rng::SplitMix64::new(21);
        for dtype in [DType::I8, DType::I4] {
            for dim in [16, 32, 48, 64, 128, 256] {
                for g in [1, 2, 3, 4, 5, 8, 9, 16] {
                    for n in [1, 7, 33, 130] {
                        let keys = rng.key_bytes(n, dim, dtype);
                        let q = rng.normal_vec(g * dim);
                        let keys = KeyRows::new(&keys, dtype, dim).unwrap();
                        let q = QueryGroup::new(&q, dim).unwrap();
                        let mut want = vec![0.0; n * g];
                        ScoreKernel::scalar().score(&q, &keys, &mut want);
                        // The oracle is the canonical dot product over the codes.
                        let row = keys.row_vec(n - 1);
                        let last = dot_canonical(q.query(g - 1), &row, dtype);
                        assert_eq!(want[n * g - 1].to_bits(), last.to_bits());
                        for kernel in ScoreKernel::all_available() {
                            let mut got = vec![f32::NAN; n * g];
                            kernel.score(&q, &keys, &mut got);
                            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "{kernel:?} {dtype:?} dim {dim} g {g} n {n} at {i}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
