//! The run driver: [`run_sim`] runs seeds one after another ([`run_seed`]) and reports the
//! first violation ([`SimReport`], [`Violation`]); each seed plans a run (pool size, scheduler
//! pace, cache write-back rate, which host crashes or stalls, each host's clocks), formats the
//! pool, starts one thread per host ([`crate::protocol::run_host`]), and ends with the final
//! check.

use crate::backing::SimBacking;
use crate::check::final_check;
use crate::clock::HostClock;
use crate::ctx::{Ctx, LEASE_NS};
use crate::host::SimHost;
use crate::model::Model;
use crate::protocol::run_host;
use crate::sched::{Sched, STUCK_AFTER_LEASES};
use crate::sync::lock;
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_runtime::coherence::{self, set_drop_site, Site};
use cxlkv_runtime::format::CoherenceMode;
use cxlkv_runtime::mem::SharedMemory;
use cxlkv_runtime::pool::{self, Pool, PoolConfig};
use cxlkv_runtime::watch::LivenessRule;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    /// Each host's wall clock starts up to this many milliseconds off (either way) and steps one to
    /// three times during the run, forward or back, to another offset within as much; with it on,
    /// each host's oscillator also drifts by up to ±5 % (0: every host's clocks agree).
    pub clock_skew_ms: u64,
    /// The liveness rule the hosts run: [`LivenessRule::Counter`], or the old
    /// [`LivenessRule::Timestamp`] as the simulator's teeth (needs a build whose runtime has the
    /// `coherence-teeth` feature).
    pub liveness: LivenessRule,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            hosts: 4,
            seeds: 100,
            seed_start: 0,
            drop_site: None,
            ops: 40,
            clock_skew_ms: 0,
            liveness: LivenessRule::Counter,
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
    /// Crashes and stalls past the lease simulated.
    pub crashes: u64,
    /// Of them, stalls (the stalled host resumes and must find itself fenced).
    pub stalls: u64,
    /// Takeovers of a crashed or stalled host's partition by its successor, after its watch found
    /// the host dead.
    pub takeovers: u64,
    /// The largest offset of a host's wall clock from the simulation's time, in milliseconds.
    pub max_skew_ms: u64,
    /// Operations run.
    pub ops: u64,
    /// The site removed, if any.
    pub dropped: Option<String>,
    /// The first violation, if any.
    pub violation: Option<Violation>,
    /// A configuration error (unknown site, a build without `coherence-teeth`).
    pub error: Option<String>,
    /// The liveness rule run.
    pub liveness: LivenessRule,
    /// The clock skew asked for, in milliseconds.
    pub clock_skew_ms: u64,
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
        let mut site = self
            .dropped
            .as_deref()
            .map(|s| format!(" (site {s} removed)"))
            .unwrap_or_default();
        if self.liveness == LivenessRule::Timestamp {
            site.push_str(" (old timestamp liveness)");
        }
        if self.clock_skew_ms > 0 {
            site.push_str(&format!(
                " (clock skew up to {} ms, {} ms used)",
                self.clock_skew_ms, self.max_skew_ms
            ));
        }
        match &self.violation {
            None => write!(
                f,
                "sim: ok{site}: {} seeds, {} operations, {} crashes and {} stalls, {} takeovers; no invariant broke",
                self.seeds_run, self.ops, self.crashes - self.stalls, self.stalls, self.takeovers
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
        stalls: 0,
        takeovers: 0,
        max_skew_ms: 0,
        ops: 0,
        dropped: opts.drop_site.clone(),
        violation: None,
        error: None,
        liveness: opts.liveness,
        clock_skew_ms: opts.clock_skew_ms,
    };
    if opts.liveness == LivenessRule::Timestamp && !coherence::TEETH {
        rep.error =
            Some("--liveness timestamp needs a build with the coherence-teeth feature".into());
        return rep;
    }
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
            Some(s) if coherence::TEETH => Some(s),
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
        let out = run_seed(opts, seed, site);
        rep.seeds_run += 1;
        rep.ops += out.ops;
        rep.crashes += u64::from(out.crashed);
        rep.stalls += u64::from(out.stalled);
        rep.takeovers += u64::from(out.taken_over);
        rep.max_skew_ms = rep.max_skew_ms.max(out.max_skew_ns / 1_000_000);
        if let Some(v) = out.violation {
            rep.violation = Some(v);
            break;
        }
    }
    rep
}

/// What one seed's run did.
struct SeedOutcome {
    ops: u64,
    crashed: bool,
    stalled: bool,
    taken_over: bool,
    max_skew_ns: u64,
    violation: Option<Violation>,
}

/// Simulated time when a run starts.
const START_NS: u64 = 1_000_000_000;

