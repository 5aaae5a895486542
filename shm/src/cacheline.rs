//! Cache-line primitives: the CPU instructions behind software coherence.
//!
//! - **Hardware-coherent** memory ([`Coherence::Hardware`]): ordering fences only.
//! - **Software-coherent** memory ([`Coherence::Software`]): publish writes the range's cache
//!   lines back ([`write_back`]: CLWB, else CLFLUSHOPT, else CLFLUSH, chosen at run time by CPUID)
//!   and fences (SFENCE); acquire invalidates the range ([`invalidate`]: CLFLUSHOPT, else CLFLUSH)
//!   and fences (MFENCE) before the read. Bulk payloads are published as they are written
//!   ([`write_streaming`]): non-temporal stores, then SFENCE, with no write-back pass.
//!
//! On targets other than x86-64 there is no user-space cache maintenance this module knows of:
//! [`detect`] reports [`FlushKind::Fence`], and software mode degrades to full fences (correct only
//! on memory that is in fact coherent; docs/COHERENCE.md).
//!
//! This module knows nothing of the pool protocol: the protocol's named publish and acquire sites
//! live in `cxlkv_runtime::coherence` and call [`crate::SharedMemory::publish`] /
//! [`crate::SharedMemory::acquire`], which a [`crate::Region`] implements with these primitives.

use std::sync::atomic::{fence, Ordering};

/// Coherence mode of a pool, recorded in its superblock.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoherenceMode {
    /// All parties share hardware coherence (processes on one host): fences order accesses.
    Hardware = 0,
    /// Parties do not share coherence: writers write back, readers invalidate (docs/COHERENCE.md).
    Software = 1,
}

impl CoherenceMode {
    /// Decodes the superblock field.
    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(Self::Hardware),
            1 => Some(Self::Software),
            _ => None,
        }
    }
}

/// Size of a cache line, the unit of write-back and invalidation.
pub const LINE: u64 = 64;

/// The cache-maintenance instruction a software-coherent publish uses to write a line back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushKind {
    /// CLWB: writes the line back and may keep it cached (best for publish).
    Clwb,
    /// CLFLUSHOPT: writes back and invalidates; weakly ordered (needs a fence).
    ClflushOpt,
    /// CLFLUSH: writes back and invalidates; ordered with other CLFLUSHes (slowest).
    Clflush,
    /// No cache-maintenance instruction on this target: full fences only.
    Fence,
}

/// How a region keeps parties coherent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coherence {
    /// Hardware coherence: publish and acquire are ordering fences.
    Hardware,
    /// Software coherence: publish writes back with the given instruction, acquire invalidates.
    Software(FlushKind),
}

impl Coherence {
    /// The implementation of a pool's recorded mode on this CPU.
    pub fn for_mode(mode: CoherenceMode) -> Self {
        match mode {
            CoherenceMode::Hardware => Coherence::Hardware,
            CoherenceMode::Software => Coherence::Software(detect()),
        }
    }
}

/// The best write-back instruction of this CPU (CPUID leaf 7 EBX bit 24 = CLWB, bit 23 =
/// CLFLUSHOPT; CLFLUSH is baseline x86-64). Cached after the first call.
pub fn detect() -> FlushKind {
    use std::sync::OnceLock;
    static KIND: OnceLock<FlushKind> = OnceLock::new();
    *KIND.get_or_init(detect_uncached)
}

