//! Several partitions per participant: once the partitions it holds have no free block for a put,
//! a participant claims a further one (free, orphaned, of its tenant or empty, within its quota)
//! before it evicts any of its own blocks, and gives each further partition back once it holds no
//! live block (and at detach).
//!
//! Each further partition is held through a further participant slot of its own (an *extra*: slot,
//! token, heartbeat thread, owner word, fencing), claimed by the same process. The pool format is
//! unchanged: a slot still names one partition in its `partition` word, so every reader of the
//! format, 3.2 builds included, judges ownership and orphans as before, and the single-writer rule,
//! fencing and recovery stay per partition (docs/FORMAT.md §7). A process that dies or stops stops
//! every slot's heartbeat at once: observers find all of them dead and take every partition over,
//! each on its own. An extra is claimed only while another slot stays free, so a second process
//! can always attach. A pool meant for multi-partition holders wants `participants` above
//! `partitions`.
//!
//! Only participants of a hardware-coherent pool attached by compare-and-swap grow: on a
//! software-coherent pool (no cross-host compare-and-swap; operator-assigned slots) every
//! participant holds its one partition.

use super::state::{Holdings, Participant};
use crate::coherence::{self, Site};
use crate::format::{self, slot, Codec, ObjectPartEntry};
use crate::key::Key;
use crate::object::{part_key, Manifest};
use crate::pool::{Location, PoolError, Probe, Result};
use crate::tenant;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Participant {
    /// The partitions this participant holds: its own first, then the further ones it claimed.
    pub fn partitions(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.partition().into_iter().collect();
        v.extend(self.holdings().extra.iter().filter_map(|x| x.partition()));
        v
    }

    /// The participant slots holding this participant's further partitions (see the module).
    pub fn extra_slots(&self) -> Vec<u32> {
        self.holdings().extra.iter().map(|x| x.id()).collect()
    }

    fn holdings(&self) -> std::sync::MutexGuard<'_, Holdings> {
        self.holdings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `store` (a put of `key` taking `blocks` blocks) on the holder of a partition with room:
    /// this participant, a further partition it holds, or one it claims now; else on the holder of
    /// `key` (or this participant), which evicts. Then removes `key` from every other partition
    /// it holds, so readers (who take the first partition that has a key) see the new value
    /// (only when `stored` says the store wrote: a put-if-absent that found the key wrote nothing).
    pub(super) fn store_spread<T>(
        &self,
        key: Key,
        blocks: u64,
        store: impl FnOnce(&Participant) -> Result<T>,
        stored: impl Fn(&T) -> bool,
    ) -> Result<T> {
        if !self.grows || self.owner.is_none() {
            return store(self);
        }
        let mut h = self.holdings();
        let target = self.pick_holder(&mut h, key, blocks)?;
        let r = match &target {
            None => store(self),
            Some(x) => store(x),
        };
        let mut emptied = false;
        if r.as_ref().is_ok_and(stored) {
            let holders = std::iter::once(self).chain(h.extra.iter().map(|x| &**x));
            for other in holders {
                let chosen = match &target {
                    None => std::ptr::eq(other, self),
                    Some(x) => std::ptr::eq(other, &**x),
                };
                if !chosen {
                    emptied |= other.drop_stale(key)?;
                }
            }
        }
        if emptied {
            give_back_empty(&mut h);
        }
        r
    }

    /// Deletes `key` from whichever partition of this participant holds it, and gives back a
    /// further partition left without live blocks.
    pub(super) fn delete_spread(&self, key: Key) -> Result<bool> {
        if !self.grows {
            return self.delete_key(key);
        }
        let mut h = self.holdings();
        // An object may have parts in several partitions held: they go after its manifest.
        let parts = match h.extra.is_empty() {
            true => None,
            false => self.pool.object_manifest(key)?.map(|m| m.part_keys()),
        };
        let first = self.delete_key(key);
        let r = match first {
            Err(PoolError::NotOwner { partition: p, .. }) => {
                match h.extra.iter().find(|x| x.partition() == Some(p)) {
                    Some(x) => x.delete_key(key),
                    None => first,
                }
            }
            r => r,
        };
        if matches!(r, Ok(true)) {
            let holders: Vec<&Participant> = std::iter::once(self)
                .chain(h.extra.iter().map(|x| &**x))
                .collect();
            for pk in parts.into_iter().flatten() {
                drop_everywhere(&holders, pk)?;
            }
        }
        give_back_empty(&mut h);
        r
    }

    /// Removes a replaced copy of `key` from this participant's (one) partition, if it has one:
    /// true if it did.
    fn drop_stale(&self, key: Key) -> Result<bool> {
        let Some(p) = self.partition() else {
            return Ok(false);
        };
        if let Probe::Found(_) = self.pool.probe(p, key)? {
            return self.delete_key(key);
        }
        Ok(false)
    }

    /// Live blocks of this participant's own partition (the count it publishes).
    fn live_count(&self) -> u64 {
        self.owner
            .as_ref()
            .map_or(0, |m| m.lock().unwrap_or_else(|e| e.into_inner()).live)
    }

    /// Free blocks of this participant's own partition (no eviction needed for that many).
    fn free_blocks(&self) -> u64 {
        self.owner.as_ref().map_or(0, |m| {
            m.lock().unwrap_or_else(|e| e.into_inner()).free.len() as u64
        })
    }

    /// The holder to store `blocks` blocks of `key` on (`None`: this participant).
    fn pick_holder(
        &self,
        h: &mut Holdings,
        key: Key,
        blocks: u64,
    ) -> Result<Option<Arc<Participant>>> {
        if self.free_blocks() >= blocks {
            return Ok(None);
        }
        if let Some(x) = h.extra.iter().find(|x| x.free_blocks() >= blocks) {
            return Ok(Some(x.clone()));
        }
        if let Some(x) = self.claim_further(h)? {
            return Ok(Some(x));
        }
        // Every partition held is full: evict in the one that holds the key, else our own.
        for x in &h.extra {
            if let Some(p) = x.partition() {
                if let Probe::Found(_) = self.pool.probe(p, key)? {
                    return Ok(Some(x.clone()));
                }
            }
        }
        Ok(None)
    }

    /// Claims a further partition through an extra slot, if one is free or orphaned, a slot stays
    /// free for others, and the tenant is under its quota. Retried at most every eighth of a lease
    /// after finding none.
    fn claim_further(&self, h: &mut Holdings) -> Result<Option<Arc<Participant>>> {
        let now = Instant::now();
        if h.retry_at.is_some_and(|t| now < t) {
            return Ok(None);
        }
        let pause = Duration::from_nanos(self.pool.superblock().lease_ns / 8);
        h.retry_at = Some(now + pause);
        let t = self.pool.tenant;
        if t != 0 {
            let quota = tenant::quota_of(&self.pool, t)?;
            if quota != 0 && tenant::use_of(&self.pool, t)? >= quota {
                return Ok(None);
            }
        }
        if self.free_slots()? < 2 {
            return Ok(None);
        }
        let opts = super::AttachOptions {
            heartbeat: self.heartbeat.is_some(),
            own_partition: true,
        };
        let attached = match &self.tenant {
            Some(t) => Participant::attach_as_with(&self.pool, t, opts),
            None => Participant::attach(&self.pool, opts),
        };
        let mut x = match attached {
            Ok(x) => x,
            Err(PoolError::NoFreeParticipant(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        if x.partition().is_none() {
            return Ok(None); // dropping it frees the slot again
        }
        x.grows = false;
        let x = Arc::new(x);
        h.extra.push(x.clone());
        h.retry_at = None;
        Ok(Some(x))
    }

    /// Slots free now (token 0), a hint: others may claim them meanwhile.
    fn free_slots(&self) -> Result<u32> {
        let mem = self.pool.mem();
        let mut n = 0;
        for i in 0..self.pool.superblock().participants {
            let off = self.pool.slot_off(i);
            // Pairs with the publish of the slot by its claimer (SlotWrite).
            coherence::acquire(mem, Site::LivenessRead, off, 64);
            if mem.load_u64(off + slot::TOKEN, Ordering::Acquire)? == 0 {
                n += 1;
            }
        }
        Ok(n)
    }
}

/// Gives back (detaches) every further partition without a live block.
fn give_back_empty(h: &mut Holdings) {
    h.extra.retain(|x| x.live_count() > 0);
    h.retry_at = None;
}

/// Blocks a put of `len` bytes takes: one, or an object's parts and its manifest.
pub(super) fn blocks_for(len: u64, block_size: u64) -> u64 {
    if len <= block_size {
        1
    } else {
        len.div_ceil(block_size) + 1
    }
}

impl Participant {
    /// Stores `payload` as an object larger than one partition: room is made first (free blocks
    /// across the partitions held, further partitions claimed, else least recently used blocks
    /// evicted), so its parts never evict one another; then the parts go to whichever partitions
    /// have free blocks, the first to the partition whose sequence number makes the nonce, and the
    /// manifest last. Readers find parts outside the manifest's partition by key
    /// ([`crate::object`]). Those parts stay in their partition's eviction order: evicting one
    /// makes the object a miss, and once its manifest is gone they are orphans that eviction
    /// reclaims.
    pub(super) fn put_object_spanning(
        &self,
        key: Key,
        codec: Codec,
        payload: &[u8],
    ) -> Result<Location> {
        let bs = self.pool.block_size();
        let n = (payload.len() as u64).div_ceil(bs);
        self.check_object_len(payload.len() as u64)?;
        let old_parts = self.pool.object_manifest(key)?.map(|m| m.part_keys());
        let mut h = self.holdings();
        self.make_room(&mut h, n + 1)?;
        let holders: Vec<&Participant> = std::iter::once(self)
            .chain(h.extra.iter().map(|x| &**x))
            .collect();
        let with_room = || {
            holders
                .iter()
                .copied()
                .find(|x| x.free_blocks() > 0)
                .ok_or(PoolError::PartitionFull(self.partition().unwrap_or(0)))
        };
        let first = with_room()?;
        // Unique in the pool for all time: the first part's store takes this sequence number.
        let nonce = {
            let st = first.owner()?;
            (u64::from(st.partition) << 48) | st.next_seq
        };
        let mut parts = Vec::with_capacity(n as usize);
        let result = (|| {
            for (i, chunk) in payload.chunks(bs as usize).enumerate() {
                let pk = part_key(key, nonce, i as u32);
                let w = if i == 0 { first } else { with_room()? };
                w.put_with_codec(pk, Codec::ObjectPart, chunk)?;
                parts.push(ObjectPartEntry {
                    key_lo: pk.lo(),
                    key_hi: pk.hi(),
                    len: chunk.len() as u64,
                    crc: format::crc32c(chunk),
                    reserved: 0,
                });
            }
            let manifest = Manifest::encode(key, codec, bs, nonce, &parts);
            let w = with_room()?;
            let loc = w.put_with_codec(key, Codec::ObjectManifest, &manifest)?;
            Ok((w, loc))
        })();
        let (w, loc) = match result {
            Ok(r) => r,
            Err(e) => {
                // Best effort: what is left are orphans, which eviction reclaims.
                for p in &parts {
                    let _ = drop_everywhere(&holders, Key::from_parts(p.key_lo, p.key_hi));
                }
                return Err(e);
            }
        };
        for x in &holders {
            if !std::ptr::eq(*x, w) {
                x.drop_stale(key)?;
            }
        }
        for pk in old_parts.into_iter().flatten() {
            drop_everywhere(&holders, pk)?;
        }
        Ok(loc)
    }

    /// Makes `need` blocks free across the partitions held: claims further partitions, then
    /// evicts least recently used blocks (every holder in turn).
    fn make_room(&self, h: &mut Holdings, need: u64) -> Result<()> {
        loop {
            let free: u64 =
                self.free_blocks() + h.extra.iter().map(|x| x.free_blocks()).sum::<u64>();
            if free >= need {
                return Ok(());
            }
            h.retry_at = None;
            if self.claim_further(h)?.is_some() {
                continue;
            }
            let mut evicted = self.evict_into_free()?;
            for x in &h.extra {
                if evicted {
                    break;
                }
                evicted = x.evict_into_free()?;
            }
            if !evicted {
                return Err(PoolError::PartitionFull(self.partition().unwrap_or(0)));
            }
        }
    }

    /// Evicts one block (an object: all its blocks here) of this participant's partition onto its
    /// free list; false if nothing is evictable.
    fn evict_into_free(&self) -> Result<bool> {
        let mut st = self.owner()?;
        match self.evict_one(&mut st)? {
            Some(b) => {
                st.free.push(b);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Deletes `key` from whichever of `holders` holds it.
fn drop_everywhere(holders: &[&Participant], key: Key) -> Result<()> {
    for x in holders {
        if x.drop_stale(key)? {
            return Ok(());
        }
    }
    Ok(())
}
