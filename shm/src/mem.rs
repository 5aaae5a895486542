//! Access to memory that other processes, hosts or a device may write.
//!
//! [`SharedMemory`] is the only way the pool touches shared bytes. Every access names an offset and
//! a length that are checked against the memory's size before any pointer arithmetic; nothing hands
//! out a Rust reference into shared memory. Words that another party reads concurrently are accessed
//! as atomics with explicit orderings (alignment checked); bulk data moves by copies into or out of
//! private buffers and is validated by the protocol (seqlock versions and CRCs), never trusted.
//!
//! Structures move in and out as whole [`Plain`] values: [`read_obj`] and [`write_obj`] copy one
//! by offset, [`as_bytes`] and [`from_bytes`] encode and decode one in a private buffer.
//!
//! Coherence is part of the interface: [`SharedMemory::publish`] after writing a range that others
//! read, [`SharedMemory::acquire`] before reading a range others wrote. On hardware-coherent memory
//! both are ordering fences only; docs/COHERENCE.md describes the protocol.

use std::sync::atomic::Ordering;
use thiserror::Error;

/// Errors of shared-memory access.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MemError {
    /// The range `[offset, offset + len)` does not lie inside memory of `size` bytes.
    #[error("access of {len} bytes at offset {offset} is outside memory of {size} bytes")]
    OutOfBounds {
        /// Start of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Size of the memory.
        size: u64,
    },
    /// An atomic access at an offset that is not a multiple of its width.
    #[error("atomic access at offset {offset} is not {align}-byte aligned")]
    Misaligned {
        /// Offset of the access.
        offset: u64,
        /// Required alignment.
        align: u64,
    },
    /// A write to memory mapped for reading only (`Region::open_read_only`).
    #[error("write of {len} bytes at offset {offset} to memory opened read-only")]
    ReadOnly {
        /// Start of the write.
        offset: u64,
        /// Length of the write.
        len: u64,
    },
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, MemError>;

/// Checks that `[offset, offset + len)` lies within `size` bytes; returns the start as `usize`.
#[inline]
pub fn check_range(offset: u64, len: u64, size: u64) -> Result<usize> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(offset as usize),
        _ => Err(MemError::OutOfBounds { offset, len, size }),
    }
}

#[inline]
fn check_atomic(offset: u64, width: u64, size: u64) -> Result<usize> {
    if !offset.is_multiple_of(width) {
        return Err(MemError::Misaligned {
            offset,
            align: width,
        });
    }
    check_range(offset, width, size)
}

