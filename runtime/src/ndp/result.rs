//! The result buffer of SCORE_TOPK and GATHER: its size ([`topk_result_size`]), encoding
//! ([`encode_topk_result`], the device's and the host's) and checked decoding
//! ([`decode_topk_result`]), with the scan counts ([`ScanStats`]) and per-block softmax mass
//! ([`block_mass`]) it carries; the per-list section of a selected SCORE_TOPK
//! ([`encode_list_info`]) and the ATTEND result ([`encode_attend_result`],
//! [`decode_attend_result`]).

use crate::format;
use crate::ndp::abi::*;
use crate::ndp::block::{locate_token, ResolvedBlock};
use cxlkv_kernels::{DType, Hit, Partial, PruneStats};

/// Counts of a scan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Key bytes read.
    pub bytes_scanned: u64,
    /// Blocks whose keys were read.
    pub blocks_scanned: u32,
    /// Blocks skipped on their bounds.
    pub blocks_pruned: u32,
}

impl From<&PruneStats> for ScanStats {
    /// The counts of a kernels' block-wise scan, as the result header carries them.
    fn from(s: &PruneStats) -> ScanStats {
        ScanStats {
            bytes_scanned: s.bytes_scanned,
            blocks_scanned: s.blocks_scanned.min(u32::MAX as usize) as u32,
            blocks_pruned: s.blocks_skipped.min(u32::MAX as usize) as u32,
        }
    }
}

/// Softmax mass (`scale · score`, normalised over `hits`) that each block holds.
pub fn block_mass(hits: &[Hit], blocks: &[ResolvedBlock], order: &[usize], scale: f32) -> Vec<f32> {
    let mut mass = vec![0f64; blocks.len()];
    let max = hits
        .iter()
        .map(|h| f64::from(scale) * f64::from(h.score))
        .fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0f64;
    for h in hits {
        let w = (f64::from(scale) * f64::from(h.score) - max).exp();
        total += w;
        if let Some((b, _)) = locate_token(blocks, order, h.index) {
            mass[b] += w;
        }
    }
    mass.iter()
        .map(|m| if total > 0.0 { (m / total) as f32 } else { 0.0 })
        .collect()
}

/// Bytes of a SCORE_TOPK result: header, hits, values (if gathered), per-block mass.
pub fn topk_result_size(
    lists: usize,
    per_list: usize,
    dim: usize,
    esize: usize,
    gather: bool,
    nblocks: usize,
) -> Option<u64> {
    let hits = lists.checked_mul(per_list)?.checked_mul(8)?;
    let values = if gather {
        lists
            .checked_mul(per_list)?
            .checked_mul(dim)?
            .checked_mul(esize)?
    } else {
        0
    };
    let mass = nblocks.checked_mul(4)?;
    let total = 64usize
        .checked_add(hits)?
        .checked_add(values.next_multiple_of(8))?
        .checked_add(mass)?;
    Some(total as u64)
}

/// Encodes a SCORE_TOPK (or GATHER, with scores 0) result: lists padded to `per_list` hits.
pub fn encode_topk_result(
    lists: &[Vec<Hit>],
    per_list: usize,
    dim: usize,
    dtype: DType,
    values: Option<&[u8]>,
    mass: &[f32],
    stats: &ScanStats,
) -> Vec<u8> {
    let hits_off = 64usize;
    let values_off = hits_off + lists.len() * per_list * 8;
    let vlen = values.map_or(0, |v| v.len().next_multiple_of(8));
    let mass_off = values_off + vlen;
    let total = mass_off + mass.len() * 4;
    let header = cxlkv_ndp_result {
        lists: lists.len() as u32,
        per_list: per_list as u32,
        dim: dim as u32,
        dtype: dtype as u32,
        hits_off: hits_off as u32,
        values_off: if values.is_some() {
            values_off as u32
        } else {
            0
        },
        mass_off: mass_off as u32,
        nblocks: mass.len() as u32,
        bytes_scanned: stats.bytes_scanned,
        blocks_scanned: stats.blocks_scanned,
        blocks_pruned: stats.blocks_pruned,
        bounds_off: 0,
        bounds_match: 0,
        total_bytes: total as u64,
    };
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(format::as_bytes(&header));
    for list in lists {
        for i in 0..per_list {
            let h = list.get(i).map_or(
                cxlkv_ndp_hit {
                    token: u32::MAX,
                    score: f32::NEG_INFINITY,
                },
                |h| cxlkv_ndp_hit {
                    token: h.index,
                    score: h.score,
                },
            );
            out.extend_from_slice(format::as_bytes(&h));
        }
    }
    if let Some(v) = values {
        out.extend_from_slice(v);
        out.resize(mass_off, 0);
    }
    for m in mass {
        out.extend_from_slice(&m.to_le_bytes());
    }
    debug_assert_eq!(out.len(), total);
    out
}

