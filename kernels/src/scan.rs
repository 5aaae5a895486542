//! Fused scoring and top-k: one pass over the keys, scoring an L1-sized chunk for the whole GQA
//! group and feeding it to the selectors before the next chunk is read.

use crate::rows::{KeyRows, QueryGroup};
use crate::score::ScoreKernel;
use crate::topk::{GroupMode, Hit, TopK, TopKSelector};

/// Keys scored per chunk: small enough that the chunk's scores stay in L1.
pub const SCAN_CHUNK_KEYS: usize = 256;

/// The top-k of `queries` over all of `keys` (token `i` is row `i`): one list per query
/// ([`GroupMode::PerQuery`]) or one for the group ([`GroupMode::GroupMax`]), best first.
pub fn scan_topk(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    topk: TopK,
) -> Vec<Vec<Hit>> {
    let mut selectors = new_selectors(queries, topk);
    scan_into(kernel, queries, keys, 0, topk.mode, &mut selectors);
    selectors
        .into_iter()
        .map(TopKSelector::into_sorted)
        .collect()
}

/// One selector per result list of `topk` for this group.
pub fn new_selectors(queries: &QueryGroup<'_>, topk: TopK) -> Vec<TopKSelector> {
    (0..topk.lists(queries.count()))
        .map(|_| TopKSelector::new(topk.k))
        .collect()
}

/// Scores `keys` (token `base + i` is row `i`) and offers them to `selectors` (one per query, or
/// one for [`GroupMode::GroupMax`]).
pub fn scan_into(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    base: u32,
    mode: GroupMode,
    selectors: &mut [TopKSelector],
) {
    let mut scores = Vec::new();
    scan_chunks(kernel, queries, keys, base, mode, selectors, &mut scores);
}

/// [`scan_into`] with a score buffer that the caller keeps from one call to the next (scans that
/// feed many blocks): the chunk loop of every full and block-wise scan.
pub fn scan_chunks(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    base: u32,
    mode: GroupMode,
    selectors: &mut [TopKSelector],
    scores: &mut Vec<f32>,
) {
    let g = queries.count();
    scores.resize(SCAN_CHUNK_KEYS * g, 0.0);
    let mut start = 0;
    while start < keys.len() {
        let end = (start + SCAN_CHUNK_KEYS).min(keys.len());
        let chunk = &mut scores[..(end - start) * g];
        kernel.score(queries, &keys.slice(start, end), chunk);
        offer(chunk, g, base + start as u32, mode, selectors);
        start = end;
    }
}

/// Offers key-major `scores` of `g` queries (token `base + i` is row `i`) to `selectors`.
pub fn offer(scores: &[f32], g: usize, base: u32, mode: GroupMode, selectors: &mut [TopKSelector]) {
    match mode {
        GroupMode::PerQuery => {
            assert_eq!(selectors.len(), g, "one selector per query");
            offer_per_query(scores, g, base, selectors);
        }
        GroupMode::GroupMax => {
            assert_eq!(selectors.len(), 1, "one selector for the group");
            let sel = &mut selectors[0];
            for (i, row) in scores.chunks_exact(g).enumerate() {
                let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                sel.push(base + i as u32, best);
            }
        }
    }
}

/// Scores tested together against their queries' thresholds, one bit each in a mask.
const FILTER_SCORES: usize = 64;

/// [`offer`] for [`GroupMode::PerQuery`]. Once the selectors are warm almost every score falls
/// below its query's threshold, so the scores are tested in blocks of whole keys (at most
/// [`FILTER_SCORES`] scores) with one vector compare per four scores into a bit mask, and only
/// the scores whose bit is set are offered.
fn offer_per_query(scores: &[f32], g: usize, base: u32, selectors: &mut [TopKSelector]) {
    if g > FILTER_SCORES {
        for (q, sel) in selectors.iter_mut().enumerate() {
            sel.push_strided(base, scores, g, q);
        }
        return;
    }
    let keys_per_block = FILTER_SCORES / g;
    // Each score's threshold at the same position in a block, key-major like the scores.
    let mut floors = [f32::NEG_INFINITY; FILTER_SCORES];
    let refresh = |floors: &mut [f32; FILTER_SCORES], selectors: &[TopKSelector]| {
        for row in floors[..keys_per_block * g].chunks_exact_mut(g) {
            for (f, sel) in row.iter_mut().zip(selectors) {
                *f = sel.threshold();
            }
        }
    };
    refresh(&mut floors, selectors);
    for (b, block) in scores.chunks(keys_per_block * g).enumerate() {
        let mut hits = entry_mask(block, &floors);
        if hits == 0 {
            continue;
        }
        let first = base + (b * keys_per_block) as u32;
        while hits != 0 {
            let j = hits.trailing_zeros() as usize;
            hits &= hits - 1;
            selectors[j % g].push(first + (j / g) as u32, block[j]);
        }
        // A threshold changes (rises) only when its selector compacts: copy them again then.
        if floors
            .iter()
            .zip(selectors.iter())
            .any(|(&f, sel)| f != sel.threshold())
        {
            refresh(&mut floors, selectors);
        }
    }
}

