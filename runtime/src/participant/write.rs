//! Writes to the owner's partition: put (copying a payload in), the commit that publishes a
//! filled block under its key, eviction to make room, and delete.
//!
//! A block is published payload first, then header, then index entry (each step a crash point);
//! a block leaves the index before its pins are looked for, and a pinned block is reused only
//! once its pins are gone.

use super::crash::crash_point;
use super::holdings::blocks_for;
use super::index::write_slot;
use super::state::{OwnerState, Participant};
use crate::coherence::{self, Site};
use crate::format::{
    self, claim, counters, decode_entry, encode_entry, partition, slot_version, BlockHeader, Codec,
    ENTRY_EMPTY, ENTRY_TOMBSTONE,
};
use crate::key::Key;
use crate::kv::{self, KvShape};
use crate::metrics::{count_call, Op, Outcome};
use crate::pool::{Location, PoolError, Probe, Result};
use std::sync::atomic::{fence, Ordering};
use std::time::Instant;

impl Participant {
    /// Stores `payload` under `key` in a partition this participant holds (replacing an older
    /// block of the same key in any of them): its own while it has a free block, else a further
    /// one with room or claimed now (`holdings`), else evicting least recently used unpinned
    /// blocks.
    ///
    /// A payload larger than one block is stored as a multi-block object (parts, then a manifest
    /// under `key`; see [`crate::object`]): readers see it only once whole, and `get`, `get_into`,
    /// `contains`, `delete` treat it like a block. Its location is the manifest's. Counted in the
    /// process's metrics as a `put` of `payload.len()` bytes ([`crate::metrics`]).
    pub fn put(&self, key: Key, payload: &[u8]) -> Result<Location> {
        let t0 = Instant::now();
        let bs = self.pool.block_size();
        let blocks = blocks_for(payload.len() as u64, bs);
        // An object larger than one partition spans the partitions this participant holds.
        let spans = blocks > u64::from(self.pool.superblock().blocks_per_partition);
        let r = if spans && self.grows && self.owner.is_some() {
            self.put_object_spanning(key, Codec::Raw, payload)
        } else {
            let store = |w: &Participant| {
                if payload.len() as u64 > bs {
                    w.put_object(key, Codec::Raw, payload)
                } else {
                    w.put_with_codec(key, Codec::Raw, payload)
                }
            };
            self.store_spread(key, blocks, store, |_| true)
        };
        if r.is_ok() {
            // Write-through to the cross-pod tier (asynchronous; a multi-block object is
            // published whole).
            crate::crosspod::on_put(key);
        }
        count_call(Op::Put, t0, &r, |_| (Outcome::Ok, payload.len() as u64, 0));
        r
    }

    /// Stores a typed KV block (K and V `[kv_heads][tokens][head_dim]` of `shape.dtype`) under
    /// `key`; the key bounds are computed here so scorers can prune the block. Counted as a `put`
    /// of the bytes of K and V.
    pub fn put_kv(&self, key: Key, shape: &KvShape, k: &[u8], v: &[u8]) -> Result<Location> {
        self.put_kv_with(key, shape, k, v, kv::Sketch::None)
    }

    /// [`Participant::put_kv`] with a key sketch made from the same K ([`kv::encode_with`]).
    pub fn put_kv_with(
        &self,
        key: Key,
        shape: &KvShape,
        k: &[u8],
        v: &[u8],
        sketch: kv::Sketch,
    ) -> Result<Location> {
        let t0 = Instant::now();
        let r = kv::encode_with(shape, k, v, sketch).and_then(|payload| {
            self.store_spread(
                key,
                1,
                |w| w.put_with_codec(key, Codec::KvV1, &payload),
                |_| true,
            )
        });
        count_call(Op::Put, t0, &r, |_| {
            (Outcome::Ok, (k.len() + v.len()) as u64, 0)
        });
        r
    }

