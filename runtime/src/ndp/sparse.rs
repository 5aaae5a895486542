//! The sparse ATTEND (ABI 1.2): ATTEND with `CXLKV_NDP_FLAG_SELECT`. Per query the selection of a
//! selected SCORE_TOPK ([`crate::ndp::select::Selection`]: sinks, window, exclusion, top-k or top-p
//! by exact mass), the union `U` of the group's lists in token order, and each query's exact
//! partial over `U`'s rows only; the result is ATTEND's plus, per query, `|U|` and the softmax mass
//! `U` leaves out. The pieces both the device and the host fallback use are here, so that both
//! return bit-identical answers: the tail's checks ([`parse_tail`]), the union ([`union`]), the
//! left-out mass ([`left_out`]) and the result format ([`encode_sparse_result`]).
//!
//! The partial over `U` is one [`cxlkv_kernels::attend_block`] over `U`'s key and value rows
//! gathered in token order (tiles of [`cxlkv_kernels::attend::CHUNK`] rows, no block merge), the
//! computation the HLS engine's sparse unit performs too.

use crate::format;
use crate::ndp::abi::*;
use crate::ndp::layout::DeviceStatus;
use crate::ndp::result::{attend_result_size, encode_attend_result, ScanStats};
use crate::ndp::select::Select;
use cxlkv_kernels::{Hit, Partial};

/// Bytes of the argument tail after the block list: `cxlkv_ndp_attend` then `cxlkv_ndp_select`.
pub const TAIL_BYTES: usize = 16 + 64;

/// What a sparse ATTEND selects: the rules and the per-query cap `k` (the budget of top-k, the
/// cap of top-p).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sparse {
    /// Sinks, window, exclusion, top-p.
    pub select: Select,
    /// Tokens per query list, at most (1..=`CXLKV_NDP_MAX_K`).
    pub k: usize,
    /// Score on the blocks' key sketches and re-score this many candidates per query exactly
    /// (ABI 1.3, [`crate::ndp::sketch`]); `None` scores every key exactly.
    pub candidates: Option<usize>,
}

/// Checks a sparse ATTEND's argument tail (`TAIL_BYTES`): the attend part's reserved fields and
/// finite scale, the selection (as a selected SCORE_TOPK's, plus `CXLKV_NDP_SEL_SKETCH` with its
/// candidate count), and one scale for both. Returns the selection, the scale and the candidates.
pub fn parse_tail(tail: &[u8]) -> Result<(Select, f32, Option<usize>), DeviceStatus> {
    let args = |d: u32| DeviceStatus::at(CXLKV_NDP_ERR_ARGS, d as usize);
    if tail.len() < TAIL_BYTES {
        return Err(DeviceStatus::new(CXLKV_NDP_ERR_ARGS));
    }
    let a: cxlkv_ndp_attend = format::from_bytes(&tail[..16]);
    if a.reserved0 != 0 || a.reserved1 != 0 {
        return Err(args(CXLKV_NDP_DETAIL_BAD_OPTIONS));
    }
    if !a.scale.is_finite() {
        return Err(args(CXLKV_NDP_DETAIL_BAD_SCALE));
    }
    let mut w: cxlkv_ndp_select = format::from_bytes(&tail[16..TAIL_BYTES]);
    let candidates = if w.options & CXLKV_NDP_SEL_SKETCH != 0 {
        let c = w.candidates as usize;
        check_candidates(c)?;
        w.options &= !CXLKV_NDP_SEL_SKETCH;
        w.candidates = 0;
        Some(c)
    } else {
        None
    };
    let (sel, scale) = Select::from_abi(&w)?;
    if scale.to_bits() != a.scale.to_bits() {
        return Err(args(CXLKV_NDP_DETAIL_BAD_SCALE));
    }
    Ok((sel, scale, candidates))
}