/// A decoded SCORE_TOPK / GATHER result.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodedTopK {
    /// Hits per list, best first (padding removed).
    pub lists: Vec<Vec<Hit>>,
    /// Value rows `[lists][per_list][dim]` raw, when gathered (padding rows included).
    pub values: Vec<u8>,
    /// Per-block softmax mass of list 0.
    pub mass: Vec<f32>,
    /// Scan counts reported by the producer.
    pub stats: ScanStats,
}

/// Decodes a result buffer, checking every offset against its length (it came from a peer).
pub fn decode_topk_result(bytes: &[u8], esize: usize) -> Option<DecodedTopK> {
    if bytes.len() < 64 {
        return None;
    }
    let h: cxlkv_ndp_result = format::from_bytes(bytes);
    let lists = h.lists as usize;
    let per = h.per_list as usize;
    let hits_end = (h.hits_off as usize).checked_add(lists.checked_mul(per)?.checked_mul(8)?)?;
    let hits_raw = bytes.get(h.hits_off as usize..hits_end)?;
    let mut out = DecodedTopK {
        stats: ScanStats {
            bytes_scanned: h.bytes_scanned,
            blocks_scanned: h.blocks_scanned,
            blocks_pruned: h.blocks_pruned,
        },
        ..Default::default()
    };
    for l in 0..lists {
        let list = (0..per)
            .map(|i| format::from_bytes::<cxlkv_ndp_hit>(&hits_raw[(l * per + i) * 8..]))
            .filter(|x| x.token != u32::MAX)
            .map(|x| Hit {
                index: x.token,
                score: x.score,
            })
            .collect();
        out.lists.push(list);
    }
    if h.values_off != 0 {
        let n = lists
            .checked_mul(per)?
            .checked_mul(h.dim as usize)?
            .checked_mul(esize)?;
        out.values = bytes
            .get(h.values_off as usize..(h.values_off as usize).checked_add(n)?)?
            .to_vec();
    }
    let m = bytes
        .get(h.mass_off as usize..(h.mass_off as usize).checked_add(h.nblocks as usize * 4)?)?;
    out.mass = m
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Some(out)
}

/// Encodes host-computed lists the way the device does (for tests comparing result buffers).
pub fn encode_host_result(
    lists: &[Vec<Hit>],
    dim: usize,
    dtype: DType,
    values: Option<&[u8]>,
    mass: &[f32],
    stats: &ScanStats,
) -> Vec<u8> {
    let per = lists.first().map_or(0, Vec::len);
    encode_topk_result(lists, per, dim, dtype, values, mass, stats)
}

/// Appends the `struct cxlkv_ndp_list_info [lists]` section of a selected SCORE_TOPK to `out`
/// (an encoded SCORE_TOPK result) and names it in the header (`bounds_off`, `total_bytes`).
pub fn encode_list_info(out: &mut Vec<u8>, lists: &[Vec<Hit>], left_out: &[f32]) {
    let at = out.len().next_multiple_of(8);
    out.resize(at, 0);
    for (l, m) in lists.iter().zip(left_out) {
        out.extend_from_slice(format::as_bytes(&cxlkv_ndp_list_info {
            count: l.len() as u32,
            left_out_mass: *m,
        }));
    }
    let mut h: cxlkv_ndp_result = format::from_bytes(out);
    h.bounds_off = at as u32;
    h.total_bytes = out.len() as u64;
    out[..64].copy_from_slice(format::as_bytes(&h));
}

