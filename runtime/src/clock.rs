//! The clock seam: where the protocol reads time.
//!
//! A party of a pool reads two clocks through the [`Clock`] of its [`crate::Pool`]:
//!
//! - [`Clock::now_ns`], the wall clock (nanoseconds since the Unix epoch): identity and creation
//!   stamps only. Hosts' wall clocks disagree and step (NTP, a VM resumed after migration), so no
//!   protocol decision compares one host's wall clock with another's.
//! - [`Clock::monotonic_ns`], this party's own monotonic clock: how long *this* party has waited.
//!   It never steps and is never compared across hosts: an observer measures how long a holder's
//!   heartbeat counter stood still on it, and a holder measures how long ago it last beat
//!   ([`crate::watch`]).
//!
//! Production pools use [`SystemClock`]; the non-coherence simulator (`cxlkv-sim`) opens each
//! simulated host's pool with a clock of its own (offset, steps and drift chosen per seed), so
//! simulated time and per-host skew never reach production code paths.

/// The clocks of one party of a pool.
pub trait Clock: Send + Sync {
    /// Nanoseconds since the Unix epoch on this party's wall clock (may step either way).
    fn now_ns(&self) -> u64;

    /// Nanoseconds on this party's monotonic clock, from an origin of its own: never decreases,
    /// and counts the time the party was suspended. Meaningful only as a difference of two
    /// readings of the same party.
    fn monotonic_ns(&self) -> u64;
}

/// The host's clocks: the wall clock and `CLOCK_BOOTTIME` (monotonic, counting suspend, so a
/// holder that slept through its lease knows it on waking).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        system_now_ns()
    }

    fn monotonic_ns(&self) -> u64 {
        system_monotonic_ns()
    }
}

/// Nanoseconds since the Unix epoch on this host's wall clock.
pub fn system_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Nanoseconds on this host's `CLOCK_BOOTTIME` (monotonic since boot, suspend included; read by
/// [`cxlkv_shm::time::boottime_ns`]).
pub fn system_monotonic_ns() -> u64 {
    cxlkv_shm::time::boottime_ns()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = system_monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = system_monotonic_ns();
        assert!(a > 0 && b >= a + 1_000_000, "{a} then {b}");
    }
}
