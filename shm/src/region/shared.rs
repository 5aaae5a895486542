//! How a [`Region`] implements [`SharedMemory`]: copies and atomics go to its mapping, and
//! `publish`/`acquire` implement its coherence: fences on hardware-coherent memory, cache-line
//! write-back and invalidation (or non-temporal stores) on software-coherent memory.

use super::map::Region;
use crate::cacheline::{self as coherence, Coherence, CoherenceMode, FlushKind};
use crate::mem::{self, SharedMemory};
use std::sync::atomic::{fence, Ordering};

impl Region {
    /// The write-back instruction of software-coherent mode, `None` in hardware-coherent mode.
    fn flush_kind(&self) -> Option<FlushKind> {
        match self.coherence.load(Ordering::Relaxed) {
            0 => None,
            1 => Some(FlushKind::Clwb),
            2 => Some(FlushKind::ClflushOpt),
            3 => Some(FlushKind::Clflush),
            _ => Some(FlushKind::Fence),
        }
    }

    /// Refuses a write to a read-only region before it reaches the mapping (where it would fault).
    fn writable(&self, offset: u64, len: u64) -> mem::Result<()> {
        if self.read_only {
            return Err(mem::MemError::ReadOnly { offset, len });
        }
        Ok(())
    }

    /// The coherence this region's publish and acquire implement.
    pub fn coherence(&self) -> Coherence {
        self.flush_kind()
            .map_or(Coherence::Hardware, Coherence::Software)
    }
}

impl SharedMemory for Region {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> mem::Result<()> {
        self.mem.read(offset, dst)
    }
    fn write(&self, offset: u64, src: &[u8]) -> mem::Result<()> {
        self.writable(offset, src.len() as u64)?;
        self.mem.write(offset, src)
    }
    fn fill(&self, offset: u64, len: u64, byte: u8) -> mem::Result<()> {
        self.writable(offset, len)?;
        self.mem.fill(offset, len, byte)
    }
    fn load_u64(&self, offset: u64, order: Ordering) -> mem::Result<u64> {
        self.mem.load_u64(offset, order)
    }
    fn store_u64(&self, offset: u64, value: u64, order: Ordering) -> mem::Result<()> {
        self.writable(offset, 8)?;
        self.mem.store_u64(offset, value, order)
    }
    fn compare_exchange_u64(
        &self,
        offset: u64,
        current: u64,
        new: u64,
    ) -> mem::Result<std::result::Result<u64, u64>> {
        self.writable(offset, 8)?;
        self.mem.compare_exchange_u64(offset, current, new)
    }
    fn publish(&self, offset: u64, len: u64) {
        match self.flush_kind() {
            // Hardware-coherent memory: ordering only. Pairs with the fence in `acquire` of the
            // reader.
            None => fence(Ordering::Release),
            Some(kind) => {
                if let Ok(p) = self.mem.raw_range(offset, len) {
                    // SAFETY: the range is inside this region's mapping (checked by raw_range);
                    // write-back does not change its contents. Pairs with the reader's
                    // invalidate in `acquire`.
                    unsafe { coherence::write_back(p, len as usize, kind) };
                }
            }
        }
    }
    fn acquire(&self, offset: u64, len: u64) {
        match self.flush_kind() {
            // Pairs with the Release fence in the writer's `publish`.
            None => fence(Ordering::Acquire),
            Some(kind) => {
                if let Ok(p) = self.mem.raw_range(offset, len) {
                    // SAFETY: as in `publish`; invalidation writes dirty lines back before
                    // dropping them, so no data is lost. Pairs with the writer's write-back.
                    unsafe { coherence::invalidate(p, len as usize, kind) };
                }
            }
        }
    }
    fn write_published(&self, offset: u64, src: &[u8]) -> mem::Result<()> {
        self.writable(offset, src.len() as u64)?;
        match self.flush_kind() {
            None => {
                self.mem.write(offset, src)?;
                // Pairs with the fence in `acquire` of the reader, as `publish`.
                fence(Ordering::Release);
                Ok(())
            }
            // Non-temporal stores and SFENCE: the bytes are in memory, ordered before later
            // stores, with no write-back pass. Pairs with the reader's invalidate in `acquire`.
            Some(kind) => self.mem.write_streaming(offset, src, kind),
        }
    }
    fn set_coherence(&self, mode: CoherenceMode) {
        let code = match Coherence::for_mode(mode) {
            Coherence::Hardware => 0,
            Coherence::Software(FlushKind::Clwb) => 1,
            Coherence::Software(FlushKind::ClflushOpt) => 2,
            Coherence::Software(FlushKind::Clflush) => 3,
            Coherence::Software(FlushKind::Fence) => 4,
        };
        self.coherence.store(code, Ordering::Relaxed);
    }
    fn read_checksummed(&self, offset: u64, dst: &mut [u8], crc: u32) -> mem::Result<u32> {
        self.mem.read_checksummed(offset, dst, crc)
    }
    fn checksum(&self, offset: u64, len: u64, crc: u32) -> mem::Result<u32> {
        self.mem.checksum(offset, len, crc)
    }
    fn prefetch(&self, offset: u64, len: u64) {
        self.mem.prefetch(offset, len);
    }
    fn raw_range(&self, offset: u64, len: u64) -> mem::Result<Option<*mut u8>> {
        self.mem.raw_range(offset, len).map(Some)
    }
}
