//! Recovery of a partition that changes hands: the new owner rebuilds its private state from the
//! index, repairing slots a crashed owner left mid-update and dropping entries whose block does
//! not validate; every committed block stays readable.

use super::index::write_slot;
use super::state::{OwnerState, Recovery};
use crate::coherence::{self, Site};
use crate::format::{self, decode_entry, partition, read_plain, ENTRY_EMPTY, ENTRY_TOMBSTONE};
use crate::key::Key;
use crate::policy::{EvictionPolicy, Lru};
use crate::pool::{Location, Pool, Result};
use std::sync::atomic::Ordering;

/// Rebuilds owner state for partition `p` from shared memory: repairs slots left mid-update,
/// drops entries whose block does not validate, and frees every unreferenced block.
pub(super) fn recover_partition(pool: &Pool, p: u32) -> Result<(OwnerState, Recovery)> {
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
    if max_seq > format::MAX_SEQ {
        // Corrupt: no index entry can hold such a sequence number (and incrementing it overflowed).
        // Restart above the highest live entry found below; its blocks stay valid.
        max_seq = 0;
    }
    for s in 0..sb.index_slots {
        let off = pool.index_slot_off(p, s);
        let v = mem.load_u64(off, Ordering::Acquire)?;
        let slot: format::IndexSlot = read_plain(mem, off)?;
        let key = Key::from_parts(slot.key_lo, slot.key_hi);
        let mid_update = v & 1 == 1;
        let keep = match decode_entry(slot.entry) {
            Some((b, seq)) if (b as usize) < nblocks && indexed[b as usize].is_none() => {
                let loc = Location {
                    partition: p,
                    slot: s,
                    version: v,
                    block: b,
                    seq,
                };
                match pool.checked_header(key, &loc)? {
                    Some(h)
                        if {
                            // Pairs with the BlockWrite publish of the previous owner.
                            coherence::acquire(
                                mem,
                                Site::RecoveryRead,
                                pool.payload_off(p, b),
                                h.len,
                            );
                            format::crc32c_shared(mem, pool.payload_off(p, b), h.len)?
                                == h.payload_crc
                        } =>
                    {
                        indexed[b as usize] = Some((s, seq));
                        max_seq = max_seq.max(seq + 1);
                        true
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        let live = decode_entry(slot.entry).is_some();
        if mid_update || (live && !keep) {
            // Either finish the interrupted update as the entry now reads, or drop a bad entry.
            let entry = if keep {
                slot.entry
            } else if slot.entry == ENTRY_EMPTY {
                ENTRY_EMPTY
            } else {
                ENTRY_TOMBSTONE
            };
            if mid_update {
                rec.repaired_slots += 1;
                // Make the version even first so write_slot's odd/even dance stays consistent.
                mem.store_u64(off, v.wrapping_add(1), Ordering::Relaxed)?;
            }
            if live && !keep {
                rec.dropped_entries += 1;
            }
            write_slot(pool, p, s, if keep { key } else { Key(0) }, entry)?;
        }
    }
    // An entry made empty above may have broken no chain: empties are only created when a slot
    // was empty before the crash (entry unchanged) — tombstones keep chains intact otherwise.
    let mut by_seq: Vec<(u64, u32)> = indexed
        .iter()
        .enumerate()
        .filter_map(|(b, e)| e.map(|(_, seq)| (seq, b as u32)))
        .collect();
    by_seq.sort_unstable();
    let mut policy: Box<dyn EvictionPolicy> = Box::new(Lru::new(nblocks));
    for &(_, b) in &by_seq {
        policy.insert(b);
    }
    rec.blocks = by_seq.len() as u64;
    let free = (0..nblocks as u32)
        .rev()
        .filter(|b| indexed[*b as usize].is_none())
        .collect();
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
            indexed,
            policy,
            next_seq,
        },
        rec,
    ))
}
