//! The non-coherence simulator: many simulated hosts in one process, each with a private
//! write-back cache of 64-byte lines over shared backing memory, interleaved by a seeded scheduler.
//!
//! - [`SimBacking`]: the shared memory (what a CXL device holds). It is itself a coherent
//!   [`SharedMemory`] (direct access), used by checkers that look at memory after a run.
//! - [`SimHost`]: one host's view. Reads fill its cache and then return the cached line, stale or
//!   not, until the line is acquired; writes (atomics included: a non-coherent host's atomic store
//!   is just a store) dirty lines that reach the backing only when published, acquired (write back
//!   then invalidate, as CLFLUSHOPT does) or evicted at random moments (partial, out of order). A
//!   crash drops every unpublished line. `raw_range` is `None` (no stable addresses).
//! - The scheduler: host threads take turns holding a baton; every [`SharedMemory`] call is a
//!   yield point where the seeded RNG picks who runs next, so a run is reproducible from its seed.
//!
//! [`run_sim`] runs the randomized protocol test the real pool code on it: puts, gets, pins,
//! deletes, evictions, heartbeats, a crash and its takeover by a designated successor, checking
//! the invariants of docs/COHERENCE.md.

use cxlkv_runtime::clock::Clock;
use cxlkv_runtime::coherence::{Site, LINE};
use cxlkv_runtime::format::CoherenceMode;
use cxlkv_runtime::hotness::{read_hotlist, Access, HotEntry, Hotness};
use cxlkv_runtime::key::Key;
use cxlkv_runtime::mem::{self, check_range, SharedMemory};
use cxlkv_runtime::participant::{AttachOptions, Participant, PinnedBlock};
use cxlkv_runtime::pool::{Pool, PoolConfig, PoolError};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A small deterministic RNG (xorshift64*).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The shared backing memory of a simulation.
pub struct SimBacking {
    bytes: Mutex<Vec<u8>>,
}

impl SimBacking {
    /// `size` bytes (rounded up to whole lines) of pseudo-random garbage from `seed`, as memory
    /// holds before anyone formats it.
    pub fn new(size: u64, seed: u64) -> Arc<SimBacking> {
        let n = size.div_ceil(LINE) * LINE;
        let mut r = Rng::new(seed ^ 0xbac1);
        let bytes = (0..n / 8).flat_map(|_| r.next().to_le_bytes()).collect();
        Arc::new(SimBacking {
            bytes: Mutex::new(bytes),
        })
    }

    fn load_line(&self, line: u64) -> [u8; 64] {
        let b = lock(&self.bytes);
        let at = (line * LINE) as usize;
        b[at..at + 64].try_into().expect("64 bytes")
    }

    fn store_line(&self, line: u64, data: &[u8; 64]) {
        let mut b = lock(&self.bytes);
        let at = (line * LINE) as usize;
        b[at..at + 64].copy_from_slice(data);
    }
}