    pub(crate) fn put_with_codec(
        &self,
        key: Key,
        codec: Codec,
        payload: &[u8],
    ) -> Result<Location> {
        let cap = self.pool.block_size();
        if payload.len() as u64 > cap {
            return Err(PoolError::PayloadTooLarge {
                len: payload.len() as u64,
                capacity: cap,
            });
        }
        let mut st = self.owner()?;
        // Checksummed from the private source, so the copy below never has to be read back.
        let crc = format::crc32c(payload);
        self.store_block(&mut st, key, codec, payload, crc)
    }

    /// The steps of a put under the owner lock: allocate, copy the payload in, commit.
    pub(super) fn store_block(
        &self,
        st: &mut OwnerState,
        key: Key,
        codec: Codec,
        payload: &[u8],
        crc: u32,
    ) -> Result<Location> {
        self.within_quota(st)?;
        let block = self.allocate(st)?;
        crash_point("put:allocated");
        let p = st.partition;
        let off = self.pool.payload_off(p, block);
        // The payload reaches memory before the header and index entry that announce it
        // (`finish_commit`); on software-coherent memory it is streamed there with non-temporal
        // stores, so no write-back pass follows. Pairs with the PayloadRead acquires of readers.
        if let Err(e) = coherence::write_published(self.pool.mem(), Site::BlockWrite, off, payload)
        {
            self.release_block(st, block);
            return Err(e.into());
        }
        crash_point("put:payload");
        self.finish_commit(st, key, block, codec, payload.len() as u64, crc, true)
    }

    /// Takes a block for writing and claims it (its claim word says `WRITING` by this owner's
    /// generation, in memory, before any other store to the block). A block another generation
    /// left mid-write is quarantined: dropped from the free list for good.
    pub(super) fn allocate(&self, st: &mut OwnerState) -> Result<u32> {
        loop {
            let block = self.take_block(st)?;
            if self.claim_block(st.partition, block)? {
                return Ok(block);
            }
        }
    }

    /// Claims `block` for writing with a compare-and-swap of its claim word: `Ok(false)` if another
    /// generation has it mid-write (quarantined), [`PoolError::Fenced`] if a successor owns the
    /// partition. Whoever swaps first owns the block: a former owner's late swap fails once the
    /// successor claimed the block, and a block it claims late is one the successor has not
    /// claimed, which the successor then finds quarantined here.
    pub(super) fn claim_block(&self, p: u32, block: u32) -> Result<bool> {
        let mem = self.pool.mem();
        let off = self.pool.header_off(p, block) + BlockHeader::CLAIM_OFF as u64;
        let g = self.owner_word >> 32;
        // Pairs with the BlockWrite publish of the claim by a former or later owner.
        coherence::acquire(mem, Site::HeaderRead, off, 8);
        let w = mem.load_u64(off, Ordering::Acquire)?;
        if claim::quarantined(w, g) {
            return Ok(false);
        }
        if claim::generation(w) != g {
            // A predecessor's word, or a successor's: then we are fenced.
            self.check_fence(p)?;
        }
        crash_point("claim:read");
        match mem.compare_exchange_u64(off, w, claim::word(g, claim::WRITING))? {
            Ok(_) => {
                // The claim reaches memory before the payload does. Pairs with the acquire above
                // and the RecoveryRead of a successor.
                coherence::publish(mem, Site::BlockWrite, off, 8);
                Ok(true)
            }
            Err(_) => {
                self.check_fence(p)?;
                // Still ours: a former owner claimed it late, and may still write it.
                Ok(false)
            }
        }
    }

    /// Puts back a claimed block whose write was abandoned: its claim word goes back to idle (so a
    /// successor does not quarantine it), then the free list.
    pub(super) fn release_block(&self, st: &mut OwnerState, block: u32) {
        let off = self.pool.header_off(st.partition, block) + BlockHeader::CLAIM_OFF as u64;
        let g = self.owner_word >> 32;
        let mem = self.pool.mem();
        if let Ok(Ok(_)) = mem.compare_exchange_u64(
            off,
            claim::word(g, claim::WRITING),
            claim::word(g, claim::IDLE),
        ) {
            coherence::publish(mem, Site::BlockWrite, off, 8);
        }
        st.free.push(block);
    }

