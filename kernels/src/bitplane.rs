//! Bit-plane layout of f16 keys and an approximate scorer that reads only the high planes.
//!
//! An f16 element has 16 bits: sign (bit 15), exponent (bits 14..10), mantissa (bits 9..0).
//! [`BitPlanes`] stores plane `p` (`p = 0` the sign, `1..=5` the exponent from its top bit,
//! `6..=15` the mantissa from its top bit) as one packed bit string over all elements in row-major
//! order: element `e = row * dim + d` is bit `e % 8` of byte `e / 8` of the plane. A row's bits in a
//! plane are `dim / 8` contiguous bytes, so a scorer that wants only the sign, exponent and top
//! `m` mantissa bits reads `(6 + m) / 16` of the key bytes.
//!
//! [`approx_scores`] rebuilds each element from those planes, fills the dropped mantissa bits with
//! the midpoint of the interval they span (unbiased), and scores in the canonical order. It is a
//! pre-filter: callers take more candidates than `k` and re-score them exactly.

use crate::dtype::{f16_to_f32, DType};
use crate::rows::{KeyRows, QueryGroup, LANES, MAX_ROW_BYTES};
use crate::score::reduce_lanes;
use crate::topk::{Hit, TopKSelector};

/// Planes holding the sign and the exponent.
pub const SIGN_EXP_PLANES: usize = 6;
/// Bits of an f16, hence planes.
pub const PLANES: usize = 16;

/// f16 keys in bit-plane layout (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitPlanes {
    rows: usize,
    dim: usize,
    /// `PLANES` planes of `plane_bytes()` bytes, plane 0 (sign) first.
    planes: Vec<u8>,
}

impl BitPlanes {
    /// Rows (tokens).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Head dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bytes of one plane.
    pub fn plane_bytes(&self) -> usize {
        self.rows * self.dim / 8
    }

    /// Plane `p` (0 = sign, 1..=5 exponent, 6..=15 mantissa, each from the top bit).
    pub fn plane(&self, p: usize) -> &[u8] {
        &self.planes[p * self.plane_bytes()..(p + 1) * self.plane_bytes()]
    }

    /// Bytes [`approx_scores`] reads with `mantissa_bits` mantissa planes.
    pub fn bytes_read(&self, mantissa_bits: usize) -> usize {
        (SIGN_EXP_PLANES + mantissa_bits.min(10)) * self.plane_bytes()
    }

    /// The 16 bits of the chunk `c` (elements `16c..16c+16`) of row `i` in plane `p`.
    #[inline]
    fn chunk_bits(&self, p: usize, i: usize, c: usize) -> u16 {
        let off = p * self.plane_bytes() + (i * self.dim + c * LANES) / 8;
        u16::from_le_bytes([self.planes[off], self.planes[off + 1]])
    }
}

/// The bit-plane form of f16 `keys`. Panics if `keys` is not f16.
pub fn to_bitplanes(keys: &KeyRows<'_>) -> BitPlanes {
    assert_eq!(
        keys.dtype(),
        DType::F16,
        "bit planes are defined for f16 keys"
    );
    let (rows, dim) = (keys.len(), keys.dim());
    let plane_bytes = rows * dim / 8;
    let mut planes = vec![0u8; PLANES * plane_bytes];
    for (e, h) in keys.to_vec().chunks_exact(2).enumerate() {
        let h = u16::from_le_bytes([h[0], h[1]]);
        for p in 0..PLANES {
            let bit = (h >> (15 - p)) & 1;
            planes[p * plane_bytes + e / 8] |= (bit as u8) << (e % 8);
        }
    }
    BitPlanes { rows, dim, planes }
}

/// The f16 keys (little-endian bytes, row-major) of `planes`: the exact inverse of
/// [`to_bitplanes`].
pub fn from_bitplanes(planes: &BitPlanes) -> Vec<u8> {
    let elems = planes.rows * planes.dim;
    let mut out = Vec::with_capacity(elems * 2);
    for e in 0..elems {
        let mut h = 0u16;
        for p in 0..PLANES {
            let bit = (planes.plane(p)[e / 8] >> (e % 8)) & 1;
            h |= (bit as u16) << (15 - p);
        }
        out.extend_from_slice(&h.to_le_bytes());
    }
    out
}

