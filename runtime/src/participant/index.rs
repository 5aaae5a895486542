//! The owner's writes to its partition's index: the seqlock write of one slot, the owner's view
//! of a slot, and the removal of an entry by backward shift.

use super::crash::crash_point;
use super::state::{OwnerState, Participant};
use crate::coherence::{self, Site};
use crate::format::{decode_entry, slot_version, ENTRY_EMPTY, ENTRY_TOMBSTONE, INDEX_SLOT_SIZE};
use crate::key::Key;
use crate::pool::{Pool, PoolError, Result};
use crate::sync::{fence, Ordering};
use cxlkv_shm::SharedMemory;

/// Seqlock write of one index slot by the owner of partition `p`, whose generation is
/// `generation`. Both version changes are compare-and-swaps from a word of that generation: once a
/// successor retagged the slot (takeover), the swap fails and the writer gets
/// [`PoolError::Fenced`] — also when it was held up between any check and the swap. A writer
/// held up after its odd swap stores its fields into a slot the successor quarantined.
pub(super) fn write_slot(
    pool: &Pool,
    p: u32,
    s: u32,
    key: Key,
    entry: u64,
    generation: u64,
) -> Result<()> {
    write_slot_at(
        pool.mem(),
        pool.index_slot_off(p, s),
        key,
        entry,
        generation,
    )?
    .map_err(|v| PoolError::Fenced {
        partition: p,
        generation: slot_version::generation(v) as u32,
    })
}

/// The protocol of [`write_slot`] on the slot at `off` of `mem`: `Ok(Err(version))` when the
/// slot's version (`version`, as last read) says the writer is fenced. The loom models call it on
/// loom-backed memory (`crate::lockfree`).
pub(crate) fn write_slot_at(
    mem: &dyn SharedMemory,
    off: u64,
    key: Key,
    entry: u64,
    generation: u64,
) -> cxlkv_shm::mem::Result<std::result::Result<(), u64>> {
    // Pairs with the IndexWrite publish of a successor's retag at takeover.
    coherence::acquire(mem, Site::IndexRead, off, 8);
    let v = mem.load_u64(off, Ordering::Acquire)?;
    if slot_version::generation(v) != generation & 0xffff_ffff
        || slot_version::quarantined(v)
        || v & 1 == 1
    {
        return Ok(Err(v));
    }
    let odd = slot_version::begin(v);
    if let Err(now) = mem.compare_exchange_u64(off, v, odd)? {
        return Ok(Err(now));
    }
    // The odd version reaches memory before any field does. Pairs with the IndexRead acquires in
    // `Pool::read_slot` / `Pool::slot_version`.
    coherence::publish(mem, Site::IndexWrite, off, 8);
    crash_point("slot:odd");
    // Orders the odd version before the field stores; pairs with the Acquire fence before a
    // reader's version re-check in `Pool::read_slot` / `Pool::slot_version`.
    fence(Ordering::Release);
    mem.store_u64(off + 8, key.lo(), Ordering::Relaxed)?;
    mem.store_u64(off + 16, key.hi(), Ordering::Relaxed)?;
    mem.store_u64(off + 24, entry, Ordering::Relaxed)?;
    crash_point("slot:fields");
    // Fields (and the block they point to) before the even version (the swap is AcqRel, so
    // Release). Pairs with the Acquire load of the version in `Pool::read_slot`. It fails
    // when a successor quarantined the slot meanwhile: nothing becomes visible.
    if let Err(now) = mem.compare_exchange_u64(off, odd, slot_version::end(odd))? {
        return Ok(Err(now));
    }
    coherence::publish(mem, Site::IndexWrite, off, INDEX_SLOT_SIZE);
    Ok(Ok(()))
}

impl Participant {
    /// The owner's view of one of its slots (no concurrent writer, so no seqlock loop).
    pub(super) fn own_slot(&self, p: u32, s: u32) -> Result<(u64, Key, u64)> {
        let off = self.pool.index_slot_off(p, s);
        let m = self.pool.mem();
        Ok((
            m.load_u64(off, Ordering::Relaxed)?,
            Key::from_parts(
                m.load_u64(off + 8, Ordering::Relaxed)?,
                m.load_u64(off + 16, Ordering::Relaxed)?,
            ),
            m.load_u64(off + 24, Ordering::Relaxed)?,
        ))
    }

    /// Removes `block`'s index entry at `slot`.
    pub(super) fn unindex(&self, st: &mut OwnerState, block: u32, slot: u32) -> Result<()> {
        // Backward-shift deletion (Knuth's Algorithm R), so that eviction churn leaves no
        // tombstones behind and probe paths stay short. Invariant kept at every step for readers:
        // a live key stays findable from its home slot. The hole is a tombstone while the shift
        // runs (probes continue past it); an entry moves to the hole only if the hole lies on its
        // probe path, and it is written there before its old slot becomes the new hole. A reader
        // that raced a move may see a miss and retry; it never sees wrong data (the seqlock).
        let p = st.partition;
        let g = self.owner_word >> 32;
        let mask = self.pool.superblock().index_slots - 1;
        write_slot(&self.pool, p, slot, Key(0), ENTRY_TOMBSTONE, g)?;
        if st.indexed[block as usize].take().is_some() {
            st.live = st.live.saturating_sub(1);
            self.publish_live(st);
        }
        st.policy.remove(block);
        let mut hole = slot;
        let mut j = slot;
        loop {
            j = (j + 1) & mask;
            if j == slot {
                break; // wrapped around a table with no empty slot
            }
            let (v, key, entry) = self.own_slot(p, j)?;
            if slot_version::quarantined(v) {
                continue; // probes pass it like a tombstone; nothing moves into or out of it
            }
            if entry == ENTRY_EMPTY {
                break;
            }
            let Some((b, seq)) = decode_entry(entry) else {
                continue;
            };
            let home = self.pool.home_slot(key);
            // Keys whose home lies cyclically in (hole, j] do not pass through the hole.
            let home_after_hole = if hole <= j {
                hole < home && home <= j
            } else {
                home > hole || home <= j
            };
            if home_after_hole {
                continue;
            }
            write_slot(&self.pool, p, hole, key, entry, g)?;
            if let Some(e) = st.indexed.get_mut(b as usize) {
                *e = Some((hole, seq));
            }
            write_slot(&self.pool, p, j, Key(0), ENTRY_TOMBSTONE, g)?;
            hole = j;
        }
        // Every entry between the hole and the empty slot that ended the scan has its home after
        // the hole, so no probe path needs the hole: it becomes empty.
        if j != slot {
            write_slot(&self.pool, p, hole, Key(0), ENTRY_EMPTY, g)?;
        }
        Ok(())
    }
}
