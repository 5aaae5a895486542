//! Eviction policies: which block to give up when a tier is full.
//!
//! A policy orders the blocks of one tier, numbered `0..blocks` (a partition's blocks for the pool
//! owner, a tier's slots in the `cxlkv-tier` crate, cache slots for its trace simulator (`replay`):
//! all three run this same code). Four are provided:
//!
//! - [`Lru`]: least recently used.
//! - [`LfuDecay`]: least frequently used, with exponentially decayed counts (a half-life in
//!   accesses), so yesterday's favourites age out.
//! - [`PrefixAware`]: decayed frequency, but only *leaves* of cached prefix chains are candidates:
//!   a block that starts cached chains is what makes its descendants reachable as prefix hits, so it
//!   goes only after them.
//! - [`Belady`]: the offline optimum for plain caching (evict the block used farthest in the
//!   future), fed with next-use times by a trace replay; a reference line, not a runtime policy.

use std::collections::BTreeSet;

/// An eviction policy over the blocks of one tier (numbered `0..blocks`).
pub trait EvictionPolicy: Send {
    /// A block became indexed.
    fn insert(&mut self, block: u32);
    /// A block was read by its owner.
    fn touch(&mut self, block: u32);
    /// A block left the index (deleted, replaced or evicted).
    fn remove(&mut self, block: u32);
    /// Removes and returns the next victim, or `None` when no block is tracked.
    fn victim(&mut self) -> Option<u32>;
    /// Hint: `child` continues the key chain whose previous block is `parent` (both tracked).
    /// Policies that do not care about prefix structure ignore it.
    fn link(&mut self, child: u32, parent: u32) {
        let _ = (child, parent);
    }
    /// Hint from an offline replay: `block`'s next access is at logical time `next` (`u64::MAX`:
    /// never). Given before the access's `insert`/`touch`. Only [`Belady`] uses it.
    fn next_use(&mut self, block: u32, next: u64) {
        let _ = (block, next);
    }
}

/// The policies this crate provides, by name (for configuration, the CLI and reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyKind {
    /// [`Lru`].
    Lru,
    /// [`LfuDecay`].
    LfuDecay,
    /// [`PrefixAware`].
    PrefixAware,
    /// [`Belady`] (offline: needs next-use hints).
    Belady,
}

