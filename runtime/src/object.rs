//! Multi-block objects: a payload larger than one block, stored as parts (ordinary committed
//! blocks of codec [`Codec::ObjectPart`] under keys derived from the object's key and a per-put
//! nonce) and, last, a manifest (codec [`Codec::ObjectManifest`]) under the object's own key. The
//! manifest is published through the normal commit path after every part is committed, so a
//! reader finds either no object or a whole one; a crash before it leaves orphan parts under keys
//! nobody asks for, which eviction reclaims (docs/FORMAT.md, Objects).
//!
//! This module holds the manifest codec, the part-key derivation and the read of an object; the
//! owner's side (put, replacement, delete, eviction as a unit) is in `participant::object`.

use crate::coherence::{self, Site};
use crate::format::{
    self, as_bytes, from_bytes, BlockHeader, Codec, ObjectManifest, ObjectPartEntry, OBJECT_MAGIC,
    OBJECT_VERSION,
};
use crate::key::Key;
use crate::pool::{BlockInfo, Location, Pool, Probe, ReadBuf, Result};
use xxhash_rust::xxh3::xxh3_128;

/// Bytes of a manifest's head.
pub const MANIFEST_HEAD: u64 = std::mem::size_of::<ObjectManifest>() as u64;
/// How much of a payload a reader prefetches before it has checked the block's header, so that
/// the two memory latencies overlap (`Pool::read_validated`).
pub(crate) const PAYLOAD_HEAD: u64 = 4 << 10;

/// Copies `dst.len()` bytes of the pool from `off` into `dst` and returns the CRC of the copy (as
/// the read protocol requires), computed in the same pass over the bytes
/// ([`SharedMemory::read_checksummed`](cxlkv_shm::mem::SharedMemory::read_checksummed)).
pub(crate) fn copy_checksummed(pool: &Pool, off: u64, dst: &mut [u8]) -> Result<u32> {
    Ok(pool.mem().read_checksummed(off, dst, 0)?)
}

/// Bytes of one part entry.
pub const PART_ENTRY: u64 = std::mem::size_of::<ObjectPartEntry>() as u64;

/// The key of part `index` of the object `key` written with `nonce`.
pub fn part_key(key: Key, nonce: u64, index: u32) -> Key {
    let mut b = [0u8; 48];
    b[..20].copy_from_slice(b"cxlkv-object-part-v1");
    b[20..36].copy_from_slice(&key.0.to_le_bytes());
    b[36..44].copy_from_slice(&nonce.to_le_bytes());
    b[44..48].copy_from_slice(&index.to_le_bytes());
    Key(xxh3_128(&b))
}

/// The largest object a pool of `block_size`-byte blocks and `blocks` blocks per partition can
/// hold: its parts and manifest must fit in one partition, and its part table in one block.
pub fn max_object_len(block_size: u64, blocks: u64) -> u64 {
    let by_manifest = block_size.saturating_sub(MANIFEST_HEAD) / PART_ENTRY;
    let by_partition = blocks.saturating_sub(1);
    by_manifest.min(by_partition).saturating_mul(block_size)
}

/// A decoded, checked manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// Its head.
    pub head: ObjectManifest,
    /// Its parts, in order.
    pub parts: Vec<ObjectPartEntry>,
}