#[cfg(target_arch = "x86_64")]
fn detect_uncached() -> FlushKind {
    // CPUID exists on every x86-64 CPU; leaf 0 reports the highest basic leaf, and leaf 7 is only
    // queried when it exists.
    let max = core::arch::x86_64::__cpuid(0).eax;
    if max < 7 {
        return FlushKind::Clflush;
    }
    let ebx = core::arch::x86_64::__cpuid_count(7, 0).ebx;
    if ebx & (1 << 24) != 0 {
        FlushKind::Clwb
    } else if ebx & (1 << 23) != 0 {
        FlushKind::ClflushOpt
    } else {
        FlushKind::Clflush
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_uncached() -> FlushKind {
    FlushKind::Fence
}

/// Line-aligned start address and line count covering `[ptr, ptr + len)`.
#[inline]
fn lines(ptr: *const u8, len: usize) -> (usize, usize) {
    let start = (ptr as usize) & !(LINE as usize - 1);
    let end = (ptr as usize).saturating_add(len);
    (start, (end - start).div_ceil(LINE as usize))
}

/// Writes the cache lines covering `[ptr, ptr + len)` back to memory with `kind`, then SFENCE (so
/// the write-backs complete before any later store, e.g. the flag that announces the data).
///
/// # Safety
/// `[ptr, ptr + len)` must lie in mapped memory of this process (the instructions fault on
/// unmapped addresses); its contents are not changed.
pub unsafe fn write_back(ptr: *const u8, len: usize, kind: FlushKind) {
    if len == 0 {
        fence(Ordering::SeqCst);
        return;
    }
    let (start, n) = lines(ptr, len);
    #[cfg(target_arch = "x86_64")]
    {
        for i in 0..n {
            let p = (start + i * LINE as usize) as *const u8;
            // SAFETY: `p` lies in a line that overlaps the caller's mapped range (the caller's
            // contract), and these instructions only move that line between cache and memory.
            unsafe { write_back_line(p, kind) };
        }
        // SAFETY: SFENCE has no preconditions. It orders the weakly ordered write-backs above
        // before every later store (the publishing store the reader's acquire pairs with).
        unsafe { core::arch::asm!("sfence", options(nostack, preserves_flags)) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (start, n, kind);
    }
    // Compiler and CPU ordering for the Rust memory model; pairs with the reader's fence in
    // `invalidate`.
    fence(Ordering::SeqCst);
}

/// Invalidates the cache lines covering `[ptr, ptr + len)` (CLFLUSHOPT, or CLFLUSH when `kind`
/// says CLFLUSHOPT is missing), then MFENCE, so the following loads miss and read memory. A line
/// this party dirtied is written back first (the instructions do so), never lost.
///
/// # Safety
/// As [`write_back`].
pub unsafe fn invalidate(ptr: *const u8, len: usize, kind: FlushKind) {
    if len == 0 {
        fence(Ordering::SeqCst);
        return;
    }
    let (start, n) = lines(ptr, len);
    #[cfg(target_arch = "x86_64")]
    {
        for i in 0..n {
            let p = (start + i * LINE as usize) as *const u8;
            // SAFETY: as in `write_back`: `p` is in the caller's mapped range; the line's contents
            // are written back if dirty and dropped from the cache, never changed.
            unsafe {
                match kind {
                    FlushKind::Clwb | FlushKind::ClflushOpt => {
                        core::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
                    }
                    FlushKind::Clflush => {
                        core::arch::asm!("clflush [{0}]", in(reg) p, options(nostack, preserves_flags))
                    }
                    FlushKind::Fence => {}
                }
            }
        }
        // SAFETY: MFENCE has no preconditions. It completes the invalidations before any later
        // load (SFENCE would not order loads).
        unsafe { core::arch::asm!("mfence", options(nostack, preserves_flags)) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (start, n, kind);
    }
    // Pairs with the writer's fence in `write_back`.
    fence(Ordering::SeqCst);
}

/// Writes `line`'s cache line back with `kind` (no fence).
///
/// # Safety
/// `line` must lie in mapped memory of this process.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn write_back_line(line: *const u8, kind: FlushKind) {
    // SAFETY: the caller's contract: `line` is mapped; the instructions move the line between
    // cache and memory without changing its contents.
    unsafe {
        match kind {
            FlushKind::Clwb => {
                core::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags))
            }
            FlushKind::ClflushOpt => {
                core::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags))
            }
            FlushKind::Clflush => {
                core::arch::asm!("clflush [{0}]", in(reg) line, options(nostack, preserves_flags))
            }
            FlushKind::Fence => {}
        }
    }
}

