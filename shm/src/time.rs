//! The host's monotonic clock for liveness: `CLOCK_BOOTTIME`, which never steps and counts time
//! spent suspended (the pool protocol's clock seam, `cxlkv_runtime::clock`, reads it).

/// Nanoseconds on this host's `CLOCK_BOOTTIME` (monotonic since boot, suspend included).
pub fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a pointer to a live local and touches no
    // other memory; CLOCK_BOOTTIME exists on every Linux since 2.6.39.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        // Not expected on Linux; `Instant` (CLOCK_MONOTONIC) still never steps.
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        return ORIGIN
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}
