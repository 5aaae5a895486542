//! Pool-wide statistics read from shared memory (`cxlkv pool stat`).
//!
//! Liveness comes from the pool handle's watch ([`crate::watch`]): one call of [`pool_stats`] on a
//! fresh handle finds every holder [`Liveness::Unknown`]; calls through the same handle over a
//! while tell the live (their heartbeat counter moved) from the dead (it stood still for a lease).

use crate::format::{counters, partition, slot, ENTRY_EMPTY, ENTRY_TOMBSTONE};
use crate::participant::liveness::participant_liveness;
use crate::participant::state::ParticipantStats;
use crate::pool::{Pool, Result};
use crate::watch::Liveness;
use std::sync::atomic::Ordering;

/// One participant slot as seen from outside.
#[derive(Clone, Debug)]
pub struct ParticipantInfo {
    /// Slot number.
    pub id: u32,
    /// What this pool handle's watch says of it so far.
    pub liveness: Liveness,
    /// Holder's process id.
    pub pid: u64,
    /// Slot generation.
    pub generation: u64,
    /// Its heartbeat counter.
    pub heartbeat: u64,
    /// Milliseconds (this party's monotonic clock) this handle has seen the counter unchanged.
    pub still_ms: u64,
    /// Partition owned, if any.
    pub partition: Option<u32>,
    /// Published counters.
    pub counters: ParticipantStats,
}

/// One partition as seen from outside.
#[derive(Clone, Debug)]
pub struct PartitionInfo {
    /// Partition number.
    pub id: u32,
    /// Owning participant, if any.
    pub owner: Option<u32>,
    /// Owner generation (bumped at every change of hands).
    pub generation: u32,
    /// Live index entries.
    pub blocks: u64,
    /// Blocks in the partition.
    pub capacity: u64,
    /// Tombstones in the index.
    pub tombstones: u64,
    /// Next block sequence number.
    pub next_seq: u64,
    /// Tenant whose blocks it holds (format 3.2; 0 = none).
    pub tenant: u32,
}

/// Statistics of a whole pool.
#[derive(Clone, Debug)]
pub struct PoolStats {
    /// Held participant slots.
    pub participants: Vec<ParticipantInfo>,
    /// All partitions.
    pub partitions: Vec<PartitionInfo>,
    /// Use and quota per tenant (format 3.2), tenant 0 (the public space) first.
    pub tenants: Vec<crate::tenant::TenantUse>,
}

/// The counters published in the slot at `base` (both counter lines; the caller acquired them).
fn read_counters(pool: &Pool, base: u64) -> Result<ParticipantStats> {
    let layout = pool.slot_layout();
    let mut c = [0u64; counters::COUNT as usize];
    for (i, v) in c.iter_mut().enumerate() {
        *v = pool
            .mem()
            .load_u64(base + layout.counter(i as u64), Ordering::Relaxed)?;
    }
    Ok(ParticipantStats::from_array(c))
}

/// The counters participant slot `id` publishes, read from shared memory (any process can): `None`
/// when the slot is free or `id` is not a slot of the pool. Cheaper than [`pool_stats`], which
/// also scans every partition's index.
pub fn participant_counters(pool: &Pool, id: u32) -> Result<Option<ParticipantStats>> {
    if id >= pool.superblock().participants {
        return Ok(None);
    }
    let base = pool.slot_off(id);
    pool.mem().acquire(base, pool.slot_layout().size);
    if pool.mem().load_u64(base + slot::TOKEN, Ordering::Acquire)? == 0 {
        return Ok(None);
    }
    read_counters(pool, base).map(Some)
}

/// Reads the statistics of `pool`.
pub fn pool_stats(pool: &Pool) -> Result<PoolStats> {
    let sb = pool.superblock();
    let mem = pool.mem();
    let layout = *pool.slot_layout();
    let mut participants = Vec::new();
    for q in 0..sb.participants {
        let base = pool.slot_off(q);
        mem.acquire(base, layout.size);
        if mem.load_u64(base + slot::TOKEN, Ordering::Acquire)? == 0 {
            continue;
        }
        let verdict = participant_liveness(pool, q)?;
        let part = mem.load_u64(base + slot::PARTITION, Ordering::Relaxed)?;
        let c = read_counters(pool, base)?;
        participants.push(ParticipantInfo {
            id: q,
            liveness: verdict.liveness,
            pid: mem.load_u64(base + slot::PID, Ordering::Relaxed)?,
            generation: mem.load_u64(base + slot::GENERATION, Ordering::Relaxed)?,
            heartbeat: verdict.heartbeat,
            still_ms: verdict.still_ns / 1_000_000,
            partition: part.checked_sub(1).map(|p| p as u32),
            counters: c,
        });
    }
    let mut partitions = Vec::new();
    for p in 0..sb.partitions {
        let base = pool.partition_off(p);
        mem.acquire(base, sb.payloads_off);
        let owner = mem.load_u64(base + partition::OWNER, Ordering::Acquire)?;
        let (mut blocks, mut tombstones) = (0, 0);
        for s in 0..sb.index_slots {
            match mem.load_u64(pool.index_slot_off(p, s) + 24, Ordering::Relaxed)? {
                ENTRY_EMPTY => {}
                ENTRY_TOMBSTONE => tombstones += 1,
                _ => blocks += 1,
            }
        }
        partitions.push(PartitionInfo {
            id: p,
            owner: ((owner & 0xffff_ffff) as u32).checked_sub(1),
            generation: (owner >> 32) as u32,
            blocks,
            capacity: u64::from(sb.blocks_per_partition),
            tombstones,
            next_seq: mem.load_u64(base + partition::NEXT_SEQ, Ordering::Relaxed)?,
            tenant: crate::tenant::partition_tag(pool, p)?.0,
        });
    }
    Ok(PoolStats {
        participants,
        partitions,
        tenants: crate::tenant::usage(pool)?,
    })
}
