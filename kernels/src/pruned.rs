//! Exact top-k with block pruning: the block-wise scan that every engine runs.
//!
//! Keys come in blocks, each with an element-wise key minimum and maximum ([`crate::bounds`]).
//! Blocks are visited in descending order of their upper bound (the group's maximum bound for a
//! block). A block is skipped when no query could admit any of its keys: for every list, the
//! block's bound is strictly below that list's current `k`-th best score. Because the bound is a
//! true upper bound of every *computed* score (see [`crate::bounds`]) and a key that merely ties
//! the `k`-th score could still win on a lower index, skipping needs a strict inequality. The
//! result is exactly the full scan's top-k; only the number of keys read changes.
//!
//! That argument is written once, here: [`VisitOrder`] is the order, [`can_skip`] the test and
//! [`PrunedScan`] the loop (which block to read next, what was skipped). What scores a block and
//! keeps the lists is a [`BlockScorer`]: [`KernelScorer`] runs this crate's kernels (the same
//! chunk loop as [`crate::scan::scan_topk`]); the device emulator's HLS engine is another.
//! [`pruned_topk`] runs the scan over one key array cut into [`BlockBounds`] blocks; the NDP
//! device and its host fallback run it over a pool's typed blocks.

use crate::bounds::{upper_bound, BlockBounds};
use crate::rows::{KeyRows, QueryGroup};
use crate::scan::{new_selectors, scan_chunks};
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

/// Scores key blocks into top-k lists: the part of a [`PrunedScan`] that an engine supplies.
/// Implementations rank with the crate's total order and score in the canonical summation order,
/// so every engine returns the same lists.
pub trait BlockScorer {
    /// How the group's queries share the lists (one list per query, or one for the group).
    fn mode(&self) -> GroupMode;
    /// The `k`-th best score of list `list`, or `None` while the list holds fewer than `k` hits.
    fn kth_score(&mut self, list: usize) -> Option<f32>;
    /// Scores every row of `keys` (token `base + i` is row `i`) and offers them to the lists.
    fn score_block(&mut self, keys: &KeyRows<'_>, base: u32);
    /// The lists, best first.
    fn into_lists(self) -> Vec<Vec<Hit>>;
}

/// This crate's kernels as a [`BlockScorer`]: a [`ScoreKernel`] scores each block in chunks of
/// [`crate::scan::SCAN_CHUNK_KEYS`] keys for the whole group, [`TopKSelector`]s keep the lists.
pub struct KernelScorer<'q> {
    kernel: ScoreKernel,
    queries: QueryGroup<'q>,
    mode: GroupMode,
    selectors: Vec<TopKSelector>,
    /// One chunk's scores, kept from block to block.
    scores: Vec<f32>,
}

impl<'q> KernelScorer<'q> {
    /// Lists of the `topk.k` best keys for `queries`, scored with `kernel`.
    pub fn new(kernel: ScoreKernel, queries: &QueryGroup<'q>, topk: TopK) -> KernelScorer<'q> {
        KernelScorer {
            kernel,
            queries: *queries,
            mode: topk.mode,
            selectors: new_selectors(queries, topk),
            scores: Vec::new(),
        }
    }
}

impl BlockScorer for KernelScorer<'_> {
    fn mode(&self) -> GroupMode {
        self.mode
    }

    fn kth_score(&mut self, list: usize) -> Option<f32> {
        self.selectors[list].kth().map(|h| h.score)
    }

    fn score_block(&mut self, keys: &KeyRows<'_>, base: u32) {
        scan_chunks(
            self.kernel,
            &self.queries,
            keys,
            base,
            self.mode,
            &mut self.selectors,
            &mut self.scores,
        );
    }

    fn into_lists(self) -> Vec<Vec<Hit>> {
        self.selectors
            .into_iter()
            .map(TopKSelector::into_sorted)
            .collect()
    }
}

/// Key blocks in the order a scan visits them, with the key bytes of each and, for a pruned
/// scan, the per-query upper bounds of each.
#[derive(Clone, Debug)]
pub struct VisitOrder {
    /// Queries per block in `bounds`.
    g: usize,
    /// `blocks × g` upper bounds, block-major; empty when nothing may be skipped.
    bounds: Vec<f32>,
    /// Block indices, first visited first.
    order: Vec<usize>,
    /// Key bytes of block `b` at `bytes[b]`.
    bytes: Vec<u64>,
}

