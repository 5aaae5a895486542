//! Reservations: a block taken for an in-place (zero-copy) write, committed under its key once
//! filled, and their raw form for language bindings.

use super::crash::crash_point;
use super::state::Participant;
use crate::format::{self, Codec};
use crate::key::Key;
use crate::metrics::{count_call, Op, Outcome};
use crate::pool::{Location, PoolError, Result};
use std::time::Instant;

impl Participant {
    /// Reserves a block for `len` bytes under `key`: the caller writes the payload in place (zero
    /// copy) and then commits. Dropping the reservation without committing frees the block.
    pub fn reserve(&self, key: Key, len: u64, codec: Codec) -> Result<Reservation<'_>> {
        let cap = self.pool.block_size();
        if len > cap {
            return Err(PoolError::PayloadTooLarge { len, capacity: cap });
        }
        let mut st = self.owner()?;
        self.within_quota(&mut st)?;
        let block = self.allocate(&mut st)?;
        Ok(self.reserved(st.partition, block, key, len, codec))
    }

    /// [`reserve`](Self::reserve) only if a block is free without evicting anything (and the
    /// participant's tenant is under its quota): `None` where a reservation would evict. For a
    /// writer that reserves before it knows whether it has data to fill the block with (the
    /// cross-pod import reads a chain the store may not hold), so that a miss costs the pool
    /// nothing.
    pub fn reserve_free(
        &self,
        key: Key,
        len: u64,
        codec: Codec,
    ) -> Result<Option<Reservation<'_>>> {
        let cap = self.pool.block_size();
        if len > cap {
            return Err(PoolError::PayloadTooLarge { len, capacity: cap });
        }
        let mut st = self.owner()?;
        if self.at_quota()? {
            return Ok(None);
        }
        while let Some(block) = st.free.pop() {
            if self.claim_block(st.partition, block)? {
                return Ok(Some(self.reserved(st.partition, block, key, len, codec)));
            }
        }
        Ok(None)
    }

    /// The reservation of `block`, just claimed in `partition`.
    fn reserved(
        &self,
        partition: u32,
        block: u32,
        key: Key,
        len: u64,
        codec: Codec,
    ) -> Reservation<'_> {
        crash_point("put:allocated");
        Reservation {
            participant: self,
            partition,
            block,
            key,
            len,
            codec,
            done: false,
        }
    }

    /// Address of a raw reservation's payload, for in-place writes.
    pub fn raw_reservation_ptr(&self, r: &RawReservation) -> Result<Option<*mut u8>> {
        Ok(self
            .pool
            .mem()
            .raw_range(self.pool.payload_off(r.partition, r.block), r.len)?)
    }

    /// Commits a reservation taken with [`Reservation::into_raw`].
    pub fn commit_raw(&self, r: RawReservation) -> Result<Location> {
        let len = r.len;
        self.commit_raw_prefix(r, len, None)
    }

    /// [`Reservation::commit_prefix`] of a reservation taken with [`Reservation::into_raw`].
    pub fn commit_raw_prefix(
        &self,
        r: RawReservation,
        len: u64,
        expected_crc: Option<u32>,
    ) -> Result<Location> {
        Reservation {
            participant: self,
            partition: r.partition,
            block: r.block,
            key: r.key,
            len: r.len,
            codec: r.codec,
            done: false,
        }
        .commit_prefix(len, expected_crc)
    }

    /// Abandons a reservation taken with [`Reservation::into_raw`]; its block is freed.
    pub fn abort_raw(&self, r: RawReservation) {
        drop(Reservation {
            participant: self,
            partition: r.partition,
            block: r.block,
            key: r.key,
            len: r.len,
            codec: r.codec,
            done: false,
        });
    }
}

/// A block reserved for an in-place write; see [`Participant::reserve`].
pub struct Reservation<'a> {
    participant: &'a Participant,
    partition: u32,
    block: u32,
    key: Key,
    len: u64,
    codec: Codec,
    done: bool,
}

impl Reservation<'_> {
    /// Payload length reserved.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length reservation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `bytes` at `offset` within the reserved payload.
    pub fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        cxlkv_shm::mem::check_range(offset, bytes.len() as u64, self.len)?;
        let pool = &self.participant.pool;
        pool.mem()
            .write(pool.payload_off(self.partition, self.block) + offset, bytes)?;
        Ok(())
    }

    /// Pool offset of the reserved payload (what an NDP command names as its buffer; docs/ABI.md).
    pub fn payload_offset(&self) -> u64 {
        self.participant
            .pool
            .payload_off(self.partition, self.block)
    }

    /// Address of the reserved payload for in-place writes (`None` on memory without stable
    /// addresses). Valid until commit or drop; only the reserver may write through it.
    pub fn as_mut_ptr(&self) -> Result<Option<*mut u8>> {
        let pool = &self.participant.pool;
        Ok(pool
            .mem()
            .raw_range(pool.payload_off(self.partition, self.block), self.len)?)
    }

    /// Checksums the payload in place and publishes the block under its key. Counted in the
    /// process's metrics as a `put` of the reserved length.
    pub fn commit(self) -> Result<Location> {
        let len = self.len;
        self.commit_prefix(len, None)
    }

    /// Publishes the first `len` bytes of the reservation (at most its length; the bytes past
    /// them are not part of the block) under its key, and with `expected_crc`, only if their
    /// CRC-32C is that: else [`PoolError::PayloadCrc`], the block is freed and nothing is
    /// published. For a writer that reads a payload and its own checksum into the reservation in
    /// one transfer (the cross-pod import): one pass over the bytes both checks them and makes the
    /// block's checksum. Counted as a `put` of `len` bytes.
    pub fn commit_prefix(mut self, len: u64, expected_crc: Option<u32>) -> Result<Location> {
        let t0 = Instant::now();
        let r = self.publish(len, expected_crc);
        if r.is_ok() {
            crate::crosspod::on_put(self.key);
        }
        count_call(Op::Put, t0, &r, |_| (Outcome::Ok, len, 0));
        r
    }

    fn publish(&mut self, len: u64, expected_crc: Option<u32>) -> Result<Location> {
        if len > self.len {
            return Err(PoolError::PayloadTooLarge {
                len,
                capacity: self.len,
            });
        }
        let p = self.participant;
        let off = p.pool.payload_off(self.partition, self.block);
        let crc = format::crc32c_shared(p.pool.mem(), off, len)?;
        if let Some(expected) = expected_crc.filter(|&e| e != crc) {
            // Not done: dropping the reservation frees the block.
            return Err(PoolError::PayloadCrc(expected, crc));
        }
        self.done = true;
        let mut st = p.owner()?;
        p.finish_commit(&mut st, self.key, self.block, self.codec, len, crc, false)
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Some(m) = &self.participant.owner {
                let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
                self.participant.release_block(&mut st, self.block);
            }
        }
    }
}

/// A reservation detached from the borrow of its participant, for language bindings: finish it
/// with [`Participant::commit_raw`] or [`Participant::abort_raw`] on the same participant.
#[derive(Debug)]
pub struct RawReservation {
    partition: u32,
    block: u32,
    key: Key,
    len: u64,
    codec: Codec,
}

impl RawReservation {
    /// Payload length reserved.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length reservation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Reservation<'_> {
    /// Detaches the reservation from its borrow; see [`RawReservation`].
    pub fn into_raw(mut self) -> RawReservation {
        self.done = true;
        RawReservation {
            partition: self.partition,
            block: self.block,
            key: self.key,
            len: self.len,
            codec: self.codec,
        }
    }
}