/// Checks a key sketch's candidate count from the wire: 1..=`CXLKV_NDP_MAX_CANDIDATES`
/// (`CXLKV_NDP_ERR_ARGS`, detail `BAD_OPTIONS`, otherwise).
pub fn check_candidates(c: usize) -> Result<(), DeviceStatus> {
    if c == 0 || c > CXLKV_NDP_MAX_CANDIDATES as usize {
        return Err(DeviceStatus::at(
            CXLKV_NDP_ERR_ARGS,
            CXLKV_NDP_DETAIL_BAD_OPTIONS as usize,
        ));
    }
    Ok(())
}

/// The wire form of a sparse ATTEND's selection: [`Select::to_abi`], plus the sketch option and
/// its candidate count.
pub fn select_to_abi(sp: &Sparse, scale: f32) -> cxlkv_ndp_select {
    let mut w = sp.select.to_abi(scale);
    if let Some(c) = sp.candidates {
        w.options |= CXLKV_NDP_SEL_SKETCH;
        w.candidates = u32::try_from(c).unwrap_or(u32::MAX);
    }
    w
}

/// The union of the lists' tokens, ascending, each once.
pub fn union(lists: &[Vec<Hit>]) -> Vec<u32> {
    let mut u: Vec<u32> = lists.iter().flatten().map(|h| h.index).collect();
    u.sort_unstable();
    u.dedup();
    u
}

/// Per query, the softmax mass (over every token the selection saw) that the union leaves out:
/// `max(0, 1 - l_U exp(m_U - max) / sum)` in f64 with `(max, sum)` the query's log-sum-exp, 0 when
/// nothing was seen.
pub fn left_out(parts: &[Partial], log_sum_exp: &[(f64, f64)]) -> Vec<f32> {
    parts
        .iter()
        .zip(log_sum_exp)
        .map(|(p, &(max, sum))| {
            if sum <= 0.0 || p.sum <= 0.0 {
                return if sum <= 0.0 { 0.0 } else { 1.0 };
            }
            let held = f64::from(p.sum) * (f64::from(p.max) - max).exp() / sum;
            (1.0 - held).max(0.0) as f32
        })
        .collect()
}

/// Bytes of a sparse ATTEND result: ATTEND's, then `cxlkv_ndp_list_info [g]` at an 8-byte offset.
pub fn sparse_result_size(g: usize, dim: usize) -> Option<u64> {
    attend_result_size(g, dim)?
        .next_multiple_of(8)
        .checked_add(8 * g as u64)
}