impl PolicyKind {
    /// Every policy, the online ones first and the offline reference last.
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::Lru,
        PolicyKind::LfuDecay,
        PolicyKind::PrefixAware,
        PolicyKind::Belady,
    ];

    /// Short name: `lru`, `lfu-decay`, `prefix-aware`, `belady`.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::LfuDecay => "lfu-decay",
            PolicyKind::PrefixAware => "prefix-aware",
            PolicyKind::Belady => "belady",
        }
    }

    /// Parses a short name (also accepts `lfu` and `prefix`).
    pub fn parse(s: &str) -> Option<PolicyKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "lru" => Some(PolicyKind::Lru),
            "lfu" | "lfu-decay" | "lfu_decay" => Some(PolicyKind::LfuDecay),
            "prefix" | "prefix-aware" | "prefix_aware" => Some(PolicyKind::PrefixAware),
            "belady" | "opt" | "min" => Some(PolicyKind::Belady),
            _ => None,
        }
    }

    /// True for the offline reference, which needs [`EvictionPolicy::next_use`] hints.
    pub fn is_offline(self) -> bool {
        self == PolicyKind::Belady
    }

    /// A policy of this kind over `blocks` blocks, with default tuning (decay half-life of one
    /// tier's worth of accesses; prefix-aware insertions count half an access).
    pub fn build(self, blocks: usize) -> Box<dyn EvictionPolicy> {
        self.build_for(blocks, blocks)
    }

    /// A policy tuned for a tier of `capacity` blocks whose block numbers run to `blocks`
    /// (≥ `capacity`): the tuning follows the capacity, the tables the numbering.
    pub fn build_for(self, capacity: usize, blocks: usize) -> Box<dyn EvictionPolicy> {
        let half_life = (capacity as f64).max(1.0);
        match self {
            PolicyKind::Lru => Box::new(Lru::new(blocks)),
            PolicyKind::LfuDecay => Box::new(LfuDecay::new(blocks, half_life)),
            // Tuned on the conversation trace (data/traces): an insertion counts half an access.
            PolicyKind::PrefixAware => {
                Box::new(PrefixAware::new(blocks, half_life).with_insert_weight(0.5))
            }
            PolicyKind::Belady => Box::new(Belady::new(blocks)),
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

const NIL: u32 = u32::MAX;

/// Least recently used: an intrusive doubly linked list over block numbers, O(1) per operation.
#[derive(Debug)]
pub struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    head: u32, // most recent
    tail: u32, // least recent
}

impl Lru {
    /// An empty LRU over `blocks` blocks.
    pub fn new(blocks: usize) -> Lru {
        Lru {
            prev: vec![NIL; blocks],
            next: vec![NIL; blocks],
            linked: vec![false; blocks],
            head: NIL,
            tail: NIL,
        }
    }

    fn unlink(&mut self, b: u32) {
        let i = b as usize;
        if !self.linked[i] {
            return;
        }
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n
        } else {
            self.next[p as usize] = n
        }
        if n == NIL {
            self.tail = p
        } else {
            self.prev[n as usize] = p
        }
        self.linked[i] = false;
    }

    fn push_front(&mut self, b: u32) {
        let i = b as usize;
        self.prev[i] = NIL;
        self.next[i] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = b;
        } else {
            self.tail = b;
        }
        self.head = b;
        self.linked[i] = true;
    }
}

impl EvictionPolicy for Lru {
    fn insert(&mut self, block: u32) {
        self.unlink(block);
        self.push_front(block);
    }
    fn touch(&mut self, block: u32) {
        if self.linked[block as usize] {
            self.unlink(block);
            self.push_front(block);
        }
    }
    fn remove(&mut self, block: u32) {
        self.unlink(block);
    }
    fn victim(&mut self) -> Option<u32> {
        let t = self.tail;
        (t != NIL).then(|| {
            self.unlink(t);
            t
        })
    }
}

/// Exponentially decayed access counts: an access at logical time `t` adds `2^(t / half_life)`,
/// so comparing sums compares counts decayed to a common time without touching every block on each
/// tick. Values are renormalized (all divided by a power of two, exactly) before they overflow.
#[derive(Debug)]
struct DecayedScores {
    score: Vec<f64>,
    now: u64,
    half_life: f64,
    offset: f64,
}

/// Exponent at which scores are scaled down (2^900 < f64::MAX ≈ 2^1024).
const RENORM_EXP: f64 = 900.0;

impl DecayedScores {
    fn new(blocks: usize, half_life: f64) -> Self {
        DecayedScores {
            score: vec![0.0; blocks],
            now: 0,
            half_life: half_life.max(1.0),
            offset: 0.0,
        }
    }

    /// Advances time by one access and returns that access's weight, or `None` when every score
    /// must first be renormalized (the caller rebuilds its order after [`Self::renormalize`]).
    fn weight(&mut self) -> Option<f64> {
        self.now += 1;
        let e = self.now as f64 / self.half_life - self.offset;
        (e < RENORM_EXP).then(|| e.exp2())
    }

    fn renormalize(&mut self) {
        self.offset += RENORM_EXP;
        let scale = (-RENORM_EXP).exp2();
        for s in &mut self.score {
            *s *= scale;
        }
    }

    fn next_weight(&mut self, rebuilt: &mut bool) -> f64 {
        loop {
            if let Some(w) = self.weight() {
                return w;
            }
            self.now -= 1;
            self.renormalize();
            *rebuilt = true;
        }
    }

