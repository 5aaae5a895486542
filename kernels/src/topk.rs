//! Streaming top-k selection of `(token index, score)` pairs.
//!
//! [`TopKSelector`] keeps at most `2k` candidates; when the buffer fills it keeps the `k` best
//! (`select_nth_unstable`, linear time) and remembers the worst of them as a running threshold.
//! Once `k` candidates have been seen, most new scores are rejected by a single float compare
//! against that threshold.
//!
//! Ranking (the crate-wide rule): higher score first; equal scores (`-0.0 == +0.0`) by lower token
//! index. Indices are unique within a scan, so the order is total and the final top-k list is the
//! same whatever order candidates arrive in: full scan, pruned scan, threads or SIMD flavour.

use std::cmp::Ordering;

/// One selected key: its token index and its (unscaled) score `q·k`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    /// Token index (row of the scanned keys, plus the scan's base index).
    pub index: u32,
    /// Score `q·k` as computed in the canonical order.
    pub score: f32,
}

/// Zeros of either sign rank as one value.
#[inline]
fn rank_score(s: f32) -> f32 {
    if s == 0.0 {
        0.0
    } else {
        s
    }
}

impl Hit {
    /// Ranking order: `Less` means `self` ranks before (is better than) `other`.
    #[inline]
    pub fn rank_cmp(&self, other: &Hit) -> Ordering {
        rank_score(other.score)
            .total_cmp(&rank_score(self.score))
            .then(self.index.cmp(&other.index))
    }

    /// True if `self` ranks strictly before `other`.
    #[inline]
    pub fn beats(&self, other: &Hit) -> bool {
        self.rank_cmp(other) == Ordering::Less
    }
}

/// How a group's `G` queries share a top-k.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupMode {
    /// One top-k list per query.
    PerQuery,
    /// One list for the group, ranking each key by its maximum score over the `G` queries.
    GroupMax,
}

/// A top-k request: how many hits and how the group shares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TopK {
    /// Hits wanted per list (fewer if fewer keys exist).
    pub k: usize,
    /// Per query or group maximum.
    pub mode: GroupMode,
}

impl TopK {
    /// `k` best per query.
    pub fn per_query(k: usize) -> TopK {
        TopK {
            k,
            mode: GroupMode::PerQuery,
        }
    }

    /// `k` best by the group's maximum score.
    pub fn group_max(k: usize) -> TopK {
        TopK {
            k,
            mode: GroupMode::GroupMax,
        }
    }

    /// Number of result lists for a group of `g` queries.
    pub fn lists(&self, g: usize) -> usize {
        match self.mode {
            GroupMode::PerQuery => g,
            GroupMode::GroupMax => 1,
        }
    }
}

/// Streaming selection of the `k` best hits (see the module documentation).
#[derive(Clone, Debug)]
pub struct TopKSelector {
    k: usize,
    capacity: usize,
    buf: Vec<Hit>,
    /// Worst of the `k` kept hits after the last compaction, once `k` were seen.
    floor: Option<Hit>,
    /// `floor.score`, or -inf before: a score below it can never enter.
    floor_score: f32,
}

impl TopKSelector {
    /// A selector for the `k` best hits.
    pub fn new(k: usize) -> TopKSelector {
        let capacity = (2 * k).max(k + 32);
        TopKSelector {
            k,
            capacity,
            buf: Vec::with_capacity(if k == 0 { 0 } else { capacity }),
            floor: None,
            floor_score: f32::NEG_INFINITY,
        }
    }

    /// The `k` this selector keeps.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Offers key `index` with `score`.
    #[inline]
    pub fn push(&mut self, index: u32, score: f32) {
        // The one-compare rejection that most candidates take once the selector is warm.
        if score < self.floor_score {
            return;
        }
        self.push_slow(Hit { index, score });
    }

    #[inline(never)]
    fn push_slow(&mut self, hit: Hit) {
        if self.k == 0 {
            return;
        }
        if let Some(floor) = self.floor {
            if !hit.beats(&floor) {
                return;
            }
        }
        self.buf.push(hit);
        if self.buf.len() >= self.capacity {
            self.compact();
        }
    }