/// Copies `src` to `dst` and publishes it in the same pass: on return every byte is in memory, not
/// in this CPU's caches, and ordered before every later store. Whole lines go out with
/// non-temporal stores (AVX-512 `vmovntdq` where the CPU has it, else SSE2 `movntdq`), which write
/// around the cache, evict a cached copy of the line and need no write-back; a partial first or
/// last line is copied with ordinary stores and written back with `kind`. One SFENCE then makes
/// the weakly ordered streaming stores and write-backs globally visible before any later store
/// (the header and index entry that announce the data). This is [`write_back`] of freshly written
/// data without the write-back pass, which on this machine costs as much as the copy itself.
///
/// With [`FlushKind::Fence`] (no cache maintenance known on this target) it is a copy and a full
/// fence.
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes, must not overlap `src`, and no Rust
/// reference may point into it.
pub unsafe fn write_streaming(dst: *mut u8, src: &[u8], kind: FlushKind) {
    #[cfg(target_arch = "x86_64")]
    if kind != FlushKind::Fence {
        let len = src.len();
        let line = LINE as usize;
        let head = ((dst as usize).wrapping_neg() & (line - 1)).min(len);
        let body = (len - head) & !(line - 1);
        let tail = len - head - body;
        // SAFETY: the three pieces partition `[0, len)` of both buffers, which the caller
        // guarantees valid and disjoint; `dst + head` is line-aligned and `body` a whole number of
        // lines, as the streaming copies require; the write-backs name lines of `dst`.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
            stream_lines(dst.add(head), src.as_ptr().add(head), body);
            let t = head + body;
            std::ptr::copy_nonoverlapping(src.as_ptr().add(t), dst.add(t), tail);
            if head > 0 {
                write_back_line(dst, kind);
            }
            if tail > 0 {
                write_back_line(dst.add(t), kind);
            }
        }
        // SAFETY: SFENCE has no preconditions. It drains the write-combining buffers of the
        // streaming stores and orders them and the write-backs before every later store (the
        // publishing store the reader's acquire pairs with).
        unsafe { core::arch::asm!("sfence", options(nostack, preserves_flags)) };
        // Compiler and CPU ordering for the Rust memory model, as in `write_back`.
        fence(Ordering::SeqCst);
        return;
    }
    let _ = kind;
    // SAFETY: the caller guarantees `dst` valid for `src.len()` bytes and disjoint from `src`.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    fence(Ordering::SeqCst);
}

/// Streams `len` bytes (a multiple of [`LINE`]) from `src` to the line-aligned `dst` with
/// non-temporal stores, AVX-512 where the CPU has it (checked at run time), else SSE2 (baseline
/// x86-64). No fence.
///
/// # Safety
/// `dst` line-aligned and valid for writes of `len` bytes, `src` valid for reads of `len` bytes,
/// not overlapping; `len` a multiple of [`LINE`].
#[cfg(target_arch = "x86_64")]
unsafe fn stream_lines(dst: *mut u8, src: *const u8, len: usize) {
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked above); the rest is the caller's contract.
        unsafe { stream_lines_avx512(dst, src, len) }
    } else {
        // SAFETY: the caller's contract; SSE2 is part of x86-64.
        unsafe { stream_lines_sse2(dst, src, len) }
    }
}

/// # Safety
/// As [`stream_lines`], and the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_lines_avx512(dst: *mut u8, src: *const u8, len: usize) {
    use core::arch::x86_64::{_mm512_loadu_si512, _mm512_stream_si512};
    let mut i = 0;
    while i < len {
        // SAFETY: `i + 64 <= len` (len is a multiple of 64), so both 64-byte accesses are in the
        // caller's buffers; the load is unaligned, the store's address line-aligned as required.
        unsafe {
            let v = _mm512_loadu_si512(src.add(i).cast());
            _mm512_stream_si512(dst.add(i).cast(), v);
        }
        i += 64;
    }
}