    /// Order key of a score: non-negative f64 bits sort like the values.
    fn key(&self, block: u32) -> (u64, u32) {
        (self.score[block as usize].to_bits(), block)
    }
}

/// Least frequently used with exponentially decayed counts (see the module docs).
#[derive(Debug)]
pub struct LfuDecay {
    s: DecayedScores,
    tracked: Vec<bool>,
    order: BTreeSet<(u64, u32)>,
}

impl LfuDecay {
    /// An empty policy over `blocks` blocks; a count halves every `half_life` accesses.
    pub fn new(blocks: usize, half_life: f64) -> LfuDecay {
        LfuDecay {
            s: DecayedScores::new(blocks, half_life),
            tracked: vec![false; blocks],
            order: BTreeSet::new(),
        }
    }

    fn bump(&mut self, block: u32, fresh: bool) {
        let mut rebuilt = false;
        let w = self.s.next_weight(&mut rebuilt);
        if rebuilt {
            self.order = (0..self.tracked.len() as u32)
                .filter(|b| self.tracked[*b as usize])
                .map(|b| self.s.key(b))
                .collect();
        }
        self.order.remove(&self.s.key(block));
        let i = block as usize;
        self.s.score[i] = if fresh { w } else { self.s.score[i] + w };
        self.tracked[i] = true;
        self.order.insert(self.s.key(block));
    }
}

impl EvictionPolicy for LfuDecay {
    fn insert(&mut self, block: u32) {
        self.bump(block, true);
    }
    fn touch(&mut self, block: u32) {
        if self.tracked[block as usize] {
            self.bump(block, false);
        }
    }
    fn remove(&mut self, block: u32) {
        if std::mem::take(&mut self.tracked[block as usize]) {
            self.order.remove(&self.s.key(block));
        }
    }
    fn victim(&mut self) -> Option<u32> {
        let (_, b) = self.order.pop_first()?;
        self.tracked[b as usize] = false;
        Some(b)
    }
}

/// Prefix-aware hotness: decayed frequency as in [`LfuDecay`], but a block with cached children in
/// its key chain is not a candidate while they are cached. Evicting the first block of a chain
/// makes every cached block after it unreachable as a prefix hit, so chains are trimmed from their
/// leaves; a block that starts many chains (a shared system prompt) is kept until they are gone.
#[derive(Debug)]
pub struct PrefixAware {
    s: DecayedScores,
    tracked: Vec<bool>,
    /// Incarnation of each block number, bumped on insert, so stale parent links are ignored.
    gen: Vec<u32>,
    /// `(parent, parent's incarnation)` of each tracked block.
    parent: Vec<(u32, u32)>,
    /// Tracked children linked to each block (valid for its current incarnation).
    children: Vec<u32>,
    /// Fraction of an access that an insertion counts for: below 1, a block seen once leaves
    /// before any block that was reused (most blocks of a trace are never used again).
    insert_weight: f64,
    /// Tracked blocks without cached children, by score.
    leaves: BTreeSet<(u64, u32)>,
    /// Every tracked block, by score: the fallback when links form a cycle.
    all: BTreeSet<(u64, u32)>,
}

impl PrefixAware {
    /// An empty policy over `blocks` blocks; a count halves every `half_life` accesses.
    pub fn new(blocks: usize, half_life: f64) -> PrefixAware {
        PrefixAware {
            s: DecayedScores::new(blocks, half_life),
            tracked: vec![false; blocks],
            gen: vec![0; blocks],
            parent: vec![(NIL, 0); blocks],
            children: vec![0; blocks],
            insert_weight: 1.0,
            leaves: BTreeSet::new(),
            all: BTreeSet::new(),
        }
    }

    fn bump(&mut self, block: u32, fresh: bool) {
        let mut rebuilt = false;
        let w = self.s.next_weight(&mut rebuilt);
        if rebuilt {
            self.rebuild();
        }
        let i = block as usize;
        let k = self.s.key(block);
        self.all.remove(&k);
        let was_leaf = self.leaves.remove(&k);
        self.s.score[i] = if fresh {
            w * self.insert_weight
        } else {
            self.s.score[i] + w
        };
        let k = self.s.key(block);
        self.all.insert(k);
        if was_leaf || (fresh && self.children[i] == 0) {
            self.leaves.insert(k);
        }
    }

