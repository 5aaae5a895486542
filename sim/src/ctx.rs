//! What the host threads of one seed share ([`Ctx`]): their simulated hosts and clocks, the
//! scheduler, the model, and the seed's plan (who crashes or stalls, how many operations).

use crate::backing::SimBacking;
use crate::host::SimHost;
use crate::model::Model;
use crate::sched::Sched;
use crate::sync::lock;
use cxlkv_runtime::clock::Clock;
use cxlkv_runtime::coherence::Site;
use cxlkv_runtime::format::{slot, PARTICIPANT_SLOT_SIZE, SUPERBLOCK_SIZE};
use cxlkv_runtime::mem::SharedMemory;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The pool's lease in simulated nanoseconds.
pub(crate) const LEASE_NS: u64 = 1_000_000;

/// One simulated host's clock: the simulation's clock plus how far this host's runs ahead (a
/// stalled host's clock ran on while the others saw no heartbeat).
pub(crate) struct HostClock {
    pub(crate) sim: Arc<AtomicU64>,
    pub(crate) ahead: AtomicU64,
}

impl Clock for HostClock {
    fn now_ns(&self) -> u64 {
        self.sim.load(Ordering::Relaxed) + self.ahead.load(Ordering::Relaxed)
    }
}

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
    /// Set with a violation: every host returns at its next operation.
    pub(crate) stop: AtomicBool,
}

impl Ctx {
    /// Records a violation and stops the run.
    pub(crate) fn fail(&self, s: String) {
        lock(&self.model).fail(s);
        self.stop.store(true, Ordering::SeqCst);
    }

    /// The run was stopped (a violation).
    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// True once more than a lease of simulated time passed since `since`.
    pub(crate) fn lapsed(&self, since: u64) -> bool {
        self.sched.now().saturating_sub(since) > LEASE_NS
    }

    /// Makes host `h`'s published heartbeat older than a lease (time passed without it beating).
    pub(crate) fn age_heartbeat(&self, h: usize) {
        let now = self.sched.now();
        let off = SUPERBLOCK_SIZE + h as u64 * PARTICIPANT_SLOT_SIZE + slot::HEARTBEAT;
        let _ = self
            .backing
            .store_u64(off, now.saturating_sub(2 * LEASE_NS), Ordering::SeqCst);
    }
}