/// The per-list `(count, left-out mass)` of a selected SCORE_TOPK result, checked against its
/// length.
pub fn decode_list_info(bytes: &[u8]) -> Option<Vec<(u32, f32)>> {
    if bytes.len() < 64 {
        return None;
    }
    let h: cxlkv_ndp_result = format::from_bytes(bytes);
    let at = h.bounds_off as usize;
    let n = h.lists as usize;
    let raw = bytes.get(at..at.checked_add(n.checked_mul(8)?)?)?;
    Some(
        raw.chunks_exact(8)
            .map(|c| {
                let i: cxlkv_ndp_list_info = format::from_bytes(c);
                (i.count, i.left_out_mass)
            })
            .collect(),
    )
}

/// Bytes of an ATTEND result: header, `cxlkv_ndp_partial [g]`, f32 outputs `[g][dim]`.
pub fn attend_result_size(g: usize, dim: usize) -> Option<u64> {
    let parts = g.checked_mul(8)?;
    let outs = g.checked_mul(dim)?.checked_mul(4)?;
    Some(64u64 + parts as u64 + outs as u64)
}

/// Encodes an ATTEND result.
pub fn encode_attend_result(parts: &[Partial], stats: &ScanStats) -> Vec<u8> {
    let g = parts.len();
    let dim = parts.first().map_or(0, |p| p.out.len());
    let values_off = 64 + 8 * g;
    let total = values_off + 4 * g * dim;
    let header = cxlkv_ndp_result {
        lists: g as u32,
        per_list: 1,
        dim: dim as u32,
        dtype: DType::F32 as u32,
        hits_off: 64,
        values_off: values_off as u32,
        mass_off: total as u32,
        nblocks: 0,
        bytes_scanned: stats.bytes_scanned,
        blocks_scanned: stats.blocks_scanned,
        blocks_pruned: stats.blocks_pruned,
        bounds_off: 0,
        bounds_match: 0,
        total_bytes: total as u64,
    };
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(format::as_bytes(&header));
    for p in parts {
        out.extend_from_slice(format::as_bytes(&cxlkv_ndp_partial {
            max: p.max,
            sum: p.sum,
        }));
    }
    for p in parts {
        for x in &p.out {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    debug_assert_eq!(out.len(), total);
    out
}

/// Decodes an ATTEND result of `g` queries of `dim`, checking every offset against its length.
pub fn decode_attend_result(
    bytes: &[u8],
    g: usize,
    dim: usize,
) -> Option<(Vec<Partial>, ScanStats)> {
    if bytes.len() < 64 {
        return None;
    }
    let h: cxlkv_ndp_result = format::from_bytes(bytes);
    if h.lists as usize != g || h.dim as usize != dim || h.dtype != DType::F32 as u32 {
        return None;
    }
    let ph = bytes.get(h.hits_off as usize..(h.hits_off as usize).checked_add(8 * g)?)?;
    let outs =
        bytes.get(h.values_off as usize..(h.values_off as usize).checked_add(4 * g * dim)?)?;
    let parts = (0..g)
        .map(|j| {
            let p: cxlkv_ndp_partial = format::from_bytes(&ph[8 * j..]);
            Partial {
                out: outs[4 * j * dim..4 * (j + 1) * dim]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                max: p.max,
                sum: p.sum,
            }
        })
        .collect();
    let stats = ScanStats {
        bytes_scanned: h.bytes_scanned,
        blocks_scanned: h.blocks_scanned,
        blocks_pruned: h.blocks_pruned,
    };
    Some((parts, stats))
}
