//! Test-only crash injection at named steps of the write protocol (feature `crash-points`).

#[cfg(feature = "crash-points")]
use std::sync::atomic::{AtomicU64, Ordering};

/// Test-only crash injection: with the `crash-points` feature, `CXLKV_CRASH_AT=SITE:N` makes the
/// process SIGKILL itself the N-th time it reaches `SITE`, so tests can kill a writer at every step
/// of the write protocol. Without the feature this compiles to nothing.
#[inline(always)]
pub(super) fn crash_point(site: &'static str) {
    #[cfg(feature = "crash-points")]
    {
        use std::sync::OnceLock;
        static SPEC: OnceLock<Option<(String, u64)>> = OnceLock::new();
        static HITS: AtomicU64 = AtomicU64::new(0);
        let spec = SPEC.get_or_init(|| {
            let v = std::env::var("CXLKV_CRASH_AT").ok()?;
            let (site, n) = v.rsplit_once(':')?;
            Some((site.to_string(), n.parse().ok()?))
        });
        if let Some((s, n)) = spec {
            if s == site && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *n {
                // SAFETY: kill(2) on our own pid with SIGKILL has no memory-safety preconditions.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
        }
    }
    #[cfg(not(feature = "crash-points"))]
    let _ = site;
}

/// Names of the crash points (see `crash_point`), in the order a put reaches them.
pub const CRASH_SITES: [&str; 5] = [
    "put:payload",
    "put:header",
    "slot:odd",
    "slot:fields",
    "put:indexed",
];
