//! Recovery of a partition that changes hands: the new owner retags every index slot with its
//! generation (so a former owner's late compare-and-swap fails), quarantines what a former owner
//! left mid-write (a slot left odd, a block claimed but not committed), drops entries whose block
//! does not validate, and rebuilds its private state from the index; every committed block stays
//! readable.

use super::index::write_slot;
use super::state::{OwnerState, Recovery};
use crate::coherence::{self, Site};
use crate::format::{
    self, claim, decode_entry, partition, slot_version, BlockHeader, ENTRY_EMPTY, ENTRY_TOMBSTONE,
};
use crate::key::Key;
use crate::policy::{EvictionPolicy, Lru};
use crate::pool::{Location, Pool, Result};
use cxlkv_shm::mem::read_obj;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// Rebuilds owner state for partition `p`, just claimed with generation `generation`, from shared
/// memory (see the module).
pub(super) fn recover_partition(
    pool: &Pool,
    p: u32,
    generation: u64,
) -> Result<(OwnerState, Recovery)> {
    let sb = pool.superblock();
    let mem = pool.mem();
    let nblocks = sb.blocks_per_partition as usize;
    let mut indexed: Vec<Option<(u32, u64)>> = vec![None; nblocks];
    let mut rec = Recovery {
        partition: Some(p),
        ..Default::default()
    };
    // Pairs with the IndexWrite and BlockWrite publishes of the partition's previous owner.
    coherence::acquire(
        mem,
        Site::RecoveryRead,
        pool.partition_off(p),
        sb.payloads_off,
    );
    let mut max_seq = mem.load_u64(
        pool.partition_off(p) + partition::NEXT_SEQ,
        Ordering::Acquire,
    )?;
    if max_seq > format::MAX_SEQ - 1 {
        // Corrupt: no index entry can hold such a sequence number (and incrementing it overflowed).
        // Restart above the highest live entry found below; its blocks stay valid.
        max_seq = 0;
    }
    // A former owner may hold the word's value as the sequence number of a write in flight: the
    // next one we hand out is above it.
    max_seq += 1;
    let mut kept_keys = HashSet::new();
    // Entries of slots a former owner left odd: re-homed below if they validate.
    let mut in_flight = Vec::new();
    for s in 0..sb.index_slots {
        let off = pool.index_slot_off(p, s);
        // Retag with compare-and-swap, from the word whose fields we read: a former owner still
        // running changes the word before any field, so a swap that succeeds read stable fields,
        // and a former owner's swap after ours fails.
        loop {
            let v = mem.load_u64(off, Ordering::Acquire)?;
            let slot: format::IndexSlot = read_obj(mem, off)?;
            let key = Key::from_parts(slot.key_lo, slot.key_hi);
            if slot_version::quarantined(v) {
                if mem
                    .compare_exchange_u64(off, v, slot_version::retag(v, generation))?
                    .is_ok()
                {
                    rec.quarantined_slots += 1;
                    break;
                }
                continue;
            }
            if v & 1 == 1 {
                // Left mid-update by a former owner, which may still store its fields here:
                // quarantined for good (readers and writers pass it like a tombstone).
                let q = slot_version::retag(v & !1, generation) | slot_version::QUARANTINED;
                if mem.compare_exchange_u64(off, v, q)?.is_ok() {
                    rec.repaired_slots += 1;
                    rec.quarantined_slots += 1;
                    in_flight.push((key, slot.entry));
                    break;
                }
                continue;
            }
            if mem
                .compare_exchange_u64(off, v, slot_version::retag(v, generation))?
                .is_err()
            {
                continue;
            }
            let Some((b, seq)) = decode_entry(slot.entry) else {
                break;
            };
            let loc = Location {
                partition: p,
                slot: s,
                version: v,
                block: b,
                seq,
            };
            if (b as usize) < nblocks
                && indexed[b as usize].is_none()
                && validates(pool, key, &loc, generation)?
            {
                indexed[b as usize] = Some((s, seq));
                kept_keys.insert(key);
                max_seq = max_seq.max(seq + 1);
            } else {
                rec.dropped_entries += 1;
                write_slot(pool, p, s, Key(0), ENTRY_TOMBSTONE, generation)?;
            }
            break;
        }
    }
    // Every slot now carries our generation: a former owner's late swap on any of them fails.
    coherence::publish(
        mem,
        Site::IndexWrite,
        pool.index_slot_off(p, 0),
        u64::from(sb.index_slots) * format::INDEX_SLOT_SIZE,
    );
    // A former owner interrupted in a slot's rewrite: its entry, if its block validates (it was
    // committed before the slot was touched), goes to a fresh slot on the key's probe path; else
    // the write is lost, as after a crash (the put never returned Ok).
    for (key, entry) in in_flight {
        let Some((b, seq)) = decode_entry(entry) else {
            continue;
        };
        if (b as usize) >= nblocks || indexed[b as usize].is_some() || kept_keys.contains(&key) {
            continue;
        }
        let Some(s) = free_slot_on_path(pool, p, key)? else {
            continue;
        };
        let loc = Location {
            partition: p,
            slot: s,
            version: 0,
            block: b,
            seq,
        };
        if validates(pool, key, &loc, generation)? {
            write_slot(pool, p, s, key, entry, generation)?;
            indexed[b as usize] = Some((s, seq));
            kept_keys.insert(key);
            max_seq = max_seq.max(seq + 1);
        }
    }
    let mut by_seq: Vec<(u64, u32)> = indexed
        .iter()
        .enumerate()
        .filter_map(|(b, e)| e.map(|(_, seq)| (seq, b as u32)))
        .collect();
    by_seq.sort_unstable();
    let objects = super::object::rebuild_objects(pool, p, &indexed)?;
    let parts: HashSet<u32> = objects.values().flatten().map(|&(b, _)| b).collect();
    let mut policy: Box<dyn EvictionPolicy> = Box::new(Lru::new(nblocks));
    for &(_, b) in &by_seq {
        // An object's parts leave with its manifest, never on their own.
        if !parts.contains(&b) {
            policy.insert(b);
        }
    }
    rec.blocks = by_seq.len() as u64;
    // Unreferenced blocks are free, except those another generation claimed and never committed:
    // a former owner may still store into them (quarantined). A block a former owner claims after
    // this scan is found quarantined when we try to claim it (`Participant::allocate`).
    let mut free = Vec::new();
    for b in (0..nblocks as u32).rev() {
        if indexed[b as usize].is_some() {
            continue;
        }
        let w = mem.load_u64(
            pool.header_off(p, b) + BlockHeader::CLAIM_OFF as u64,
            Ordering::Acquire,
        )?;
        if claim::quarantined(w, generation) {
            rec.quarantined_blocks += 1;
        } else {
            free.push(b);
        }
    }
    let next_seq = max_seq.max(1);
    mem.store_u64(
        pool.partition_off(p) + partition::NEXT_SEQ,
        next_seq,
        Ordering::Relaxed,
    )?;
    Ok((
        OwnerState {
            partition: p,
            free,
            deferred: Vec::new(),
            live: by_seq.len() as u64,
            indexed,
            policy,
            next_seq,
            objects,
        },
        rec,
    ))
}

