//! Memory regions: one owner per mapping.
//!
//! A [`Region`] owns exactly one mapping and unmaps it on drop. It is where pool memory comes from:
//! anonymous memory (tests), a shared-memory file under `/dev/shm` (the embedded default), a file on
//! any filesystem (fsdax on a DAX-mounted one), a device-DAX character device, or shared memory bound
//! to one NUMA node (a CPU-less node is how a CXL expander appears). The region implements
//! [`SharedMemory`], so nothing outside this module and [`crate::mem`] sees its address.

use crate::mem::{self, RawMemory, SharedMemory};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use thiserror::Error;

/// Where a region's memory comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Private anonymous memory (tests, scratch pools).
    Anonymous,
    /// A shared-memory file `/dev/shm/NAME`.
    Shm(String),
    /// A file on any filesystem (fsdax when the filesystem is DAX-mounted).
    File(PathBuf),
    /// A device-DAX character device (`/dev/daxX.Y`): 2 MiB-aligned offsets and lengths.
    Dax(PathBuf),
    /// Shared memory bound to NUMA node `node` with `mbind(MPOL_BIND)`, backed by `/dev/shm/NAME`.
    Numa {
        /// The NUMA node the pages must land on.
        node: u32,
        /// Name of the backing shared-memory file.
        name: String,
    },
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Anonymous => write!(f, "anon"),
            Backend::Shm(n) => write!(f, "shm:{n}"),
            Backend::File(p) => write!(f, "file:{}", p.display()),
            Backend::Dax(p) => write!(f, "dax:{}", p.display()),
            Backend::Numa { node, name } => write!(f, "numa:{node}:{name}"),
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = RegionError;
    /// Parses `anon`, `shm:NAME`, `file:PATH`, `dax:PATH`, `numa:N` or `numa:N:NAME`. A bare path
    /// (starting with `/` or `.`) is a file, except that `/dev/shm/NAME` is shm and `/dev/dax*` is
    /// device DAX.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || RegionError::BadSpec(s.to_string());
        if s == "anon" {
            return Ok(Backend::Anonymous);
        }
        if let Some(name) = s.strip_prefix("shm:") {
            return shm_name(name).map(|n| Backend::Shm(n.to_string())).ok_or_else(bad);
        }
        if let Some(p) = s.strip_prefix("file:") {
            return if p.is_empty() { Err(bad()) } else { Ok(Backend::File(p.into())) };
        }
        if let Some(p) = s.strip_prefix("dax:") {
            return if p.is_empty() { Err(bad()) } else { Ok(Backend::Dax(p.into())) };
        }
        if let Some(rest) = s.strip_prefix("numa:") {
            let (node, name) = match rest.split_once(':') {
                Some((n, name)) => (n, name.to_string()),
                None => (rest, format!("cxlkv-numa{rest}")),
            };
            let node = node.parse().map_err(|_| bad())?;
            shm_name(&name).ok_or_else(bad)?;
            return Ok(Backend::Numa { node, name });
        }
        if let Some(name) = s.strip_prefix("/dev/shm/") {
            return shm_name(name).map(|n| Backend::Shm(n.to_string())).ok_or_else(bad);
        }
        if s.starts_with("/dev/dax") {
            return Ok(Backend::Dax(s.into()));
        }
        if s.starts_with('/') || s.starts_with('.') {
            return Ok(Backend::File(s.into()));
        }
        Err(bad())
    }
}

fn shm_name(name: &str) -> Option<&str> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && !name.starts_with('.');
    ok.then_some(name)
}

impl Backend {
    /// The filesystem path behind this backend, if it has one.
    pub fn path(&self) -> Option<PathBuf> {
        match self {
            Backend::Anonymous => None,
            Backend::Shm(n) | Backend::Numa { name: n, .. } => Some(Path::new("/dev/shm").join(n)),
            Backend::File(p) | Backend::Dax(p) => Some(p.clone()),
        }
    }
}

/// Huge-page policy of a mapping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HugePages {
    /// Base pages only.
    #[default]
    None,
    /// Ask for transparent huge pages (`madvise(MADV_HUGEPAGE)`).
    Transparent,
    /// Explicit huge pages (`MAP_HUGETLB`, anonymous regions only): fails when none are reserved.
    Explicit,
}