    fn rebuild(&mut self) {
        self.all.clear();
        self.leaves.clear();
        for b in 0..self.tracked.len() as u32 {
            if self.tracked[b as usize] {
                self.all.insert(self.s.key(b));
                if self.children[b as usize] == 0 {
                    self.leaves.insert(self.s.key(b));
                }
            }
        }
    }

    /// Drops `block`'s link to its parent; the parent becomes a leaf if that was its last child.
    fn unlink_parent(&mut self, block: u32) {
        let (p, g) = std::mem::replace(&mut self.parent[block as usize], (NIL, 0));
        if p == NIL || !self.tracked[p as usize] || self.gen[p as usize] != g {
            return;
        }
        let c = &mut self.children[p as usize];
        *c = c.saturating_sub(1);
        if *c == 0 {
            self.leaves.insert(self.s.key(p));
        }
    }

    fn untrack(&mut self, block: u32) {
        let i = block as usize;
        if !std::mem::take(&mut self.tracked[i]) {
            return;
        }
        let k = self.s.key(block);
        self.all.remove(&k);
        self.leaves.remove(&k);
        self.unlink_parent(block);
        self.children[i] = 0;
    }
}

impl PrefixAware {
    /// Sets the fraction of an access that an insertion counts for (default 1).
    pub fn with_insert_weight(mut self, weight: f64) -> PrefixAware {
        self.insert_weight = weight.clamp(0.0, 1.0);
        self
    }
}

impl EvictionPolicy for PrefixAware {
    fn insert(&mut self, block: u32) {
        self.untrack(block);
        let i = block as usize;
        self.gen[i] = self.gen[i].wrapping_add(1);
        self.children[i] = 0;
        self.tracked[i] = true;
        self.bump(block, true);
    }
    fn touch(&mut self, block: u32) {
        if self.tracked[block as usize] {
            self.bump(block, false);
        }
    }
    fn remove(&mut self, block: u32) {
        self.untrack(block);
    }
    fn victim(&mut self) -> Option<u32> {
        let (_, b) = match self.leaves.first() {
            Some(&k) => k,
            None => *self.all.first()?,
        };
        self.untrack(b);
        Some(b)
    }
    fn link(&mut self, child: u32, parent: u32) {
        let (c, p) = (child as usize, parent as usize);
        if child == parent
            || !self.tracked[c]
            || !self.tracked[p]
            || self.parent[c] == (parent, self.gen[p])
        {
            return;
        }
        self.unlink_parent(child);
        self.parent[c] = (parent, self.gen[p]);
        self.children[p] += 1;
        if self.children[p] == 1 {
            self.leaves.remove(&self.s.key(parent));
        }
    }
}

/// Belady's MIN: evicts the tracked block whose next use is farthest in the future (never-used
/// first). Optimal for plain hit counts when next uses are exact; needs [`EvictionPolicy::next_use`].
#[derive(Debug)]
pub struct Belady {
    next: Vec<u64>,
    tracked: Vec<bool>,
    order: BTreeSet<(u64, u32)>,
}

impl Belady {
    /// An empty policy over `blocks` blocks.
    pub fn new(blocks: usize) -> Belady {
        Belady {
            next: vec![u64::MAX; blocks],
            tracked: vec![false; blocks],
            order: BTreeSet::new(),
        }
    }
}