    /// Takes a free block, reusing deferred ones whose pins are gone, else evicting.
    fn take_block(&self, st: &mut OwnerState) -> Result<u32> {
        if let Some(b) = st.free.pop() {
            return Ok(b);
        }
        if !st.deferred.is_empty() {
            let pins = self.live_pins(st.partition)?;
            if let Some(i) = st
                .deferred
                .iter()
                .position(|(b, s)| !pins.contains(&(*b, *s)))
            {
                return Ok(st.deferred.swap_remove(i).0);
            }
        }
        self.evict_one(st)?
            .ok_or(PoolError::PartitionFull(st.partition))
    }

    /// Evicts the least recently used unpinned block of this participant's partition and returns
    /// it, free for reuse; `None` if every indexed block is pinned (or none is indexed). A victim
    /// that a reader pins at the last moment is deferred and the next one tried. With a cross-pod
    /// bridge configured, a victim is first offered to it for write-back
    /// ([`crate::crosspod::write_back`], bounded by its timeout).
    pub(super) fn evict_one(&self, st: &mut OwnerState) -> Result<Option<u32>> {
        let pins = self.live_pins(st.partition)?;
        let mut skipped = Vec::new();
        let result = loop {
            let Some(victim) = st.policy.victim() else {
                break Ok(None);
            };
            let (slot, seq) = st.indexed[victim as usize].expect("policy tracks indexed blocks");
            if pins.contains(&(victim, seq)) {
                skipped.push(victim);
                continue;
            }
            // Write-back to the cross-pod tier while the block (or the object, under its
            // manifest's key) is still indexed: its bridge pins the block, or reads the object.
            let (_, key, _) = self.own_slot(st.partition, slot)?;
            if let Some(result) = crate::crosspod::write_back(key) {
                crate::metrics::global().record_write_back(result);
            }
            self.unindex(st, victim, slot)?;
            // The Dekker pair with `pin`: we removed the entry, then look for pins; a reader
            // stores its pin, then re-checks the entry. SeqCst on both sides means at least one of
            // us sees the other.
            fence(Ordering::SeqCst);
            self.count(counters::EVICTIONS, 1);
            // An object leaves as a unit: its parts go with its manifest (best effort: a
            // failure leaves orphans, which eviction reclaims).
            let _ = self.drop_object_parts(st, victim);
            if self.pinned_now(st.partition, victim, seq)? {
                st.deferred.push((victim, seq));
                continue;
            }
            break Ok(Some(victim));
        };
        for b in skipped {
            st.policy.insert(b);
        }
        result
    }

    /// This participant's tenant and its quota, or `None` where puts are unlimited (tenant 0, or
    /// a quota of 0).
    fn quota(&self) -> Result<Option<(u32, u64)>> {
        let tenant = self.pool.tenant;
        if tenant == 0 {
            return Ok(None);
        }
        let quota = crate::tenant::quota_of(&self.pool, tenant)?;
        Ok((quota != 0).then_some((tenant, quota)))
    }

    /// Whether this participant's tenant holds its quota's worth of blocks (a put would evict).
    pub(super) fn at_quota(&self) -> Result<bool> {
        Ok(match self.quota()? {
            Some((tenant, quota)) => crate::tenant::use_of(&self.pool, tenant)? >= quota,
            None => false,
        })
    }

