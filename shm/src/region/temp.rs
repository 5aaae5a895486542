//! [`TempBackend`]: a backend whose memory is removed when the guard is dropped.

use super::{Backend, Region};
use std::sync::atomic::{AtomicU32, Ordering};

/// A backend whose backing file is removed ([`Region::unlink`]) when this guard is dropped, an
/// error path or a failed assertion included: the private pool of one run, or a test's pool.
/// Mappings made from it stay valid after the removal.
#[derive(Debug)]
pub struct TempBackend(Backend);

impl TempBackend {
    /// Takes charge of removing `backend`'s memory.
    pub fn new(backend: Backend) -> TempBackend {
        TempBackend(backend)
    }

    /// A `/dev/shm` backend named `PREFIX-PID-N`, unique within this process and among
    /// processes.
    pub fn unique_shm(prefix: &str) -> TempBackend {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        TempBackend(Backend::Shm(format!("{prefix}-{}-{n}", std::process::id())))
    }

    /// The backend.
    pub fn backend(&self) -> &Backend {
        &self.0
    }
}

impl Drop for TempBackend {
    fn drop(&mut self) {
        let _ = Region::unlink(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::RegionOptions;

    #[test]
    fn dropping_the_guard_removes_the_file_and_names_are_unique() {
        let t = TempBackend::unique_shm("cxlkv-shm-temp-test");
        let other = TempBackend::unique_shm("cxlkv-shm-temp-test");
        assert_ne!(t.backend(), other.backend());
        let path = t.backend().path().unwrap();
        let r = Region::create(t.backend(), 4096, &RegionOptions::default()).unwrap();
        assert!(path.exists());
        drop(t);
        assert!(!path.exists(), "{} left behind", path.display());
        drop(r);
    }
}
