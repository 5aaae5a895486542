//! Coherence: one small interface, two implementations.
//!
//! Every protocol path calls [`publish`] after writing shared data and [`acquire`] before reading
//! data another party wrote, naming the protocol [`Site`] it serves. The memory decides what that
//! costs ([`SharedMemory::publish`] / [`SharedMemory::acquire`]):
//!
//! - **Hardware-coherent** memory ([`Coherence::Hardware`]): ordering fences only.
//! - **Software-coherent** memory ([`Coherence::Software`]): publish writes the range's cache
//!   lines back ([`write_back`]: CLWB, else CLFLUSHOPT, else CLFLUSH, chosen at run time by CPUID)
//!   and fences (SFENCE); acquire invalidates the range ([`invalidate`]: CLFLUSHOPT, else CLFLUSH)
//!   and fences (MFENCE) before the read.
//!
//! On targets other than x86-64 there is no user-space cache maintenance this module knows of:
//! [`detect`] reports [`FlushKind::Fence`], and software mode degrades to full fences (correct only
//! on memory that is in fact coherent; documented in docs/COHERENCE.md).
//!
//! With the test-only `coherence-teeth` feature, [`set_drop_site`] makes one named site a no-op in
//! the calling thread, so tests can show that every site is needed (docs/COHERENCE.md lists them).

use crate::mem::SharedMemory;
use std::sync::atomic::{fence, Ordering};

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
    pub fn for_mode(mode: crate::format::CoherenceMode) -> Self {
        match mode {
            crate::format::CoherenceMode::Hardware => Coherence::Hardware,
            crate::format::CoherenceMode::Software => Coherence::Software(detect()),
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
            unsafe {
                match kind {
                    FlushKind::Clwb => {
                        core::arch::asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags))
                    }
                    FlushKind::ClflushOpt => {
                        core::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
                    }
                    FlushKind::Clflush => {
                        core::arch::asm!("clflush [{0}]", in(reg) p, options(nostack, preserves_flags))
                    }
                    FlushKind::Fence => {}
                }
            }
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

/// The protocol points that publish or acquire shared data. Each is one call site (or a group of
/// call sites serving one purpose) that the `coherence-teeth` tests remove one at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Site {
    /// Publish of the formatted pool (participant table, partition headers, indexes) in `create`.
    FormatWrite,
    /// Publish of the superblock, written last in `create`.
    SuperblockWrite,
    /// Acquire of the superblock in `open`.
    SuperblockRead,
    /// Publish of a participant slot: claim, partition announcement, detach.
    SlotWrite,
    /// Publish of a heartbeat.
    HeartbeatWrite,
    /// Acquire of a slot's token and heartbeat to judge liveness (attach, takeover).
    LivenessRead,
    /// Publish of a pin entry (pin and unpin).
    PinWrite,
    /// Acquire of the participant table before an owner reuses a block (pin scan).
    PinScanRead,
    /// Publish of a partition's owner word (claim, takeover, release).
    OwnerWrite,
    /// Acquire of a partition's owner word (claim, fencing check).
    OwnerRead,
    /// Publish of an index slot (odd version, then fields and even version).
    IndexWrite,
    /// Acquire of an index slot (seqlock read, final version re-check).
    IndexRead,
    /// Publish of a block's payload and header before its index entry.
    BlockWrite,
    /// Acquire of a block header.
    HeaderRead,
    /// Acquire of a block payload (get, pin, in-place verification).
    PayloadRead,
    /// Acquire of a dead owner's partition (header, index, block headers) during takeover.
    RecoveryRead,
}

impl Site {
    /// Every site, in protocol order.
    pub const ALL: [Site; 16] = [
        Site::FormatWrite,
        Site::SuperblockWrite,
        Site::SuperblockRead,
        Site::SlotWrite,
        Site::HeartbeatWrite,
        Site::LivenessRead,
        Site::PinWrite,
        Site::PinScanRead,
        Site::OwnerWrite,
        Site::OwnerRead,
        Site::IndexWrite,
        Site::IndexRead,
        Site::BlockWrite,
        Site::HeaderRead,
        Site::PayloadRead,
        Site::RecoveryRead,
    ];

    /// The site's name (as `cxlkv sim --drop-site` takes it).
    pub fn name(self) -> &'static str {
        match self {
            Site::FormatWrite => "format-write",
            Site::SuperblockWrite => "superblock-write",
            Site::SuperblockRead => "superblock-read",
            Site::SlotWrite => "slot-write",
            Site::HeartbeatWrite => "heartbeat-write",
            Site::LivenessRead => "liveness-read",
            Site::PinWrite => "pin-write",
            Site::PinScanRead => "pin-scan-read",
            Site::OwnerWrite => "owner-write",
            Site::OwnerRead => "owner-read",
            Site::IndexWrite => "index-write",
            Site::IndexRead => "index-read",
            Site::BlockWrite => "block-write",
            Site::HeaderRead => "header-read",
            Site::PayloadRead => "payload-read",
            Site::RecoveryRead => "recovery-read",
        }
    }

    /// The site called `name`.
    pub fn from_name(name: &str) -> Option<Site> {
        Site::ALL.into_iter().find(|s| s.name() == name)
    }
}

#[cfg(feature = "coherence-teeth")]
thread_local! {
    static DROPPED: std::cell::Cell<Option<Site>> = const { std::cell::Cell::new(None) };
}

/// Test-only (`coherence-teeth`): makes `site` a no-op in the calling thread (`None` restores it).
#[cfg(feature = "coherence-teeth")]
pub fn set_drop_site(site: Option<Site>) {
    DROPPED.with(|d| d.set(site));
}

#[inline(always)]
fn dropped(site: Site) -> bool {
    #[cfg(feature = "coherence-teeth")]
    {
        DROPPED.with(|d| d.get()) == Some(site)
    }
    #[cfg(not(feature = "coherence-teeth"))]
    {
        let _ = site;
        false
    }
}

/// Publishes `[off, off + len)` of `mem` at protocol point `site`.
#[inline]
pub fn publish(mem: &dyn SharedMemory, site: Site, off: u64, len: u64) {
    if !dropped(site) {
        mem.publish(off, len);
    }
}

/// Acquires `[off, off + len)` of `mem` at protocol point `site`.
#[inline]
pub fn acquire(mem: &dyn SharedMemory, site: Site, off: u64, len: u64) {
    if !dropped(site) {
        mem.acquire(off, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_names_round_trip() {
        for s in Site::ALL {
            assert_eq!(Site::from_name(s.name()), Some(s));
        }
        assert_eq!(Site::from_name("nope"), None);
    }

    #[test]
    fn lines_cover_the_range() {
        assert_eq!(lines(64 as *const u8, 64), (64, 1));
        assert_eq!(lines(65 as *const u8, 64), (64, 2));
        assert_eq!(lines(std::ptr::null(), 1), (0, 1));
    }

    #[test]
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
