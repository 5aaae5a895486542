//! [`Tiers`]: one participant's partition as the middle tier between DRAM and SSD (crate docs).

use crate::slots::SlotMap;
use cxlkv_runtime::hotness::{Access, Hotness};
use cxlkv_runtime::key::Key;
use cxlkv_runtime::participant::Participant;
use cxlkv_runtime::policy::{EvictionPolicy, PolicyKind};
use cxlkv_runtime::pool::PoolError;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::dram::DramCache;
pub use crate::error::{Result, TierError};
use crate::spill::{SpillFile, SpillOptions, SpillRecovery, SpillStats};

/// Where a block was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// The process-local DRAM cache.
    Dram,
    /// The shared CXL pool.
    Pool,
    /// An SSD spill file.
    Ssd,
}

/// Configuration of [`Tiers`].
#[derive(Clone, Debug)]
pub struct TierConfig {
    /// Blocks the pool tier may hold (the partition must have room for this plus four
    /// `step_budget`s).
    pub pool_blocks: usize,
    /// Entries of the DRAM cache (0: no DRAM tier).
    pub dram_blocks: usize,
    /// Eviction policy of the pool tier.
    pub policy: PolicyKind,
    /// Directory of spill files (`None`: blocks demoted from the pool are dropped).
    pub spill_dir: Option<PathBuf>,
    /// Spill file options.
    pub spill: SpillOptions,
    /// Most blocks one [`Tiers::step`] moves in each direction.
    pub step_budget: usize,
    /// Hotness estimate at which a pool block is promoted to DRAM.
    pub dram_threshold: u32,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            pool_blocks: 1024,
            dram_blocks: 128,
            policy: PolicyKind::Lru,
            spill_dir: None,
            spill: SpillOptions::default(),
            step_budget: 32,
            dram_threshold: 4,
        }
    }
}

/// Counters of the tiers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Gets served by DRAM.
    pub dram_hits: u64,
    /// Gets served by the pool.
    pub pool_hits: u64,
    /// Gets served by SSD.
    pub ssd_hits: u64,
    /// Gets that found nothing.
    pub misses: u64,
    /// Blocks copied pool → DRAM.
    pub promoted_to_dram: u64,
    /// Blocks moved SSD → pool.
    pub promoted_to_pool: u64,
    /// Blocks moved pool → SSD.
    pub demoted_to_ssd: u64,
    /// Blocks evicted from the pool with no SSD tier to take them.
    pub dropped: u64,
    /// Payload bytes copied pool → DRAM.
    pub bytes_pool_to_dram: u64,
    /// Payload bytes moved pool → SSD.
    pub bytes_pool_to_ssd: u64,
    /// Payload bytes moved SSD → pool.
    pub bytes_ssd_to_pool: u64,
}

/// What [`Tiers::open`] found and repaired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierRecovery {
    /// Blocks found in the pool partition.
    pub pool_blocks: u64,
    /// The spill file's scan.
    pub spill: SpillRecovery,
    /// Keys found both in the pool and on SSD (a move interrupted by a crash): SSD copy forgotten.
    pub duplicates_resolved: u64,
}

/// Points at which a test can make the tiering work crash (panic), to check that nothing is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FaultPoint {
    /// No fault.
    None = 0,
    /// A demotion wrote the SSD record but has not yet removed the pool copy.
    AfterSpillWrite = 1,
    /// A promotion put the block into the pool but has not yet forgotten the SSD record.
    AfterPoolPut = 2,
}

/// What one [`Tiers::step`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Blocks moved SSD → pool.
    pub promoted_to_pool: usize,
    /// Blocks copied pool → DRAM.
    pub promoted_to_dram: usize,
    /// Blocks moved pool → SSD.
    pub demoted: usize,
    /// Blocks dropped (no SSD tier).
    pub dropped: usize,
}

impl StepReport {
    /// True when the step moved nothing.
    pub fn idle(&self) -> bool {
        *self == StepReport::default()
    }
}