impl EvictionPolicy for Belady {
    fn insert(&mut self, block: u32) {
        let i = block as usize;
        if !std::mem::replace(&mut self.tracked[i], true) {
            self.order.insert((self.next[i], block));
        }
    }
    fn touch(&mut self, _block: u32) {}
    fn remove(&mut self, block: u32) {
        let i = block as usize;
        if std::mem::take(&mut self.tracked[i]) {
            self.order.remove(&(self.next[i], block));
        }
    }
    fn victim(&mut self) -> Option<u32> {
        let (_, b) = self.order.pop_last()?;
        self.tracked[b as usize] = false;
        Some(b)
    }
    fn next_use(&mut self, block: u32, next: u64) {
        let i = block as usize;
        if self.tracked[i] {
            self.order.remove(&(self.next[i], block));
            self.order.insert((next, block));
        }
        self.next[i] = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lfu_decay_keeps_frequent_and_forgets_old() {
        let mut p = LfuDecay::new(4, 4.0);
        p.insert(0);
        p.insert(1);
        for _ in 0..3 {
            p.touch(0);
        }
        assert_eq!(p.victim(), Some(1), "the rarely used block goes first");
        // Much later, a fresh block touched twice outweighs the old, decayed favourite.
        for _ in 0..40 {
            p.insert(2);
            p.remove(2);
        }
        p.insert(3);
        p.touch(3);
        assert_eq!(p.victim(), Some(0));
        assert_eq!(p.victim(), Some(3));
        assert_eq!(p.victim(), None);
    }

    #[test]
    fn decayed_scores_survive_renormalization() {
        let mut p = LfuDecay::new(2, 1.0);
        p.insert(0);
        p.insert(1);
        for _ in 0..2000 {
            p.touch(1);
        }
        assert!(p.s.offset > 0.0, "renormalized");
        assert_eq!(p.victim(), Some(0));
        assert_eq!(p.victim(), Some(1));
    }

    #[test]
    fn prefix_aware_evicts_leaves_first() {
        let mut p = PrefixAware::new(4, 1e9);
        // Chain 0 -> 1 -> 2, plus an unrelated block 3; the root is touched least.
        for b in 0..4 {
            p.insert(b);
        }
        p.link(1, 0);
        p.link(2, 1);
        for b in [1, 2, 3, 3, 2, 1, 2] {
            p.touch(b);
        }
        // Leaves are 2 (4 accesses) and 3 (3 accesses); the root 0 is the coldest but not a leaf.
        assert_eq!(p.victim(), Some(3));
        assert_eq!(p.victim(), Some(2), "a leaf before its colder parent");
        assert_eq!(p.victim(), Some(1));
        assert_eq!(p.victim(), Some(0));
        assert_eq!(p.victim(), None);
    }

    #[test]
    fn prefix_aware_ignores_stale_links() {
        let mut p = PrefixAware::new(3, 1e9);
        p.insert(0);
        p.insert(1);
        p.link(1, 0);
        p.remove(0);
        p.insert(0); // a new block in slot 0: block 1's old parent link must not count
        p.insert(2);
        p.touch(2);
        p.touch(2);
        for _ in 0..3 {
            p.touch(1);
        }
        // A stale link would make 0 an inner node and put 2 first.
        assert_eq!(p.victim(), Some(0));
        assert_eq!(p.victim(), Some(2));
        assert_eq!(p.victim(), Some(1));
    }

    #[test]
    fn belady_evicts_farthest_next_use() {
        let mut p = Belady::new(3);
        for (b, n) in [(0, 10), (1, u64::MAX), (2, 5)] {
            p.next_use(b, n);
            p.insert(b);
        }
        assert_eq!(p.victim(), Some(1));
        p.next_use(2, 50);
        assert_eq!(p.victim(), Some(2));
        assert_eq!(p.victim(), Some(0));
    }

    #[test]
    fn lru_evicts_least_recent() {
        let mut l = Lru::new(4);
        for b in 0..4 {
            l.insert(b);
        }
        l.touch(0);
        l.remove(2);
        assert_eq!(l.victim(), Some(1));
        assert_eq!(l.victim(), Some(3));
        assert_eq!(l.victim(), Some(0));
        assert_eq!(l.victim(), None);
    }
}
