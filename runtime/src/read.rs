//! The optimistic read loop shared by every copying reader ([`Pool::get`], [`Pool::get_into`],
//! the participant's counted reads): find the key, check its header, copy and checksum the
//! payload, re-check the index slot's version; a multi-block object's manifest hands over to
//! [`crate::object`], which reads the parts the same way.

use crate::coherence::{self, Site};
use crate::format::{Codec, CoherenceMode, INDEX_SLOT_SIZE};
use crate::key::Key;
use crate::object::ObjectRead;
use crate::pool::{BlockInfo, Pool, ReadBuf, Result, READ_RETRIES};

impl Pool {
    /// True when the pool's parties share hardware coherence: a prefetch ahead of an `acquire`
    /// then brings current bytes (on software-coherent memory the acquire would drop them).
    pub(crate) fn prefetch_early(&self) -> bool {
        self.superblock().coherence == CoherenceMode::Hardware as u32
    }

    /// With several partitions, starts the key's home slot in every partition on its way at
    /// once, so that `locate`'s probes wait about one memory latency instead of one per partition.
    pub(crate) fn prefetch_home_slots(&self, key: Key) {
        let partitions = self.superblock().partitions;
        if partitions > 1 && self.prefetch_early() {
            let home = self.home_slot(key);
            for p in 0..partitions {
                self.mem()
                    .prefetch(self.index_slot_off(p, home), INDEX_SLOT_SIZE);
            }
        }
    }

    /// The optimistic read loop: returns the block's info with its payload in `dst`, or `None` on
    /// a miss, also after [`READ_RETRIES`] failed validations, each counted in `retries`.
    pub(crate) fn read_validated(
        &self,
        key: Key,
        dst: &mut dyn ReadBuf,
        retries: &mut u64,
    ) -> Result<Option<BlockInfo>> {
        for _ in 0..READ_RETRIES {
            let Some(loc) = self.locate(key)? else {
                return Ok(None);
            };
            if self.prefetch_early() {
                // The header's line, then the payload's head, are fetched together before the
                // header is read and checked, so their memory latencies overlap instead of adding
                // up (the header first: it is needed first).
                self.mem().prefetch(
                    self.header_off(loc.partition, loc.block),
                    crate::format::BLOCK_HEADER_SIZE,
                );
                self.mem().prefetch(
                    self.payload_off(loc.partition, loc.block),
                    crate::object::PAYLOAD_HEAD.min(self.block_size()),
                );
            }
            let Some(h) = self.checked_header(key, &loc)? else {
                *retries += 1;
                continue;
            };
            if h.codec == Codec::ObjectManifest as u32 {
                match self.read_object(key, &loc, &h, dst)? {
                    ObjectRead::Done(info) => return Ok(Some(info)),
                    ObjectRead::Miss => return Ok(None),
                    ObjectRead::Retry => {
                        *retries += 1;
                        continue;
                    }
                }
            }
            let buf = match dst.sized(h.len as usize) {
                Ok(b) => b,
                Err(e) => {
                    // Report a size only if the header we sized from was current.
                    if self.slot_version(loc.partition, loc.slot)? != loc.version {
                        *retries += 1;
                        continue;
                    }
                    return Err(e);
                }
            };
            let off = self.payload_off(loc.partition, loc.block);
            // Pairs with the publish of the payload in the owner's commit.
            coherence::acquire(self.mem(), Site::PayloadRead, off, h.len);
            if crate::object::copy_checksummed(self, off, buf)? != h.payload_crc
                || self.slot_version(loc.partition, loc.slot)? != loc.version
            {
                *retries += 1;
                continue;
            }
            let codec = Codec::from_code(h.codec).expect("checked in header");
            return Ok(Some(BlockInfo {
                len: h.len,
                codec,
                location: loc,
            }));
        }
        Ok(None)
    }
}
