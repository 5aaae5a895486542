//! The clock seam: where the protocol reads time.
//!
//! Heartbeats, lease checks and pool statistics read time through the [`Clock`] of their
//! [`crate::Pool`]. Production pools use [`SystemClock`]; the non-coherence simulator
//! (`cxlkv-sim`) opens each simulated host's pool with a clock of its own, so simulated time and
//! per-host skew never reach production code paths.

/// A source of nanosecond timestamps for one party of a pool.
pub trait Clock: Send + Sync {
    /// Nanoseconds on this party's clock.
    fn now_ns(&self) -> u64;
}

/// The host's wall clock: nanoseconds since the Unix epoch (hosts sharing a pool must keep their
/// clocks synchronized within a small fraction of the lease; docs/COHERENCE.md).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        system_now_ns()
    }
}

/// Nanoseconds since the Unix epoch on this host's wall clock.
pub fn system_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