/// True when the block `loc` names is committed under `key` and `loc.seq` (header valid, payload
/// CRC right) and not quarantined.
fn validates(pool: &Pool, key: Key, loc: &Location, generation: u64) -> Result<bool> {
    let mem = pool.mem();
    // Whatever the block's tenant: a takeover keeps every committed block (the claimer checks
    // the partition's tenant afterwards).
    let Some(h) = pool.checked_header_any(key, loc)? else {
        return Ok(false);
    };
    if claim::quarantined(h.claim, generation) {
        return Ok(false);
    }
    // Pairs with the BlockWrite publish of the previous owner.
    let off = pool.payload_off(loc.partition, loc.block);
    coherence::acquire(mem, Site::RecoveryRead, off, h.len);
    Ok(format::crc32c_shared(mem, off, h.len)? == h.payload_crc)
}

/// The first empty or tombstone slot (not quarantined) on `key`'s probe path.
fn free_slot_on_path(pool: &Pool, p: u32, key: Key) -> Result<Option<u32>> {
    let n = pool.superblock().index_slots;
    let home = pool.home_slot(key);
    for i in 0..n {
        let s = (home + i) & (n - 1);
        let off = pool.index_slot_off(p, s);
        let v = pool.mem().load_u64(off, Ordering::Acquire)?;
        let entry = pool.mem().load_u64(off + 24, Ordering::Relaxed)?;
        if !slot_version::quarantined(v) && (entry == ENTRY_EMPTY || entry == ENTRY_TOMBSTONE) {
            return Ok(Some(s));
        }
    }
    Ok(None)
}