/// Bounds-checked access to shared memory. Implemented by [`crate::region::Region`] (real memory)
/// and by test views (the non-coherence simulator, bounds-tracking views).
///
/// Offsets are `u64` because they come from on-memory structures another party wrote; an
/// implementation must reject every out-of-range or misaligned access with an error and must not
/// touch memory outside itself.
pub trait SharedMemory: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Copies `dst.len()` bytes at `offset` into `dst`.
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()>;
    /// Copies `src` to `offset`.
    fn write(&self, offset: u64, src: &[u8]) -> Result<()>;
    /// Sets `len` bytes at `offset` to `byte`.
    fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<()>;
    /// Atomic 64-bit load (offset 8-byte aligned).
    fn load_u64(&self, offset: u64, order: Ordering) -> Result<u64>;
    /// Atomic 64-bit store (offset 8-byte aligned).
    fn store_u64(&self, offset: u64, value: u64, order: Ordering) -> Result<()>;
    /// Atomic 64-bit compare-and-swap; `Ok(Ok(previous))` on success, `Ok(Err(actual))` on
    /// failure. Only meaningful among parties that share hardware coherence (one host).
    fn compare_exchange_u64(
        &self,
        offset: u64,
        current: u64,
        new: u64,
    ) -> Result<std::result::Result<u64, u64>>;
    /// Makes this party's writes to the range visible to others (write-back on non-coherent
    /// memory) and orders them before later stores.
    fn publish(&self, offset: u64, len: u64);
    /// Makes others' published writes to the range visible to this party's following reads
    /// (invalidate on non-coherent memory).
    fn acquire(&self, offset: u64, len: u64);
    /// Copies `src` to `offset` and publishes it: [`write`](Self::write), then
    /// [`publish`](Self::publish) of the range (this default). Memory that can do both in one pass
    /// overrides it: a software-coherent [`crate::region::Region`] streams the bytes to memory with
    /// non-temporal stores instead of writing them into the cache and writing every line back.
    fn write_published(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.write(offset, src)?;
        self.publish(offset, src.len() as u64);
        Ok(())
    }
    /// Copies like [`read`](Self::read) and returns the CRC-32C of the bytes copied (of the copy,
    /// which a concurrent writer may have torn, not of the memory now), continuing `crc`, the
    /// CRC-32C of bytes before them (0 for none). Memory with an address reads each byte once
    /// ([`crate::checksum`]); this default copies, then checksums the copy.
    fn read_checksummed(&self, offset: u64, dst: &mut [u8], crc: u32) -> Result<u32> {
        self.read(offset, dst)?;
        let mut d = crc_fast::Digest::new_with_init_state(
            crc_fast::CrcAlgorithm::Crc32Iscsi,
            u64::from(!crc),
        );
        d.update(dst);
        Ok(d.finalize() as u32)
    }
    /// The CRC-32C of `[offset, offset + len)`, continuing `crc` (as
    /// [`read_checksummed`](Self::read_checksummed)), for bytes no other party writes meanwhile:
    /// a reservation being committed, a block validated under a pin. Memory with an address reads
    /// them in place ([`crate::checksum`]); this default copies 16 KiB pieces and checksums them.
    fn checksum(&self, offset: u64, len: u64, crc: u32) -> Result<u32> {
        let mut buf = [0u8; 16 << 10];
        let (mut crc, mut done) = (crc, 0);
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            crc = self.read_checksummed(offset + done, &mut buf[..n], crc)?;
            done += n as u64;
        }
        Ok(crc)
    }
    /// Hints that `[offset, offset + len)` is about to be read: starts bringing it toward this
    /// CPU's caches, so that a read of it later waits less. Only a hint: it never fails, never
    /// changes the memory, and does nothing for ranges out of bounds or memory that cannot
    /// prefetch (this default). On software-coherent memory, prefetch a range only after its
    /// [`acquire`](Self::acquire): lines fetched before the invalidation are dropped by it.
    fn prefetch(&self, _offset: u64, _len: u64) {}
    /// Raw address of `[offset, offset + len)` for zero-copy users (pins, reserve/commit, the C
    /// ABI, DMA registration), or `None` for memory that has no stable address (simulators).
    fn raw_range(&self, offset: u64, len: u64) -> Result<Option<*mut u8>>;
    /// Sets how `publish` and `acquire` keep parties coherent (the pool's recorded mode; see
    /// [`crate::cacheline`]). Memory that models coherence itself (simulators) ignores it.
    fn set_coherence(&self, _mode: crate::cacheline::CoherenceMode) {}
}

/// Plain data that can be copied to and from shared memory byte for byte: the on-memory
/// structures of the pool format and the device ABI.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain no padding, no pointers or references, and be valid
/// for every bit pattern.
pub unsafe trait Plain: Copy + Default + 'static {}

