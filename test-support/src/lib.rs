//! # cxlkv-test-support
//!
//! The helpers that the workspace's tests and benches share, written once (`publish = false`: no
//! library of the product depends on it; crates take it as a dev-dependency).
//!
//! - [`TempPool`]: a pool on a fresh `/dev/shm` backend, removed when dropped (a failed assertion
//!   included), built on the runtime's [`TempBackend`] guard.
//! - [`ndpd`] and [`spawn_ndpd`]: the `cxlkv-ndpd` binary and a daemon serving a pool, through
//!   the device crate's launcher ([`cxlkv_ndp::daemon`]), with the message a test wants when the
//!   binary is not built.
//! - [`SplitMix64`]: the seeded generator every test and bench draws its data from (the
//!   kernels' generator, which the simulator also runs on).
//! - [`smollm2`]: the SmolLM2 GGUF the model tests run on (`$CXLKV_MODEL`, else the cache that
//!   `scripts/fetch-model.sh` fills), or `None` with a printed reason, so a test skips clearly.
//! - [`attach_once_dead`]: attach to a pool whose slots a killed process still holds, waiting for
//!   its heartbeat to stand still a lease (the crash tests' heir).
//! - [`fails_with`]: a command's exit 2 with a clear error (no panic), as bad input must end.
//! - [`median`]: the upper median of measurements, as the benches report them (defined in
//!   `cxlkv-bench-support`, whose `cxlkv bench qk` harness reports it too).
//!
//! Python's counterparts (the daemon binary, temporary pools, the seeded generator) are in
//! `python/tests/conftest.py`.

// Items are `pub` only where a user of the crate can reach them.
#![warn(unreachable_pub)]

use cxlkv_ndp::daemon::{find_ndpd, Daemon};
use cxlkv_runtime::{Backend, Participant, Pool, PoolConfig, PoolError, RegionOptions};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use cxlkv_bench_support::median;
pub use cxlkv_kernels::rng::{push_elem, SplitMix64};
pub use cxlkv_runtime::region::TempBackend;

/// A pool on its own `/dev/shm` file, removed when this is dropped.
pub struct TempPool {
    // Declared first: the pool's mapping goes before its file does.
    pool: Pool,
    backend: TempBackend,
}

impl TempPool {
    /// Creates a pool of `size` bytes with `cfg` on a fresh backend named after `tag`.
    pub fn create(tag: &str, size: u64, cfg: &PoolConfig) -> TempPool {
        let backend = TempBackend::unique_shm(&format!("cxlkv-test-{tag}"));
        let pool = Pool::create_on(backend.backend(), size, cfg, &RegionOptions::default())
            .unwrap_or_else(|e| panic!("create pool on {}: {e}", backend.backend()));
        TempPool { pool, backend }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Where it lives (for a daemon or another process to open).
    pub fn backend(&self) -> &Backend {
        self.backend.backend()
    }
}

/// The `cxlkv-ndpd` binary ([`find_ndpd`]: `$CXLKV_NDPD`, else beside the test executables);
/// panics with how to build it when it is missing.
pub fn ndpd() -> PathBuf {
    find_ndpd().expect(
        "cxlkv-ndpd is not built next to the test executables: `cargo build -p cxlkv-ndp` \
         (scripts/test.sh builds the workspace first) or set CXLKV_NDPD",
    )
}

/// `cxlkv-ndpd --pool BACKEND ARGS..` ([`ndpd`]), serving when this returns, stopped when the
/// [`Daemon`] is dropped.
pub fn spawn_ndpd(backend: &Backend, args: &[&str]) -> Daemon {
    let exe = ndpd();
    Daemon::spawn(&exe, &backend.to_string(), args).unwrap_or_else(|e| panic!("{e}"))
}

/// The SmolLM2-135M GGUF: `$CXLKV_MODEL`, else the file `scripts/fetch-model.sh` caches
/// (`${XDG_CACHE_HOME:-$HOME/.cache}/cxlkv/models/`). `None` when it is absent, after printing
/// why `test` is skipped (CI before the fetch, a machine without the model).
pub fn smollm2(test: &str) -> Option<PathBuf> {
    let path = match std::env::var_os("CXLKV_MODEL") {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_default()
            .join("cxlkv/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "{test}: skipped: no model at {} (run scripts/fetch-model.sh or set CXLKV_MODEL)",
            path.display()
        );
        None
    }
}

/// Attaches through `pool`, retrying while every slot is held (a dead holder's heartbeat must
/// stand still for a lease first); panics after 20 s.
pub fn attach_once_dead(pool: &Pool) -> Participant {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match pool.attach() {
            Ok(p) => return p,
            Err(PoolError::NoFreeParticipant(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("attach: {e}"),
        }
    }
}

/// Asserts that a command failed as a bad input should: exit status 2, no panic, and each of
/// `needles` in its stderr.
pub fn fails_with(out: &std::process::Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} not in: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temp_pool_is_removed_when_dropped() {
        let cfg = PoolConfig {
            block_size: 64 << 10,
            participants: 2,
            ..PoolConfig::default()
        };
        let t = TempPool::create("self", 8 << 20, &cfg);
        let path = t.backend().path().unwrap();
        assert!(path.exists());
        t.pool().attach().unwrap();
        drop(t);
        assert!(!path.exists(), "{} left behind", path.display());
    }
}
