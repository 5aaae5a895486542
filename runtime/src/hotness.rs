//! Hotness: which blocks are worth keeping close.
//!
//! Three signals meet in one [`Hotness`] view:
//! - **local accesses** of this participant (gets, pins, NDP scans), counted in an epoch-decayed
//!   count-min sketch: [`SKETCH_ROWS`] rows of [`SKETCH_WIDTH`] relaxed atomic counters; every
//!   [`Hotness::epoch_len`] accesses all counters are halved. A small candidate set keeps the
//!   hottest keys seen, and [`Hotness::publish`] writes them as a compact hotlist into the
//!   participant's own slot (layout: docs/FORMAT.md, "Hotlist"; [`hotlist`] below);
//! - the **device's hotlist** (what the NDP device scanned), fed as plain `(key, weight)` pairs by
//!   [`Hotness::record_device`];
//! - **attention mass** per block from `SCORE_TOPK` results, fed by
//!   [`Hotness::record_attention_mass`].
//!
//! Recording is wait-free for the counters (four `fetch_add`s); the candidate set is updated only
//! when a key's estimate beats the set's minimum, under a `try_lock` that skips on contention, so
//! the get path never waits on tracking.

use crate::coherence::{self, Site};
use crate::key::Key;
use crate::participant::state::Participant;
use crate::pool::{Pool, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// Local accesses one unit of attention mass is worth in [`Hotness::heat`]: a block that held a
/// whole query's softmax weight counts like four gets.
pub const ATTENTION_ACCESSES: u32 = 4;

/// Rows of the count-min sketch.
pub const SKETCH_ROWS: usize = 4;
/// Counters per row (a power of two).
pub const SKETCH_WIDTH: usize = 1 << 14;

/// Layout of the hotlist in a participant slot, at the pool's
/// [`SlotLayout::hotlist`](crate::format::SlotLayout::hotlist) (docs/FORMAT.md).
pub mod hotlist {
    /// Seqlock word: odd while the holder rewrites the hotlist; readers retry.
    pub const SEQ: u64 = 0;
    /// The sketch epoch the list was taken in.
    pub const EPOCH: u64 = 8;
    /// `entry_size << 32 | count`.
    pub const COUNT: u64 = 16;
    /// First entry (after a 64-byte header).
    pub const ENTRIES: u64 = 64;
    /// Bytes of one entry: key_lo, key_hi, score (u64 each).
    pub const ENTRY_SIZE: u64 = 24;
    /// Entries the list can hold.
    pub const CAPACITY: u64 = 64;
    /// Bytes of the whole hotlist.
    pub const SIZE: u64 = ENTRIES + CAPACITY * ENTRY_SIZE;
}

// The hotlist fits the room the slot layout reserves for it (checked at compile time).
const _: () = assert!(hotlist::SIZE <= crate::format::HOTLIST_SIZE);

/// What kind of access is being recorded, with its weight in the sketch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A get (copy out).
    Get,
    /// A pin (zero-copy reader or DMA): the block must stay, so it counts double.
    Pin,
    /// An NDP scan of the block on this participant's behalf.
    Scan,
}

impl Access {
    fn weight(self) -> u32 {
        match self {
            Access::Get | Access::Scan => 1,
            Access::Pin => 2,
        }
    }
}

/// One hotlist entry: a key and its decayed access count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HotEntry {
    /// The block key.
    pub key: Key,
    /// Decayed access count (sketch estimate).
    pub score: u64,
}

/// Per-participant hotness tracking and the merged view (module docs).
pub struct Hotness {
    sketch: Box<[AtomicU32]>,
    accesses: AtomicU64,
    epoch: AtomicU64,
    epoch_len: u64,
    enabled: AtomicBool,
    /// Estimate a key must beat to enter a full candidate set.
    floor: AtomicU32,
    candidates: Mutex<Vec<(Key, u32)>>,
    device: Mutex<HashMap<Key, f64>>,
    attention: Mutex<HashMap<Key, f64>>,
}