/// Mapping options.
#[derive(Clone, Copy, Debug, Default)]
pub struct RegionOptions {
    /// Fault every page in at map time (`MAP_POPULATE`), so first touches on the hot path are cheap.
    pub prefault: bool,
    /// Huge-page policy.
    pub huge_pages: HugePages,
}

/// Errors of region creation and mapping.
#[derive(Debug, Error)]
pub enum RegionError {
    /// The backend specification could not be parsed.
    #[error("bad backend {0:?}: expected anon, shm:NAME, file:PATH, dax:PATH or numa:N[:NAME]")]
    BadSpec(String),
    /// A size of zero, or one the backend cannot map.
    #[error("bad region size {size}: {why}")]
    BadSize {
        /// The size asked for.
        size: u64,
        /// Why it is refused.
        why: &'static str,
    },
    /// An operating-system call failed.
    #[error("{op} {path}: {source}")]
    Os {
        /// The operation (open, mmap, ftruncate, ...).
        op: &'static str,
        /// The path involved, or the backend.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The backend is not available on this machine (no such node, no DAX device, ...).
    #[error("{backend} is not available here: {why}")]
    Unavailable {
        /// The backend.
        backend: String,
        /// Why.
        why: String,
    },
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, RegionError>;

fn os(op: &'static str, path: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> RegionError {
    let path = path.to_string();
    move |source| RegionError::Os { op, path, source }
}

/// One mapping of pool memory. Unmapped on drop; accessed only through [`SharedMemory`].
#[derive(Debug)]
pub struct Region {
    mem: RawMemory,
    backend: Backend,
    // Keeps the descriptor open for the mapping's lifetime (device DAX requires it on some kernels).
    _file: Option<File>,
}

impl Region {
    /// Creates fresh memory of `size` bytes. For file-backed backends the file is created and must
    /// not exist yet (so a pool is never overwritten by accident).
    pub fn create(backend: &Backend, size: u64, opts: &RegionOptions) -> Result<Region> {
        if size == 0 {
            return Err(RegionError::BadSize { size, why: "must be positive" });
        }
        match backend {
            Backend::Anonymous => Self::map(backend, None, size, opts),
            Backend::Shm(_) | Backend::File(_) => {
                let path = backend.path().expect("file-backed");
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .map_err(os("create", path.display()))?;
                let r = file.set_len(size).map_err(os("ftruncate", path.display())).and_then(
                    |()| Self::map(backend, Some(file), size, opts),
                );
                if r.is_err() {
                    let _ = std::fs::remove_file(&path);
                }
                r
            }
            Backend::Dax(_) | Backend::Numa { .. } => Err(RegionError::Unavailable {
                backend: backend.to_string(),
                why: "backend not built into this version".into(),
            }),
        }
    }

    /// Maps existing memory: the whole file for file-backed backends.
    pub fn open(backend: &Backend, opts: &RegionOptions) -> Result<Region> {
        match backend {
            Backend::Anonymous => Err(RegionError::Unavailable {
                backend: backend.to_string(),
                why: "anonymous memory cannot be reopened".into(),
            }),
            Backend::Shm(_) | Backend::File(_) => {
                let path = backend.path().expect("file-backed");
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(os("open", path.display()))?;
                let size = file.metadata().map_err(os("stat", path.display()))?.len();
                if size == 0 {
                    return Err(RegionError::BadSize { size, why: "the file is empty" });
                }
                Self::map(backend, Some(file), size, opts)
            }
            Backend::Dax(_) | Backend::Numa { .. } => Err(RegionError::Unavailable {
                backend: backend.to_string(),
                why: "backend not built into this version".into(),
            }),
        }
    }

    /// Anonymous private memory of `size` bytes, zero-filled.
    pub fn anonymous(size: u64) -> Result<Region> {
        Self::create(&Backend::Anonymous, size, &RegionOptions::default())
    }

    fn map(backend: &Backend, file: Option<File>, size: u64, opts: &RegionOptions) -> Result<Region> {
        use std::os::fd::AsRawFd;
        let len = usize::try_from(size)
            .map_err(|_| RegionError::BadSize { size, why: "larger than the address space" })?;
        let mut flags = match file {
            Some(_) => libc::MAP_SHARED,
            None => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        };
        if opts.prefault {
            flags |= libc::MAP_POPULATE;
        }
        if opts.huge_pages == HugePages::Explicit {
            if file.is_some() {
                return Err(RegionError::Unavailable {
                    backend: backend.to_string(),
                    why: "explicit huge pages need anonymous memory or a hugetlbfs file".into(),
                });
            }
            flags |= libc::MAP_HUGETLB;
        }
        let fd = file.as_ref().map_or(-1, |f| f.as_raw_fd());
        // SAFETY: a fresh mapping at an address of the kernel's choosing; no existing memory is
        // affected. The result is checked for MAP_FAILED below.
        let addr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0)
        };
        if addr == libc::MAP_FAILED {
            return Err(os("mmap", backend)(std::io::Error::last_os_error()));
        }
        if opts.huge_pages == HugePages::Transparent {
            // SAFETY: advice on the mapping just created, exactly its range.
            let rc = unsafe { libc::madvise(addr, len, libc::MADV_HUGEPAGE) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                // SAFETY: unmapping the mapping created above, which nothing else references yet.
                unsafe { libc::munmap(addr, len) };
                return Err(os("madvise(MADV_HUGEPAGE)", backend)(e));
            }
        }
        let base = NonNull::new(addr.cast::<u8>()).expect("mmap never returns null on success");
        // SAFETY: the mapping is `len` bytes, readable and writable, page-aligned, and lives until
        // Drop unmaps it, which also drops the RawMemory.
        let mem = unsafe { RawMemory::new(base.as_ptr(), size) };
        Ok(Region { mem, backend: backend.clone(), _file: file })
    }