/// Wall-clock steps happen within this many leases of a run's start (a run takes a few).
const STEPS_WITHIN_LEASES: u64 = 8;

/// Runs seed `seed` of `opts`, `site` removed.
fn run_seed(opts: &SimOptions, seed: u64, site: Option<Site>) -> SeedOutcome {
    let (hosts, ops) = (opts.hosts as usize, opts.ops);
    let mut rng = SplitMix64::new(seed);
    let cfg = PoolConfig {
        block_size: 4096,
        participants: hosts as u32,
        partitions: None,
        lease: Duration::from_nanos(LEASE_NS),
        coherence: CoherenceMode::Software,
        ..Default::default()
    };
    let blocks = 3 + rng.below(3);
    let base = pool::plan(64 << 20, &cfg).expect("plan").partition_off;
    let size = base + hosts as u64 * (blocks + 3) * 4096;
    let backing = SimBacking::new(size, seed);
    // A lease lasts about 3000 or 12000 yield points per host (per seed): a few or many
    // operations of every host, so runs outlive leases and heartbeats must reach memory.
    let pace = [3000, 12000][SplitMix64::new(seed ^ 0x1ea5e).below(2) as usize];
    let sched = Arc::new(Sched::new(
        hosts,
        seed ^ 0x5ced,
        1 + rng.below(6),
        START_NS,
        LEASE_NS / (pace * hosts as u64),
        START_NS + STUCK_AFTER_LEASES * LEASE_NS,
    ));
    // A third of the seeds crash a host, a third stall one past its lease (a zombie owner).
    let fate = rng.below(3);
    let victim = rng.below(hosts as u64) as usize;
    let crash = (fate == 1).then_some(victim);
    // Caches that write dirty lines back often (a busy host) or rarely (an idle one).
    let evict = [16, 256, 4096][rng.below(3) as usize];
    let stall = (fate == 2).then(|| (victim, rng.below(u64::from(ops).max(1)) as u32));
    let successor = (fate != 0).then_some(victim);
    let hs: Vec<Arc<SimHost>> = (0..hosts)
        .map(|h| {
            let crash_at = (crash == Some(h)).then(|| 200 + rng.below(6000));
            Arc::new(SimHost::scheduled(
                backing.clone(),
                seed ^ ((h as u64 + 1) << 32),
                h,
                sched.clone(),
                evict,
                crash_at,
            ))
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
    // Each host's clocks, from a generator of their own (the plan above stays the same per seed).
    let mut clock_rng = SplitMix64::new(seed ^ 0xc10c);
    let skew_ns = opts.clock_skew_ms.saturating_mul(1_000_000);
    let clocks: Vec<Arc<HostClock>> = (0..hosts)
        .map(|_| {
            Arc::new(HostClock::plan(
                sched.clock().clone(),
                START_NS,
                skew_ns,
                STEPS_WITHIN_LEASES * LEASE_NS,
                &mut clock_rng,
            ))
        })
        .collect();
    let max_skew_ns = clocks.iter().map(|c| c.max_skew_ns()).max().unwrap_or(0);
    let ctx = Arc::new(Ctx {
        hosts: hs.clone(),
        clocks,
        backing,
        sched: sched.clone(),
        model: Mutex::new(Model::new(hosts)),
        keys: blocks as usize + 2,
        ops,
        crash: successor,
        stall,
        seed,
        site,
        rule: opts.liveness,
        stop: AtomicBool::new(false),
    });
    // Host 0 formats the pool before the others start.
    set_drop_site(site);
    let created = Pool::create(hs[0].clone(), &cfg);
    set_drop_site(None);
    if let Err(e) = created {
        return SeedOutcome {
            ops: 0,
            crashed: false,
            stalled: false,
            taken_over: false,
            max_skew_ns,
            violation: Some(Violation {
                seed,
                hosts: hosts as u32,
                what: format!("create failed: {e}"),
                trace: vec![],
            }),
        };
    }
    sched.start();
    let threads: Vec<_> = (0..hosts)
        .map(|h| {
            let ctx = ctx.clone();
            std::thread::Builder::new()
                .name(format!("sim-host-{h}"))
                .spawn(move || run_host(&ctx, h))
                .expect("spawn sim host")
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let (crashed, stalled, taken_over) = {
        let m = lock(&ctx.model);
        (m.crashed.is_some(), m.zombie.is_some(), m.taken_over)
    };
    if lock(&ctx.model).violation.is_none() {
        final_check(&ctx);
    }
    let m = lock(&ctx.model);
    SeedOutcome {
        ops: m.ops,
        crashed,
        stalled,
        taken_over,
        max_skew_ns,
        violation: m.violation.clone().map(|what| Violation {
            seed,
            hosts: hosts as u32,
            what,
            trace: m.trace.clone(),
        }),
    }
}
