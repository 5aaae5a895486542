//! One simulated host's view of a [`SimBacking`]: [`SimHost`], a private write-back cache of
//! 64-byte lines, and its [`SharedMemory`] implementation.
//!
//! Reads fill the cache and then return the cached line, stale or not, until the line is acquired;
//! writes (atomics included: a non-coherent host's atomic store is just a store) dirty lines that
//! reach the backing only when published, acquired (write back then invalidate, as CLFLUSHOPT
//! does) or evicted at random moments (partial, out of order). A crash drops every unpublished
//! line. `raw_range` is `None` (no stable addresses). Every access of a scheduled host is a step:
//! random eviction, the crash check, and the scheduler's yield point.

use crate::backing::{aligned, SimBacking};
use crate::sched::{Sched, SimStuck};
use crate::sync::lock;
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_runtime::coherence::LINE;
use cxlkv_runtime::mem::{self, check_range, SharedMemory};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// A host's private cache: the lines it holds, those of them it wrote and has not written back,
/// and its fate (dead after a crash; `crash_at`: the step at which it crashes).
#[derive(Default)]
struct HostCache {
    lines: BTreeMap<u64, [u8; 64]>,
    dirty: BTreeSet<u64>,
    dead: bool,
    ops: u64,
    crash_at: Option<u64>,
}

/// The payload of a simulated crash (unwinds the crashing host's thread without a panic message).
pub(crate) struct SimCrash;

/// One simulated host's view of a [`SimBacking`]: a private write-back cache of 64-byte lines.
pub struct SimHost {
    id: usize,
    backing: Arc<SimBacking>,
    cache: Mutex<HostCache>,
    rng: Mutex<SplitMix64>,
    sched: Option<Arc<Sched>>,
    /// A scheduled step writes a random dirty line back with probability 1 / `evict`.
    evict: u64,
}

impl SimHost {
    /// A host over `backing` with an empty cache, not scheduled (runs whenever called).
    pub fn new(backing: Arc<SimBacking>, seed: u64) -> SimHost {
        SimHost {
            id: 0,
            backing,
            cache: Mutex::default(),
            rng: Mutex::new(SplitMix64::new(seed)),
            sched: None,
            evict: 32,
        }
    }

    /// Host `id` of a run scheduled by `sched`: a scheduled step may write a random dirty line
    /// back (with probability 1 / `evict`); with `crash_at`, the host crashes at that step.
    pub(crate) fn scheduled(
        backing: Arc<SimBacking>,
        seed: u64,
        id: usize,
        sched: Arc<Sched>,
        evict: u64,
        crash_at: Option<u64>,
    ) -> SimHost {
        let host = SimHost {
            id,
            sched: Some(sched),
            evict,
            ..SimHost::new(backing, seed)
        };
        lock(&host.cache).crash_at = crash_at;
        host
    }

    /// Dirty lines not yet written back.
    pub fn dirty_lines(&self) -> usize {
        lock(&self.cache).dirty.len()
    }

    /// Crashes the host now: its unpublished lines are lost and later accesses do nothing.
    pub fn crash(&self) {
        let mut c = lock(&self.cache);
        c.dead = true;
        c.lines.clear();
        c.dirty.clear();
    }

    /// Crashes the host now (as at its planned step) if a crash is planned and has not come yet:
    /// a host that finished its operations before its crash step crashes while it waits for the
    /// others instead (which unwinds its thread).
    pub(crate) fn crash_if_planned(&self) {
        let mut c = lock(&self.cache);
        if c.dead || c.crash_at.is_none_or(|at| at <= c.ops) {
            return;
        }
        c.dead = true;
        c.lines.clear();
        c.dirty.clear();
        drop(c);
        std::panic::resume_unwind(Box::new(SimCrash));
    }

    /// A step: random eviction, the crash check, and the scheduler's yield point. `false` when
    /// the host is dead (the access does nothing).
    fn step(&self) -> bool {
        {
            let mut c = lock(&self.cache);
            if c.dead {
                return false;
            }
            c.ops += 1;
            if self.sched.as_ref().is_some_and(|s| s.stuck()) {
                // The run is stuck: this host stops here (its later accesses do nothing).
                c.dead = true;
                drop(c);
                std::panic::resume_unwind(Box::new(SimStuck));
            }
            if c.crash_at == Some(c.ops) {
                c.dead = true;
                c.lines.clear();
                c.dirty.clear();
                drop(c);
                std::panic::resume_unwind(Box::new(SimCrash));
            }
            if self.sched.is_some() {
                let mut r = lock(&self.rng);
                // Random, partial, out-of-order write-back of a dirty line ...
                if r.below(self.evict) == 0 && !c.dirty.is_empty() {
                    let at = r.next_u64();
                    let line = c
                        .dirty
                        .range(at % (1 << 20)..)
                        .next()
                        .or_else(|| c.dirty.iter().next())
                        .copied();
                    if let Some(l) = line {
                        c.dirty.remove(&l);
                        let data = c.lines[&l];
                        self.backing.store_line(l, &data);
                    }
                }
                // ... and eviction of a clean line.
                if r.below(16) == 0 && !c.lines.is_empty() {
                    let at = r.next_u64() % (1 << 20);
                    let line = c.lines.range(at..).next().map(|(l, _)| *l);
                    if let Some(l) = line {
                        if !c.dirty.contains(&l) {
                            c.lines.remove(&l);
                        }
                    }
                }
            }
        }
        if let Some(s) = &self.sched {
            s.yield_point(self.id);
        }
        true
    }