impl VisitOrder {
    /// Every block in list order, none skippable: a full scan. `bytes[b]` is block `b`'s key bytes.
    pub fn in_order(bytes: Vec<u64>) -> VisitOrder {
        VisitOrder {
            g: 0,
            bounds: Vec::new(),
            order: (0..bytes.len()).collect(),
            bytes,
        }
    }

    /// The blocks by their group bound (the highest of the queries' [`upper_bound`]s), highest
    /// first, ties in list order. `bytes[b]` is block `b`'s key bytes and `bounds(b)` its
    /// element-wise key `(min, max)`.
    pub fn by_bound<'b>(
        queries: &QueryGroup<'_>,
        bytes: Vec<u64>,
        mut bounds: impl FnMut(usize) -> (&'b [f32], &'b [f32]),
    ) -> VisitOrder {
        let (g, blocks) = (queries.count(), bytes.len());
        let mut ub = vec![0f32; blocks * g];
        let mut order: Vec<(f32, usize)> = Vec::with_capacity(blocks);
        for b in 0..blocks {
            let (lo, hi) = bounds(b);
            let row = &mut ub[b * g..(b + 1) * g];
            for (q, slot) in row.iter_mut().enumerate() {
                *slot = upper_bound(queries.query(q), lo, hi);
            }
            order.push((row.iter().copied().fold(f32::NEG_INFINITY, f32::max), b));
        }
        order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        VisitOrder {
            g,
            bounds: ub,
            order: order.into_iter().map(|(_, b)| b).collect(),
            bytes,
        }
    }

    /// Block indices in visiting order.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// The per-query upper bounds of block `b`, or `None` in a full scan.
    pub fn bounds(&self, b: usize) -> Option<&[f32]> {
        (!self.bounds.is_empty()).then(|| &self.bounds[b * self.g..(b + 1) * self.g])
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True if there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// The skip rule: true if no key of a block whose per-query upper bounds are `ub` can enter any
/// of `scorer`'s lists, that is if each bound is strictly below its list's `k`-th score (with
/// [`GroupMode::GroupMax`], the group's highest bound below the one list's).
pub fn can_skip(scorer: &mut impl BlockScorer, ub: &[f32]) -> bool {
    match scorer.mode() {
        GroupMode::GroupMax => {
            let best = ub.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            scorer.kth_score(0).is_some_and(|kth| best < kth)
        }
        GroupMode::PerQuery => ub
            .iter()
            .enumerate()
            .all(|(q, &bound)| scorer.kth_score(q).is_some_and(|kth| bound < kth)),
    }
}

/// A top-k scan over key blocks: [`PrunedScan::next_block`] names the next block to read
/// (skipping, and counting, those the rule excludes), the caller hands its keys to
/// [`PrunedScan::scan`], and [`PrunedScan::finish`] returns the lists. Whatever the visiting order
/// or the skipping, the lists equal the full scan's.
pub struct PrunedScan<S> {
    scorer: S,
    visits: VisitOrder,
    /// Position in the visiting order of the next block to consider.
    next: usize,
    stats: PruneStats,
}

impl<S: BlockScorer> PrunedScan<S> {
    /// A scan of the blocks of `visits` into `scorer`'s lists.
    pub fn new(scorer: S, visits: VisitOrder) -> PrunedScan<S> {
        let stats = PruneStats {
            blocks_total: visits.len(),
            ..PruneStats::default()
        };
        PrunedScan {
            scorer,
            visits,
            next: 0,
            stats,
        }
    }

    /// The next block whose keys must be scanned, or `None` when the scan is complete. Blocks that
    /// cannot matter are skipped on the way. With a single threshold (one list) the first skipped
    /// block ends the scan: the threshold only rises and the remaining bounds only fall.
    pub fn next_block(&mut self) -> Option<usize> {
        while let Some(&b) = self.visits.order.get(self.next) {
            self.next += 1;
            let Some(ub) = self.visits.bounds(b) else {
                return Some(b);
            };
            if !can_skip(&mut self.scorer, ub) {
                return Some(b);
            }
            self.skipped(b);
            if self.scorer.mode() == GroupMode::GroupMax || self.visits.g == 1 {
                while let Some(&rest) = self.visits.order.get(self.next) {
                    self.next += 1;
                    self.skipped(rest);
                }
            }
        }
        None
    }

    fn skipped(&mut self, b: usize) {
        self.stats.blocks_skipped += 1;
        self.stats.bytes_skipped += self.visits.bytes[b];
    }

    /// Scores the keys of the block [`PrunedScan::next_block`] returned (token `base + i` is row
    /// `i`).
    pub fn scan(&mut self, keys: &KeyRows<'_>, base: u32) {
        self.scorer.score_block(keys, base);
        self.stats.blocks_scanned += 1;
        self.stats.bytes_scanned += keys.byte_len() as u64;
    }

    /// Counts so far.
    pub fn stats(&self) -> &PruneStats {
        &self.stats
    }

    /// The lists, best first, and the counts.
    pub fn finish(self) -> (Vec<Vec<Hit>>, PruneStats) {
        (self.scorer.into_lists(), self.stats)
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
    let n = keys.len();
    let range = |b: usize| {
        let (start, end) = bounds.block_range(b);
        (start, end.min(n))
    };
    let bytes = (0..n.div_ceil(bounds.block_tokens()))
        .map(|b| {
            let (start, end) = range(b);
            ((end - start) * keys.row_bytes()) as u64
        })
        .collect();
    let visits = VisitOrder::by_bound(queries, bytes, |b| (bounds.min(b), bounds.max(b)));
    let mut scan = PrunedScan::new(KernelScorer::new(kernel, queries, topk), visits);
    while let Some(b) = scan.next_block() {
        let (start, end) = range(b);
        scan.scan(&keys.slice(start, end), start as u32);
    }
    scan.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounds::block_bounds;
    use crate::dtype::DType;
    use crate::rng::SplitMix64;
    use crate::scan::scan_topk;

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
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

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn every_mode_and_group_equals_the_full_scan() {
        // Clustered keys in uneven blocks; G = 3 per query (three thresholds, no early end) and
        // group max (one threshold), a prefix shorter than the bounds, and a full scan in order.
        let mut rng = SplitMix64::new(22);
        let (n, dim, g) = (1500, 32, 3);
        let mut kv = Vec::new();
        let mut center = rng.normal_vec(dim);
        for i in 0..n {
            if i % 97 == 0 {
                center = rng.normal_vec(dim);
            }
            for c in &center {
                crate::rng::push_elem(&mut kv, DType::F16, c + 0.05 * rng.normal());
            }
        }
        let all = KeyRows::new(&kv, DType::F16, dim).unwrap();
        let bounds = block_bounds(&all, 50);
        let qv = rng.normal_vec(g * dim);
        let q = QueryGroup::new(&qv, dim).unwrap();
        for keys in [all, all.slice(0, 1234)] {
            for topk in [TopK::per_query(7), TopK::group_max(7)] {
                let full = scan_topk(ScoreKernel::scalar(), &q, &keys, topk);
                let (pruned, stats) = pruned_topk(ScoreKernel::detect(), &q, &keys, &bounds, topk);
                assert_eq!(pruned, full, "{topk:?} over {} keys", keys.len());
                assert_eq!(stats.blocks_total, keys.len().div_ceil(50));
                assert_eq!(
                    stats.blocks_scanned + stats.blocks_skipped,
                    stats.blocks_total
                );
                assert!(stats.blocks_skipped > 0, "{topk:?}: {stats:?}");
                assert_eq!(
                    stats.bytes_scanned + stats.bytes_skipped,
                    keys.byte_len() as u64
                );
                let bytes = (0..stats.blocks_total)
                    .map(|b| ((50 * (b + 1)).min(keys.len()) - 50 * b) as u64 * 64)
                    .collect();
                let mut scan = PrunedScan::new(
                    KernelScorer::new(ScoreKernel::detect(), &q, topk),
                    VisitOrder::in_order(bytes),
                );
                let mut visited = Vec::new();
                while let Some(b) = scan.next_block() {
                    visited.push(b);
                    let end = (50 * (b + 1)).min(keys.len());
                    scan.scan(&keys.slice(50 * b, end), (50 * b) as u32);
                }
                assert_eq!(visited, (0..stats.blocks_total).collect::<Vec<_>>());
                let (lists, st) = scan.finish();
                assert_eq!(lists, full);
                assert_eq!(st.blocks_scanned, stats.blocks_total);
            }
        }
    }
}
