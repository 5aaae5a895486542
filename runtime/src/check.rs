//! `cxlkv pool check`: validates every structure of a pool and reports what is wrong.
//!
//! The checker reads only (it is safe on a live pool, though a live writer can make it report
//! transient states as notes). Errors are damage: a reader may miss data because of them (it never
//! returns wrong bytes; see the read protocol). Notes are states the protocol repairs by itself,
//! such as an index slot left mid-update by a crashed owner, which the next owner repairs.

use crate::format::{
    claim, decode_entry, partition, pin, slot, slot_version, tenant_table, BlockHeader, Codec,
    IndexSlot, ENTRY_EMPTY, ENTRY_TOMBSTONE,
};
use crate::key::Key;
use crate::object::Manifest;
use crate::participant::liveness::participant_liveness;
use crate::pool::{Pool, Result};
use crate::watch::Liveness;
use cxlkv_shm::mem::read_obj;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// One finding of the checker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Where: "superblock", "participant 3", "partition 1 slot 77", ...
    pub place: String,
    /// What is wrong.
    pub what: String,
}

/// What the checker found.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    /// Damage.
    pub errors: Vec<Finding>,
    /// States the protocol repairs by itself.
    pub notes: Vec<Finding>,
    /// Participant slots held.
    pub held_participants: u32,
    /// Held slots whose holder this pool handle's watch has seen alive (its heartbeat moved). A
    /// single check through a fresh handle sees none: it cannot watch a heartbeat for a lease.
    pub live_participants: u32,
    /// Held slots whose holder the watch found dead (its heartbeat stood still for a lease).
    pub dead_participants: u32,
    /// Live index entries checked (header and payload CRC).
    pub blocks_checked: u64,
    /// Payload bytes checksummed.
    pub bytes_checked: u64,
    /// Index slots quarantined at a takeover (a former owner was rewriting them): passed by
    /// probes like tombstones, never reused. Not damage (docs/COHERENCE.md, Fencing).
    pub quarantined_slots: u64,
    /// Blocks quarantined: claimed for writing by another generation than the partition's
    /// current owner and never committed, so never reused. Not damage.
    pub quarantined_blocks: u64,
    /// Object parts no manifest names: left by a put interrupted before its manifest (or by a
    /// replacement interrupted before the old parts were deleted). Valid blocks that eviction
    /// reclaims; not damage (docs/FORMAT.md, Objects).
    pub orphan_parts: u64,
}

impl CheckReport {
    /// True when no damage was found.
    pub fn ok(&self) -> bool {
        self.errors.is_empty()
    }
}

impl std::fmt::Display for CheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unknown = self.held_participants - self.live_participants - self.dead_participants;
        writeln!(
            f,
            "checked {} blocks ({} payload bytes), {} participant slots held ({} seen live, {} dead, {} not watched long enough to tell)",
            self.blocks_checked,
            self.bytes_checked,
            self.held_participants,
            self.live_participants,
            self.dead_participants,
            unknown
        )?;
        if self.quarantined_slots + self.quarantined_blocks > 0 {
            writeln!(
                f,
                "quarantined after takeovers of a writer held up mid-write: {} index slots, {} blocks",
                self.quarantined_slots, self.quarantined_blocks
            )?;
        }
        for n in &self.notes {
            writeln!(f, "note: {}: {}", n.place, n.what)?;
        }
        for e in &self.errors {
            writeln!(f, "error: {}: {}", e.place, e.what)?;
        }
        if self.ok() {
            write!(f, "pool OK")
        } else {
            write!(f, "pool DAMAGED: {} error(s)", self.errors.len())
        }
    }
}

