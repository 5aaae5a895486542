//! The protocol's coherence sites.
//!
//! Every protocol path calls [`publish`] after writing shared data and [`acquire`] before reading
//! data another party wrote, naming the protocol [`Site`] it serves. The memory decides what that
//! costs ([`SharedMemory::publish`] / [`SharedMemory::acquire`]): fences on hardware-coherent
//! memory, cache-line write-back and invalidation on software-coherent memory
//! ([`cxlkv_shm::cacheline`]).
//!
//! With the test-only `coherence-teeth` feature, `set_drop_site` makes one named site a no-op in
//! the calling thread, so tests can show that every site is needed (docs/COHERENCE.md lists them).
//! A new site is a new [`Site`] variant (with its name in [`Site::ALL`]), a call of [`publish`] or
//! [`acquire`] at the protocol point, and a simulator case that breaks without it.

pub use cxlkv_shm::cacheline::LINE;
use cxlkv_shm::SharedMemory;

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
    /// Publish of a participant's hotlist: the odd seq, the entries, the even seq.
    HotlistWrite,
    /// Acquire of another participant's hotlist, and of its seq for the re-check.
    HotlistRead,
    /// NDP device: publish of its registers (magic, generation, heartbeat, counters, sleeping).
    NdpRegsWrite,
    /// Acquire of the device registers: by a client (liveness, counters, sleeping flag) and by a
    /// starting device (the previous device's generation).
    NdpRegsRead,
    /// NDP client: publish of a command slot, its arguments, the SQ tail and the doorbell.
    NdpSubmitWrite,
    /// NDP device: acquire of the SQ tail, the command slot and the command's arguments.
    NdpSubmitRead,
    /// NDP device: publish of a command's results, its completion entry and the CQ tail.
    NdpCompleteWrite,
    /// NDP client: acquire of the CQ tail, completion entries and results.
    NdpCompleteRead,
    /// Ring credits: publish of the SQ head (device) and the CQ head (client).
    NdpHeadWrite,
    /// Ring credits: acquire of the SQ head (client, ring full?) and CQ head (device).
    NdpHeadRead,
}

impl Site {
    /// Every site: the pool's, then the NDP rings'.
    pub const ALL: [Site; 26] = [
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
        Site::HotlistWrite,
        Site::HotlistRead,
        Site::NdpRegsWrite,
        Site::NdpRegsRead,
        Site::NdpSubmitWrite,
        Site::NdpSubmitRead,
        Site::NdpCompleteWrite,
        Site::NdpCompleteRead,
        Site::NdpHeadWrite,
        Site::NdpHeadRead,
    ];

    /// The sites of the NDP queue pairs and registers (exercised by the device's ring test on the
    /// simulator, not by the pool's `run_sim`).
    pub const NDP: [Site; 8] = [
        Site::NdpRegsWrite,
        Site::NdpRegsRead,
        Site::NdpSubmitWrite,
        Site::NdpSubmitRead,
        Site::NdpCompleteWrite,
        Site::NdpCompleteRead,
        Site::NdpHeadWrite,
        Site::NdpHeadRead,
    ];

    /// Whether this is a site of the pool protocol (not of the NDP rings).
    pub fn is_pool(self) -> bool {
        !Site::NDP.contains(&self)
    }

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
            Site::HotlistWrite => "hotlist-write",
            Site::HotlistRead => "hotlist-read",
            Site::NdpRegsWrite => "ndp-regs-write",
            Site::NdpRegsRead => "ndp-regs-read",
            Site::NdpSubmitWrite => "ndp-submit-write",
            Site::NdpSubmitRead => "ndp-submit-read",
            Site::NdpCompleteWrite => "ndp-complete-write",
            Site::NdpCompleteRead => "ndp-complete-read",
            Site::NdpHeadWrite => "ndp-head-write",
            Site::NdpHeadRead => "ndp-head-read",
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

/// Whether this build can drop sites (the test-only `coherence-teeth` feature). Shipped builds
/// cannot: [`set_drop_site`] and [`set_drop_site_everywhere`] do nothing there.
pub const TEETH: bool = cfg!(feature = "coherence-teeth");

/// Test-only: makes `site` a no-op in the calling thread (`None` restores it). Returns false,
/// doing nothing, in a build without the `coherence-teeth` feature ([`TEETH`]).
pub fn set_drop_site(site: Option<Site>) -> bool {
    #[cfg(feature = "coherence-teeth")]
    {
        DROPPED.with(|d| d.set(site));
        true
    }
    #[cfg(not(feature = "coherence-teeth"))]
    {
        let _ = site;
        false
    }
}

/// Process-wide drop (`coherence-teeth`): index into [`Site::ALL`] plus one, 0 = none.
#[cfg(feature = "coherence-teeth")]
static DROPPED_EVERYWHERE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Test-only: makes `site` a no-op in every thread of the process (`None` restores it), for tests
/// whose other party runs on threads they do not own (the NDP device's workers); such a test must
/// be alone in its test binary. Returns false, doing nothing, in a build without the
/// `coherence-teeth` feature.
pub fn set_drop_site_everywhere(site: Option<Site>) -> bool {
    #[cfg(feature = "coherence-teeth")]
    {
        let i = site.map_or(0, |s| {
            1 + Site::ALL.iter().position(|&a| a == s).unwrap_or(0)
        });
        DROPPED_EVERYWHERE.store(i, std::sync::atomic::Ordering::SeqCst);
        true
    }
    #[cfg(not(feature = "coherence-teeth"))]
    {
        let _ = site;
        false
    }
}

#[inline(always)]
fn dropped(site: Site) -> bool {
    #[cfg(feature = "coherence-teeth")]
    {
        let all = DROPPED_EVERYWHERE.load(std::sync::atomic::Ordering::Relaxed);
        (all != 0 && Site::ALL[all - 1] == site) || DROPPED.with(|d| d.get()) == Some(site)
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

/// Writes `src` at `off` of `mem` and publishes it at protocol point `site`
/// ([`SharedMemory::write_published`]: non-temporal stores on software-coherent memory). With the
/// site dropped it is a plain write, whose lines stay in this party's cache.
#[inline]
pub fn write_published(
    mem: &dyn SharedMemory,
    site: Site,
    off: u64,
    src: &[u8],
) -> cxlkv_shm::mem::Result<()> {
    if dropped(site) {
        mem.write(off, src)
    } else {
        mem.write_published(off, src)
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
}
