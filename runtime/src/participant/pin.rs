//! Pins: a reader's entry in its pin table that keeps a block in place (its owner will neither
//! reuse nor rewrite it) for zero-copy reads, the owner's scan of every live participant's pins
//! before it reuses a block, and the raw form of a pin for language bindings.
//!
//! Pin and reuse meet in a Dekker pair: the reader stores its pin, fences, then re-checks the
//! index; the owner removes the entry, fences, then scans the pins. At least one sees the other.

use super::liveness::participant_dead;
use super::state::Participant;
use crate::coherence::{self, Site};
use crate::format::{self, counters, pin, slot, Codec, PIN_SIZE};
use crate::key::Key;
use crate::metrics::{count_call, Op, Outcome};
use crate::pool::{BlockInfo, BlockRef, Location, PoolError, Result, READ_RETRIES};
use std::collections::HashSet;
use std::sync::atomic::{fence, Ordering};
use std::time::Instant;

impl Participant {
    /// Pins the block under `key`: while the pin is held (and this participant is alive) its
    /// owner will not reuse the block, so the returned view stays valid for zero-copy reads.
    /// A multi-block object cannot be pinned (pins hold one block): that is
    /// [`PoolError::PayloadTooLarge`] with the object's length; read it with `get_into`.
    ///
    /// Counted as a `pin` (of the payload's bytes out; a miss, or a failure) in the process's
    /// metrics.
    pub fn pin(&self, key: Key) -> Result<Option<PinnedBlock<'_>>> {
        let t0 = Instant::now();
        let r = self.pin_key(key);
        count_call(Op::Pin, t0, &r, |p| match p {
            Some(p) => (Outcome::Ok, 0, p.info().len),
            None => (Outcome::Miss, 0, 0),
        });
        r
    }

    fn pin_key(&self, key: Key) -> Result<Option<PinnedBlock<'_>>> {
        if self.self_fencing && self.lease_lost() {
            return Err(self.fenced_error());
        }
        let entry = self.take_pin_entry()?;
        match self.pin_in(entry, key) {
            Ok(Some(pinned)) => {
                self.count(counters::PINS, 1);
                Ok(Some(pinned))
            }
            other => {
                self.unpin(entry);
                if matches!(other, Ok(None)) {
                    self.count(counters::MISSES, 1);
                }
                other
            }
        }
    }

    /// Pins `key` using pin entry `entry` of our slot; the caller frees the entry on `None`/error.
    fn pin_in(&self, entry: u64, key: Key) -> Result<Option<PinnedBlock<'_>>> {
        let pool = &self.pool;
        let mem = pool.mem();
        for _ in 0..READ_RETRIES {
            let Some(loc) = pool.locate(key)? else {
                return Ok(None);
            };
            self.record_pin(entry, &loc)?;
            let Some(h) = pool.checked_header(key, &loc)? else {
                continue;
            };
            if h.codec == Codec::ObjectManifest as u32 {
                // Pins hold one block in place; an object spans many (read it with get_into).
                let len = pool.length(key)?.unwrap_or(h.len);
                return Err(PoolError::PayloadTooLarge {
                    len,
                    capacity: pool.block_size(),
                });
            }
            // Validate the payload once; after this, the pin keeps it in place.
            let poff = pool.payload_off(loc.partition, loc.block);
            // Pairs with the BlockWrite publish of the payload.
            coherence::acquire(mem, Site::PayloadRead, poff, h.len);
            if format::crc32c_shared(mem, poff, h.len)? != h.payload_crc
                || pool.slot_version(loc.partition, loc.slot)? != loc.version
            {
                continue;
            }
            let codec = Codec::from_code(h.codec).expect("checked header");
            return Ok(Some(PinnedBlock {
                participant: self,
                entry,
                info: BlockInfo {
                    len: h.len,
                    codec,
                    location: loc,
                },
                payload_off: poff,
            }));
        }
        Ok(None)
    }

    /// Pins a block found with [`Pool::block_ref`](crate::pool::Pool::block_ref) without
    /// checksumming its payload (for in-place scanners such as the NDP device, which would
    /// otherwise read every byte twice). `None` if the block changed since `r` was taken. While the
    /// returned pin is held the owner will neither reuse nor rewrite the block, so its payload is
    /// immutable and may be read in place.
    pub fn pin_block(&self, r: &BlockRef) -> Result<Option<PinnedBlock<'_>>> {
        if self.self_fencing && self.lease_lost() {
            return Err(self.fenced_error());
        }
        let entry = self.take_pin_entry()?;
        let loc = r.location;
        // Either the owner sees this pin, or we see below that the slot changed.
        let pinned = self
            .record_pin(entry, &loc)
            .and_then(|()| self.pool.still_valid(r));
        match pinned {
            Ok(true) => {
                self.count(counters::PINS, 1);
                let codec = Codec::from_code(r.header.codec).unwrap_or(Codec::Raw);
                Ok(Some(PinnedBlock {
                    participant: self,
                    entry,
                    info: BlockInfo {
                        len: r.header.len,
                        codec,
                        location: loc,
                    },
                    payload_off: r.payload_off,
                }))
            }
            other => {
                self.unpin(entry);
                other.map(|_| None)
            }
        }
    }

    /// Reserves a free entry of this participant's pin table (released by `unpin`).
    fn take_pin_entry(&self) -> Result<u64> {
        let table = self.pool.slot_layout().pins;
        let mut used = self.pin_used.lock().unwrap_or_else(|e| e.into_inner());
        // One bit per entry, 64 to a word; bits past the table's end are never free.
        let free = used
            .iter()
            .enumerate()
            .find(|(_, w)| **w != u64::MAX)
            .map(|(i, w)| i as u64 * 64 + u64::from((!*w).trailing_zeros()))
            .filter(|&e| e < table);
        let Some(free) = free else {
            drop(used);
            self.count(counters::PIN_FULL, 1);
            return Err(PoolError::PinTableFull(table));
        };
        used[(free / 64) as usize] |= 1 << (free % 64);
        Ok(free)
    }

    /// Clears pin entry `entry` of our slot and frees it for the next pin.
    fn unpin(&self, entry: u64) {
        let off = self.pool.slot_off(self.id) + self.pool.slot_layout().pin(entry) + pin::SEQ;
        // A fenced participant's slot may belong to a successor now (it cleared our pins).
        if !(self.self_fencing && self.lease_lost()) {
            // Release: our reads of the block happen before the owner may reuse it.
            let _ = self.pool.mem().store_u64(off, 0, Ordering::Release);
            coherence::publish(self.pool.mem(), Site::PinWrite, off, 8);
        }
        self.pin_used.lock().unwrap_or_else(|e| e.into_inner())[(entry / 64) as usize] &=
            !(1 << (entry % 64));
    }

    /// Records pin entry `entry` for the block at `loc`, then fences: the Dekker pair with the
    /// owner's fence between unindexing a block and scanning pins (`allocate`, `delete`).
    fn record_pin(&self, entry: u64, loc: &Location) -> Result<()> {
        let mem = self.pool.mem();
        let eoff = self.pool.slot_off(self.id) + self.pool.slot_layout().pin(entry);
        let where_ = (u64::from(loc.partition) << 32) | u64::from(loc.block);
        mem.store_u64(eoff + pin::WHERE, where_, Ordering::Relaxed)?;
        mem.store_u64(eoff + pin::SEQ, loc.seq, Ordering::Release)?;
        // Pairs with the owner's PinScanRead acquire before it reuses a block.
        coherence::publish(mem, Site::PinWrite, eoff, PIN_SIZE);
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Calls `visit(block, seq)` for each pin on partition `p` held by a live participant, until
    /// it returns true; returns whether it did.
    fn scan_pins(&self, p: u32, mut visit: impl FnMut(u32, u64) -> bool) -> Result<bool> {
        let pool = &self.pool;
        let mem = pool.mem();
        for q in 0..pool.superblock().participants {
            let base = pool.slot_off(q);
            // Our own slot: we are its only writer, so our cached lines are the truth and need no
            // invalidation (which would also write our dirty heartbeat line back, hiding a missing
            // HeartbeatWrite publish from the simulator).
            if q != self.id {
                // Pairs with the PinWrite publishes of pin holders (and their SlotWrite claims).
                coherence::acquire(mem, Site::PinScanRead, base, pool.slot_layout().size);
                if mem.load_u64(base + slot::TOKEN, Ordering::Acquire)? == 0
                    || participant_dead(pool, q)?
                {
                    continue;
                }
            }
            for e in 0..pool.slot_layout().pins {
                let eoff = base + pool.slot_layout().pin(e);
                let seq = mem.load_u64(eoff + pin::SEQ, Ordering::Acquire)?;
                if seq == 0 {
                    continue;
                }
                let w = mem.load_u64(eoff + pin::WHERE, Ordering::Relaxed)?;
                if (w >> 32) as u32 == p && visit(w as u32, seq) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// (block, seq) pairs of partition `p` pinned by live participants.
    pub(super) fn live_pins(&self, p: u32) -> Result<HashSet<(u32, u64)>> {
        let mut set = HashSet::new();
        self.scan_pins(p, |b, s| {
            set.insert((b, s));
            false
        })?;
        Ok(set)
    }

    pub(super) fn pinned_now(&self, p: u32, block: u32, seq: u64) -> Result<bool> {
        self.scan_pins(p, |b, s| (b, s) == (block, seq))
    }

    /// Address of a raw pin's payload (`None` on memory without stable addresses).
    pub fn raw_pin_ptr(&self, pin: &RawPin) -> Result<Option<*const u8>> {
        Ok(self
            .pool
            .mem()
            .raw_range(pin.payload_off, pin.info.len)?
            .map(|p| p as *const u8))
    }

    /// Releases a pin taken with [`PinnedBlock::into_raw`].
    pub fn unpin_raw(&self, pin: RawPin) {
        self.unpin(pin.entry);
    }
}

/// A pinned block: its payload stays in place until this is dropped.
pub struct PinnedBlock<'a> {
    participant: &'a Participant,
    entry: u64,
    info: BlockInfo,
    payload_off: u64,
}

impl PinnedBlock<'_> {
    /// Length, codec and location of the block.
    pub fn info(&self) -> BlockInfo {
        self.info
    }

    /// Payload length.
    pub fn len(&self) -> u64 {
        self.info.len
    }

    /// True for an empty payload.
    pub fn is_empty(&self) -> bool {
        self.info.len == 0
    }

    /// Copies payload bytes at `offset` into `dst`.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        cxlkv_shm::mem::check_range(offset, dst.len() as u64, self.info.len)?;
        Ok(self
            .participant
            .pool
            .mem()
            .read(self.payload_off + offset, dst)?)
    }

    /// Address of the payload for zero-copy readers and DMA registration (`None` on memory without
    /// stable addresses). Valid until the pin is dropped; the memory must only be read.
    pub fn as_ptr(&self) -> Result<Option<*const u8>> {
        Ok(self
            .participant
            .pool
            .mem()
            .raw_range(self.payload_off, self.info.len)?
            .map(|p| p as *const u8))
    }
}

impl Drop for PinnedBlock<'_> {
    fn drop(&mut self) {
        self.participant.unpin(self.entry);
    }
}

/// A pin detached from the borrow of its participant, for language bindings (the C ABI): it must
/// be given back to the same participant with [`Participant::unpin_raw`]. Dropping it without
/// doing so leaks the pin until the participant detaches.
#[derive(Debug)]
pub struct RawPin {
    entry: u64,
    info: BlockInfo,
    payload_off: u64,
}

impl RawPin {
    /// Length, codec and location of the pinned block.
    pub fn info(&self) -> BlockInfo {
        self.info
    }
}

impl PinnedBlock<'_> {
    /// Detaches the pin from its borrow; see [`RawPin`].
    pub fn into_raw(self) -> RawPin {
        let raw = RawPin {
            entry: self.entry,
            info: self.info,
            payload_off: self.payload_off,
        };
        std::mem::forget(self);
        raw
    }
}