    /// The backend this region maps.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Removes the backing file of a file-backed backend (shm or file); the mapping stays valid.
    pub fn unlink(backend: &Backend) -> Result<()> {
        match backend.path() {
            Some(p) if !matches!(backend, Backend::Dax(_)) => {
                std::fs::remove_file(&p).map_err(os("unlink", p.display()))
            }
            _ => Ok(()),
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let base = self.mem.raw_range(0, 0).expect("empty range at 0 is in bounds");
        // SAFETY: unmaps exactly the mapping this region owns; RawMemory is dropped with us, and no
        // reference into the mapping exists (views hand out copies only).
        unsafe { libc::munmap(base.cast(), self.mem.size() as usize) };
    }
}

impl SharedMemory for Region {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> mem::Result<()> {
        self.mem.read(offset, dst)
    }
    fn write(&self, offset: u64, src: &[u8]) -> mem::Result<()> {
        self.mem.write(offset, src)
    }
    fn fill(&self, offset: u64, len: u64, byte: u8) -> mem::Result<()> {
        self.mem.fill(offset, len, byte)
    }
    fn load_u64(&self, offset: u64, order: Ordering) -> mem::Result<u64> {
        self.mem.load_u64(offset, order)
    }
    fn store_u64(&self, offset: u64, value: u64, order: Ordering) -> mem::Result<()> {
        self.mem.store_u64(offset, value, order)
    }
    fn compare_exchange_u64(
        &self,
        offset: u64,
        current: u64,
        new: u64,
    ) -> mem::Result<std::result::Result<u64, u64>> {
        self.mem.compare_exchange_u64(offset, current, new)
    }
    fn publish(&self, _offset: u64, _len: u64) {
        // Hardware-coherent memory: ordering only. Pairs with the fence in `acquire` of the reader.
        fence(Ordering::Release);
    }
    fn acquire(&self, _offset: u64, _len: u64) {
        // Pairs with the Release fence in the writer's `publish`.
        fence(Ordering::Acquire);
    }
    fn raw_range(&self, offset: u64, len: u64) -> mem::Result<Option<*mut u8>> {
        self.mem.raw_range(offset, len).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_backend_specs() {
        assert_eq!("anon".parse::<Backend>().unwrap(), Backend::Anonymous);
        assert_eq!("shm:pool0".parse::<Backend>().unwrap(), Backend::Shm("pool0".into()));
        assert_eq!("/dev/shm/p".parse::<Backend>().unwrap(), Backend::Shm("p".into()));
        assert_eq!("/tmp/x.pool".parse::<Backend>().unwrap(), Backend::File("/tmp/x.pool".into()));
        assert_eq!(
            "numa:2".parse::<Backend>().unwrap(),
            Backend::Numa { node: 2, name: "cxlkv-numa2".into() }
        );
        assert!("shm:../etc".parse::<Backend>().is_err());
        assert!("numa:x".parse::<Backend>().is_err());
        assert!("bogus".parse::<Backend>().is_err());
    }
}
