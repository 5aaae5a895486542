//! What the host threads of one seed share ([`Ctx`]): their simulated hosts and clocks, the
//! scheduler, the model, and the seed's plan (who crashes or stalls, how many operations).

use crate::backing::SimBacking;
use crate::clock::HostClock;
use crate::host::SimHost;
use crate::model::Model;
use crate::sched::Sched;
use crate::sync::lock;
use cxlkv_runtime::coherence::Site;
use cxlkv_runtime::watch::{self_fence_ns, LivenessRule};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The pool's lease in simulated nanoseconds.
pub(crate) const LEASE_NS: u64 = 1_000_000;

/// The state one seed's host threads share.
pub(crate) struct Ctx {
    pub(crate) hosts: Vec<Arc<SimHost>>,
    pub(crate) clocks: Vec<Arc<HostClock>>,
    pub(crate) backing: Arc<SimBacking>,
    pub(crate) sched: Arc<Sched>,
    pub(crate) model: Mutex<Model>,
    /// Keys per host.
    pub(crate) keys: usize,
    /// Operations per host.
    pub(crate) ops: u32,
    /// The host that crashes or stalls, which its successor takes over.
    pub(crate) crash: Option<usize>,
    /// `(host, op)`: the host stalls past its lease before that operation.
    pub(crate) stall: Option<(usize, u32)>,
    pub(crate) seed: u64,
    /// The publish/acquire site removed in this run.
    pub(crate) site: Option<Site>,
    /// The liveness rule the hosts run (the old timestamp rule only as the simulator's teeth).
    pub(crate) rule: LivenessRule,
    /// Set with a violation: every host returns at its next operation.
    pub(crate) stop: AtomicBool,
}

impl Ctx {
    /// Records a violation and stops the run.
    pub(crate) fn fail(&self, s: String) {
        lock(&self.model).fail(s);
        self.stop.store(true, Ordering::SeqCst);
        self.sched.unpark_all();
    }

    /// The run was stopped (a violation).
    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// True once host `h`'s own lease lapsed since its beat at simulation time `since`, by the
    /// rule it runs: more than three quarters of a lease of its monotonic clock (the timestamp
    /// rule: more than a lease of its wall clock). The runtime read its clock later than `since`,
    /// so whenever it fenced itself this is true.
    pub(crate) fn own_lease_lapsed(&self, h: usize, since: u64) -> bool {
        let (c, now) = (&self.clocks[h], self.sched.now());
        match self.rule {
            LivenessRule::Counter => c.mono_between(since, now) > self_fence_ns(LEASE_NS),
            LivenessRule::Timestamp => c.wall_between(since, now) > LEASE_NS,
        }
    }

    /// True while no host's monotonic clock can have counted a lease since simulation time
    /// `since`: a holder that beat at `since` cannot look dead to anyone yet.
    pub(crate) fn within_every_lease(&self, since: u64) -> bool {
        let now = self.sched.now();
        self.clocks
            .iter()
            .all(|c| c.mono_between(since, now) <= LEASE_NS)
    }
}
