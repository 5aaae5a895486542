//! Making memory cold: evicting a buffer from every cache level so that a benchmark reads it from
//! DRAM (or CXL), not from a last-level cache that may be larger than the buffer.

/// Cache line size assumed for flushing (every x86-64 CPU in service uses 64 bytes).
pub const CACHE_LINE: usize = 64;

/// Writes back and evicts every cache line of `bytes` from all cache levels (x86-64 `clflush`),
/// then fences so that later loads miss. Returns false where no flush instruction is available
/// (non-x86 targets): callers should then use buffers larger than the last-level cache.
pub fn evict(bytes: &[u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_clflush, _mm_mfence};
        let base = bytes.as_ptr();
        let mut off = 0;
        while off < bytes.len() {
            // SAFETY: `base + off` is inside `bytes` (off < len); clflush only needs a valid
            // address and SSE2, which every x86-64 CPU has. It does not change memory contents.
            unsafe { _mm_clflush(base.add(off)) };
            off += CACHE_LINE;
        }
        // SAFETY: mfence has no memory-safety preconditions; SSE2 is baseline on x86-64. It
        // orders the flushes above before the loads of the measured code that follows.
        unsafe { _mm_mfence() };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = bytes;
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg_attr(miri, ignore = "CLFLUSH is an intrinsic Miri does not implement")]
    fn evicting_keeps_contents() {
        let v: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let copy = v.clone();
        super::evict(&v);
        assert_eq!(v, copy);
        super::evict(&[]);
    }
}