/// The bytes of a plain value.
pub fn as_bytes<T: Plain>(v: &T) -> &[u8] {
    // SAFETY: T: Plain has no padding, so all size_of::<T>() bytes are initialized.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// A plain value from the first `size_of::<T>()` bytes of `bytes` (which must be that long).
pub fn from_bytes<T: Plain>(bytes: &[u8]) -> T {
    assert!(
        bytes.len() >= std::mem::size_of::<T>(),
        "short buffer for plain value"
    );
    // SAFETY: length checked above; T: Plain is valid for every bit pattern; read_unaligned copes
    // with any alignment of the byte buffer.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

/// Copies a plain value out of shared memory at `offset` (bounds checked by `mem`).
pub fn read_obj<T: Plain>(mem: &dyn SharedMemory, offset: u64) -> Result<T> {
    let mut v = T::default();
    // SAFETY: T: Plain is valid for every bit pattern, so overwriting its bytes keeps it valid; the
    // slice covers exactly the value and is dropped before `v` is used again.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut((&mut v as *mut T).cast::<u8>(), std::mem::size_of::<T>())
    };
    mem.read(offset, bytes)?;
    Ok(v)
}

/// Copies a plain value into shared memory at `offset` (bounds checked by `mem`).
pub fn write_obj<T: Plain>(mem: &dyn SharedMemory, offset: u64, v: &T) -> Result<()> {
    mem.write(offset, as_bytes(v))
}

/// Shared memory at a fixed address: the raw-pointer operations behind [`SharedMemory`] for
/// mapped regions. Every method checks bounds first; the `unsafe` is confined to this type.
#[derive(Debug)]
pub(crate) struct RawMemory {
    base: *mut u8,
    size: u64,
}

// SAFETY: RawMemory is a pointer and a length; all accesses go through bounds-checked methods that
// use atomics or copies, so sharing it between threads is as safe as sharing the mapping itself.
unsafe impl Send for RawMemory {}
// SAFETY: see Send above; no method hands out references into the memory.
unsafe impl Sync for RawMemory {}

impl RawMemory {
    /// # Safety
    /// `base` must be valid for reads and writes of `size` bytes for the life of this value and
    /// page-aligned (so that every 8-byte-aligned offset is 8-byte aligned in address space).
    pub(crate) unsafe fn new(base: *mut u8, size: u64) -> Self {
        RawMemory { base, size }
    }

    #[inline]
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    #[inline]
    pub(crate) fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let at = check_range(offset, dst.len() as u64, self.size)?;
        // SAFETY: [at, at + len) is inside the mapping (checked above); dst is private memory, so
        // the ranges cannot overlap. Concurrent writers may tear the copy; callers validate it.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(at), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// [`SharedMemory::read_checksummed`] for a mapping: one pass over the bytes.
    #[inline]
    pub(crate) fn read_checksummed(&self, offset: u64, dst: &mut [u8], crc: u32) -> Result<u32> {
        let at = check_range(offset, dst.len() as u64, self.size)?;
        // SAFETY: [at, at + len) is inside the mapping (checked above); dst is private memory, so
        // the ranges cannot overlap. Concurrent writers may tear the copy; the CRC is of the copy.
        Ok(unsafe { crate::checksum::copy_crc32c(self.base.add(at), dst, crc) })
    }

    pub(crate) fn checksum(&self, offset: u64, len: u64, crc: u32) -> Result<u32> {
        let at = check_range(offset, len, self.size)?;
        // SAFETY: [at, at + len) is inside the mapping (checked above); the bytes are read
        // through a raw pointer, never a reference.
        Ok(unsafe { crate::checksum::crc32c_at(self.base.add(at), len as usize, crc) })
    }

    #[inline]
    pub(crate) fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let at = check_range(offset, src.len() as u64, self.size)?;
        // SAFETY: destination range checked above; src is private memory (no overlap).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.add(at), src.len()) };
        Ok(())
    }

    /// [`write`](Self::write) that leaves the bytes in memory, not in this CPU's caches
    /// ([`crate::cacheline::write_streaming`]).
    pub(crate) fn write_streaming(
        &self,
        offset: u64,
        src: &[u8],
        kind: crate::cacheline::FlushKind,
    ) -> Result<()> {
        let at = check_range(offset, src.len() as u64, self.size)?;
        // SAFETY: destination range checked above; src is private memory (no overlap), and no
        // reference into the mapping exists.
        unsafe { crate::cacheline::write_streaming(self.base.add(at), src, kind) };
        Ok(())
    }

    pub(crate) fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<()> {
        let at = check_range(offset, len, self.size)?;
        // SAFETY: range checked above.
        unsafe { std::ptr::write_bytes(self.base.add(at), byte, len as usize) };
        Ok(())
    }

    #[inline]
    fn atomic(&self, offset: u64) -> Result<&std::sync::atomic::AtomicU64> {
        let at = check_atomic(offset, 8, self.size)?;
        // SAFETY: in bounds and 8-byte aligned (base is page-aligned, offset checked); AtomicU64
        // has the layout of u64, and every access to this word by any party is atomic, so the
        // reference is to an atomic cell, never to plain data another party writes.
        Ok(unsafe { &*(self.base.add(at) as *const std::sync::atomic::AtomicU64) })
    }

    #[inline]
    pub(crate) fn load_u64(&self, offset: u64, order: Ordering) -> Result<u64> {
        Ok(self.atomic(offset)?.load(order))
    }

    #[inline]
    pub(crate) fn store_u64(&self, offset: u64, value: u64, order: Ordering) -> Result<()> {
        self.atomic(offset)?.store(value, order);
        Ok(())
    }

    #[inline]
    pub(crate) fn compare_exchange_u64(
        &self,
        offset: u64,
        current: u64,
        new: u64,
    ) -> Result<std::result::Result<u64, u64>> {
        Ok(self
            .atomic(offset)?
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire))
    }

    /// Prefetches every cache line of `[offset, offset + len)` into this CPU's L2 (x86_64; a
    /// no-op elsewhere and for ranges out of bounds). A hint: it cannot fault or change memory.
    #[inline]
    pub(crate) fn prefetch(&self, offset: u64, len: u64) {
        if let Ok(at) = check_range(offset, len, self.size) {
            // SAFETY: [at, at + len) is inside the mapping (checked above).
            unsafe { crate::checksum::prefetch(self.base.add(at), len as usize) };
        }
    }

    pub(crate) fn raw_range(&self, offset: u64, len: u64) -> Result<*mut u8> {
        let at = check_range(offset, len, self.size)?;
        // SAFETY: in bounds (checked above); only an address is computed, nothing is dereferenced.
        Ok(unsafe { self.base.add(at) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_checks_catch_overflow() {
        assert_eq!(check_range(0, 8, 8), Ok(0));
        assert!(check_range(1, 8, 8).is_err());
        assert!(check_range(u64::MAX, 2, 8).is_err());
        assert!(check_atomic(4, 8, 64).is_err());
    }

    /// Every raw-pointer path of `RawMemory` on a private page, so that Miri (scripts/miri.sh)
    /// checks the `unsafe` blocks above: bounds, alignment and the atomic casts.
    #[test]
    fn raw_memory_stays_inside_its_bytes() {
        let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!base.is_null());
        // SAFETY: `base` is a live, page-aligned allocation of 4096 bytes, freed only below, after
        // the last use of `m`.
        let m = unsafe { RawMemory::new(base, 4096) };
        check_raw_memory(&m, base);
        // SAFETY: allocated above with this layout; `m` is not used again.
        unsafe { std::alloc::dealloc(base, layout) };
    }

    fn check_raw_memory(m: &RawMemory, base: *mut u8) {
        m.write(4090, b"cxlkv!").unwrap();
        let mut six = [0u8; 6];
        m.read(4090, &mut six).unwrap();
        assert_eq!(&six, b"cxlkv!");
        assert_eq!(
            m.write(4091, b"cxlkv!"),
            Err(MemError::OutOfBounds {
                offset: 4091,
                len: 6,
                size: 4096
            })
        );
        m.fill(8, 16, 0xab).unwrap();
        assert_eq!(m.load_u64(16, Ordering::Acquire), Ok(0xabab_abab_abab_abab));
        m.store_u64(4088, 41, Ordering::Release).unwrap();
        assert_eq!(m.compare_exchange_u64(4088, 41, 42), Ok(Ok(41)));
        assert_eq!(m.compare_exchange_u64(4088, 41, 43), Ok(Err(42)));
        assert!(matches!(
            m.load_u64(4092, Ordering::Relaxed),
            Err(MemError::Misaligned { .. })
        ));
        assert!(m.load_u64(4096, Ordering::Relaxed).is_err());
        let mut all = vec![0u8; 4096];
        let crc = m.read_checksummed(0, &mut all, 0).unwrap();
        assert_eq!(crc, crate::checksum::crc32c(&all));
        assert!(m.read_checksummed(1, &mut all, 0).is_err());
        // Prefetch is a hint: in bounds, out of bounds or empty, it leaves the bytes as they were.
        m.prefetch(4000, 96);
        m.prefetch(4090, 100);
        m.prefetch(u64::MAX, 2);
        m.prefetch(4096, 0);
        let mut again = vec![0u8; 4096];
        m.read(0, &mut again).unwrap();
        assert!(again == all);
        assert_eq!(m.raw_range(4096, 0), Ok(base.wrapping_add(4096)));
        assert!(m.raw_range(4000, 97).is_err());
    }
}
