//! The holder's side of liveness ([`crate::watch`]): the heartbeat counter it advances in its slot
//! and its own lease, which it measures on its own monotonic clock and which ends its writes
//! (self-fencing) before any observer may declare it dead.

use crate::coherence::{self, Site};
use crate::format::slot;
use crate::pool::{Pool, Result};
use crate::watch::{liveness_rule, self_fence_ns, LivenessRule};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// A holder's lease, shared by its handle and its heartbeat thread.
pub(super) struct OwnLease {
    /// Fenced for good: its partition was taken over, its slot reclaimed, or (software-coherent
    /// pools) its own lease lapsed.
    pub(super) fenced: AtomicBool,
    /// This party's clock read just before its last heartbeat was written: monotonic, or (the
    /// test-only timestamp rule) wall.
    last_beat: AtomicU64,
    /// The heartbeat value last written. The lock keeps two beating threads (the heartbeat thread
    /// and a caller of `Participant::beat`) from writing their values out of order.
    written: Mutex<u64>,
    /// The liveness rule this holder beats by (chosen when it attached).
    rule: LivenessRule,
}

impl OwnLease {
    /// Writes the first heartbeat of slot `id` (Release: an observer that sees it sees the slot
    /// initialized) and starts the lease. The counter goes on from the slot's previous value, so it
    /// never repeats a value a watcher of the previous holder saw. Not yet published: the caller
    /// publishes the whole slot.
    pub(super) fn start(pool: &Pool, id: u32) -> Result<OwnLease> {
        let rule = liveness_rule();
        let off = pool.slot_off(id) + slot::HEARTBEAT;
        let (first, at) = match rule {
            LivenessRule::Counter => {
                let at = pool.monotonic_ns();
                let prev = pool.mem().load_u64(off, Ordering::Relaxed)?;
                (prev.wrapping_add(1), at)
            }
            LivenessRule::Timestamp => {
                let now = pool.now_ns();
                (now, now)
            }
        };
        pool.mem().store_u64(off, first, Ordering::Release)?;
        Ok(OwnLease {
            fenced: AtomicBool::new(false),
            last_beat: AtomicU64::new(at),
            written: Mutex::new(first),
            rule,
        })
    }

    /// Advances the heartbeat of slot `id` and publishes it.
    pub(super) fn beat(&self, pool: &Pool, id: u32) -> Result<()> {
        let off = pool.slot_off(id) + slot::HEARTBEAT;
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let (value, at) = match self.rule {
            LivenessRule::Counter => (written.wrapping_add(1), pool.monotonic_ns()),
            LivenessRule::Timestamp => {
                let now = pool.now_ns();
                (now, now)
            }
        };
        pool.mem().store_u64(off, value, Ordering::Release)?;
        // The reading preceded the write: an observer first sees the new value after it.
        self.last_beat.store(at, Ordering::Relaxed);
        *written = value;
        // Pairs with the LivenessRead acquire of whoever judges this participant's liveness.
        coherence::publish(pool.mem(), Site::HeartbeatWrite, off, 8);
        Ok(())
    }

    /// True once this holder's own lease lapsed: more than [`self_fence_ns`] of its monotonic
    /// clock since the reading before its last beat (the timestamp rule: more than a lease of its
    /// wall clock).
    pub(super) fn lapsed(&self, pool: &Pool) -> bool {
        let lease = pool.superblock().lease_ns;
        let last = self.last_beat.load(Ordering::Relaxed);
        match self.rule {
            LivenessRule::Counter => {
                pool.monotonic_ns().saturating_sub(last) > self_fence_ns(lease)
            }
            LivenessRule::Timestamp => pool.now_ns().saturating_sub(last) > lease,
        }
    }
}
