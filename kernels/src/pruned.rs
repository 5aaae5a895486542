//! Exact top-k with block pruning.
//!
//! Blocks are visited in descending order of their upper bound (the group's maximum bound for a
//! block). A block is skipped when no query could admit any of its keys: for every query, the
//! block's bound is strictly below that query's current `k`-th best score. Because the bound is a
//! true upper bound of every *computed* score (see [`crate::bounds`]) and a key that merely ties
//! the `k`-th score could still win on a lower index, skipping needs a strict inequality. The
//! result is exactly the full scan's top-k; only the number of keys read changes.

use crate::bounds::BlockBounds;
use crate::rows::{KeyRows, QueryGroup};
use crate::scan::{new_selectors, offer};
use crate::score::ScoreKernel;
use crate::topk::{GroupMode, Hit, TopK, TopKSelector};

/// What pruning saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PruneStats {
    /// Blocks covering the scanned keys.
    pub blocks_total: usize,
    /// Blocks whose keys were read and scored.
    pub blocks_scanned: usize,
    /// Blocks skipped on their bound.
    pub blocks_skipped: usize,
    /// Key bytes not read thanks to skipping.
    pub bytes_skipped: u64,
    /// Key bytes read.
    pub bytes_scanned: u64,
}

impl PruneStats {
    /// Fraction of blocks skipped (0 when there are none).
    pub fn skipped_fraction(&self) -> f64 {
        if self.blocks_total == 0 {
            0.0
        } else {
            self.blocks_skipped as f64 / self.blocks_total as f64
        }
    }

    /// Adds `other`'s counts to `self`.
    pub fn accumulate(&mut self, other: &PruneStats) {
        self.blocks_total += other.blocks_total;
        self.blocks_scanned += other.blocks_scanned;
        self.blocks_skipped += other.blocks_skipped;
        self.bytes_skipped += other.bytes_skipped;
        self.bytes_scanned += other.bytes_scanned;
    }
}

/// The exact top-k of `queries` over `keys` (same result as [`crate::scan::scan_topk`]), reading
/// only the blocks whose bound can still matter. `bounds` must have been built from the same keys;
/// it may cover more tokens than `keys` holds (a causal prefix): bounds over a superset are still
/// bounds.
pub fn pruned_topk(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    bounds: &BlockBounds,
    topk: TopK,
) -> (Vec<Vec<Hit>>, PruneStats) {
    assert_eq!(bounds.dim(), keys.dim(), "bounds of another head dimension");
    assert!(
        bounds.tokens() >= keys.len(),
        "bounds cover fewer tokens than the keys"
    );
    let g = queries.count();
    let n = keys.len();
    let blocks = n.div_ceil(bounds.block_tokens());
    // Per block: the bound of each query, and the group's maximum for the visiting order.
    let mut bound = vec![0f32; blocks * g];
    let mut order: Vec<(f32, usize)> = Vec::with_capacity(blocks);
    for b in 0..blocks {
        let row = &mut bound[b * g..(b + 1) * g];
        for (q, slot) in row.iter_mut().enumerate() {
            *slot = bounds.upper_bound(queries.query(q), b);
        }
        let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        order.push((best, b));
    }
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));

    let mut selectors = new_selectors(queries, topk);
    let mut stats = PruneStats {
        blocks_total: blocks,
        ..PruneStats::default()
    };
    let mut scores = vec![0f32; bounds.block_tokens() * g];
    let row_bytes = keys.row_bytes() as u64;
    for (visit, &(group_bound, b)) in order.iter().enumerate() {
        let (start, end) = bounds.block_range(b);
        let end = end.min(n);
        if can_skip(
            &mut selectors,
            topk.mode,
            group_bound,
            &bound[b * g..(b + 1) * g],
        ) {
            stats.blocks_skipped += 1;
            stats.bytes_skipped += (end - start) as u64 * row_bytes;
            if single_threshold(topk.mode, g) {
                // One threshold that only rises, bounds that only fall: nothing later can enter.
                for &(_, rest) in &order[visit + 1..] {
                    let (s, e) = bounds.block_range(rest);
                    stats.blocks_skipped += 1;
                    stats.bytes_skipped += (e.min(n) - s) as u64 * row_bytes;
                }
                break;
            }
            continue;
        }
        let chunk = &mut scores[..(end - start) * g];
        kernel.score(queries, &keys.slice(start, end), chunk);
        offer(chunk, g, start as u32, topk.mode, &mut selectors);
        stats.blocks_scanned += 1;
        stats.bytes_scanned += (end - start) as u64 * row_bytes;
    }
    let hits = selectors
        .into_iter()
        .map(TopKSelector::into_sorted)
        .collect();
    (hits, stats)
}

fn single_threshold(mode: GroupMode, g: usize) -> bool {
    mode == GroupMode::GroupMax || g == 1
}

/// True if no key of a block with these bounds can enter any list.
fn can_skip(
    selectors: &mut [TopKSelector],
    mode: GroupMode,
    group_bound: f32,
    bounds: &[f32],
) -> bool {
    match mode {
        GroupMode::GroupMax => selectors[0]
            .kth()
            .is_some_and(|kth| group_bound < kth.score),
        GroupMode::PerQuery => selectors
            .iter_mut()
            .zip(bounds)
            .all(|(sel, &bound)| sel.kth().is_some_and(|kth| bound < kth.score)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounds::block_bounds;
    use crate::dtype::DType;
    use crate::rng::SplitMix64;
    use crate::scan::scan_topk;

    #[test]
    fn equals_the_full_scan_and_prunes_clustered_keys() {
        let mut rng = SplitMix64::new(21);
        let (n, dim) = (1000, 32);
        // Keys drift slowly along a direction, so blocks differ and bounds can prune.
        let mut kv = Vec::new();
        for i in 0..n {
            for d in 0..dim {
                let x = if d == 0 {
                    i as f32 / 100.0
                } else {
                    0.1 * rng.normal()
                };
                crate::rng::push_elem(&mut kv, DType::F16, x);
            }
        }
        let keys = KeyRows::new(&kv, DType::F16, dim).unwrap();
        let bounds = block_bounds(&keys, 16);
        let mut qv = vec![0.0; dim];
        qv[0] = 1.0;
        let q = QueryGroup::new(&qv, dim).unwrap();
        let k = TopK::per_query(20);
        let full = scan_topk(ScoreKernel::scalar(), &q, &keys, k);
        let (pruned, stats) = pruned_topk(ScoreKernel::detect(), &q, &keys, &bounds, k);
        assert_eq!(pruned, full);
        assert_eq!(stats.blocks_total, 63);
        assert_eq!(stats.blocks_scanned + stats.blocks_skipped, 63);
        assert!(stats.blocks_skipped > 50, "{stats:?}");
        assert_eq!(
            stats.bytes_scanned + stats.bytes_skipped,
            (n * dim * 2) as u64
        );
    }
}