/// Owner-private placement state (locked before the spill file when both are needed).
struct State {
    slots: SlotMap<Key>,
    policy: Box<dyn EvictionPolicy>,
    /// SSD hits waiting to move to the pool, with the bytes already read.
    to_pool: Vec<(Key, Vec<u8>)>,
    to_dram: Vec<Key>,
    /// Victims taken out of the pool tier, still in the partition until written to SSD in a batch.
    demoting: Vec<Key>,
    /// Hints for keys not yet in the pool, applied when they enter it.
    pending_next: HashMap<Key, u64>,
    pending_parent: HashMap<Key, Key>,
    stats: TierStats,
}

/// The three tiers of one participant (module docs).
pub struct Tiers {
    participant: Participant,
    dram: Option<DramCache>,
    spill: Option<Mutex<SpillFile>>,
    state: Mutex<State>,
    hotness: Hotness,
    cfg: TierConfig,
    physical_blocks: usize,
    fault: AtomicU8,
}

impl std::fmt::Debug for Tiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiers")
            .field("participant", &self.participant.id())
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Tiers {
    /// Takes `participant`'s partition as the pool tier: adopts the blocks already there, opens
    /// (and recovers) the partition's spill file, and resolves blocks found in both.
    pub fn open(participant: Participant, cfg: TierConfig) -> Result<(Tiers, TierRecovery)> {
        let pool = participant.pool().clone();
        let Some(p) = participant.partition() else {
            return Err(TierError::Pool(PoolError::NoPartition {
                participant: participant.id(),
            }));
        };
        let physical = pool.superblock().blocks_per_partition as usize;
        // Room for the tier, a step's worth of puts ahead of demotion, a batch staged for it and a
        // step's promotions: the partition itself must never have to evict.
        if cfg.pool_blocks == 0 || cfg.pool_blocks + 4 * cfg.step_budget.max(1) > physical {
            return Err(TierError::BadConfig(format!(
                "pool tier of {} blocks plus four step budgets of {} does not fit a partition of {physical} blocks",
                cfg.pool_blocks, cfg.step_budget
            )));
        }
        // Room for every block the partition can hold (adopted ones may exceed the tier).
        let slots = physical + 1;
        let mut st = State {
            slots: SlotMap::new(slots),
            // Tuned for the tier's size (as the simulator's), sized for the whole partition.
            policy: cfg.policy.build_for(cfg.pool_blocks + 1, slots),
            to_pool: Vec::new(),
            to_dram: Vec::new(),
            demoting: Vec::new(),
            pending_next: HashMap::new(),
            pending_parent: HashMap::new(),
            stats: TierStats::default(),
        };
        let mut rec = TierRecovery::default();
        for s in 0..pool.superblock().index_slots {
            if let Some((_, key, entry)) = pool.read_slot(p, s)? {
                if cxlkv_runtime::format::decode_entry(entry).is_some() {
                    if let Some(slot) = st.slots.assign(key) {
                        st.policy.insert(slot);
                        rec.pool_blocks += 1;
                    }
                }
            }
        }
        let spill = match &cfg.spill_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| TierError::Io {
                    path: dir.clone(),
                    source: e,
                })?;
                let (mut sf, srec) = SpillFile::open(&SpillFile::path_for(dir, p), cfg.spill)?;
                rec.spill = srec;
                for k in sf.keys() {
                    if st.slots.get(k).is_some() {
                        sf.remove(k);
                        rec.duplicates_resolved += 1;
                    }
                }
                Some(Mutex::new(sf))
            }
            None => None,
        };
        let dram = (cfg.dram_blocks > 0).then(|| DramCache::new(cfg.dram_blocks));
        let hotness = Hotness::new((cfg.pool_blocks as u64).max(1024));
        let t = Tiers {
            participant,
            dram,
            spill,
            state: Mutex::new(st),
            hotness,
            physical_blocks: physical,
            cfg,
            fault: AtomicU8::new(0),
        };
        Ok((t, rec))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spill(&self) -> Option<MutexGuard<'_, SpillFile>> {
        self.spill
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The participant whose partition is the pool tier.
    pub fn participant(&self) -> &Participant {
        &self.participant
    }

    /// The hotness tracker fed by this tier's gets.
    pub fn hotness(&self) -> &Hotness {
        &self.hotness
    }

    /// The configuration.
    pub fn config(&self) -> &TierConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> TierStats {
        self.state().stats
    }

    /// Counters of the spill file, if there is one.
    pub fn spill_stats(&self) -> Option<SpillStats> {
        self.spill().map(|s| s.stats())
    }

    /// True when the spill file uses `O_DIRECT`.
    pub fn spill_direct(&self) -> Option<bool> {
        self.spill().map(|s| s.direct())
    }

    /// Blocks the pool tier holds now (not counting those staged for demotion).
    pub fn pool_len(&self) -> usize {
        self.state().slots.len()
    }

    /// Test hook: the next time tiering work reaches `at`, it panics (a crash of the tiering
    /// thread). Reset after firing.
    pub fn inject_fault(&self, at: FaultPoint) {
        self.fault.store(at as u8, Ordering::SeqCst);
    }

    fn fault_point(&self, at: FaultPoint) {
        if self
            .fault
            .compare_exchange(at as u8, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            panic!("injected tiering crash at {at:?}");
        }
    }

    /// The tiers that hold `key` now (no access is recorded): any of DRAM (a replica), pool, SSD.
    pub fn locate(&self, key: Key) -> Vec<Tier> {
        let mut v = Vec::new();
        if self.dram.as_ref().is_some_and(|d| d.contains(key)) {
            v.push(Tier::Dram);
        }
        let st = self.state();
        if st.slots.get(key).is_some() || st.demoting.contains(&key) {
            v.push(Tier::Pool);
        }
        drop(st);
        if self.spill().is_some_and(|s| s.contains(key)) {
            v.push(Tier::Ssd);
        }
        v
    }

    /// True when `key` is held by the pool tier (so also any DRAM replica): a prefix hit without
    /// I/O. Blocks staged for demotion are no longer held, though still readable until flushed.
    pub fn in_memory(&self, key: Key) -> bool {
        self.state().slots.get(key).is_some()
    }

    /// Stores `bytes` under `key` in the pool tier (superseding any SSD copy); `parent` is the
    /// previous block of its key chain, for prefix-aware policies. If background work has fallen a
    /// whole step budget behind (the pool tier is `pool_blocks + step_budget` full), demotes
    /// inline first: backpressure, so the partition never has to evict on its own.
    pub fn put(&self, key: Key, bytes: &[u8], parent: Option<Key>) -> Result<()> {
        let mut st = self.state();
        let limit =
            (self.cfg.pool_blocks + self.cfg.step_budget.max(1)).min(self.physical_blocks - 1);
        if st.slots.get(key).is_none() && st.slots.len() + st.demoting.len() >= limit {
            drop(st);
            self.demote(usize::MAX, true)?;
            st = self.state();
        }
        self.participant.put(key, bytes)?;
        if let Some(d) = &self.dram {
            d.remove(key); // a stale replica must not outlive the new bytes
        }
        if let Some(mut s) = self.spill() {
            s.remove(key);
        }
        // A queued promotion of the key carries the bytes it had on SSD: stale now.
        st.to_pool.retain(|(k, _)| *k != key);
        st.demoting.retain(|k| *k != key);
        if let Some(p) = parent {
            st.pending_parent.insert(key, p);
        }
        Self::admit(&mut st, key);
        Ok(())
    }

    /// Enters `key` (now in the pool) into the policy, or touches it if it is there.
    fn admit(st: &mut State, key: Key) {
        let slot = match st.slots.get(key) {
            Some(s) => {
                if let Some(n) = st.pending_next.remove(&key) {
                    st.policy.next_use(s, n);
                }
                st.policy.touch(s);
                s
            }
            None => {
                let s = st.slots.assign(key).expect("slots cover the partition");
                if let Some(n) = st.pending_next.remove(&key) {
                    st.policy.next_use(s, n);
                }
                st.policy.insert(s);
                s
            }
        };
        if let Some(p) = st.pending_parent.remove(&key).and_then(|p| st.slots.get(p)) {
            st.policy.link(slot, p);
        }
    }

    /// Offline hint for Belady: `key`'s next access is at logical time `next`.
    pub fn hint_next_use(&self, key: Key, next: u64) {
        let mut st = self.state();
        match st.slots.get(key) {
            Some(s) => st.policy.next_use(s, next),
            None => {
                st.pending_next.insert(key, next);
            }
        }
    }

    /// Tells the policy that `child` follows `parent` in a key chain (applied when both are in
    /// the pool tier).
    pub fn link(&self, child: Key, parent: Key) {
        let mut st = self.state();
        match (st.slots.get(child), st.slots.get(parent)) {
            (Some(c), Some(p)) => st.policy.link(c, p),
            (None, _) => {
                st.pending_parent.insert(child, parent);
            }
            _ => {}
        }
    }

    /// Copies the block under `key` into `out` from whichever tier holds it; `None` on a miss.
    /// A pool hit may queue a DRAM promotion and an SSD hit queues a pool promotion, both done
    /// by [`Self::step`].
    pub fn get(&self, key: Key, out: &mut Vec<u8>) -> Result<Option<Tier>> {
        self.hotness.record(key, Access::Get);
        if let Some(d) = &self.dram {
            if d.get(key, out) {
                let mut st = self.state();
                if let Some(s) = st.slots.get(key) {
                    st.policy.touch(s);
                }
                st.stats.dram_hits += 1;
                return Ok(Some(Tier::Dram));
            }
        }
        if let Some((bytes, _)) = self.participant.get(key)? {
            *out = bytes;
            // Local gets, the device's scans and attention mass together (`Hotness::heat`).
            let hot = self.hotness.heat(key) >= self.cfg.dram_threshold;
            let mut st = self.state();
            if let Some(s) = st.slots.get(key) {
                st.policy.touch(s);
            } else if let Some(i) = st.demoting.iter().position(|k| *k == key) {
                // Staged for demotion but not yet written: back into the tier, as a new block.
                st.demoting.remove(i);
                Self::admit(&mut st, key);
            }
            if hot && self.dram.is_some() && !st.to_dram.contains(&key) {
                st.to_dram.push(key);
            }
            st.stats.pool_hits += 1;
            return Ok(Some(Tier::Pool));
        }
        let mut st = self.state();
        let found = match self.spill() {
            Some(mut s) => s.read(key)?,
            None => None,
        };
        match found {
            Some(bytes) => {
                out.clear();
                out.extend_from_slice(&bytes);
                if !st.to_pool.iter().any(|(k, _)| *k == key) {
                    st.to_pool.push((key, bytes));
                }
                st.stats.ssd_hits += 1;
                Ok(Some(Tier::Ssd))
            }
            None => {
                st.stats.misses += 1;
                Ok(None)
            }
        }
    }

    /// One bounded round of background work: promote up to `step_budget` SSD hits into the pool,
    /// demote policy victims while the pool tier is over its size (at most `step_budget`), and
    /// copy up to `step_budget` hot pool blocks into DRAM.
    pub fn step(&self) -> Result<StepReport> {
        let budget = self.cfg.step_budget.max(1);
        let promoted_to_pool = self.promote_to_pool(budget)?;
        let (demoted, dropped) = self.demote(budget, false)?;
        let promoted_to_dram = self.promote_to_dram(budget)?;
        Ok(StepReport {
            promoted_to_pool,
            promoted_to_dram,
            demoted,
            dropped,
        })
    }

    fn promote_to_pool(&self, budget: usize) -> Result<usize> {
        let mut st = self.state();
        let n = st.to_pool.len().min(budget);
        let batch: Vec<(Key, Vec<u8>)> = st.to_pool.drain(..n).collect();
        let mut done = 0;
        for (key, bytes) in batch {
            if st.slots.get(key).is_some() {
                continue;
            }
            if st.slots.len() + st.demoting.len() + 1 >= self.physical_blocks {
                st.to_pool.push((key, bytes)); // no room until a demotion batch is flushed
                continue;
            }
            let mut sp = self.spill();
            if !sp.as_ref().is_some_and(|s| s.contains(key)) {
                continue; // superseded or dropped meanwhile
            }
            self.participant.put(key, &bytes)?;
            self.fault_point(FaultPoint::AfterPoolPut);
            if let Some(s) = sp.as_mut() {
                s.remove(key);
            }
            drop(sp);
            Self::admit(&mut st, key);
            st.stats.promoted_to_pool += 1;
            st.stats.bytes_ssd_to_pool += bytes.len() as u64;
            done += 1;
        }
        Ok(done)
    }

    /// Picks victims while the pool tier is over its size (at most `budget`) and stages them for
    /// demotion; writes staged blocks to SSD in batches of `step_budget` (all of them if
    /// `flush_all`). Returns (moved to SSD, dropped).
    fn demote(&self, budget: usize, flush_all: bool) -> Result<(usize, usize)> {
        let mut st = self.state();
        let mut picked = 0;
        while st.slots.len() > self.cfg.pool_blocks && picked < budget {
            let Some(v) = st.policy.victim() else { break };
            let key = st.slots.release(v);
            if let Some(d) = &self.dram {
                d.remove(key);
            }
            // Still in the partition until flushed; a get before then takes it back.
            st.demoting.push(key);
            picked += 1;
        }
        let batch = self.cfg.step_budget.max(1);
        if st.demoting.is_empty() || (st.demoting.len() < batch && !flush_all) {
            return Ok((0, 0));
        }
        let n = if flush_all { st.demoting.len() } else { batch };
        let keys: Vec<Key> = st.demoting.drain(..n).collect();
        let mut payloads = Vec::with_capacity(keys.len());
        for &key in &keys {
            payloads.push(self.participant.get(key)?.map(|(b, _)| b));
        }
        let mut moved = 0;
        if let Some(mut sp) = self.spill() {
            let items: Vec<(Key, &[u8])> = keys
                .iter()
                .zip(&payloads)
                .filter_map(|(k, b)| b.as_deref().map(|b| (*k, b)))
                .collect();
            if let Err(e) = sp.write_batch(&items) {
                // Nothing moved: the blocks stay staged in the pool.
                st.demoting.extend(keys);
                return Err(e);
            }
            moved = items.len();
            st.stats.bytes_pool_to_ssd += items.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
            st.stats.demoted_to_ssd += moved as u64;
        }
        self.fault_point(FaultPoint::AfterSpillWrite);
        for &key in &keys {
            self.participant.delete(key)?;
        }
        let dropped = keys.len() - moved;
        st.stats.dropped += dropped as u64;
        Ok((moved, dropped))
    }

    /// Writes every block staged for demotion to SSD now.
    pub fn flush(&self) -> Result<()> {
        self.demote(0, true).map(|_| ())
    }

    fn promote_to_dram(&self, budget: usize) -> Result<usize> {
        let Some(d) = &self.dram else { return Ok(0) };
        let keys: Vec<Key> = {
            let mut st = self.state();
            let n = st.to_dram.len().min(budget);
            st.to_dram.drain(..n).collect()
        };
        let mut done = 0;
        for key in keys {
            // Hold the state lock across the copy so a demotion cannot drop the pool copy between
            // our read and the insert (which would leave a replica of a block not in the pool).
            let mut st = self.state();
            if st.slots.get(key).is_none() {
                continue;
            }
            if let Some((bytes, _)) = self.participant.get(key)? {
                d.insert(key, &bytes);
                st.stats.promoted_to_dram += 1;
                st.stats.bytes_pool_to_dram += bytes.len() as u64;
                done += 1;
            }
        }
        Ok(done)
    }

    /// Runs [`Self::step`] on a background thread every `period` (sooner while there is work)
    /// until the returned handle is stopped or dropped; it always runs at least one step.
    pub fn spawn(self: &Arc<Self>, period: std::time::Duration) -> TieringThread {
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (self.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name("cxlkv-tiering".into())
            .spawn(move || {
                // At least one step, even if stopped at once.
                loop {
                    let r = t.step()?;
                    if s.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    if r.idle() {
                        std::thread::sleep(period);
                    }
                }
            })
            .expect("spawn tiering thread");
        TieringThread {
            stop,
            handle: Some(handle),
        }
    }
}

/// The background tiering thread of [`Tiers::spawn`].
pub struct TieringThread {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<Result<()>>>,
}

impl TieringThread {
    /// Stops the thread; `Err` carries a step error, or a panic of the thread as `Ok(Err(..))`'s
    /// outer error (the thread's crash).
    pub fn stop(mut self) -> std::thread::Result<Result<()>> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().expect("joined once").join()
    }
}

impl Drop for TieringThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
