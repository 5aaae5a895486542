//! Claiming a partition: one free, orphaned (its owner dead, or its owner's slot reclaimed by
//! someone who does not hold it) or left by the dead holder of our own slot. A takeover bumps the
//! partition's generation in its owner word, which fences the former owner.
//!
//! Tenants (format 3.2): a participant claims only a partition tagged with its tenant or one
//! without live blocks. The live count it reads first is a hint (a 3.1 owner never wrote it); the
//! recovery of the claimed partition counts for sure, and a partition that holds another tenant's
//! blocks is handed back, every block kept. A partition kept without live blocks is tagged with
//! the claimer's tenant.

use super::liveness::participant_dead;
use super::recovery::recover_partition;
use super::state::{OwnerState, Participant, Recovery};
use crate::coherence::{self, Site};
use crate::format::{partition, slot};
use crate::pool::{Pool, Result};
use crate::tenant;
use std::sync::atomic::Ordering;

/// How a claimer writes the owner word of the partition it claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OwnerWrite {
    /// Compare-and-swap against the word read: any participant may race for the partition.
    CompareExchange,
    /// Plain store: the operator assigned the partition to this slot, so no other host races for
    /// it (the mode of a software-coherent pool, see [`Participant::attach_slot`]).
    Store,
}

/// A partition claimed and kept: the claim, the owner state its recovery rebuilt, and what the
/// recovery did.
pub(super) type Owned = (Claim, OwnerState, Recovery);

/// A partition claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Claim {
    /// The partition.
    pub(super) partition: u32,
    /// Its new owner word: generation (bumped) above, owner slot + 1 below.
    pub(super) owner_word: u64,
    /// The participant that held it and was found dead.
    pub(super) took_over_from: Option<u32>,
}

impl Participant {
    /// Claims the first partition that is free or orphaned, racing other claimers with
    /// compare-and-swap. `None` if every partition is held by a live participant.
    pub(super) fn claim_free_partition(&self) -> Result<Option<Owned>> {
        for p in 0..self.pool.superblock().partitions {
            let (tag, live) = tenant::partition_tag(&self.pool, p)?;
            if tag != self.pool.tenant() && live != 0 {
                continue; // another tenant's blocks: never ours to take
            }
            if let Some(claim) = self.claim_partition(p, OwnerWrite::CompareExchange)? {
                if let Some(owned) = self.keep_if_tenant_fits(claim)? {
                    return Ok(Some(owned));
                }
            }
        }
        self.withdraw_claim()?;
        Ok(None)
    }

    /// Recovers partition `claim` and keeps it if it is this participant's tenant's or holds no
    /// live block (then tags it); else hands it back as detach does, every block kept.
    fn keep_if_tenant_fits(&self, claim: Claim) -> Result<Option<Owned>> {
        let pool = &self.pool;
        let p = claim.partition;
        let (state, rec) = recover_partition(pool, p, claim.owner_word >> 32)?;
        let (tag, _) = tenant::partition_tag(pool, p)?;
        let base = pool.partition_off(p);
        let mem = pool.mem();
        if tag != pool.tenant() {
            if state.live != 0 {
                let off = base + partition::OWNER;
                let released = claim.owner_word & !0xffff_ffff;
                let _ = mem.compare_exchange_u64(off, claim.owner_word, released)?;
                coherence::publish(mem, Site::OwnerWrite, off, 8);
                return Ok(None);
            }
            mem.store_u64(
                base + partition::TENANT,
                u64::from(pool.tenant()),
                Ordering::Release,
            )?;
        }
        mem.store_u64(base + partition::LIVE, state.live, Ordering::Release)?;
        // Pairs with the OwnerRead acquires of readers and claimers (`tenant::partition_tag`).
        coherence::publish(mem, Site::OwnerWrite, base + partition::TENANT, 16);
        Ok(Some((claim, state, rec)))
    }

    /// Claims partition `p` with plain stores (see [`Participant::attach_slot`]): only the host the
    /// operator assigned to this slot ever claims it, so no other host races for the owner word.
    /// `None` if a live participant holds it.
    pub(super) fn claim_assigned_partition(&self, p: u32) -> Result<Option<Owned>> {
        let owned = match self.claim_partition(p, OwnerWrite::Store)? {
            Some(claim) => self.keep_if_tenant_fits(claim)?,
            None => None,
        };
        if owned.is_none() {
            self.withdraw_claim()?;
        }
        Ok(owned)
    }

    /// Claims partition `p` if it is free or orphaned. `None` if a live participant holds it or
    /// (compare-and-swap) another claimer won it; our slot may then still announce `p`, which
    /// the caller withdraws unless it claims another partition.
    fn claim_partition(&self, p: u32, write: OwnerWrite) -> Result<Option<Claim>> {
        let pool = &self.pool;
        let mem = pool.mem();
        let my_slot = pool.slot_off(self.id);
        let off = pool.partition_off(p) + partition::OWNER;
        // Pairs with the OwnerWrite publish of the previous owner.
        coherence::acquire(mem, Site::OwnerRead, off, 8);
        let word = mem.load_u64(off, Ordering::Acquire)?;
        let holder = (word & 0xffff_ffff) as u32;
        let mut took_over_from = None;
        if holder != 0 {
            let q = holder - 1;
            if q >= pool.superblock().participants {
                // Corrupt owner word: the partition is orphaned.
            } else if q != self.id && !orphaned(pool, q, p)? {
                // (A partition naming our own slot belonged to the dead holder we replaced.)
                return Ok(None);
            } else {
                took_over_from = Some(q);
            }
        }
        // Announce the intent first so that nobody judges the partition orphaned between our
        // claim and our slot saying so. Pairs with the load in `orphaned`; the publish pairs with
        // its LivenessRead acquire on other hosts.
        mem.store_u64(
            my_slot + slot::PARTITION,
            u64::from(p) + 1,
            Ordering::SeqCst,
        )?;
        coherence::publish(mem, Site::SlotWrite, my_slot + slot::PARTITION, 8);
        let gen = (word >> 32).wrapping_add(1) & 0xffff_ffff;
        let new = (gen << 32) | u64::from(self.id + 1);
        match write {
            OwnerWrite::CompareExchange => {
                if mem.compare_exchange_u64(off, word, new)?.is_err() {
                    return Ok(None);
                }
            }
            OwnerWrite::Store => mem.store_u64(off, new, Ordering::SeqCst)?,
        }
        // Pairs with the OwnerRead acquire of a fenced former owner (`check_fence`).
        coherence::publish(mem, Site::OwnerWrite, off, 8);
        Ok(Some(Claim {
            partition: p,
            owner_word: new,
            took_over_from,
        }))
    }

    /// Clears our slot's announcement of a partition claim that did not happen.
    fn withdraw_claim(&self) -> Result<()> {
        let off = self.pool.slot_off(self.id) + slot::PARTITION;
        self.pool.mem().store_u64(off, 0, Ordering::SeqCst)?;
        Ok(())
    }
}

/// True when partition `p`, owned by participant `q`, has no live owner: `q` is dead, or its slot
/// has been reclaimed by someone who does not hold `p`.
fn orphaned(pool: &Pool, q: u32, p: u32) -> Result<bool> {
    if participant_dead(pool, q)? {
        return Ok(true);
    }
    let off = pool.slot_off(q) + slot::PARTITION;
    Ok(pool.mem().load_u64(off, Ordering::SeqCst)? != u64::from(p) + 1)
}