    /// Calls `f(line, lo, hi, at)` for every line overlapping `[offset, offset + len)`, filling
    /// the cache from the backing: bytes `lo..hi` of the line are bytes `at..at + hi - lo` of the
    /// access.
    fn with_lines(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(&mut [u8; 64], usize, usize, usize),
    ) {
        if len == 0 {
            return;
        }
        let mut c = lock(&self.cache);
        for l in offset / LINE..=(offset + len - 1) / LINE {
            let line = c
                .lines
                .entry(l)
                .or_insert_with(|| self.backing.load_line(l));
            let start = offset.max(l * LINE);
            let end = (offset + len).min((l + 1) * LINE);
            f(
                line,
                (start - l * LINE) as usize,
                (end - l * LINE) as usize,
                (start - offset) as usize,
            );
        }
    }

    fn mark_dirty(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let mut c = lock(&self.cache);
        for l in offset / LINE..=(offset + len - 1) / LINE {
            c.dirty.insert(l);
        }
    }
}

impl SharedMemory for SimHost {
    fn size(&self) -> u64 {
        self.backing.size()
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> mem::Result<()> {
        check_range(offset, dst.len() as u64, self.size())?;
        if !self.step() {
            dst.fill(0);
            return Ok(());
        }
        self.with_lines(offset, dst.len() as u64, |line, lo, hi, at| {
            dst[at..at + hi - lo].copy_from_slice(&line[lo..hi]);
        });
        Ok(())
    }
    fn write(&self, offset: u64, src: &[u8]) -> mem::Result<()> {
        check_range(offset, src.len() as u64, self.size())?;
        if !self.step() {
            return Ok(());
        }
        self.with_lines(offset, src.len() as u64, |line, lo, hi, at| {
            line[lo..hi].copy_from_slice(&src[at..at + hi - lo]);
        });
        self.mark_dirty(offset, src.len() as u64);
        Ok(())
    }
    fn fill(&self, offset: u64, len: u64, byte: u8) -> mem::Result<()> {
        check_range(offset, len, self.size())?;
        if !self.step() {
            return Ok(());
        }
        self.with_lines(offset, len, |line, lo, hi, _| {
            line[lo..hi].fill(byte);
        });
        self.mark_dirty(offset, len);
        Ok(())
    }
    fn load_u64(&self, offset: u64, _order: Ordering) -> mem::Result<u64> {
        aligned(offset)?;
        let mut v = [0u8; 8];
        self.read(offset, &mut v)?;
        Ok(u64::from_le_bytes(v))
    }
    fn store_u64(&self, offset: u64, value: u64, _order: Ordering) -> mem::Result<()> {
        aligned(offset)?;
        self.write(offset, &value.to_le_bytes())
    }
    fn compare_exchange_u64(
        &self,
        offset: u64,
        current: u64,
        new: u64,
    ) -> mem::Result<Result<u64, u64>> {
        // A non-coherent host's CAS works on its own cached line only.
        let v = self.load_u64(offset, Ordering::SeqCst)?;
        if v == current {
            self.store_u64(offset, new, Ordering::SeqCst)?;
            Ok(Ok(v))
        } else {
            Ok(Err(v))
        }
    }
    fn publish(&self, offset: u64, len: u64) {
        if check_range(offset, len, self.size()).is_err() || len == 0 || !self.step() {
            return;
        }
        let mut c = lock(&self.cache);
        let lines: Vec<u64> = c
            .dirty
            .range(offset / LINE..=(offset + len - 1) / LINE)
            .copied()
            .collect();
        for l in lines {
            c.dirty.remove(&l);
            self.backing.store_line(l, &c.lines[&l]);
        }
    }
    fn acquire(&self, offset: u64, len: u64) {
        if check_range(offset, len, self.size()).is_err() || len == 0 || !self.step() {
            return;
        }
        let mut c = lock(&self.cache);
        let lines: Vec<u64> = c
            .lines
            .range(offset / LINE..=(offset + len - 1) / LINE)
            .map(|(l, _)| *l)
            .collect();
        for l in lines {
            let data = c.lines.remove(&l).expect("listed");
            if c.dirty.remove(&l) {
                self.backing.store_line(l, &data);
            }
        }
    }
    fn raw_range(&self, offset: u64, len: u64) -> mem::Result<Option<*mut u8>> {
        check_range(offset, len, self.size())?;
        Ok(None)
    }
}
