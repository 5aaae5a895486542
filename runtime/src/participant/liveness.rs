//! Liveness: whether another participant is dead (its heartbeat older than the lease), and
//! whether this one may still write (it is fenced once a successor took its partition over, or,
//! on a software-coherent pool, once its own lease lapsed).

use super::state::{OwnerState, Participant};
use crate::coherence::{self, Site};
use crate::format::{partition, slot};
use crate::pool::{Pool, PoolError, Result};
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

impl Participant {
    /// On a software-coherent pool, true (and fenced for good) once this participant's own lease
    /// has lapsed: a successor may have taken its slot and partition over, and without cross-host
    /// coherence every further write to either could undo the successor's (two writers of one
    /// cache line). A live participant's heartbeat thread never lets this happen.
    pub(super) fn lease_lost(&self) -> bool {
        if self.fenced.load(Ordering::Relaxed) {
            return true;
        }
        let lapsed = self.self_fencing
            && self
                .pool
                .now_ns()
                .saturating_sub(self.last_beat.load(Ordering::Relaxed))
                > self.pool.superblock().lease_ns;
        if lapsed {
            self.fenced.store(true, Ordering::Relaxed);
        }
        lapsed
    }

    /// True when this participant would write nothing more to shared memory on a
    /// software-coherent pool: it fenced itself, or its own lease lapsed (it is presumed dead, see
    /// `lease_lost`). The simulator uses it to know whether a detach releases the partition.
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

    /// Fails with [`PoolError::Fenced`] (fencing this participant for good) once partition `p`'s
    /// owner word is no longer the one this participant wrote.
    pub(super) fn check_fence(&self, p: u32) -> Result<()> {
        let off = self.pool.partition_off(p) + partition::OWNER;
        // Pairs with the OwnerWrite publish of a successor that took the partition over.
        coherence::acquire(self.pool.mem(), Site::OwnerRead, off, 8);
        let word = self.pool.mem().load_u64(off, Ordering::Acquire)?;
        if word != self.owner_word || self.fenced.load(Ordering::Relaxed) {
            self.fenced.store(true, Ordering::Relaxed);
            return Err(PoolError::Fenced {
                partition: p,
                generation: (word >> 32) as u32,
            });
        }
        Ok(())
    }
}

/// True when participant `q`'s heartbeat is older than the pool's lease (or it holds no slot).
pub fn participant_dead(pool: &Pool, q: u32) -> Result<bool> {
    let base = pool.slot_off(q);
    let mem = pool.mem();
    // Pairs with the SlotWrite and HeartbeatWrite publishes of participant `q`.
    coherence::acquire(mem, Site::LivenessRead, base, 64);
    if mem.load_u64(base + slot::TOKEN, Ordering::Acquire)? == 0 {
        return Ok(true);
    }
    let hb = mem.load_u64(base + slot::HEARTBEAT, Ordering::Acquire)?;
    Ok(pool.now_ns().saturating_sub(hb) > pool.superblock().lease_ns)
}