/// Bit `j` set where `scores[j]` may enter a selector whose threshold is `floors[j]`: not below
/// it, NaN included (the test `push` makes). `scores` holds at most [`FILTER_SCORES`] values.
fn entry_mask(scores: &[f32], floors: &[f32; FILTER_SCORES]) -> u64 {
    debug_assert!(scores.len() <= FILTER_SCORES);
    #[cfg(target_arch = "x86_64")]
    let (mut mask, done) = entry_mask_sse(scores, floors);
    #[cfg(not(target_arch = "x86_64"))]
    let (mut mask, done) = (0u64, 0usize);
    for (j, (&s, &f)) in scores.iter().zip(floors).enumerate().skip(done) {
        mask |= u64::from((s >= f) | s.is_nan()) << j;
    }
    mask
}

/// [`entry_mask`] of the whole quads of `scores`, one compare per four, and how many scores
/// that covers.
#[cfg(target_arch = "x86_64")]
fn entry_mask_sse(scores: &[f32], floors: &[f32; FILTER_SCORES]) -> (u64, usize) {
    use std::arch::x86_64::{_mm_cmpnlt_ps, _mm_loadu_ps, _mm_movemask_ps};
    let quads = scores.chunks_exact(4);
    let done = scores.len() - quads.remainder().len();
    let mut mask = 0u64;
    for (i, (s, f)) in quads.zip(floors.chunks_exact(4)).enumerate() {
        // SAFETY: SSE is part of the x86-64 baseline; `s` and `f` are slices of four floats.
        // "Not less than" is also true for unordered (NaN) operands.
        let bits = unsafe {
            _mm_movemask_ps(_mm_cmpnlt_ps(
                _mm_loadu_ps(s.as_ptr()),
                _mm_loadu_ps(f.as_ptr()),
            ))
        };
        mask |= u64::from(bits as u32) << (4 * i);
    }
    (mask, done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::rng::SplitMix64;
    use crate::topk::topk_by_sort;

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn per_query_offer_in_pieces_matches_sort() {
        // Query 0's scores keep rising, so its hits keep changing under a low threshold, while
        // the other queries take their hits early and then hold high thresholds: a filter that
        // tested query 0's scores against another query's threshold would lose hits. Ties and
        // zeros of both signs come from the palette; the pieces are not multiples of the
        // filter block, and G = 3 leaves a partial quad per block, G = 65 > 64 scores a key.
        let mut rng = SplitMix64::new(12);
        let (n, k) = (1000, 20);
        let values = [-1.0, -0.0, 0.0, 0.5, 2.0];
        for g in [1, 3, 4, 65] {
            let scores: Vec<f32> = (0..n * g)
                .map(|j| {
                    let (i, q) = (j / g, j % g);
                    let v = values[rng.below(5) as usize];
                    match (q, i < 100) {
                        (0, _) => v + i as f32 / 8.0,
                        (_, true) => v + 1000.0,
                        _ => v,
                    }
                })
                .collect();
            let mut sel: Vec<TopKSelector> = (0..g).map(|_| TopKSelector::new(k)).collect();
            let mut start = 0;
            for piece in [1, 37, 16, 300, 646] {
                let part = &scores[start * g..(start + piece) * g];
                offer(part, g, start as u32, GroupMode::PerQuery, &mut sel);
                start += piece;
            }
            assert_eq!(start, n);
            for (q, sel) in sel.into_iter().enumerate() {
                let own: Vec<f32> = scores.iter().skip(q).step_by(g).copied().collect();
                assert_eq!(
                    sel.into_sorted(),
                    topk_by_sort(&own, k),
                    "G = {g}, query {q}"
                );
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn group_max_ranks_by_the_best_query() {
        let mut rng = SplitMix64::new(11);
        let (n, dim, g) = (300, 32, 3);
        let kb = rng.key_bytes(n, dim, DType::F16);
        let qv = rng.normal_vec(g * dim);
        let keys = KeyRows::new(&kb, DType::F16, dim).unwrap();
        let q = QueryGroup::new(&qv, dim).unwrap();
        let mut all = vec![0.0; n * g];
        ScoreKernel::scalar().score(&q, &keys, &mut all);
        let maxes: Vec<f32> = all
            .chunks(g)
            .map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max))
            .collect();
        let got = scan_topk(ScoreKernel::detect(), &q, &keys, TopK::group_max(10));
        assert_eq!(got, vec![topk_by_sort(&maxes, 10)]);
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn quantized_scans_agree_on_every_isa() {
        let mut rng = SplitMix64::new(13);
        for dtype in [DType::I8, DType::I4] {
            for (n, dim, g) in [(1001, 64, 1), (777, 128, 4), (301, 256, 7), (515, 16, 16)] {
                let x = rng.normal_vec(n * dim);
                let (codes, scales) = crate::quant::quantize_keys(&x, dim, dtype);
                let q = crate::quant::fold_key_scales(&rng.normal_vec(g * dim), dim, &scales);
                let keys = KeyRows::new(&codes, dtype, dim).unwrap();
                let q = QueryGroup::new(&q, dim).unwrap();
                let mut all = vec![0.0; n * g];
                ScoreKernel::scalar().score(&q, &keys, &mut all);
                for topk in [TopK::per_query(40), TopK::group_max(9)] {
                    let want = scan_topk(ScoreKernel::scalar(), &q, &keys, topk);
                    if topk.mode == GroupMode::PerQuery {
                        let own: Vec<f32> = all.iter().step_by(g).copied().collect();
                        assert_eq!(want[0], topk_by_sort(&own, 40));
                    }
                    for kernel in ScoreKernel::all_available() {
                        let got = scan_topk(kernel, &q, &keys, topk);
                        assert_eq!(got, want, "{kernel:?} {dtype:?} {n} {dim} {g}");
                    }
                }
            }
        }
    }
}