/// Checks every structure of `pool`.
pub fn check(pool: &Pool) -> Result<CheckReport> {
    let sb = *pool.superblock();
    let mem = pool.mem();
    let mut r = CheckReport::default();
    let err =
        |r: &mut CheckReport, place: String, what: String| r.errors.push(Finding { place, what });

    // Participant table.
    let layout = *pool.slot_layout();
    for q in 0..sb.participants {
        let base = pool.slot_off(q);
        mem.acquire(base, layout.size);
        if mem.load_u64(base + slot::TOKEN, Ordering::Acquire)? == 0 {
            continue;
        }
        let place = format!("participant {q}");
        r.held_participants += 1;
        match participant_liveness(pool, q)?.liveness {
            Liveness::Live => r.live_participants += 1,
            Liveness::Dead => {
                r.dead_participants += 1;
                r.notes.push(Finding { place: place.clone(), what: "holder is dead (its heartbeat stood still for a lease); an attach through this handle reclaims the slot".into() });
            }
            Liveness::Free | Liveness::Unknown => {}
        }
        let part = mem.load_u64(base + slot::PARTITION, Ordering::Relaxed)?;
        if part > u64::from(sb.partitions) {
            err(
                &mut r,
                place.clone(),
                format!(
                    "owns partition {} of {}",
                    part.wrapping_sub(1),
                    sb.partitions
                ),
            );
        }
        for e in 0..layout.pins {
            let eoff = base + layout.pin(e);
            if mem.load_u64(eoff + pin::SEQ, Ordering::Acquire)? == 0 {
                continue;
            }
            let w = mem.load_u64(eoff + pin::WHERE, Ordering::Relaxed)?;
            if (w >> 32) >= u64::from(sb.partitions) || (w as u32) >= sb.blocks_per_partition {
                err(
                    &mut r,
                    format!("{place} pin {e}"),
                    format!(
                        "names partition {} block {}, outside the pool",
                        w >> 32,
                        w as u32
                    ),
                );
            }
        }
    }

    // Partitions.
    let nblocks = sb.blocks_per_partition as usize;
    for p in 0..sb.partitions {
        let base = pool.partition_off(p);
        mem.acquire(base, sb.payloads_off);
        // Object parts named by a manifest of this partition, and every part block found.
        let mut named = HashSet::new();
        let mut parts = Vec::new();
        let owner = mem.load_u64(base + partition::OWNER, Ordering::Acquire)?;
        let holder = (owner & 0xffff_ffff) as u32;
        if holder > sb.participants {
            err(
                &mut r,
                format!("partition {p}"),
                format!(
                    "owner word names participant {} of {}",
                    holder - 1,
                    sb.participants
                ),
            );
        }
        // Format 3.2: the tenant whose blocks the partition holds (0 in a 3.1 pool).
        let tag = mem.load_u64(base + partition::TENANT, Ordering::Relaxed)?;
        if tag > u64::from(tenant_table::ENTRIES) {
            err(
                &mut r,
                format!("partition {p}"),
                format!(
                    "tenant tag {tag} is not a tenant id (0..={})",
                    tenant_table::ENTRIES
                ),
            );
        }
        let next_seq = mem.load_u64(base + partition::NEXT_SEQ, Ordering::Relaxed)?;
        if next_seq > crate::format::MAX_SEQ {
            err(
                &mut r,
                format!("partition {p}"),
                format!("next sequence number {next_seq:#x} does not fit an index entry"),
            );
        }
        let mut referenced = vec![u32::MAX; nblocks];
        let mask = sb.index_slots - 1;
        for s in 0..sb.index_slots {
            let off = pool.index_slot_off(p, s);
            let slotv: IndexSlot = read_obj(mem, off)?;
            let place = format!("partition {p} slot {s}");
            if slot_version::quarantined(slotv.version) {
                r.quarantined_slots += 1;
                continue;
            }
            if slotv.version & 1 == 1 {
                r.notes.push(Finding { place: place.clone(), what: "left mid-update (a writer is active or crashed); readers skip it, the next owner repairs it".into() });
                continue;
            }
            if slotv.entry == ENTRY_EMPTY || slotv.entry == ENTRY_TOMBSTONE {
                continue;
            }
            let Some((b, seq)) = decode_entry(slotv.entry) else {
                continue;
            };
            if b as usize >= nblocks {
                err(
                    &mut r,
                    place,
                    format!("entry points at block {b} of {nblocks}"),
                );
                continue;
            }
            if referenced[b as usize] != u32::MAX {
                err(
                    &mut r,
                    place,
                    format!(
                        "block {b} is also indexed by slot {}",
                        referenced[b as usize]
                    ),
                );
                continue;
            }
            referenced[b as usize] = s;
            if seq >= next_seq.max(1) {
                err(
                    &mut r,
                    place.clone(),
                    format!("sequence {seq} not below the partition's next sequence {next_seq}"),
                );
            }
            let key = Key::from_parts(slotv.key_lo, slotv.key_hi);
            // The key must be reachable: no empty slot between its home and here.
            let home = pool.home_slot(key);
            let mut i = home;
            while i != s {
                let v = mem.load_u64(pool.index_slot_off(p, i), Ordering::Relaxed)?;
                let e = mem.load_u64(pool.index_slot_off(p, i) + 24, Ordering::Relaxed)?;
                if e == ENTRY_EMPTY && !slot_version::quarantined(v) {
                    err(
                        &mut r,
                        place.clone(),
                        format!(
                            "key {key} unreachable: empty slot {i} on its probe path from {home}"
                        ),
                    );
                    break;
                }
                i = (i + 1) & mask;
            }
            let h: BlockHeader = read_obj(mem, pool.header_off(p, b))?;
            let hplace = format!("partition {p} block {b}");
            if h.header_crc != h.compute_crc() {
                err(&mut r, hplace, "header CRC mismatch".into());
                continue;
            }
            if Key::from_parts(h.key_lo, h.key_hi) != key || h.seq != seq {
                err(
                    &mut r,
                    hplace,
                    format!(
                        "header names key {} seq {}, index says key {key} seq {seq}",
                        Key::from_parts(h.key_lo, h.key_hi),
                        h.seq
                    ),
                );
                continue;
            }
            if h.claim != claim::word(h.owner_generation, claim::COMMITTED) {
                // Every commit leaves the claim word saying committed by the generation that wrote
                // the header; a block that reads as mid-write is dropped by the next takeover.
                err(
                    &mut r,
                    hplace,
                    format!(
                        "claim word {:#x} is not committed by generation {}",
                        h.claim, h.owner_generation
                    ),
                );
                continue;
            }
            if u64::from(h.tenant) != tag {
                // Its owner's readers of the partition's tenant miss it (and another tenant could
                // read it if the partition were tagged with theirs): damage, not a repair state.
                err(
                    &mut r,
                    hplace.clone(),
                    format!(
                        "block of tenant {} in a partition tagged with tenant {tag}",
                        h.tenant
                    ),
                );
            }
            if h.len > sb.block_size || Codec::from_code(h.codec).is_none() {
                err(
                    &mut r,
                    hplace,
                    format!("length {} or codec {} invalid", h.len, h.codec),
                );
                continue;
            }
            let mut buf = vec![0u8; h.len as usize];
            mem.read(pool.payload_off(p, b), &mut buf)?;
            r.blocks_checked += 1;
            r.bytes_checked += h.len;
            if crate::format::crc32c(&buf) != h.payload_crc {
                err(&mut r, hplace, "payload CRC mismatch".into());
            } else if h.codec == Codec::KvV1 as u32 {
                if let Err(e) = crate::kv::KvBlock::parse(&buf) {
                    err(&mut r, hplace, format!("typed KV payload invalid: {e}"));
                }
            } else if h.codec == Codec::ObjectManifest as u32 {
                match Manifest::decode(&buf, key) {
                    Some(m) => named.extend(m.part_keys()),
                    None => err(&mut r, hplace, "object manifest invalid".into()),
                }
            } else if h.codec == Codec::ObjectPart as u32 {
                parts.push(key);
            }
        }
        let orphans = parts.iter().filter(|k| !named.contains(*k)).count() as u64;
        if orphans > 0 {
            r.orphan_parts += orphans;
            r.notes.push(Finding {
                place: format!("partition {p}"),
                what: format!("{orphans} object parts no manifest names (a put interrupted before its manifest, or replaced); eviction reclaims them"),
            });
        }
        let generation = owner >> 32;
        for (b, by) in referenced.iter().enumerate() {
            if *by != u32::MAX {
                continue;
            }
            let off = pool.header_off(p, b as u32) + BlockHeader::CLAIM_OFF as u64;
            if claim::quarantined(mem.load_u64(off, Ordering::Relaxed)?, generation) {
                r.quarantined_blocks += 1;
            }
        }
    }
    Ok(r)
}