impl SharedMemory for SimBacking {
    fn size(&self) -> u64 {
        lock(&self.bytes).len() as u64
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> mem::Result<()> {
        let b = lock(&self.bytes);
        let at = check_range(offset, dst.len() as u64, b.len() as u64)?;
        dst.copy_from_slice(&b[at..at + dst.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, src: &[u8]) -> mem::Result<()> {
        let mut b = lock(&self.bytes);
        let at = check_range(offset, src.len() as u64, b.len() as u64)?;
        b[at..at + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn fill(&self, offset: u64, len: u64, byte: u8) -> mem::Result<()> {
        let mut b = lock(&self.bytes);
        let at = check_range(offset, len, b.len() as u64)?;
        b[at..at + len as usize].fill(byte);
        Ok(())
    }
    fn load_u64(&self, offset: u64, _order: Ordering) -> mem::Result<u64> {
        let mut v = [0u8; 8];
        aligned(offset)?;
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
        let v = self.load_u64(offset, Ordering::SeqCst)?;
        if v == current {
            self.store_u64(offset, new, Ordering::SeqCst)?;
            Ok(Ok(v))
        } else {
            Ok(Err(v))
        }
    }
    fn publish(&self, _offset: u64, _len: u64) {}
    fn acquire(&self, _offset: u64, _len: u64) {}
    fn raw_range(&self, offset: u64, len: u64) -> mem::Result<Option<*mut u8>> {
        check_range(offset, len, self.size())?;
        Ok(None)
    }
}

fn aligned(offset: u64) -> mem::Result<()> {
    if !offset.is_multiple_of(8) {
        return Err(mem::MemError::Misaligned { offset, align: 8 });
    }
    Ok(())
}

/// The baton: which host runs, and the simulated clock.
struct Sched {
    state: Mutex<SchedState>,
    cv: Condvar,
    started: AtomicBool,
    clock: Arc<AtomicU64>,
    /// Simulated nanoseconds per yield point.
    tick: u64,
    /// Simulated time by which a run must have finished ([`STUCK_AFTER_LEASES`]); past it every
    /// host unwinds at its next step and the run reports no progress.
    deadline: u64,
    stuck: AtomicBool,
}

/// A run that has not finished after this many leases of simulated time is stuck (a normal run
/// takes a few): a livelock, or a wait that can never end, reported as a violation.
const STUCK_AFTER_LEASES: u64 = 100;

struct SchedState {
    current: usize,
    runnable: Vec<bool>,
    rng: Rng,
    /// A yield point switches hosts with probability 1 / `switch`.
    switch: u64,
}

impl Sched {
    fn wait_turn(&self, me: usize) {
        let mut g = lock(&self.state);
        while g.current != me {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn yield_point(&self, me: usize) {
        if !self.started.load(Ordering::Relaxed) {
            return;
        }
        if self.clock.fetch_add(self.tick, Ordering::Relaxed) > self.deadline {
            self.stuck.store(true, Ordering::Relaxed);
        }
        let mut g = lock(&self.state);
        let sw = g.switch;
        if g.rng.below(sw) != 0 {
            return;
        }
        let next = Self::pick(&mut g).unwrap_or(me);
        if next != me {
            g.current = next;
            self.cv.notify_all();
            while g.current != me {
                g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
    }

    /// Hands the baton to another runnable host, if any (a stalled host waiting for something).
    fn yield_forced(&self, me: usize) {
        let mut g = lock(&self.state);
        let others: Vec<usize> = (0..g.runnable.len())
            .filter(|&i| i != me && g.runnable[i])
            .collect();
        if others.is_empty() {
            return;
        }
        let next = others[g.rng.below(others.len() as u64) as usize];
        g.current = next;
        self.cv.notify_all();
        while g.current != me {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn stuck(&self) -> bool {
        self.stuck.load(Ordering::Relaxed)
    }

    fn pick(g: &mut SchedState) -> Option<usize> {
        let live: Vec<usize> = (0..g.runnable.len()).filter(|&i| g.runnable[i]).collect();
        if live.is_empty() {
            return None;
        }
        let i = g.rng.below(live.len() as u64) as usize;
        Some(live[i])
    }

    fn finish(&self, me: usize) {
        let mut g = lock(&self.state);
        g.runnable[me] = false;
        if let Some(n) = Self::pick(&mut g) {
            g.current = n;
        }
        self.cv.notify_all();
    }
}

#[derive(Default)]
struct HostCache {
    lines: BTreeMap<u64, [u8; 64]>,
    dirty: BTreeSet<u64>,
    dead: bool,
    ops: u64,
    crash_at: Option<u64>,
}

/// The payload of a simulated crash (unwinds the crashing host's thread without a panic message).
struct SimCrash;

/// The payload that unwinds a host of a stuck run (see [`STUCK_AFTER_LEASES`]).
struct SimStuck;

/// One simulated host's view of a [`SimBacking`]: a private write-back cache of 64-byte lines.
pub struct SimHost {
    id: usize,
    backing: Arc<SimBacking>,
    cache: Mutex<HostCache>,
    rng: Mutex<Rng>,
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
            rng: Mutex::new(Rng::new(seed)),
            sched: None,
            evict: 32,
        }
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
                    let at = r.next();
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
                    let at = r.next() % (1 << 20);
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

/// Options of [`run_sim`].
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Simulated hosts (2..=8).
    pub hosts: u32,
    /// Seeds to run.
    pub seeds: u64,
    /// First seed.
    pub seed_start: u64,
    /// A publish/acquire site to remove (needs a build whose runtime has the `coherence-teeth` feature); see [`sites`].
    pub drop_site: Option<String>,
    /// Operations per host per seed.
    pub ops: u32,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            hosts: 4,
            seeds: 100,
            seed_start: 0,
            drop_site: None,
            ops: 40,
        }
    }
}

/// The first invariant violation of a run.
#[derive(Clone, Debug)]
pub struct Violation {
    /// The seed.
    pub seed: u64,
    /// Hosts of the run.
    pub hosts: u32,
    /// What broke.
    pub what: String,
    /// The last operations before it, oldest first.
    pub trace: Vec<String>,
}

/// Outcome of [`run_sim`].
#[derive(Clone, Debug)]
pub struct SimReport {
    /// Seeds run.
    pub seeds_run: u64,
    /// Crashes simulated (each followed by a takeover).
    pub crashes: u64,
    /// Operations run.
    pub ops: u64,
    /// The site removed, if any.
    pub dropped: Option<String>,
    /// The first violation, if any.
    pub violation: Option<Violation>,
    /// A configuration error (unknown site, a build without `coherence-teeth`).
    pub error: Option<String>,
}

impl SimReport {
    /// True when every seed ran and no invariant broke.
    pub fn ok(&self) -> bool {
        self.violation.is_none() && self.error.is_none()
    }
}

impl std::fmt::Display for SimReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(e) = &self.error {
            return write!(f, "sim: error: {e}");
        }
        let site = self
            .dropped
            .as_deref()
            .map(|s| format!(" (site {s} removed)"))
            .unwrap_or_default();
        match &self.violation {
            None => write!(
                f,
                "sim: ok{site}: {} seeds, {} operations, {} crashes with takeover; no invariant broke",
                self.seeds_run, self.ops, self.crashes
            ),
            Some(v) => {
                writeln!(
                    f,
                    "sim: VIOLATION{site} at seed {} ({} hosts): {}",
                    v.seed, v.hosts, v.what
                )?;
                writeln!(f, "trace (last {} operations):", v.trace.len())?;
                for t in &v.trace {
                    writeln!(f, "  {t}")?;
                }
                Ok(())
            }
        }
    }
}

/// Names of the pool's publish/acquire sites, which `--drop-site` accepts (the NDP ring sites,
/// [`Site::NDP`], are exercised by the device's ring test instead).
pub fn sites() -> Vec<&'static str> {
    Site::ALL
        .iter()
        .filter(|s| s.is_pool())
        .map(|s| s.name())
        .collect()
}

/// Runs the randomized protocol test over `opts.seeds` seeds, stopping at the first violation.
pub fn run_sim(opts: &SimOptions) -> SimReport {
    let mut rep = SimReport {
        seeds_run: 0,
        crashes: 0,
        ops: 0,
        dropped: opts.drop_site.clone(),
        violation: None,
        error: None,
    };
    let site = match opts.drop_site.as_deref() {
        None => None,
        Some(n) => match Site::from_name(n) {
            Some(s) if !s.is_pool() => {
                rep.error = Some(format!(
                    "{n} is a site of the NDP rings, not of the pool protocol this simulates \
                     (the device's ring test covers it: cargo test -p cxlkv-ndp --test ring_sim)"
                ));
                return rep;
            }
            Some(s) if cxlkv_runtime::coherence::TEETH => Some(s),
            Some(_) => {
                rep.error =
                    Some("--drop-site needs a build with the coherence-teeth feature".into());
                return rep;
            }
            None => {
                rep.error = Some(format!("unknown site {n:?}; sites: {}", sites().join(", ")));
                return rep;
            }
        },
    };
    if !(2..=8).contains(&opts.hosts) {
        rep.error = Some(format!("hosts must be 2..=8, got {}", opts.hosts));
        return rep;
    }
    for seed in opts.seed_start..opts.seed_start.saturating_add(opts.seeds) {
        let out = run_seed(opts.hosts as usize, seed, opts.ops, site);
        rep.seeds_run += 1;
        rep.ops += out.ops;
        rep.crashes += u64::from(out.crashed);
        if let Some(v) = out.violation {
            rep.violation = Some(v);
            break;
        }
    }
    rep
}

const LEASE_NS: u64 = 1_000_000;

/// The model of what was committed, shared by the host threads (updated while holding the baton).
#[derive(Default)]
struct Model {
    /// Per key `(host, index)`: version committed last (0 = none) and whether it was a delete.
    committed: BTreeMap<(usize, usize), (u64, bool)>,
    /// Per key: version of the last operation started.
    started: BTreeMap<(usize, usize), u64>,
    next_version: u64,
    epoch: u64,
    crashed: Option<usize>,
    /// The host that stalled past its lease (presumed dead, taken over, then resumed).
    zombie: Option<usize>,
    taken_over: bool,
    /// Hosts done with their operations (the end-of-run barrier).
    done_ops: Vec<bool>,
    finished: Vec<bool>,
    /// Indexed blocks per partition at the end of its owner's run (live owners only).
    live_blocks: BTreeMap<usize, usize>,
    /// Indexed blocks of each host after its last completed operation.
    last_live: Vec<usize>,
    /// Partition of the pin each host holds, if any.
    pins: BTreeMap<usize, u32>,
    /// Per partition: pins held when its owner last completed an operation, plus pins taken
    /// since (each may have made the owner's operation in flight unindex one more victim).
    pin_slack: BTreeMap<u32, usize>,
    /// Per host: simulated time of its last heartbeat known to be published (attach or a beat
    /// that returned), 0 before it attached.
    beat_at: Vec<u64>,
    /// Per host: it is detaching (its slot may read as free from then on).
    leaving: Vec<bool>,
    /// Per partition: claims started and claims completed (attach or takeover returned).
    claims: BTreeMap<u32, (u64, u64)>,
    /// Per partition: the last thing that happened to it was a release by a live owner's detach.
    released: BTreeMap<u32, bool>,
    /// Per host: every hotlist it published, oldest first.
    hotlists: Vec<Vec<Vec<HotEntry>>>,
    /// Per host: a hotlist publish is in flight.
    hl_busy: Vec<bool>,
    violation: Option<String>,
    trace: Vec<String>,
    ops: u64,
}

impl Model {
    /// Host `q` may legitimately look dead or hold no current hotlist: it crashed, stalled past
    /// its lease, is detaching, or has not attached yet.
    fn out_of_watch(&self, q: usize) -> bool {
        self.crashed == Some(q) || self.zombie == Some(q) || self.leaving[q] || self.beat_at[q] == 0
    }

    fn log(&mut self, s: String) {
        if self.trace.len() >= 24 {
            self.trace.remove(0);
        }
        self.trace.push(s);
    }
    fn fail(&mut self, s: String) {
        if self.violation.is_none() {
            self.violation = Some(s);
        }
    }
}

/// One simulated host's clock: the simulation's clock plus how far this host's runs ahead (a
/// stalled host's clock ran on while the others saw no heartbeat).
struct HostClock {
    sim: Arc<AtomicU64>,
    ahead: AtomicU64,
}

impl Clock for HostClock {
    fn now_ns(&self) -> u64 {
        self.sim.load(Ordering::Relaxed) + self.ahead.load(Ordering::Relaxed)
    }
}

struct Ctx {
    hosts: Vec<Arc<SimHost>>,
    clocks: Vec<Arc<HostClock>>,
    backing: Arc<SimBacking>,
    sched: Arc<Sched>,
    model: Mutex<Model>,
    keys: usize,
    ops: u32,
    crash: Option<usize>,
    /// `(host, op)`: the host stalls past its lease before that operation.
    stall: Option<(usize, u32)>,
    seed: u64,
    site: Option<Site>,
    stop: AtomicBool,
}

struct SeedOutcome {
    ops: u64,
    crashed: bool,
    violation: Option<Violation>,
}

fn key_of(h: usize, i: usize) -> Key {
    Key::from_bytes(
        &[
            b"sim".as_slice(),
            &(h as u64).to_le_bytes(),
            &(i as u64).to_le_bytes(),
        ]
        .concat(),
    )
}

/// The bytes a put of version `v` stores under key `(h, i)`.
fn payload(h: usize, i: usize, v: u64) -> Vec<u8> {
    let mut r = Rng::new(v.wrapping_mul(31) ^ ((h as u64) << 40) ^ ((i as u64) << 20));
    let len = 24 + r.below(600) as usize;
    let mut b: Vec<u8> = [
        (h as u64).to_le_bytes(),
        (i as u64).to_le_bytes(),
        v.to_le_bytes(),
    ]
    .concat();
    b.extend((24..len).map(|_| r.next() as u8));
    b
}

/// Version encoded in a payload of key `(h, i)` if the bytes are exactly that version's.
fn version_of(h: usize, i: usize, bytes: &[u8]) -> Option<u64> {
    let v = u64::from_le_bytes(bytes.get(16..24)?.try_into().ok()?);
    (payload(h, i, v) == bytes).then_some(v)
}

fn run_seed(hosts: usize, seed: u64, ops: u32, site: Option<Site>) -> SeedOutcome {
    let mut rng = Rng::new(seed);
    let cfg = PoolConfig {
        block_size: 4096,
        participants: hosts as u32,
        partitions: None,
        lease: Duration::from_nanos(LEASE_NS),
        coherence: CoherenceMode::Software,
    };
    let blocks = 3 + rng.below(3);
    let base = cxlkv_runtime::pool::plan(64 << 20, &cfg)
        .expect("plan")
        .partition_off;
    let size = base + hosts as u64 * (blocks + 3) * 4096;
    let backing = SimBacking::new(size, seed);
    let clock = Arc::new(AtomicU64::new(1_000_000_000));
    let sched = Arc::new(Sched {
        state: Mutex::new(SchedState {
            current: 0,
            runnable: vec![true; hosts],
            rng: Rng::new(seed ^ 0x5ced),
            switch: 1 + rng.below(6),
        }),
        cv: Condvar::new(),
        started: AtomicBool::new(false),
        clock: clock.clone(),
        // A lease lasts about 3000 or 12000 yield points per host (per seed): a few or many
        // operations of every host, so runs outlive leases and heartbeats must reach memory.
        tick: LEASE_NS / ([3000, 12000][Rng::new(seed ^ 0x1ea5e).below(2) as usize] * hosts as u64),
        deadline: 1_000_000_000 + STUCK_AFTER_LEASES * LEASE_NS,
        stuck: AtomicBool::new(false),
    });
    // A third of the seeds crash a host, a third stall one past its lease (a zombie owner).
    let fate = rng.below(3);
    let victim = rng.below(hosts as u64) as usize;
    let crash = (fate == 1).then_some(victim);
    // Caches that write dirty lines back often (a busy host) or rarely (an idle one).
    let evict = [16, 256, 4096][rng.below(3) as usize];
    let stall = (fate == 2).then(|| (victim, rng.below(u64::from(ops)) as u32));
    let successor = (fate != 0).then_some(victim);
    let hs: Vec<Arc<SimHost>> = (0..hosts)
        .map(|h| {
            let mut host = SimHost::new(backing.clone(), seed ^ (h as u64 + 1) << 32);
            host.id = h;
            host.sched = Some(sched.clone());
            host.evict = evict;
            if crash == Some(h) {
                lock(&host.cache).crash_at = Some(200 + rng.below(6000));
            }
            Arc::new(host)
        })
        .collect();
    // Every host touched the memory before it was formatted: its cache holds stale lines of the
    // superblock, the participant table and the partitions (owner words, indexes, blocks).
    for h in &hs {
        let mut buf = vec![0u8; 4096 * (hosts + 1)];
        let _ = h.read(0, &mut buf);
        let mut parts = vec![0u8; (size - base) as usize];
        let _ = h.read(base, &mut parts);
    }
    let keys = blocks as usize + 2;
    let ctx = Arc::new(Ctx {
        hosts: hs.clone(),
        clocks: (0..hosts)
            .map(|_| {
                Arc::new(HostClock {
                    sim: clock.clone(),
                    ahead: AtomicU64::new(0),
                })
            })
            .collect(),
        backing: backing.clone(),
        sched: sched.clone(),
        model: Mutex::new(Model {
            finished: vec![false; hosts],
            done_ops: vec![false; hosts],
            last_live: vec![0; hosts],
            beat_at: vec![0; hosts],
            leaving: vec![false; hosts],
            hotlists: vec![Vec::new(); hosts],
            hl_busy: vec![false; hosts],
            ..Default::default()
        }),
        keys,
        ops,
        crash: successor,
        stall,
        seed,
        site,
        stop: AtomicBool::new(false),
    });
    // Host 0 formats the pool before the others start.
    let created = {
        cxlkv_runtime::coherence::set_drop_site(site);
        let r = Pool::create(hs[0].clone(), &cfg);
        cxlkv_runtime::coherence::set_drop_site(None);
        r
    };
    if let Err(e) = created {
        return SeedOutcome {
            ops: 0,
            crashed: false,
            violation: Some(Violation {
                seed,
                hosts: hosts as u32,
                what: format!("create failed: {e}"),
                trace: vec![],
            }),
        };
    }
    sched.started.store(true, Ordering::SeqCst);
    let threads: Vec<_> = (0..hosts)
        .map(|h| {
            let ctx = ctx.clone();
            std::thread::Builder::new()
                .name(format!("sim-host-{h}"))
                .spawn(move || {
                    cxlkv_runtime::coherence::set_drop_site(ctx.site);
                    ctx.sched.wait_turn(h);
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        host_main(&ctx, h)
                    }));
                    match r {
                        Ok(()) => {}
                        Err(p) if p.is::<SimStuck>() => {
                            lock(&ctx.model).fail(format!(
                                "no progress: the run did not finish within {STUCK_AFTER_LEASES} leases of simulated time (a livelock, or a wait that never ends)"
                            ));
                            ctx.stop.store(true, Ordering::SeqCst);
                        }
                        Err(p) if p.is::<SimCrash>() => {
                            let mut m = lock(&ctx.model);
                            m.crashed = Some(h);
                            m.done_ops[h] = true;
                            m.log(format!("host {h}: CRASH (unpublished lines dropped)"));
                            // Time passes: the dead host's last heartbeat is older than a lease.
                            age_heartbeat(&ctx, h);
                        }
                        Err(p) => {
                            let msg = p
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            lock(&ctx.model).fail(format!("host {h} panicked: {msg}"));
                            ctx.stop.store(true, Ordering::SeqCst);
                        }
                    }
                    lock(&ctx.model).finished[h] = true;
                    ctx.sched.finish(h);
                })
                .expect("spawn sim host")
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let crashed = lock(&ctx.model).crashed.is_some();
    if lock(&ctx.model).violation.is_none() {
        final_check(&ctx, &backing, &cfg);
    }
    let m = lock(&ctx.model);
    SeedOutcome {
        ops: m.ops,
        crashed,
        violation: m.violation.clone().map(|what| Violation {
            seed: ctx.seed,
            hosts: hosts as u32,
            what,
            trace: m.trace.clone(),
        }),
    }
}

/// Makes host `h`'s published heartbeat older than a lease (time passed without it beating).
fn age_heartbeat(ctx: &Ctx, h: usize) {
    let now = ctx.sched.clock.load(Ordering::SeqCst);
    let off = cxlkv_runtime::format::SUPERBLOCK_SIZE
        + h as u64 * cxlkv_runtime::format::PARTICIPANT_SLOT_SIZE
        + cxlkv_runtime::format::slot::HEARTBEAT;
    let _ = ctx
        .backing
        .store_u64(off, now.saturating_sub(2 * LEASE_NS), Ordering::SeqCst);
}

/// Checks a get's result for key `(kh, ki)`: a miss, or exactly a version committed no earlier
/// than `lo` and started no later than the end of the get.
fn check_read(ctx: &Ctx, who: &str, kh: usize, ki: usize, lo: (u64, bool), bytes: Option<&[u8]>) {
    let mut m = lock(&ctx.model);
    let hi = m.started.get(&(kh, ki)).copied().unwrap_or(0);
    match bytes {
        None => m.log(format!("{who}: get ({kh},{ki}) miss")),
        Some(b) => match version_of(kh, ki, b) {
            None => m.fail(format!(
                "{who}: get ({kh},{ki}) returned {} bytes that no put wrote",
                b.len()
            )),
            Some(v) if v < lo.0 || (v == lo.0 && lo.1) || v > hi => m.fail(format!(
                "{who}: get ({kh},{ki}) returned version {v}, but version {} ({}) was committed before the get",
                lo.0,
                if lo.1 { "delete" } else { "put" }
            )),
            Some(v) => m.log(format!("{who}: get ({kh},{ki}) -> v{v}")),
        },
    }
}

fn host_main(ctx: &Ctx, h: usize) {
    let mem: Arc<dyn SharedMemory> = ctx.hosts[h].clone();
    let who = format!("host {h}");
    let fail = |s: String| {
        lock(&ctx.model).fail(s);
        ctx.stop.store(true, Ordering::SeqCst);
    };
    let pool = match Pool::open_with_clock(mem.clone(), ctx.clocks[h].clone()) {
        Ok(p) => p,
        Err(e) => return fail(format!("{who}: open: {e}")),
    };
    let opts = AttachOptions {
        heartbeat: false,
        own_partition: true,
    };
    let attach_time = ctx.sched.clock.load(Ordering::SeqCst);
    claim_started(ctx, h as u32);
    let me = match Participant::attach_slot(&pool, h as u32, opts.clone()) {
        Ok(p) => p,
        Err(e) => return fail(format!("{who}: attach: {e}")),
    };
    claim_done(ctx, h as u32, Some((h, attach_time)));
    if me.partition() != Some(h as u32) {
        return fail(format!("{who}: attached without its partition"));
    }
    let mut rng = Rng::new(ctx.seed.wrapping_mul(7919) ^ h as u64);
    let hot = Hotness::new(1 << 40);
    let mut adopter: Option<Participant> = None;
    let mut pin: Option<(PinnedBlock<'_>, Vec<u8>, u64, u32)> = None;
    let successor_of = ctx.crash.filter(|&c| (c + 1) % ctx.hosts.len() == h);
    let mut op = 0u32;
    let mut owner = true;
    // Attaching wrote a heartbeat.
    let mut last_beat = attach_time;
    // True once this host's own lease lapsed (a long operation, e.g. gets spinning on a dead
    // writer's slot, starved the beats): a software-coherent participant then fences itself.
    let lapsed = |last_beat: u64| {
        ctx.sched
            .clock
            .load(Ordering::SeqCst)
            .saturating_sub(last_beat)
            > LEASE_NS
    };
    // Some hosts only read (they never scan pins, so nothing but their own publishes moves their
    // slot's lines to memory).
    let reader = rng.below(3) == 0;
    loop {
        if ctx.stop.load(Ordering::SeqCst) {
            return;
        }
        if ctx.stall == Some((h, op)) && owner {
            // Stall past the lease: presumed dead and taken over by the successor, then resume as
            // a zombie that must find itself fenced.
            {
                let mut m = lock(&ctx.model);
                m.crashed = Some(h);
                m.zombie = Some(h);
                m.epoch += 1;
                m.log(format!("{who}: STALL past its lease"));
            }
            // Its clock ran on past the lease while it stalled, and the others saw no heartbeat.
            ctx.clocks[h]
                .ahead
                .fetch_add(2 * LEASE_NS, Ordering::Relaxed);
            age_heartbeat(ctx, h);
            while !lock(&ctx.model).taken_over
                && !ctx.stop.load(Ordering::SeqCst)
                && !ctx.sched.stuck()
            {
                ctx.sched.yield_forced(h);
            }
            lock(&ctx.model).log(format!("{who}: resumes after the takeover"));
            owner = false;
        }
        // Takeover by the designated successor once the crash happened.
        if let Some(c) = successor_of {
            let (crashed, done) = {
                let m = lock(&ctx.model);
                (m.crashed == Some(c), m.finished[c])
            };
            if crashed && adopter.is_none() {
                claim_started(ctx, c as u32);
                match Participant::attach_slot(&pool, c as u32, opts.clone()) {
                    Ok(p) => {
                        claim_done(ctx, c as u32, None);
                        let mut m = lock(&ctx.model);
                        let rec = p.recovery.clone();
                        m.log(format!("{who}: takeover of {c}: {rec:?}"));
                        // The crashed owner's operation in flight may have unindexed one block per
                        // pin it found on a victim, plus one.
                        let slack = 1 + m.pin_slack.get(&(c as u32)).copied().unwrap_or(0);
                        let before = m.last_live[c];
                        if (rec.blocks as usize) + slack < before {
                            m.fail(format!(
                                "{who}: takeover of {c} recovered {} blocks; {before} were committed and indexed",
                                rec.blocks
                            ));
                        }
                        m.taken_over = true;
                        adopter = Some(p);
                    }
                    Err(e) => return fail(format!("{who}: takeover of {c} failed: {e}")),
                }
            }
            if op >= ctx.ops && (adopter.is_some() || (done && !crashed)) {
                break;
            }
        } else if op >= ctx.ops {
            break;
        }
        op += 1;
        lock(&ctx.model).ops += 1;
        // Beat now and then, and always first after the clock jumped past a lease (a live host's
        // heartbeat thread would have kept its lease fresh).
        let now = ctx.sched.clock.load(Ordering::SeqCst);
        let prev_beat = last_beat;
        if rng.below(4) == 0 || now.saturating_sub(last_beat) > LEASE_NS / 4 {
            last_beat = now;
            match me.beat() {
                Ok(()) => lock(&ctx.model).beat_at[h] = now,
                Err(PoolError::Fenced { .. }) if !owner || lapsed(prev_beat) => {
                    if owner {
                        lock(&ctx.model).log(format!("{who}: own lease lapsed; fenced itself"));
                        owner = false;
                    }
                }
                Err(e) => return fail(format!("{who}: beat: {e}")),
            }
        }
        // A held pin: its block must not have been reused while the pin's lease is live.
        if let Some((p, bytes, epoch, left)) = pin.take() {
            let loc = p.info().location;
            let off = pool.partition_offset(loc.partition).expect("valid")
                + pool.superblock().payloads_off
                + u64::from(loc.block) * pool.block_size();
            mem.acquire(off, p.len());
            let mut now = vec![0u8; p.len() as usize];
            if let Err(e) = p.read(0, &mut now) {
                return fail(format!("{who}: pinned read: {e}"));
            }
            let m_epoch = lock(&ctx.model).epoch;
            // Only while the pin's lease is live (this host's heartbeat fresh).
            if m_epoch == epoch && !lapsed(prev_beat) && owner && now != bytes {
                return fail(format!(
                    "{who}: pinned block {loc:?} was reused while pinned"
                ));
            }
            if left > 0 {
                pin = Some((p, bytes, epoch, left - 1));
            } else {
                lock(&ctx.model).pins.remove(&h);
            }
        }
        // Watch the predecessor's heartbeat, as a deployment's successor would: a live host (its
        // last beat, published, within a lease) must never look dead.
        if owner && rng.below(3) == 0 {
            if let Err(e) = watch_predecessor(ctx, &pool, h) {
                return fail(format!("{who}: liveness read: {e}"));
            }
        }
        // Hotness: publish this host's hotlist now and then, and read another host's.
        if owner && rng.below(6) == 0 {
            let list = hot.hotlist();
            lock(&ctx.model).hl_busy[h] = true;
            let r = hot.publish(&me);
            let mut m = lock(&ctx.model);
            m.hl_busy[h] = false;
            match r {
                Ok(()) => m.hotlists[h].push(list),
                Err(PoolError::Fenced { .. }) if lapsed(last_beat) => owner = false,
                Err(e) => {
                    drop(m);
                    return fail(format!("{who}: hotlist publish: {e}"));
                }
            }
        }
        if rng.below(6) == 0 {
            let q = rng.below(ctx.hosts.len() as u64) as usize;
            if q != h {
                if let Err(e) = check_hotlist(ctx, &pool, h, q) {
                    return fail(format!("{who}: hotlist read: {e}"));
                }
            }
        }
        let mut choice = rng.below(10);
        if reader && choice < 4 {
            choice += 4;
        }
        let (kh, ki) = if choice < 4 {
            (h, rng.below(ctx.keys as u64) as usize)
        } else {
            (
                rng.below(ctx.hosts.len() as u64) as usize,
                rng.below(ctx.keys as u64) as usize,
            )
        };
        let key = key_of(kh, ki);
        match choice {
            0..=2 => {
                let v = {
                    let mut m = lock(&ctx.model);
                    m.next_version += 1;
                    let v = m.next_version;
                    m.started.insert((kh, ki), v);
                    v
                };
                match me.put(key, &payload(kh, ki, v)) {
                    Ok(_) if !owner => {
                        return fail(format!(
                            "{who}: put ({kh},{ki}) committed after its partition was taken over"
                        ));
                    }
                    Err(PoolError::Fenced { .. }) if !owner || lapsed(last_beat) => {
                        owner = false;
                        lock(&ctx.model).log(format!("{who}: put ({kh},{ki}) fenced"));
                    }
                    Ok(_) => {
                        let mut m = lock(&ctx.model);
                        m.committed.insert((kh, ki), (v, false));
                        m.last_live[h] = me.live_blocks();
                        m.log(format!("{who}: put ({kh},{ki}) v{v}"));
                    }
                    Err(PoolError::PartitionFull(_)) => {
                        let mut m = lock(&ctx.model);
                        m.last_live[h] = me.live_blocks();
                        m.log(format!("{who}: put ({kh},{ki}) full"));
                    }
                    Err(e) => return fail(format!("{who}: put ({kh},{ki}) v{v}: {e}")),
                }
            }
            3 => {
                let v = {
                    let mut m = lock(&ctx.model);
                    m.next_version += 1;
                    let v = m.next_version;
                    m.started.insert((kh, ki), v);
                    v
                };
                match me.delete(key) {
                    Ok(_) if !owner => {
                        return fail(format!(
                            "{who}: delete ({kh},{ki}) ran after its partition was taken over"
                        ));
                    }
                    Err(PoolError::Fenced { .. }) if !owner || lapsed(last_beat) => {
                        owner = false;
                        lock(&ctx.model).log(format!("{who}: delete ({kh},{ki}) fenced"));
                    }
                    Ok(found) => {
                        let mut m = lock(&ctx.model);
                        m.committed.insert((kh, ki), (v, true));
                        m.last_live[h] = me.live_blocks();
                        m.log(format!("{who}: delete ({kh},{ki}) v{v} found={found}"));
                    }
                    Err(e) => return fail(format!("{who}: delete ({kh},{ki}): {e}")),
                }
            }
            4..=7 => {
                let lo = lock(&ctx.model)
                    .committed
                    .get(&(kh, ki))
                    .copied()
                    .unwrap_or((0, false));
                hot.record(key, Access::Get);
                match me.get(key) {
                    Ok(r) => check_read(ctx, &who, kh, ki, lo, r.as_ref().map(|(b, _)| &b[..])),
                    Err(e) => return fail(format!("{who}: get ({kh},{ki}): {e}")),
                }
            }
            _ => {
                if pin.is_some() {
                    continue;
                }
                let lo = lock(&ctx.model)
                    .committed
                    .get(&(kh, ki))
                    .copied()
                    .unwrap_or((0, false));
                hot.record(key, Access::Pin);
                match me.pin(key) {
                    Ok(Some(p)) => {
                        let mut b = vec![0u8; p.len() as usize];
                        if let Err(e) = p.read(0, &mut b) {
                            return fail(format!("{who}: pinned read: {e}"));
                        }
                        check_read(ctx, &format!("{who} (pin)"), kh, ki, lo, Some(&b));
                        let epoch = {
                            let mut m = lock(&ctx.model);
                            let part = p.info().location.partition;
                            m.pins.insert(h, part);
                            *m.pin_slack.entry(part).or_default() += 1;
                            m.epoch
                        };
                        pin = Some((p, b, epoch, 1 + rng.below(4) as u32));
                    }
                    Ok(None) => check_read(ctx, &format!("{who} (pin)"), kh, ki, lo, None),
                    Err(PoolError::PinTableFull(_)) => {}
                    Err(PoolError::Fenced { .. }) if !owner || lapsed(last_beat) => owner = false,
                    Err(e) => return fail(format!("{who}: pin ({kh},{ki}): {e}")),
                }
            }
        }
        let mut m = lock(&ctx.model);
        let held = m.pins.values().filter(|&&p| p == h as u32).count();
        m.pin_slack.insert(h as u32, held);
        if m.violation.is_some() {
            ctx.stop.store(true, Ordering::SeqCst);
            return;
        }
    }
    drop(pin);
    {
        let mut m = lock(&ctx.model);
        if owner {
            m.live_blocks.insert(h, me.live_blocks());
        }
        if let (Some(a), Some(c)) = (&adopter, successor_of) {
            m.live_blocks.insert(c, a.live_blocks());
        }
        m.done_ops[h] = true;
    }
    // Barrier: wait (yielding) until every host is done, then read every live owner's keys
    // through this host's own (possibly stale) cache.
    loop {
        if ctx.stop.load(Ordering::SeqCst) {
            return;
        }
        if lock(&ctx.model).done_ops.iter().all(|&d| d) {
            break;
        }
        let _ = mem.load_u64(0, Ordering::Relaxed);
    }
    check_owners(ctx, &who, &pool);
    // Detach: a participant that is not presumed dead releases its partition (owner word holder
    // 0); the final check reads that from memory.
    // Each flag is taken right before its detach: a detach is memory steps, during which the
    // simulated clock runs on and this host's own lease may lapse before the next one.
    lock(&ctx.model).leaving[h] = true;
    if let (Some(a), Some(c)) = (adopter, successor_of) {
        let releases = !a.presumed_dead();
        lock(&ctx.model).released.insert(c as u32, releases);
        drop(a);
    }
    if owner {
        let releases = !me.presumed_dead();
        lock(&ctx.model).released.insert(h as u32, releases);
    }
    drop(me);
}

fn claim_started(ctx: &Ctx, p: u32) {
    lock(&ctx.model).claims.entry(p).or_default().0 += 1;
}

/// A claim of partition `p` returned; `beat`: the attaching host and the time before its attach
/// (its first heartbeat is no older).
fn claim_done(ctx: &Ctx, p: u32, beat: Option<(usize, u64)>) {
    let mut m = lock(&ctx.model);
    m.claims.entry(p).or_default().1 += 1;
    m.released.insert(p, false);
    if let Some((h, t)) = beat {
        m.beat_at[h] = t;
    }
}

/// Host `h` reads host `q`'s hotlist (the HotlistRead site). Fails the run on a list `q` never
/// published at or after the one it had completed when the read began (torn or stale), or on no
/// list at all while `q` published nothing during the read.
fn check_hotlist(ctx: &Ctx, pool: &Pool, h: usize, q: usize) -> cxlkv_runtime::pool::Result<()> {
    let excused = |m: &Model| m.out_of_watch(q);
    let (busy0, n0) = {
        let m = lock(&ctx.model);
        if excused(&m) {
            return Ok(());
        }
        (m.hl_busy[q], m.hotlists[q].len())
    };
    let got = read_hotlist(pool, q as u32)?;
    let mut m = lock(&ctx.model);
    if excused(&m) {
        return Ok(());
    }
    let (busy1, n1) = (m.hl_busy[q], m.hotlists[q].len());
    match got {
        Some((_, list)) => {
            let valid = (n0 == 0 && list.is_empty())
                || m.hotlists[q][n0.saturating_sub(1)..].contains(&list);
            if !valid {
                m.fail(format!(
                    "host {h}: read a hotlist of {} entries that host {q} never published at or after its publish #{n0}",
                    list.len()
                ));
            } else {
                m.log(format!("host {h}: hotlist of {q}: {} entries", list.len()));
            }
        }
        None if !busy0 && !busy1 && n0 == n1 => m.fail(format!(
            "host {h}: found no valid hotlist of host {q}, which was not publishing"
        )),
        None => m.log(format!("host {h}: hotlist of {q} mid-update")),
    }
    Ok(())
}

/// Host `h` judges its predecessor's liveness from memory (`participant_dead`, the LivenessRead
/// site). Fails the run if a host whose last published heartbeat is within a lease looks dead.
fn watch_predecessor(ctx: &Ctx, pool: &Pool, h: usize) -> cxlkv_runtime::pool::Result<()> {
    let n = ctx.hosts.len();
    let q = (h + n - 1) % n;
    let excused = |m: &Model| m.out_of_watch(q);
    let beat_at = {
        let m = lock(&ctx.model);
        if excused(&m) {
            return Ok(());
        }
        m.beat_at[q]
    };
    let dead = cxlkv_runtime::participant::participant_dead(pool, q as u32)?;
    let now = ctx.sched.clock.load(Ordering::SeqCst);
    let mut m = lock(&ctx.model);
    if dead && !excused(&m) && now.saturating_sub(beat_at) <= LEASE_NS {
        m.fail(format!(
            "host {h}: host {q} looks dead, but it beat {} ns ago (lease {LEASE_NS} ns)",
            now - beat_at
        ));
    } else {
        m.log(format!("host {h}: host {q} dead={dead}"));
    }
    Ok(())
}

/// Every live owner's keys, read by `pool`'s host: each hit is the latest committed version, and
/// the hits are exactly the blocks the owner holds indexed.
fn check_owners(ctx: &Ctx, who: &str, pool: &Pool) {
    let (owners, committed, started, crashed) = {
        let m = lock(&ctx.model);
        (
            m.live_blocks.clone(),
            m.committed.clone(),
            m.started.clone(),
            m.crashed,
        )
    };
    let mut fail = None;
    'owners: for (&h, &n) in &owners {
        let mut hits = 0;
        for i in 0..ctx.keys {
            let (v, deleted) = committed.get(&(h, i)).copied().unwrap_or((0, false));
            let started = started.get(&(h, i)).copied().unwrap_or(0);
            match pool.get(key_of(h, i)) {
                Ok(None) => {}
                Ok(Some((b, _))) => {
                    hits += 1;
                    let got = version_of(h, i, &b);
                    let inflight = crashed == Some(h) && got == Some(started);
                    if (got != Some(v) || deleted) && !inflight {
                        fail = Some(format!(
                            "{who}: final read of ({h},{i}) finds {got:?}, latest committed is v{v} (deleted={deleted})"
                        ));
                        break 'owners;
                    }
                }
                Err(e) => {
                    fail = Some(format!("{who}: final get ({h},{i}): {e}"));
                    break 'owners;
                }
            }
        }
        if hits != n {
            fail = Some(format!(
                "{who}: partition {h}'s owner holds {n} blocks indexed, this host reads {hits}"
            ));
            break;
        }
    }
    if let Some(f) = fail {
        lock(&ctx.model).fail(f);
        ctx.stop.store(true, Ordering::SeqCst);
    }
}

/// After the run: a fresh host reads every key of every live owner's partition; each hit must be
/// the latest committed version, and every block an owner holds indexed must be readable.
fn final_check(ctx: &Ctx, backing: &Arc<SimBacking>, _cfg: &PoolConfig) {
    let checker: Arc<dyn SharedMemory> = Arc::new(SimHost::new(backing.clone(), 0));
    let pool = match Pool::open(checker) {
        Ok(p) => p,
        Err(e) => return lock(&ctx.model).fail(format!("checker: open: {e}")),
    };
    let mut m = lock(&ctx.model);
    // Owner words: a generation for every claim (at least the completed ones, at most the started
    // ones: a claim in flight at a crash may or may not have landed), and released by a clean
    // detach.
    for (&p, &(started, done)) in &m.claims.clone() {
        let off = pool.partition_offset(p).expect("valid partition")
            + cxlkv_runtime::format::partition::OWNER;
        let word = match pool.memory().load_u64(off, Ordering::Acquire) {
            Ok(w) => w,
            Err(e) => return m.fail(format!("checker: owner word of partition {p}: {e}")),
        };
        let (gen, holder) = (word >> 32, word & 0xffff_ffff);
        if gen < done || gen > started {
            return m.fail(format!(
                "checker: partition {p}'s owner generation is {gen} after {done} completed and {started} started claims"
            ));
        }
        if m.released.get(&p) == Some(&true) && holder != 0 {
            return m.fail(format!(
                "checker: partition {p} was released by its owner's detach, but memory names holder {holder}"
            ));
        }
    }
    let owners: Vec<(usize, usize)> = m.live_blocks.iter().map(|(&h, &n)| (h, n)).collect();
    for (h, n) in owners {
        let mut hits = 0;
        for i in 0..ctx.keys {
            let (v, deleted) = m.committed.get(&(h, i)).copied().unwrap_or((0, false));
            let started = m.started.get(&(h, i)).copied().unwrap_or(0);
            match pool.get(key_of(h, i)) {
                Ok(None) => {}
                Ok(Some((b, _))) => {
                    hits += 1;
                    let got = version_of(h, i, &b);
                    let crashed_inflight = m.crashed == Some(h) && got == Some(started);
                    if (got != Some(v) || deleted) && !crashed_inflight {
                        m.fail(format!(
                            "checker: key ({h},{i}) reads {got:?}, latest committed is v{v} (deleted={deleted})"
                        ));
                        return;
                    }
                }
                Err(e) => return m.fail(format!("checker: get ({h},{i}): {e}")),
            }
        }
        if hits != n {
            m.fail(format!(
                "checker: partition {h}'s owner holds {n} blocks indexed, readers find {hits}"
            ));
            return;
        }
    }
}
