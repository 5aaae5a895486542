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
    let g = queries.count();
    let mut scores = vec![0f32; SCAN_CHUNK_KEYS * g];
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
            for (q, sel) in selectors.iter_mut().enumerate() {
                sel.push_strided(base, scores, g, q);
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::rng::SplitMix64;
    use crate::topk::topk_by_sort;

    #[test]
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
}
