//! The owner's side of multi-block objects ([`crate::object`]): the put (parts, then the
//! manifest last), dropping an object's parts when its manifest is replaced, deleted or evicted,
//! and put-if-absent across partitions.

use super::crash::crash_point;
use super::state::{OwnerState, Participant};
use crate::format::{self, BlockHeader, Codec, ObjectPartEntry};
use crate::key::Key;
use crate::metrics::{count_call, Op, Outcome};
use crate::object::{max_object_len, part_key, Manifest, MANIFEST_HEAD, PART_ENTRY};
use crate::pool::{Location, PoolError, Result};
use cxlkv_shm::mem::read_obj;
use std::collections::HashMap;
use std::sync::atomic::{fence, Ordering};
use std::time::Instant;

/// What [`Participant::put_if_absent`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// The key was absent from every partition; the payload was stored here.
    Stored(Location),
    /// The key was already present (in this or another partition); nothing was written.
    Present(Location),
}

impl PutOutcome {
    /// True when the payload was stored.
    pub fn stored(&self) -> bool {
        matches!(self, PutOutcome::Stored(_))
    }

    /// Where the key lives now.
    pub fn location(&self) -> Location {
        match *self {
            PutOutcome::Stored(l) | PutOutcome::Present(l) => l,
        }
    }
}

impl Participant {
    /// Stores `payload` under `key` unless some participant already holds `key` in any partition
    /// ([`Pool::locate`](crate::pool::Pool::locate) looks in every one first). Large payloads are
    /// stored as objects, as by [`put`](Self::put).
    ///
    /// The check and the store are not one atomic step across participants: two participants
    /// putting the same new key at the same instant may both store it (each in its own
    /// partition). A reader then finds one of them, whole; nothing is torn. Within one participant
    /// the check and the store are ordered (its puts are serialized).
    ///
    /// Counted as a `put`: of `payload.len()` bytes when stored, of none when the key was present.
    pub fn put_if_absent(&self, key: Key, payload: &[u8]) -> Result<PutOutcome> {
        let t0 = Instant::now();
        let blocks = super::holdings::blocks_for(payload.len() as u64, self.pool.block_size());
        if blocks > u64::from(self.pool.superblock().blocks_per_partition) && self.grows {
            // Larger than a partition: spans the partitions held (`put` documents how).
            let r = match self.pool.locate(key) {
                Ok(Some(loc)) => Ok(PutOutcome::Present(loc)),
                Ok(None) => self
                    .put_object_spanning(key, Codec::Raw, payload)
                    .map(PutOutcome::Stored),
                Err(e) => Err(e),
            };
            count_call(Op::Put, t0, &r, |o| {
                let bytes = if o.stored() { payload.len() as u64 } else { 0 };
                (Outcome::Ok, bytes, 0)
            });
            return r;
        }
        let r = self.store_spread(
            key,
            blocks,
            |w| w.put_unless_present(key, payload),
            PutOutcome::stored,
        );
        count_call(Op::Put, t0, &r, |o| {
            let bytes = if o.stored() { payload.len() as u64 } else { 0 };
            (Outcome::Ok, bytes, 0)
        });
        r
    }

    fn put_unless_present(&self, key: Key, payload: &[u8]) -> Result<PutOutcome> {
        let object = payload.len() as u64 > self.pool.block_size();
        if object {
            self.check_object_len(payload.len() as u64)?;
        }
        // The look-up and the store under one hold of the owner lock: no other put of this
        // participant comes between them.
        let mut st = self.owner()?;
        if let Some(loc) = self.pool.locate(key)? {
            return Ok(PutOutcome::Present(loc));
        }
        let loc = if object {
            self.put_object_locked(&mut st, key, Codec::Raw, payload)?
        } else {
            let crc = format::crc32c(payload);
            self.store_block(&mut st, key, Codec::Raw, payload, crc)?
        };
        crate::crosspod::on_put(key);
        Ok(PutOutcome::Stored(loc))
    }

    /// For each key, whether it is present in any partition (index only, as
    /// [`Pool::contains`](crate::pool::Pool::contains)).
    pub fn contains_batch(&self, keys: &[Key]) -> Result<Vec<bool>> {
        keys.iter().map(|&k| self.pool.contains(k)).collect()
    }

    /// The length of what `key` holds (an object's whole length); `None` on a miss.
    pub fn length(&self, key: Key) -> Result<Option<u64>> {
        self.pool.length(key)
    }

    /// The largest payload [`put`](Self::put) accepts in this pool: objects up to what one
    /// manifest block can list and what the partitions it may hold hold (less one block for the
    /// manifest): every partition of the pool for a participant that claims further partitions,
    /// else its one.
    pub fn max_object_len(&self) -> u64 {
        let sb = self.pool.superblock();
        let held = if self.grows { sb.partitions } else { 1 };
        let blocks = u64::from(held) * u64::from(sb.blocks_per_partition);
        max_object_len(sb.block_size, blocks).max(sb.block_size)
    }

    /// Stores `payload` (larger than a block) as a multi-block object under `key`: parts of a
    /// block each under derived keys, then the manifest under `key`, published last. The parts
    /// stay out of the eviction order while the put runs, so they cannot evict one another.
    pub(super) fn put_object(&self, key: Key, codec: Codec, payload: &[u8]) -> Result<Location> {
        self.check_object_len(payload.len() as u64)?;
        let mut st = self.owner()?;
        self.put_object_locked(&mut st, key, codec, payload)
    }