impl Manifest {
    /// The manifest bytes of an object of `key` with `codec`, `nonce` and these parts.
    pub fn encode(
        key: Key,
        codec: Codec,
        part_size: u64,
        nonce: u64,
        parts: &[ObjectPartEntry],
    ) -> Vec<u8> {
        let head = ObjectManifest {
            magic: OBJECT_MAGIC,
            version: OBJECT_VERSION,
            codec: codec as u32,
            total_len: parts.iter().map(|p| p.len).sum(),
            part_size,
            nonce,
            key_lo: key.lo(),
            key_hi: key.hi(),
            part_count: parts.len() as u32,
            crc: 0,
        };
        let mut out =
            Vec::with_capacity((MANIFEST_HEAD + PART_ENTRY * parts.len() as u64) as usize);
        out.extend_from_slice(as_bytes(&head));
        for p in parts {
            out.extend_from_slice(as_bytes(p));
        }
        let crc = manifest_crc(&out);
        out[ObjectManifest::CRC_OFF..ObjectManifest::CRC_OFF + 4]
            .copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks manifest bytes read under `key`: magic, version, CRC, key, and that the
    /// part table is consistent (lengths sum to the total, parts of `part_size` but the last,
    /// each part's key derived from the nonce). `None` for anything else.
    pub fn decode(bytes: &[u8], key: Key) -> Option<Manifest> {
        if (bytes.len() as u64) < MANIFEST_HEAD {
            return None;
        }
        let head: ObjectManifest = from_bytes(bytes);
        let n = u64::from(head.part_count);
        if head.magic != OBJECT_MAGIC
            || head.version != OBJECT_VERSION
            || bytes.len() as u64 != MANIFEST_HEAD + n * PART_ENTRY
            || head.crc != manifest_crc(bytes)
            || Key::from_parts(head.key_lo, head.key_hi) != key
            || Codec::from_code(head.codec).is_none()
            || n == 0
            || head.part_size == 0
        {
            return None;
        }
        let parts: Vec<ObjectPartEntry> = (0..n as usize)
            .map(|i| from_bytes(&bytes[MANIFEST_HEAD as usize + i * PART_ENTRY as usize..]))
            .collect();
        let mut total = 0u64;
        for (i, p) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let len_ok = if last {
                p.len > 0 && p.len <= head.part_size
            } else {
                p.len == head.part_size
            };
            if !len_ok || Key::from_parts(p.key_lo, p.key_hi) != part_key(key, head.nonce, i as u32)
            {
                return None;
            }
            total = total.checked_add(p.len)?;
        }
        (total == head.total_len).then_some(Manifest { head, parts })
    }

    /// The object's codec.
    pub fn codec(&self) -> Codec {
        Codec::from_code(self.head.codec).unwrap_or(Codec::Raw)
    }

    /// The parts' keys, in order.
    pub fn part_keys(&self) -> Vec<Key> {
        self.parts
            .iter()
            .map(|p| Key::from_parts(p.key_lo, p.key_hi))
            .collect()
    }
}

/// CRC of manifest bytes: the head up to its `crc` field, then the part table.
fn manifest_crc(bytes: &[u8]) -> u32 {
    let mut c = format::Crc32c::default();
    c.update(&bytes[..ObjectManifest::CRC_OFF]);
    c.update(&bytes[MANIFEST_HEAD as usize..]);
    c.finish()
}

/// What one attempt at reading an object found.
pub(crate) enum ObjectRead {
    /// The whole object is in the destination.
    Done(BlockInfo),
    /// Something changed under the reader (the manifest was replaced, a part moved): try again.
    Retry,
    /// The object is absent: a part is missing (evicted, deleted) while its manifest stands.
    Miss,
}

