//! Liveness: what this pool handle's watch says of another participant (free, live, unknown or
//! dead, by the rule of [`crate::watch`]), and whether this one may still write (it is fenced once
//! a successor took its partition over, or, on a software-coherent pool, once its own lease
//! lapsed).

use super::state::{OwnerState, Participant};
use crate::coherence::{self, Site};
use crate::format::{partition, slot};
use crate::pool::{Pool, PoolError, Result};
use crate::watch::{liveness_rule, Liveness, LivenessRule, SlotSighting, Verdict};
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

impl Participant {
    /// On a software-coherent pool, true (and fenced for good) once this participant's own lease
    /// has lapsed (three quarters of a lease of its monotonic clock without a heartbeat,
    /// [`crate::watch`]): a
    /// successor may soon take its slot and partition over, and without cross-host coherence every
    /// further write to either could undo the successor's (two writers of one cache line). A live
    /// participant's heartbeat thread never lets this happen.
    pub(super) fn lease_lost(&self) -> bool {
        if self.lease.fenced.load(Ordering::Relaxed) {
            return true;
        }
        let lapsed = self.self_fencing && self.lease.lapsed(&self.pool);
        if lapsed {
            self.lease.fenced.store(true, Ordering::Relaxed);
        }
        lapsed
    }

    /// True when this participant would write nothing more to shared memory on a
    /// software-coherent pool: it fenced itself, or its own lease lapsed (it may be presumed dead,
    /// see `lease_lost`). The simulator uses it to know whether a detach releases the partition.
    pub fn presumed_dead(&self) -> bool {
        self.self_fencing && self.lease_lost()
    }

    /// The error of a participant that fenced itself.
    pub(super) fn fenced_error(&self) -> PoolError {
        PoolError::Fenced {
            partition: self.partition().unwrap_or(0),
            generation: (self.owner_word >> 32) as u32,
        }
    }

    /// Locks the owner state for a write, once this participant is known to still own its
    /// partition.
    pub(super) fn owner(&self) -> Result<MutexGuard<'_, OwnerState>> {
        let m = self.owner.as_ref().ok_or(PoolError::NoPartition {
            participant: self.id,
        })?;
        let st = m.lock().unwrap_or_else(|e| e.into_inner());
        if self.self_fencing && self.lease_lost() {
            return Err(self.fenced_error());
        }
        self.check_fence(st.partition)?;
        Ok(st)
    }

    /// The error of a write whose compare-and-swap found a successor's word: fenced for good.
    pub(super) fn fenced_now(&self, p: u32) -> PoolError {
        self.lease.fenced.store(true, Ordering::Relaxed);
        match self.check_fence(p) {
            Err(e) => e,
            Ok(()) => self.fenced_error(),
        }
    }

    /// Fails with [`PoolError::Fenced`] (fencing this participant for good) once partition `p`'s
    /// owner word is no longer the one this participant wrote.
    pub(super) fn check_fence(&self, p: u32) -> Result<()> {
        let off = self.pool.partition_off(p) + partition::OWNER;
        // Pairs with the OwnerWrite publish of a successor that took the partition over.
        coherence::acquire(self.pool.mem(), Site::OwnerRead, off, 8);
        let word = self.pool.mem().load_u64(off, Ordering::Acquire)?;
        if word != self.owner_word || self.lease.fenced.load(Ordering::Relaxed) {
            self.lease.fenced.store(true, Ordering::Relaxed);
            return Err(PoolError::Fenced {
                partition: p,
                generation: (word >> 32) as u32,
            });
        }
        Ok(())
    }
}

/// Participant `q`'s liveness as this pool handle's watch judges it ([`crate::watch`]): the first
/// look at a holder starts the watch and never finds it dead; it is dead once its heartbeat counter
/// stood still for more than a lease of this party's monotonic clock.
pub fn participant_liveness(pool: &Pool, q: u32) -> Result<Verdict> {
    let base = pool.slot_off(q);
    let mem = pool.mem();
    // Pairs with the SlotWrite and HeartbeatWrite publishes of participant `q`.
    coherence::acquire(mem, Site::LivenessRead, base, 64);
    let sighting = SlotSighting {
        token: mem.load_u64(base + slot::TOKEN, Ordering::Acquire)?,
        generation: mem.load_u64(base + slot::GENERATION, Ordering::Acquire)?,
        heartbeat: mem.load_u64(base + slot::HEARTBEAT, Ordering::Acquire)?,
    };
    let lease = pool.superblock().lease_ns;
    if liveness_rule() == LivenessRule::Timestamp {
        return Ok(timestamp_verdict(pool, sighting, lease));
    }
    Ok(pool
        .watch()
        .observe(q, sighting, pool.monotonic_ns(), lease))
}

/// True when participant `q`'s slot may be reclaimed: it is free, or this pool handle watched its
/// holder's heartbeat stand still for a lease ([`participant_liveness`]).
pub fn participant_dead(pool: &Pool, q: u32) -> Result<bool> {
    Ok(participant_liveness(pool, q)?.liveness.reclaimable())
}

/// The rule of pool format 1 (test-only, [`LivenessRule::Timestamp`]): the heartbeat is the
/// holder's wall-clock time, dead when older than a lease by this party's wall clock.
fn timestamp_verdict(pool: &Pool, s: SlotSighting, lease: u64) -> Verdict {
    let age = pool.now_ns().saturating_sub(s.heartbeat);
    let liveness = match (s.token, age > lease) {
        (0, _) => Liveness::Free,
        (_, true) => Liveness::Dead,
        (_, false) => Liveness::Live,
    };
    Verdict {
        liveness,
        still_ns: age,
        heartbeat: s.heartbeat,
    }
}