/// Approximate scores of `queries` against every row, reading only the sign, exponent and top
/// `mantissa_bits` (0..=10) mantissa planes; key-major like [`crate::score::ScoreKernel::score`].
pub fn approx_scores(
    planes: &BitPlanes,
    queries: &QueryGroup<'_>,
    mantissa_bits: usize,
    out: &mut [f32],
) {
    let m = mantissa_bits.min(10);
    let g = queries.count();
    assert_eq!(queries.dim(), planes.dim, "query and key dimensions differ");
    assert_eq!(out.len(), planes.rows * g, "output must hold N * G scores");
    let used = SIGN_EXP_PLANES + m;
    // Midpoint of the dropped mantissa bits (none when all ten are kept).
    let fill: u16 = if m < 10 { 1 << (9 - m) } else { 0 };
    let mut row = vec![0f32; planes.dim];
    for i in 0..planes.rows {
        for c in 0..planes.dim / LANES {
            let mut h = [0u16; LANES];
            for p in 0..used {
                let bits = planes.chunk_bits(p, i, c);
                for (j, hj) in h.iter_mut().enumerate() {
                    *hj |= ((bits >> j) & 1) << (15 - p);
                }
            }
            for (j, hj) in h.iter().enumerate() {
                let v = if *hj & 0x7fff == 0 { *hj } else { *hj | fill };
                row[c * LANES + j] = f16_to_f32(v);
            }
        }
        for q in 0..g {
            out[i * g + q] = dot_f32(queries.query(q), &row);
        }
    }
}

/// Canonical-order dot product of two f32 vectors.
fn dot_f32(q: &[f32], k: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    for (qc, kc) in q.chunks_exact(LANES).zip(k.chunks_exact(LANES)) {
        for j in 0..LANES {
            lanes[j] = qc[j].mul_add(kc[j], lanes[j]);
        }
    }
    reduce_lanes(&lanes)
}

/// The `k` best rows of one query by approximate score (indices are rows; scores approximate).
pub fn approx_topk(planes: &BitPlanes, query: &[f32], mantissa_bits: usize, k: usize) -> Vec<Hit> {
    let q = QueryGroup::new(query, planes.dim).expect("query of the planes' dimension");
    let mut scores = vec![0f32; planes.rows];
    approx_scores(planes, &q, mantissa_bits, &mut scores);
    let mut sel = TopKSelector::new(k);
    sel.push_strided(0, &scores, 1, 0);
    sel.into_sorted()
}

/// Pre-filtered top-k: the `candidates` best rows by approximate score, re-scored exactly against
/// `keys` (the same keys as `planes`), of which the `k` best are returned with exact scores.
pub fn prefiltered_topk(
    planes: &BitPlanes,
    keys: &KeyRows<'_>,
    query: &[f32],
    mantissa_bits: usize,
    candidates: usize,
    k: usize,
) -> Vec<Hit> {
    assert_eq!(planes.rows, keys.len(), "planes and keys differ");
    let mut sel = TopKSelector::new(k);
    let mut buf = [0u8; MAX_ROW_BYTES];
    for hit in approx_topk(planes, query, mantissa_bits, candidates.max(k)) {
        let row = keys.copy_row(hit.index as usize, &mut buf);
        let exact = crate::score::dot_canonical(query, row, keys.dtype());
        sel.push(hit.index, exact);
    }
    sel.into_sorted()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use crate::score::ScoreKernel;

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn round_trip_is_lossless_for_every_bit_pattern() {
        // 65536 patterns as 4096 rows of 16: NaN, infinities and subnormals included.
        let bytes: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        let keys = KeyRows::new(&bytes, DType::F16, 16).unwrap();
        let planes = to_bitplanes(&keys);
        assert_eq!(planes.plane_bytes(), 8192);
        // Sign plane: elements 32768.. have the sign set.
        assert_eq!(planes.plane(0)[4095], 0);
        assert_eq!(planes.plane(0)[4096], 0xff);
        assert_eq!(from_bitplanes(&planes), bytes);
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn all_planes_give_exact_scores_and_fewer_give_close_ones() {
        let mut rng = SplitMix64::new(17);
        let (n, dim) = (64, 64);
        let kb = rng.key_bytes(n, dim, DType::F16);
        let keys = KeyRows::new(&kb, DType::F16, dim).unwrap();
        let planes = to_bitplanes(&keys);
        let qv = rng.normal_vec(dim);
        let q = QueryGroup::new(&qv, dim).unwrap();
        let mut exact = vec![0.0; n];
        ScoreKernel::scalar().score(&q, &keys, &mut exact);
        let mut full = vec![0.0; n];
        approx_scores(&planes, &q, 10, &mut full);
        assert_eq!(full, exact);
        let mut rough = vec![0.0; n];
        approx_scores(&planes, &q, 2, &mut rough);
        let norm: f32 = qv.iter().map(|x| x.abs()).sum();
        for (a, b) in rough.iter().zip(&exact) {
            // Each element is off by at most 1/8 of its magnitude (2 mantissa bits kept).
            assert!((a - b).abs() <= 0.13 * 4.0 * norm, "{a} {b}");
        }
        assert_eq!(planes.bytes_read(2), n * dim * 2 / 2);
        let top = prefiltered_topk(&planes, &keys, &qv, 10, 8, 8);
        assert_eq!(top, crate::topk::topk_by_sort(&exact, 8));
    }
}
