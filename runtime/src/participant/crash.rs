//! Test-only crash and pause injection at named steps of the write protocol (feature
//! `crash-points`). Crates above the runtime with steps of their own to crash at (the SSD tier's
//! spill) call [`crash_point`] too, so that one switch and one environment variable drive them all.

#[cfg(feature = "crash-points")]
use std::sync::atomic::{AtomicU64, Ordering};

/// Test-only fault injection at a step of the write protocol. With the `crash-points` feature,
/// `CXLKV_CRASH_AT=SITE:N` makes the process SIGKILL itself the N-th time it reaches `SITE`, and
/// `CXLKV_PAUSE_AT=SITE:N` makes it SIGSTOP itself there (it goes on where it stopped once sent
/// SIGCONT: a writer held up longer than its lease, as by a VM freeze or a long page fault), so
/// tests can kill or pause a writer at every step. Without the feature this compiles to nothing
/// (and the shipped artifacts carry neither the variables' names nor the check:
/// scripts/check-shipped.sh).
#[inline(always)]
pub fn crash_point(site: &'static str) {
    #[cfg(feature = "crash-points")]
    {
        use std::sync::OnceLock;
        static CRASH: OnceLock<Option<(String, u64)>> = OnceLock::new();
        static PAUSE: OnceLock<Option<(String, u64)>> = OnceLock::new();
        static CRASH_HITS: AtomicU64 = AtomicU64::new(0);
        static PAUSE_HITS: AtomicU64 = AtomicU64::new(0);
        fn spec(var: &str) -> Option<(String, u64)> {
            let v = std::env::var(var).ok()?;
            let (site, n) = v.rsplit_once(':')?;
            Some((site.to_string(), n.parse().ok()?))
        }
        let hit = |spec: &Option<(String, u64)>, hits: &AtomicU64| match spec {
            Some((s, n)) => s == site && hits.fetch_add(1, Ordering::Relaxed) + 1 == *n,
            None => false,
        };
        if hit(CRASH.get_or_init(|| spec("CXLKV_CRASH_AT")), &CRASH_HITS) {
            // SAFETY: kill(2) on our own pid with SIGKILL has no memory-safety preconditions.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        if hit(PAUSE.get_or_init(|| spec("CXLKV_PAUSE_AT")), &PAUSE_HITS) {
            // Sent to this thread (raise, not kill of the process: a process-directed signal may be
            // taken by another thread while this one runs on), it stops the whole process (every
            // thread, the heartbeat's too) before raise returns, until SIGCONT.
            // SAFETY: raise(3) of SIGSTOP has no memory-safety preconditions.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
    }
    #[cfg(not(feature = "crash-points"))]
    let _ = site;
}

/// Names of the crash and pause points (see `crash_point`), in the order a put reaches them: a
/// free block's claim word read (not yet swapped), the block claimed, its payload written, its
/// header written (and claim committed), the index slot made odd, the slot's fields written, the
/// slot made even (the put has landed). A reservation reaches the first two at `reserve`, the
/// others but the payload at `commit`.
pub const CRASH_SITES: [&str; 7] = [
    "claim:read",
    "put:allocated",
    "put:payload",
    "put:header",
    "slot:odd",
    "slot:fields",
    "put:indexed",
];

/// The crash and pause points a multi-block object put adds (see `crash_point`): after each part
/// is indexed, and before the manifest's own put (whose steps are [`CRASH_SITES`]).
pub const OBJECT_CRASH_SITES: [&str; 2] = ["object:part", "object:manifest"];
