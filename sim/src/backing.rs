//! The shared backing memory of a simulation: what a CXL device holds. [`SimBacking`] is itself a
//! coherent [`SharedMemory`] (direct access, no cache), used to format a region before hosts look
//! at it and by checkers that look at memory after a run; hosts see it through their own
//! write-back caches ([`crate::host::SimHost`]).

use crate::sync::lock;
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_runtime::coherence::LINE;
use cxlkv_runtime::mem::{self, check_range, SharedMemory};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The shared backing memory of a simulation.
pub struct SimBacking {
    bytes: Mutex<Vec<u8>>,
}

impl SimBacking {
    /// `size` bytes (rounded up to whole lines) of pseudo-random garbage from `seed`, as memory
    /// holds before anyone formats it.
    pub fn new(size: u64, seed: u64) -> Arc<SimBacking> {
        let n = size.div_ceil(LINE) * LINE;
        let mut r = SplitMix64::new(seed ^ 0xbac1);
        let bytes = (0..n / 8)
            .flat_map(|_| r.next_u64().to_le_bytes())
            .collect();
        Arc::new(SimBacking {
            bytes: Mutex::new(bytes),
        })
    }

    /// Line `line` as memory holds it.
    pub(crate) fn load_line(&self, line: u64) -> [u8; 64] {
        let b = lock(&self.bytes);
        let at = (line * LINE) as usize;
        b[at..at + 64].try_into().expect("64 bytes")
    }

    /// Writes line `line` back to memory.
    pub(crate) fn store_line(&self, line: u64, data: &[u8; 64]) {
        let mut b = lock(&self.bytes);
        let at = (line * LINE) as usize;
        b[at..at + 64].copy_from_slice(data);
    }
}

impl SharedMemory for SimBacking {
    fn size(&self) -> u64 {
        lock(&self.bytes).len() as u64
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> mem::Result<()> {
        let b = lock(&self.bytes);
        let at = check_range(offset, dst.len() as u64, b.len() as u64)?;
        dst.copy_from_slice(&b[at..at + dst.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, src: &[u8]) -> mem::Result<()> {
        let mut b = lock(&self.bytes);
        let at = check_range(offset, src.len() as u64, b.len() as u64)?;
        b[at..at + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn fill(&self, offset: u64, len: u64, byte: u8) -> mem::Result<()> {
        let mut b = lock(&self.bytes);
        let at = check_range(offset, len, b.len() as u64)?;
        b[at..at + len as usize].fill(byte);
        Ok(())
    }
    fn load_u64(&self, offset: u64, _order: Ordering) -> mem::Result<u64> {
        let mut v = [0u8; 8];
        aligned(offset)?;
        self.read(offset, &mut v)?;
        Ok(u64::from_le_bytes(v))
    }
    fn store_u64(&self, offset: u64, value: u64, _order: Ordering) -> mem::Result<()> {
        aligned(offset)?;
        self.write(offset, &value.to_le_bytes())
    }
    fn compare_exchange_u64(
        &self,
        offset: u64,
        current: u64,
        new: u64,
    ) -> mem::Result<Result<u64, u64>> {
        let v = self.load_u64(offset, Ordering::SeqCst)?;
        if v == current {
            self.store_u64(offset, new, Ordering::SeqCst)?;
            Ok(Ok(v))
        } else {
            Ok(Err(v))
        }
    }
    fn publish(&self, _offset: u64, _len: u64) {}
    fn acquire(&self, _offset: u64, _len: u64) {}
    fn raw_range(&self, offset: u64, len: u64) -> mem::Result<Option<*mut u8>> {
        check_range(offset, len, self.size())?;
        Ok(None)
    }
}

/// Refuses an offset that is not 8-byte aligned (as an atomic access would).
pub(crate) fn aligned(offset: u64) -> mem::Result<()> {
    if !offset.is_multiple_of(8) {
        return Err(mem::MemError::Misaligned { offset, align: 8 });
    }
    Ok(())
}