    /// Evicts least recently used unpinned blocks of this participant's partition until `n`
    /// blocks are free, or until only `keep_newest` blocks are left (the most recently used
    /// ones), or nothing is left to evict; returns how many it evicted. `n` is capped at half the
    /// partition's blocks, so that room kept ahead never empties the cache. A writer whose next
    /// reservations must not wait on eviction (the cross-pod bridge, between two requests, keeping
    /// the blocks it just imported) keeps room ahead this way.
    pub fn keep_free(&self, n: u64, keep_newest: u64) -> Result<u64> {
        let n = n.min(u64::from(self.pool.superblock().blocks_per_partition) / 2);
        let mut st = self.owner()?;
        let mut evicted = 0;
        while (st.free.len() as u64) < n && st.live > keep_newest {
            match self.evict_one(&mut st)? {
                Some(b) => {
                    st.free.push(b);
                    evicted += 1;
                }
                None => break,
            }
        }
        Ok(evicted)
    }

    /// Makes room under this participant's tenant's quota before a put (format 3.2): while the
    /// tenant's use (every partition tagged with it) is at its quota, evicts this partition's
    /// least recently used block; with nothing left to evict, [`PoolError::QuotaExceeded`] and
    /// nothing changes. Tenant 0 and a quota of 0 are unlimited. Writers of one tenant in other
    /// processes read the use at the same time, so each may overshoot it by one block.
    pub(super) fn within_quota(&self, st: &mut OwnerState) -> Result<()> {
        let Some((tenant, quota)) = self.quota()? else {
            return Ok(());
        };
        while crate::tenant::use_of(&self.pool, tenant)? >= quota {
            match self.evict_one(st)? {
                Some(b) => st.free.push(b),
                None => return Err(PoolError::QuotaExceeded { tenant, quota }),
            }
        }
        Ok(())
    }

    /// Publishes the partition's live-block count (`partition::LIVE`), which anyone sums to read
    /// a tenant's use.
    pub(super) fn publish_live(&self, st: &OwnerState) {
        let off = self.pool.partition_off(st.partition) + partition::LIVE;
        let mem = self.pool.mem();
        // Only the owner writes the word; readers of a tenant's use pair with this publish.
        let _ = mem.store_u64(off, st.live, Ordering::Release);
        coherence::publish(mem, Site::OwnerWrite, off, 8);
    }