/// Encodes a sparse ATTEND result: ATTEND's, with `bounds_off` naming one
/// `cxlkv_ndp_list_info` per query (`count` = `union_len`, the query's left-out mass) and
/// `bounds_match` the key rows re-scored on a sketch (`rescored`, 0 without one).
pub fn encode_sparse_result(
    parts: &[Partial],
    union_len: usize,
    left_out: &[f32],
    rescored: Option<usize>,
    stats: &ScanStats,
) -> Vec<u8> {
    let mut out = encode_attend_result(parts, stats);
    let at = out.len().next_multiple_of(8);
    out.resize(at, 0);
    for m in left_out {
        out.extend_from_slice(format::as_bytes(&cxlkv_ndp_list_info {
            count: union_len as u32,
            left_out_mass: *m,
        }));
    }
    let mut h: cxlkv_ndp_result = format::from_bytes(&out);
    h.bounds_off = at as u32;
    h.bounds_match = rescored.map_or(0, |c| c as u32);
    h.total_bytes = out.len() as u64;
    out[..64].copy_from_slice(format::as_bytes(&h));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndp::result::{decode_attend_result, decode_list_info};

    #[test]
    fn union_is_sorted_and_counts_each_token_once() {
        let h = |i| Hit {
            index: i,
            score: 0.0,
        };
        let lists = vec![vec![h(9), h(2), h(5)], vec![h(5), h(1)], vec![]];
        assert_eq!(union(&lists), vec![1, 2, 5, 9]);
        assert!(union(&[]).is_empty());
    }

    #[test]
    fn left_out_mass_from_the_partial_and_the_log_sum_exp() {
        // Three tokens with scaled scores 0, 0, ln 2: the union holds the last one.
        let p = Partial {
            out: vec![0.0; 16],
            max: std::f32::consts::LN_2,
            sum: 1.0,
        };
        let lse = (std::f64::consts::LN_2, 2.0);
        let m = left_out(std::slice::from_ref(&p), &[lse]);
        assert!((m[0] - 0.5).abs() < 1e-6, "{m:?}");
        assert_eq!(left_out(std::slice::from_ref(&p), &[(0.0, 0.0)]), vec![0.0]);
        let empty = Partial::empty(16);
        assert_eq!(left_out(&[empty], &[lse]), vec![1.0]);
    }

    #[test]
    fn the_result_is_attends_plus_one_list_info_per_query() {
        let parts: Vec<Partial> = (0..3)
            .map(|j| Partial {
                out: vec![j as f32; 16],
                max: 1.0,
                sum: 2.0,
            })
            .collect();
        let out =
            encode_sparse_result(&parts, 7, &[0.1, 0.2, 0.3], Some(40), &ScanStats::default());
        assert_eq!(out.len() as u64, sparse_result_size(3, 16).unwrap());
        let (back, _) = decode_attend_result(&out, 3, 16).unwrap();
        assert_eq!(back, parts);
        let info = decode_list_info(&out).unwrap();
        assert_eq!(info, vec![(7, 0.1), (7, 0.2), (7, 0.3)]);
        let h: cxlkv_ndp_result = format::from_bytes(&out);
        assert_eq!(h.bounds_match, 40);
    }

    #[test]
    fn tails_are_checked() {
        let tail_c = |scale: f32, sel_scale: f32, options: u32, candidates: u32| {
            let mut t = format::as_bytes(&cxlkv_ndp_attend {
                scale,
                ..Default::default()
            })
            .to_vec();
            t.extend_from_slice(format::as_bytes(&cxlkv_ndp_select {
                scale: sel_scale,
                options,
                candidates,
                ..Default::default()
            }));
            t
        };
        let tail = |scale, sel_scale, options| tail_c(scale, sel_scale, options, 0);
        assert!(parse_tail(&tail(0.5, 0.5, 0)).is_ok());
        let detail = |t: Vec<u8>| parse_tail(&t).unwrap_err().detail;
        assert_eq!(detail(tail(0.5, 0.25, 0)), CXLKV_NDP_DETAIL_BAD_SCALE);
        assert_eq!(
            detail(tail(f32::NAN, f32::NAN, 0)),
            CXLKV_NDP_DETAIL_BAD_SCALE
        );
        assert_eq!(detail(tail(0.5, 0.5, 1 << 9)), CXLKV_NDP_DETAIL_BAD_OPTIONS);
        assert_eq!(parse_tail(&[0; 8]).unwrap_err().code, CXLKV_NDP_ERR_ARGS);
        // The sketch option: its candidate count in 1..=MAX_CANDIDATES, none without it.
        let sk = CXLKV_NDP_SEL_SKETCH;
        let (_, _, c) = parse_tail(&tail_c(0.5, 0.5, sk, 300)).unwrap();
        assert_eq!(c, Some(300));
        for bad in [
            tail_c(0.5, 0.5, sk, 0),
            tail_c(0.5, 0.5, sk, CXLKV_NDP_MAX_CANDIDATES + 1),
            tail_c(0.5, 0.5, 0, 300),
        ] {
            assert_eq!(detail(bad), CXLKV_NDP_DETAIL_BAD_OPTIONS);
        }
        // A round trip through the wire form.
        let sp = Sparse {
            select: Select::default(),
            k: 9,
            candidates: Some(77),
        };
        let mut t = format::as_bytes(&cxlkv_ndp_attend {
            scale: 0.5,
            ..Default::default()
        })
        .to_vec();
        t.extend_from_slice(format::as_bytes(&select_to_abi(&sp, 0.5)));
        assert_eq!(parse_tail(&t).unwrap().2, Some(77));
    }
}
