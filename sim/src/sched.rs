//! The scheduler: the host threads of a run take turns holding a baton, so that exactly one runs
//! at a time. Every memory access of a scheduled host is a yield point where the seeded generator
//! may hand the baton to another host, which makes a run reproducible from its seed. The scheduler
//! also keeps the simulated clock (it advances a tick per yield point) and declares a run stuck
//! once that clock passes the run's deadline. A host that waits for the others at the end of its
//! run parks: it leaves the schedule until a host finishes its operations (or its run), so that
//! the hosts still at work share the baton (and the clock) among themselves.

use crate::sync::lock;
use cxlkv_kernels::rng::SplitMix64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// A run that has not finished after this many leases of simulated time is stuck (a normal run
/// takes a few): a livelock, or a wait that can never end, reported as a violation.
pub(crate) const STUCK_AFTER_LEASES: u64 = 100;

/// The payload that unwinds a host of a stuck run (see [`STUCK_AFTER_LEASES`]).
pub(crate) struct SimStuck;

/// The baton (which host runs) and the simulated clock.
pub(crate) struct Sched {
    state: Mutex<SchedState>,
    cv: Condvar,
    /// Yield points do nothing until the run starts (host 0 formats the pool alone).
    started: AtomicBool,
    clock: Arc<AtomicU64>,
    /// Simulated nanoseconds per yield point.
    tick: u64,
    /// Simulated time by which a run must have finished ([`STUCK_AFTER_LEASES`]); past it every
    /// host unwinds at its next step and the run reports no progress.
    deadline: u64,
    stuck: AtomicBool,
}

struct SchedState {
    current: usize,
    runnable: Vec<bool>,
    /// Parked hosts are runnable but not scheduled until [`Sched::unpark_all`].
    parked: Vec<bool>,
    rng: SplitMix64,
    /// A yield point switches hosts with probability 1 / `switch`.
    switch: u64,
}

impl Sched {
    /// A scheduler of `hosts` hosts, host 0 holding the baton, its clock at `start_ns`.
    pub(crate) fn new(
        hosts: usize,
        seed: u64,
        switch: u64,
        start_ns: u64,
        tick: u64,
        deadline: u64,
    ) -> Sched {
        Sched {
            state: Mutex::new(SchedState {
                current: 0,
                runnable: vec![true; hosts],
                parked: vec![false; hosts],
                rng: SplitMix64::new(seed),
                switch,
            }),
            cv: Condvar::new(),
            started: AtomicBool::new(false),
            clock: Arc::new(AtomicU64::new(start_ns)),
            tick,
            deadline,
            stuck: AtomicBool::new(false),
        }
    }

    /// The simulated clock, shared with the hosts' clocks.
    pub(crate) fn clock(&self) -> &Arc<AtomicU64> {
        &self.clock
    }

    /// Simulated time now.
    pub(crate) fn now(&self) -> u64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// From now on yield points switch hosts.
    pub(crate) fn start(&self) {
        self.started.store(true, Ordering::SeqCst);
    }

    /// Blocks until host `me` holds the baton.
    pub(crate) fn wait_turn(&self, me: usize) {
        let mut g = lock(&self.state);
        while g.current != me {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A yield point of host `me`: the clock ticks, and the baton may pass to another host (then
    /// this returns once `me` holds it again).
    pub(crate) fn yield_point(&self, me: usize) {
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
    pub(crate) fn yield_forced(&self, me: usize) {
        let mut g = lock(&self.state);
        let others: Vec<usize> = (0..g.runnable.len())
            .filter(|&i| i != me && g.runnable[i] && !g.parked[i])
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

    /// The run passed its deadline: every host unwinds at its next step.
    pub(crate) fn stuck(&self) -> bool {
        self.stuck.load(Ordering::Relaxed)
    }

    fn pick(g: &mut SchedState) -> Option<usize> {
        let live: Vec<usize> = (0..g.runnable.len())
            .filter(|&i| g.runnable[i] && !g.parked[i])
            .collect();
        if live.is_empty() {
            return None;
        }
        let i = g.rng.below(live.len() as u64) as usize;
        Some(live[i])
    }

    /// Host `me` (holding the baton) leaves the schedule until [`Sched::unpark_all`] and then gets
    /// the baton again. Returns at once if no other host could take the baton.
    pub(crate) fn park(&self, me: usize) {
        let mut g = lock(&self.state);
        g.parked[me] = true;
        match Self::pick(&mut g) {
            Some(next) => g.current = next,
            None => {
                g.parked[me] = false;
                return;
            }
        }
        self.cv.notify_all();
        while g.current != me || g.parked[me] {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Every parked host rejoins the schedule (a yield point of a running host hands it the
    /// baton).
    pub(crate) fn unpark_all(&self) {
        lock(&self.state).parked.fill(false);
    }

    /// Host `me` is done for good: parked hosts rejoin, and the baton passes to a runnable host.
    pub(crate) fn finish(&self, me: usize) {
        let mut g = lock(&self.state);
        g.runnable[me] = false;
        g.parked.fill(false);
        if let Some(n) = Self::pick(&mut g) {
            g.current = n;
        }
        self.cv.notify_all();
    }
}