    /// Writes header and index entry for a filled block; the last step of put and commit.
    /// `payload_published`: the payload is already in memory (a put's `write_published`); else
    /// (an in-place reservation) it is published here.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_commit(
        &self,
        st: &mut OwnerState,
        key: Key,
        block: u32,
        codec: Codec,
        len: u64,
        crc: u32,
        payload_published: bool,
    ) -> Result<Location> {
        let pool = &self.pool;
        let mem = pool.mem();
        let p = st.partition;
        if let Err(e) = self.check_fence(p) {
            st.free.push(block);
            return Err(e);
        }
        let g = self.owner_word >> 32;
        let seq = st.next_seq;
        // From the value this owner (or its recovery) wrote: a former owner's late swap fails, so
        // it cannot move the word back below the sequence numbers its successor handed out.
        if mem
            .compare_exchange_u64(pool.partition_off(p) + partition::NEXT_SEQ, seq, seq + 1)?
            .is_err()
        {
            return Err(self.fenced_now(p));
        }
        st.next_seq += 1;
        let mut h = BlockHeader {
            key_lo: key.lo(),
            key_hi: key.hi(),
            seq,
            len,
            codec: codec as u32,
            payload_crc: crc,
            owner_generation: g,
            tenant: self.pool.tenant,
            ..Default::default()
        };
        h.header_crc = h.compute_crc();
        let hoff = pool.header_off(p, block);
        // Everything but the claim word, which only compare-and-swap changes.
        let bytes = format::as_bytes(&h);
        let claim_off = BlockHeader::CLAIM_OFF;
        mem.write(hoff, &bytes[..claim_off])?;
        mem.write(hoff + claim_off as u64 + 8, &bytes[claim_off + 8..])?;
        // The block is committed (no longer quarantined if the index step is interrupted); fails
        // if a successor took it over.
        if mem
            .compare_exchange_u64(
                hoff + claim_off as u64,
                claim::word(g, claim::WRITING),
                claim::word(g, claim::COMMITTED),
            )?
            .is_err()
        {
            return Err(self.fenced_now(p));
        }
        // Payload and header reach memory before the index entry that points at them. Pairs with
        // the acquires in `Pool::checked_header` and the payload read.
        if !payload_published {
            coherence::publish(mem, Site::BlockWrite, pool.payload_off(p, block), len);
        }
        coherence::publish(mem, Site::BlockWrite, hoff, format::BLOCK_HEADER_SIZE);
        crash_point("put:header");

        // Replace an existing entry for the key, else insert at the first free slot on its path.
        let n = pool.superblock().index_slots;
        let mask = n - 1;
        let home = pool.home_slot(key);
        let mut target = None;
        let mut old = None;
        for i in 0..n {
            let s = (home + i) & mask;
            let (v, k, entry) = self.own_slot(p, s)?;
            if slot_version::quarantined(v) {
                continue;
            }
            if entry == ENTRY_EMPTY {
                target.get_or_insert(s);
                break;
            }
            if entry == ENTRY_TOMBSTONE {
                target.get_or_insert(s);
                continue;
            }
            if k == key {
                target = Some(s);
                old = decode_entry(entry);
                break;
            }
        }
        let Some(s) = target else {
            st.free.push(block);
            return Err(PoolError::PartitionFull(p));
        };
        write_slot(pool, p, s, key, encode_entry(block, seq), g)?;
        crash_point("put:indexed");
        st.indexed[block as usize] = Some((s, seq));
        st.live += 1;
        st.policy.insert(block);
        if let Some((old_block, old_seq)) = old {
            if (old_block as usize) < st.indexed.len() && old_block != block {
                st.indexed[old_block as usize] = None;
                st.live = st.live.saturating_sub(1);
                st.policy.remove(old_block);
                fence(Ordering::SeqCst); // Dekker pair with `pin`, as in `allocate`.
                if self.pinned_now(p, old_block, old_seq)? {
                    st.deferred.push((old_block, old_seq));
                } else {
                    st.free.push(old_block);
                }
                // A replaced object's parts go once the new block is indexed (best effort: a
                // failure leaves orphans, which eviction reclaims).
                let _ = self.drop_object_parts(st, old_block);
            }
        }
        self.publish_live(st);
        self.count(counters::PUTS, 1);
        self.count(counters::BYTES_IN, len);
        Ok(Location {
            partition: p,
            slot: s,
            version: 0,
            block,
            seq,
        })
    }

    /// Deletes `key` from the partitions this participant holds (a further partition left empty is
    /// given back). `Ok(false)` if it is nowhere;
    /// [`PoolError::NotOwner`] if it lives in another participant's partition. Counted as a
    /// `delete` (`Ok(false)`: a miss).
    pub fn delete(&self, key: Key) -> Result<bool> {
        let t0 = Instant::now();
        let r = self.delete_spread(key);
        count_call(Op::Delete, t0, &r, |&found| {
            let outcome = if found { Outcome::Ok } else { Outcome::Miss };
            (outcome, 0, 0)
        });
        r
    }

    pub(super) fn delete_key(&self, key: Key) -> Result<bool> {
        let mut st = self.owner()?;
        let p = st.partition;
        match self.pool.probe(p, key)? {
            Probe::Found(loc) => {
                self.unindex(&mut st, loc.block, loc.slot)?;
                fence(Ordering::SeqCst); // Dekker pair with `pin`, as in `allocate`.
                if self.pinned_now(p, loc.block, loc.seq)? {
                    st.deferred.push((loc.block, loc.seq));
                } else {
                    st.free.push(loc.block);
                }
                // An object: its manifest went first (readers miss from here), then its parts.
                self.drop_object_parts(&mut st, loc.block)?;
                self.count(counters::DELETES, 1);
                Ok(true)
            }
            Probe::Absent | Probe::Busy => match self.pool.locate(key)? {
                Some(loc) => Err(PoolError::NotOwner {
                    key,
                    partition: loc.partition,
                }),
                None => Ok(false),
            },
        }
    }
}