/// # Safety
/// As [`stream_lines`].
#[cfg(target_arch = "x86_64")]
unsafe fn stream_lines_sse2(dst: *mut u8, src: *const u8, len: usize) {
    use core::arch::x86_64::{_mm_loadu_si128, _mm_stream_si128};
    let mut i = 0;
    while i < len {
        // SAFETY: as in `stream_lines_avx512`, in 16-byte pieces of one line (the store address
        // is 16-byte aligned since the line is).
        unsafe {
            for j in (0..64).step_by(16) {
                let v = _mm_loadu_si128(src.add(i + j).cast());
                _mm_stream_si128(dst.add(i + j).cast(), v);
            }
        }
        i += 64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_cover_the_range() {
        assert_eq!(lines(std::ptr::without_provenance(64), 64), (64, 1));
        assert_eq!(lines(std::ptr::without_provenance(65), 64), (64, 2));
        assert_eq!(lines(std::ptr::null(), 1), (0, 1));
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "non-temporal stores and cache-line flushes are inline assembly, which Miri cannot run"
    )]
    fn streaming_copies_every_alignment_and_length() {
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 13 + 5) as u8).collect();
        let mut kinds = vec![detect(), FlushKind::Clflush, FlushKind::Fence];
        kinds.dedup();
        for kind in kinds {
            for at in [0usize, 1, 17, 63, 64, 65] {
                for len in [0usize, 1, 40, 63, 64, 65, 128, 200, 640, 777] {
                    let mut dst = vec![0xeeu8; 1024 + 128];
                    let base = dst.as_mut_ptr().align_offset(64);
                    // SAFETY: `base + at + len` stays inside the private `dst`, disjoint from
                    // `src`; no reference into `dst` is live during the call.
                    unsafe { write_streaming(dst.as_mut_ptr().add(base + at), &src[..len], kind) };
                    let (before, rest) = dst[base..].split_at(at);
                    assert!(before.iter().all(|&b| b == 0xee), "{kind:?} {at} {len}");
                    assert_eq!(&rest[..len], &src[..len], "{kind:?} {at} {len}");
                    assert!(
                        rest[len..].iter().all(|&b| b == 0xee),
                        "{kind:?} {at} {len}"
                    );
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(
        miri,
        ignore = "non-temporal stores are inline assembly, which Miri cannot run"
    )]
    fn both_streaming_loops_copy_whole_lines() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 1) as u8).collect();
        let mut dst = vec![0u8; 4096 + 64];
        let base = dst.as_mut_ptr().align_offset(64);
        // SAFETY: `dst + base` is line-aligned with 4096 bytes after it, disjoint from `src`.
        unsafe { stream_lines_sse2(dst.as_mut_ptr().add(base), src.as_ptr(), 4096) };
        assert_eq!(&dst[base..base + 4096], &src[..]);
        if std::arch::is_x86_feature_detected!("avx512f") {
            dst.fill(0);
            // SAFETY: as above; AVX-512F is present.
            unsafe { stream_lines_avx512(dst.as_mut_ptr().add(base), src.as_ptr(), 4096) };
            assert_eq!(&dst[base..base + 4096], &src[..]);
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "cache-line flushes are inline assembly, which Miri cannot run"
    )]
    fn flushes_keep_contents() {
        let mut v = vec![7u8; 4096];
        let kind = detect();
        for k in [kind, FlushKind::Clflush] {
            // SAFETY: the range is a live private allocation.
            unsafe {
                write_back(v.as_ptr().add(3), 1000, k);
                invalidate(v.as_ptr(), v.len(), k);
            }
        }
        v[5] = 1;
        assert_eq!(v.iter().map(|&b| u64::from(b)).sum::<u64>(), 7 * 4095 + 1);
    }
}