    /// [`PoolError::PayloadTooLarge`] for an object this pool cannot hold, before anything is
    /// written.
    pub(super) fn check_object_len(&self, len: u64) -> Result<()> {
        let bs = self.pool.block_size();
        let max = self.max_object_len();
        if len > max || MANIFEST_HEAD + len.div_ceil(bs) * PART_ENTRY > bs {
            return Err(PoolError::PayloadTooLarge { len, capacity: max });
        }
        Ok(())
    }

    /// [`put_object`](Self::put_object) under the owner lock, with the length checked.
    fn put_object_locked(
        &self,
        st: &mut OwnerState,
        key: Key,
        codec: Codec,
        payload: &[u8],
    ) -> Result<Location> {
        let bs = self.pool.block_size();
        let n = (payload.len() as u64).div_ceil(bs);
        let p = st.partition;
        // Unique in the pool for all time: sequence numbers never repeat within a partition.
        let nonce = (u64::from(p) << 48) | st.next_seq;
        let mut parts = Vec::with_capacity(n as usize);
        let mut stored: Vec<(u32, u64)> = Vec::with_capacity(n as usize);
        let result = (|| {
            for (i, chunk) in payload.chunks(bs as usize).enumerate() {
                let pk = part_key(key, nonce, i as u32);
                let crc = format::crc32c(chunk);
                let loc = self.store_block(st, pk, Codec::ObjectPart, chunk, crc)?;
                // Out of the eviction order until the manifest owns it.
                st.policy.remove(loc.block);
                stored.push((loc.block, loc.seq));
                parts.push(ObjectPartEntry {
                    key_lo: pk.lo(),
                    key_hi: pk.hi(),
                    len: chunk.len() as u64,
                    crc,
                    reserved: 0,
                });
                crash_point("object:part");
            }
            let manifest = Manifest::encode(key, codec, bs, nonce, &parts);
            let crc = format::crc32c(&manifest);
            crash_point("object:manifest");
            self.store_block(st, key, Codec::ObjectManifest, &manifest, crc)
        })();
        match result {
            Ok(loc) => {
                st.objects.insert(loc.block, stored);
                Ok(loc)
            }
            Err(e) => {
                // Best effort: a fenced owner cannot delete; its successor finds orphans.
                for (b, seq) in stored {
                    let _ = self.drop_block(st, b, seq);
                }
                Err(e)
            }
        }
    }

    /// Drops the parts of the object whose manifest block was `manifest` (just unindexed or
    /// replaced); nothing if it was no object's manifest.
    pub(super) fn drop_object_parts(&self, st: &mut OwnerState, manifest: u32) -> Result<()> {
        let Some(parts) = st.objects.remove(&manifest) else {
            return Ok(());
        };
        let mut first_err = None;
        for (b, seq) in parts {
            if let Err(e) = self.drop_block(st, b, seq) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Unindexes block `b` if it still holds the entry of sequence number `seq`, and frees it
    /// (deferred while pinned).
    fn drop_block(&self, st: &mut OwnerState, b: u32, seq: u64) -> Result<()> {
        let Some(Some((slot, s))) = st.indexed.get(b as usize).copied() else {
            return Ok(());
        };
        if s != seq {
            return Ok(());
        }
        self.unindex(st, b, slot)?;
        fence(Ordering::SeqCst); // Dekker pair with `pin`, as in `allocate`.
        if self.pinned_now(st.partition, b, seq)? {
            st.deferred.push((b, seq));
        } else {
            st.free.push(b);
        }
        Ok(())
    }
}

/// Rebuilds the owner's map of objects (manifest block → parts) from the indexed blocks of
/// partition `p`, at takeover or attach: every part a valid manifest names, found indexed in the
/// partition, joins its manifest (and leaves the eviction order); parts no manifest names are
/// orphans, left to eviction like any block.
pub(super) fn rebuild_objects(
    pool: &crate::pool::Pool,
    p: u32,
    indexed: &[Option<(u32, u64)>],
) -> Result<HashMap<u32, Vec<(u32, u64)>>> {
    let mem = pool.mem();
    let mut by_key = HashMap::new();
    let mut manifests = Vec::new();
    for (b, e) in indexed.iter().enumerate() {
        let Some((_, seq)) = *e else { continue };
        let h: BlockHeader = read_obj(mem, pool.header_off(p, b as u32))?;
        let key = Key::from_parts(h.key_lo, h.key_hi);
        by_key.insert(key, (b as u32, seq, h.codec));
        if h.codec == Codec::ObjectManifest as u32 {
            manifests.push((b as u32, key, h));
        }
    }
    let mut objects = HashMap::new();
    for (b, key, h) in manifests {
        let mut bytes = vec![0u8; h.len as usize];
        // Acquired by the recovery's RecoveryRead of the partition and the payload check.
        mem.read(pool.payload_off(p, b), &mut bytes)?;
        let Some(m) = Manifest::decode(&bytes, key) else {
            continue;
        };
        let parts: Vec<(u32, u64)> = m
            .part_keys()
            .iter()
            .filter_map(|k| by_key.get(k))
            .filter(|(_, _, codec)| *codec == Codec::ObjectPart as u32)
            .map(|&(pb, seq, _)| (pb, seq))
            .collect();
        objects.insert(b, parts);
    }
    Ok(objects)
}