impl std::fmt::Debug for Hotness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hotness")
            .field("accesses", &self.accesses.load(Ordering::Relaxed))
            .field("epoch", &self.epoch.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for Hotness {
    fn default() -> Self {
        Hotness::new(1 << 16)
    }
}

fn row_hash(key: Key, row: usize) -> usize {
    // Key bits are already a strong hash: mix the halves with a per-row odd multiplier.
    const M: [u64; SKETCH_ROWS] = [
        0x9e37_79b9_7f4a_7c15,
        0xc2b2_ae3d_27d4_eb4f,
        0x1656_67b1_9e37_79f9,
        0xff51_afd7_ed55_8ccd,
    ];
    let h = (key.lo() ^ key.hi().rotate_left(17)).wrapping_mul(M[row]);
    (h >> 40) as usize & (SKETCH_WIDTH - 1)
}

impl Hotness {
    /// A tracker whose counts halve every `epoch_len` accesses.
    pub fn new(epoch_len: u64) -> Hotness {
        Hotness {
            sketch: (0..SKETCH_ROWS * SKETCH_WIDTH)
                .map(|_| AtomicU32::new(0))
                .collect(),
            accesses: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            epoch_len: epoch_len.max(1),
            enabled: AtomicBool::new(true),
            floor: AtomicU32::new(0),
            candidates: Mutex::new(Vec::with_capacity(hotlist::CAPACITY as usize)),
            device: Mutex::new(HashMap::new()),
            attention: Mutex::new(HashMap::new()),
        }
    }

    /// Accesses per decay epoch.
    pub fn epoch_len(&self) -> u64 {
        self.epoch_len
    }

    /// Decay epochs elapsed.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Turns recording on or off (off: [`Self::record`] returns at once; for overhead benches).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Records one access to `key`.
    #[inline]
    pub fn record(&self, key: Key, access: Access) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        let w = access.weight();
        let mut est = u32::MAX;
        for r in 0..SKETCH_ROWS {
            let c = &self.sketch[r * SKETCH_WIDTH + row_hash(key, r)];
            est = est.min(c.fetch_add(w, Ordering::Relaxed).saturating_add(w));
        }
        if est > self.floor.load(Ordering::Relaxed) {
            self.offer(key, est);
        }
        let n = self.accesses.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_multiple_of(self.epoch_len) {
            self.decay();
        }
    }

    fn offer(&self, key: Key, est: u32) {
        let Ok(mut c) = self.candidates.try_lock() else {
            return;
        };
        if let Some(e) = c.iter_mut().find(|e| e.0 == key) {
            e.1 = est;
        } else if c.len() < hotlist::CAPACITY as usize {
            c.push((key, est));
        } else if let Some(min) = c.iter_mut().min_by_key(|e| e.1) {
            if est > min.1 {
                *min = (key, est);
            }
        }
        if c.len() == hotlist::CAPACITY as usize {
            self.floor
                .store(c.iter().map(|e| e.1).min().unwrap_or(0), Ordering::Relaxed);
        }
    }

    /// Halves every count (one epoch passes). Concurrent records may lose a little of their
    /// weight to the race; the sketch is an estimate.
    pub fn decay(&self) {
        for c in self.sketch.iter() {
            let v = c.load(Ordering::Relaxed);
            if v != 0 {
                c.store(v / 2, Ordering::Relaxed);
            }
        }
        let mut c = self.candidates.lock().unwrap_or_else(|e| e.into_inner());
        c.iter_mut().for_each(|e| e.1 /= 2);
        c.retain(|e| e.1 > 0);
        drop(c);
        let mut a = self.attention.lock().unwrap_or_else(|e| e.into_inner());
        a.values_mut().for_each(|m| *m /= 2.0);
        a.retain(|_, m| *m >= 1.0 / 64.0);
        drop(a);
        self.floor.store(0, Ordering::Relaxed);
        self.epoch.fetch_add(1, Ordering::Relaxed);
    }

    /// The sketch's decayed count for `key` (never below the true decayed count).
    pub fn estimate(&self, key: Key) -> u32 {
        (0..SKETCH_ROWS)
            .map(|r| self.sketch[r * SKETCH_WIDTH + row_hash(key, r)].load(Ordering::Relaxed))
            .min()
            .unwrap_or(0)
    }

    /// The hottest local keys, hottest first (at most [`hotlist::CAPACITY`]).
    pub fn hotlist(&self) -> Vec<HotEntry> {
        let c = self.candidates.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<HotEntry> = c
            .iter()
            .map(|&(key, _)| HotEntry {
                key,
                score: u64::from(self.estimate(key)),
            })
            .collect();
        v.sort_by(|a, b| b.score.cmp(&a.score).then(a.key.cmp(&b.key)));
        v
    }

    /// Feeds the device's hotlist (what the NDP device scanned, its own decayed heat per block):
    /// `(key, heat)` pairs. The device list is a snapshot, so it replaces the previous one.
    pub fn record_device(&self, pairs: &[(Key, u64)]) {
        let mut d = self.device.lock().unwrap_or_else(|e| e.into_inner());
        d.clear();
        for &(k, w) in pairs {
            *d.entry(k).or_default() += w as f64;
        }
    }

    /// How hot `key` is across all three signals, in local-access units: the sketch estimate, plus
    /// the device's heat for it, plus [`ATTENTION_ACCESSES`] per unit of attention mass it
    /// received (decayed with the sketch). The tiers promote on this.
    pub fn heat(&self, key: Key) -> u32 {
        if !self.enabled.load(Ordering::Relaxed) {
            // Tracking off: no signal at all (and no cost on the get path).
            return 0;
        }
        let of = |m: &Mutex<HashMap<Key, f64>>| {
            m.lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .copied()
                .unwrap_or(0.0)
        };
        let extra = of(&self.device) + of(&self.attention) * f64::from(ATTENTION_ACCESSES);
        self.estimate(key)
            .saturating_add(extra.min(f64::from(u32::MAX)) as u32)
    }

    /// Feeds per-block attention mass from `SCORE_TOPK` results: `(key, mass)` pairs, mass in
    /// `[0, 1]` per query (the share of softmax weight that fell in the block).
    pub fn record_attention_mass(&self, pairs: &[(Key, f32)]) {
        let mut a = self.attention.lock().unwrap_or_else(|e| e.into_inner());
        for &(k, m) in pairs {
            if m.is_finite() && m > 0.0 {
                *a.entry(k).or_default() += f64::from(m);
            }
        }
    }

    /// The merged view: each signal normalized to a share of its own total, summed, hottest first
    /// (at most `n` keys). A key hot in every signal scores up to 3.
    pub fn merged(&self, n: usize) -> Vec<(Key, f64)> {
        let mut score: HashMap<Key, f64> = HashMap::new();
        let local = self.hotlist();
        let total: f64 = local.iter().map(|e| e.score as f64).sum();
        for e in &local {
            *score.entry(e.key).or_default() += e.score as f64 / total.max(1.0);
        }
        for m in [&self.device, &self.attention] {
            let m = m.lock().unwrap_or_else(|e| e.into_inner());
            let total: f64 = m.values().sum();
            for (k, v) in m.iter() {
                *score.entry(*k).or_default() += v / total.max(f64::MIN_POSITIVE);
            }
        }
        let mut v: Vec<(Key, f64)> = score.into_iter().collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// Writes the local hotlist into `participant`'s own slot (seqlock-protected; docs/FORMAT.md).
    /// Refused with `Fenced` once the participant is presumed dead: its slot may be a
    /// successor's.
    pub fn publish(&self, participant: &Participant) -> Result<()> {
        if participant.presumed_dead() {
            return Err(crate::pool::PoolError::Fenced {
                partition: participant.partition().unwrap_or(0),
                generation: (participant.generation() & 0xffff_ffff) as u32,
            });
        }
        let list = self.hotlist();
        let pool = participant.pool();
        let base = pool.slot_off(participant.id()) + pool.slot_layout().hotlist;
        let mem = pool.mem();
        let seq = mem.load_u64(base + hotlist::SEQ, Ordering::Relaxed)?;
        let odd = (seq | 1).wrapping_add(if seq & 1 == 1 { 2 } else { 0 });
        mem.store_u64(base + hotlist::SEQ, odd, Ordering::Relaxed)?;
        // The odd seq reaches memory before any entry line can (a dirty line may be written back
        // at any moment): a reader that finds new entry bytes then finds the seq changed. Pairs
        // with the HotlistRead acquire of the reader's seq re-check.
        coherence::publish(mem, Site::HotlistWrite, base, 8);
        // Orders the odd seq before the entry stores; pairs with the Acquire fence before the
        // reader's seq re-check in `read_hotlist`.
        std::sync::atomic::fence(Ordering::Release);
        mem.store_u64(base + hotlist::EPOCH, self.epoch(), Ordering::Relaxed)?;
        mem.store_u64(
            base + hotlist::COUNT,
            (hotlist::ENTRY_SIZE << 32) | list.len() as u64,
            Ordering::Relaxed,
        )?;
        for (i, e) in list.iter().enumerate() {
            let off = base + hotlist::ENTRIES + i as u64 * hotlist::ENTRY_SIZE;
            mem.store_u64(off, e.key.lo(), Ordering::Relaxed)?;
            mem.store_u64(off + 8, e.key.hi(), Ordering::Relaxed)?;
            mem.store_u64(off + 16, e.score, Ordering::Relaxed)?;
        }
        // The entries before the even seq (on non-coherent memory too: published first).
        coherence::publish(mem, Site::HotlistWrite, base, hotlist::SIZE);
        // Release: entries before the even seq. Pairs with the Acquire load in `read_hotlist`.
        mem.store_u64(base + hotlist::SEQ, odd.wrapping_add(1), Ordering::Release)?;
        coherence::publish(mem, Site::HotlistWrite, base, 8);
        Ok(())
    }
}

/// Reads participant `id`'s published hotlist; `Ok(None)` if it stayed mid-update for the whole
/// retry budget or its header is malformed (a reader never trusts the count it reads).
pub fn read_hotlist(pool: &Pool, id: u32) -> Result<Option<(u64, Vec<HotEntry>)>> {
    if id >= pool.superblock().participants {
        return Ok(None);
    }
    let base = pool.slot_off(id) + pool.slot_layout().hotlist;
    let mem = pool.mem();
    for _ in 0..crate::pool::READ_RETRIES {
        // Pairs with the HotlistWrite publishes of the holder.
        coherence::acquire(mem, Site::HotlistRead, base, hotlist::SIZE);
        // Pairs with the Release store of the even seq in `Hotness::publish`.
        let s1 = mem.load_u64(base + hotlist::SEQ, Ordering::Acquire)?;
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let epoch = mem.load_u64(base + hotlist::EPOCH, Ordering::Relaxed)?;
        let word = mem.load_u64(base + hotlist::COUNT, Ordering::Relaxed)?;
        let (count, size) = (word & 0xffff_ffff, word >> 32);
        if word != 0 && (size != hotlist::ENTRY_SIZE || count > hotlist::CAPACITY) {
            return Ok(None);
        }
        let mut v = Vec::with_capacity(count as usize);
        for i in 0..count {
            let off = base + hotlist::ENTRIES + i * hotlist::ENTRY_SIZE;
            let key = Key::from_parts(
                mem.load_u64(off, Ordering::Relaxed)?,
                mem.load_u64(off + 8, Ordering::Relaxed)?,
            );
            v.push(HotEntry {
                key,
                score: mem.load_u64(off + 16, Ordering::Relaxed)?,
            });
        }
        // Orders the entry loads before the re-check; pairs with the Release fence in `publish`.
        std::sync::atomic::fence(Ordering::Acquire);
        // The re-check reads memory, not our copy of the line read above.
        coherence::acquire(mem, Site::HotlistRead, base, 8);
        if mem.load_u64(base + hotlist::SEQ, Ordering::Relaxed)? == s1 {
            return Ok(Some((epoch, v)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_keys_rise_and_decay() {
        let h = Hotness::new(1 << 40);
        let hot = Key::from_bytes(b"hot");
        for i in 0..2000u32 {
            h.record(Key::from_bytes(&i.to_le_bytes()), Access::Get);
            h.record(hot, Access::Pin);
        }
        let list = h.hotlist();
        assert_eq!(list[0].key, hot);
        assert!(list[0].score >= 4000);
        h.decay();
        assert!(h.estimate(hot) >= 2000 && h.estimate(hot) < 4000);
        h.set_enabled(false);
        h.record(hot, Access::Get);
        assert_eq!(h.accesses.load(Ordering::Relaxed), 4000);
    }

    #[test]
    fn merged_view_combines_signals() {
        let h = Hotness::new(1 << 40);
        let (a, b, c) = (Key(1), Key(2), Key(3));
        for _ in 0..10 {
            h.record(a, Access::Get);
        }
        h.record_device(&[(b, 5)]);
        h.record_attention_mass(&[(c, 0.5), (a, 0.5), (b, f32::NAN)]);
        let m = h.merged(10);
        assert_eq!(m[0].0, a, "hot locally and in attention");
        assert!(m.iter().any(|e| e.0 == b) && m.iter().any(|e| e.0 == c));
        // Heat in access units: a = 10 gets + 0.5 mass, b = device heat 5, c = 0.5 mass.
        assert_eq!(h.heat(a), 10 + ATTENTION_ACCESSES / 2);
        assert_eq!(h.heat(b), 5);
        assert_eq!(h.heat(c), ATTENTION_ACCESSES / 2);
        // The device list is a snapshot: a new one replaces it.
        h.record_device(&[(c, 1)]);
        assert_eq!(h.heat(b), 0);
        assert_eq!(h.heat(c), ATTENTION_ACCESSES / 2 + 1);
        // Attention decays with the sketch.
        h.record_attention_mass(&[(c, 1.5)]);
        h.decay();
        assert_eq!(h.heat(c), 2 * ATTENTION_ACCESSES / 2 + 1);
    }
}