impl Pool {
    /// One attempt at reading the object whose manifest block `loc` (header `h`, already checked)
    /// holds: the manifest, then each part straight into `dst`, each checked against the
    /// manifest's length and CRC and its own slot's version; finally the manifest's slot must be
    /// unchanged, so parts of two puts never mix.
    pub(crate) fn read_object(
        &self,
        key: Key,
        loc: &Location,
        h: &BlockHeader,
        dst: &mut dyn ReadBuf,
    ) -> Result<ObjectRead> {
        let Some(m) = self.read_manifest(loc, h)? else {
            return Ok(ObjectRead::Retry);
        };
        let Some(m) = Manifest::decode(&m, key) else {
            // A committed block whose CRC matched but whose manifest does not decode: nothing a
            // reader can return (`pool check` reports it).
            return Ok(
                if self.slot_version(loc.partition, loc.slot)? == loc.version {
                    ObjectRead::Miss
                } else {
                    ObjectRead::Retry
                },
            );
        };
        let buf = match dst.sized(m.head.total_len as usize) {
            Ok(b) => b,
            Err(e) => {
                if self.slot_version(loc.partition, loc.slot)? != loc.version {
                    return Ok(ObjectRead::Retry);
                }
                return Err(e);
            }
        };
        let manifest_gone = |pool: &Pool| -> Result<ObjectRead> {
            Ok(
                if pool.slot_version(loc.partition, loc.slot)? == loc.version {
                    ObjectRead::Miss
                } else {
                    ObjectRead::Retry
                },
            )
        };
        let mut off = 0usize;
        for p in &m.parts {
            let pk = Key::from_parts(p.key_lo, p.key_hi);
            // Parts lie in the manifest's partition, or (a participant holding several
            // partitions) in another: the part key is unique to this put, so wherever it is found
            // it is this object's part.
            let ploc = match self.probe(loc.partition, pk)? {
                Probe::Found(l) => l,
                Probe::Absent => match self.locate(pk)? {
                    Some(l) => l,
                    None => return manifest_gone(self),
                },
                Probe::Busy => return Ok(ObjectRead::Retry),
            };
            let Some(ph) = self.checked_header(pk, &ploc)? else {
                return Ok(ObjectRead::Retry);
            };
            if ph.codec != Codec::ObjectPart as u32 || ph.len != p.len || ph.payload_crc != p.crc {
                return manifest_gone(self);
            }
            let dst = &mut buf[off..off + p.len as usize];
            let poff = self.payload_off(ploc.partition, ploc.block);
            // Pairs with the publish of the part's payload in its commit.
            coherence::acquire(self.mem(), Site::PayloadRead, poff, p.len);
            // Checksummed in the same pass as the copy.
            if copy_checksummed(self, poff, dst)? != p.crc
                || self.slot_version(ploc.partition, ploc.slot)? != ploc.version
            {
                return Ok(ObjectRead::Retry);
            }
            off += p.len as usize;
        }
        if self.slot_version(loc.partition, loc.slot)? != loc.version {
            return Ok(ObjectRead::Retry);
        }
        Ok(ObjectRead::Done(BlockInfo {
            len: m.head.total_len,
            codec: m.codec(),
            location: *loc,
        }))
    }

    /// The manifest payload of block `loc` (header `h`), checked against its block CRC and the
    /// slot version; `None` if it changed while read.
    fn read_manifest(&self, loc: &Location, h: &BlockHeader) -> Result<Option<Vec<u8>>> {
        let mut m = vec![0u8; h.len as usize];
        let off = self.payload_off(loc.partition, loc.block);
        // Pairs with the publish of the manifest's payload in its commit.
        coherence::acquire(self.mem(), Site::PayloadRead, off, h.len);
        self.mem().read(off, &mut m)?;
        if format::crc32c(&m) != h.payload_crc
            || self.slot_version(loc.partition, loc.slot)? != loc.version
        {
            return Ok(None);
        }
        Ok(Some(m))
    }

    /// The manifest of the multi-block object under `key`, `None` if `key` is absent or holds a
    /// single block. For tools and tests (which part keys an object has, how it is laid out).
    pub fn object_manifest(&self, key: Key) -> Result<Option<Manifest>> {
        for _ in 0..crate::pool::READ_RETRIES {
            let Some(loc) = self.locate(key)? else {
                return Ok(None);
            };
            let Some(h) = self.checked_header(key, &loc)? else {
                continue;
            };
            if h.codec != Codec::ObjectManifest as u32 {
                return Ok(None);
            }
            if let Some(m) = self.read_manifest(&loc, &h)? {
                return Ok(Manifest::decode(&m, key));
            }
        }
        Ok(None)
    }

    /// The length of what `key` holds: the object's length for a multi-block object, else the
    /// block's; `None` on a miss. Sizes a buffer for `get_into` (the length may change before the
    /// read if the key is put again meanwhile: `get_into` then reports `BufferTooSmall`).
    pub fn length(&self, key: Key) -> Result<Option<u64>> {
        for _ in 0..crate::pool::READ_RETRIES {
            let Some(loc) = self.locate(key)? else {
                return Ok(None);
            };
            let Some(h) = self.checked_header(key, &loc)? else {
                continue;
            };
            if h.codec != Codec::ObjectManifest as u32 {
                return Ok(Some(h.len));
            }
            match self.read_manifest(&loc, &h)? {
                Some(m) => return Ok(Manifest::decode(&m, key).map(|m| m.head.total_len)),
                None => continue,
            }
        }
        Ok(None)
    }
}