    /// A score below this can never enter (`-inf` until `k` hits were seen); a score at or above
    /// it, or NaN, may.
    #[inline]
    pub fn threshold(&self) -> f32 {
        self.floor_score
    }

    /// Offers keys `base + i` with scores `scores[i * stride + offset]` for every `i`.
    #[inline]
    pub fn push_strided(&mut self, base: u32, scores: &[f32], stride: usize, offset: usize) {
        let mut floor = self.floor_score;
        let mut index = base;
        let mut at = offset;
        while at < scores.len() {
            let score = scores[at];
            // Same test as `push`, with the threshold held in a register between rejections.
            if score >= floor || score.is_nan() {
                self.push_slow(Hit { index, score });
                floor = self.floor_score;
            }
            at += stride;
            index += 1;
        }
    }

    /// Offers every hit of `hits` (for merging partial results).
    pub fn extend(&mut self, hits: &[Hit]) {
        for h in hits {
            self.push(h.index, h.score);
        }
    }

    /// Keeps the `k` best candidates and raises the threshold to the worst of them.
    fn compact(&mut self) {
        if self.buf.len() > self.k {
            self.buf
                .select_nth_unstable_by(self.k - 1, |a, b| a.rank_cmp(b));
            self.buf.truncate(self.k);
        }
        if self.buf.len() == self.k && self.k > 0 {
            let worst = *self
                .buf
                .iter()
                .max_by(|a, b| a.rank_cmp(b))
                .expect("k > 0 hits");
            self.floor = Some(worst);
            self.floor_score = worst.score;
        }
    }

    /// The current `k`-th best hit, if `k` hits have been offered: a key must beat it to enter.
    pub fn kth(&mut self) -> Option<Hit> {
        if self.k == 0 || self.buf.len() < self.k {
            return self.floor;
        }
        if self.buf.len() > self.k || self.floor.is_none() {
            self.compact();
        }
        self.floor
    }

    /// The `min(k, offered)` best hits, best first.
    pub fn into_sorted(mut self) -> Vec<Hit> {
        self.compact();
        self.buf.sort_unstable_by(|a, b| a.rank_cmp(b));
        self.buf
    }
}

/// The `k` best of `scores` (index `i` is token `i`), best first, by full sort: the reference.
pub fn topk_by_sort(scores: &[f32], k: usize) -> Vec<Hit> {
    let mut all: Vec<Hit> = scores
        .iter()
        .enumerate()
        .map(|(i, &score)| Hit {
            index: i as u32,
            score,
        })
        .collect();
    all.sort_by(|a, b| a.rank_cmp(b));
    all.truncate(k);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn ties_go_to_the_lower_index() {
        let mut s = TopKSelector::new(2);
        for i in [5u32, 3, 9, 1, 7] {
            s.push(i, 1.0);
        }
        s.push(8, -0.0);
        let got: Vec<u32> = s.into_sorted().iter().map(|h| h.index).collect();
        assert_eq!(got, vec![1, 3]);
        let a = Hit {
            index: 1,
            score: -0.0,
        };
        let b = Hit {
            index: 2,
            score: 0.0,
        };
        assert!(a.beats(&b) && !b.beats(&a));
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn matches_sort_in_any_arrival_order() {
        let mut rng = SplitMix64::new(3);
        for &k in &[0usize, 1, 2, 7, 64, 300] {
            for &n in &[0usize, 1, 5, 100, 1000] {
                let scores: Vec<f32> = (0..n).map(|_| (rng.below(20) as f32) - 10.0).collect();
                let want = topk_by_sort(&scores, k);
                let mut order: Vec<usize> = (0..n).collect();
                for i in (1..n).rev() {
                    order.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let mut sel = TopKSelector::new(k);
                for &i in &order {
                    sel.push(i as u32, scores[i]);
                }
                if n >= k && k > 0 {
                    assert_eq!(sel.kth(), want.last().copied());
                }
                assert_eq!(sel.into_sorted(), want, "k={k} n={n}");
            }
        }
    }
}
