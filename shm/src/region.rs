//! Memory regions: one owner per mapping.
//!
//! A [`Region`] owns exactly one mapping and unmaps it on drop. It is where pool memory comes from,
//! and it implements [`SharedMemory`], so nothing outside this module and [`crate::mem`] sees its
//! address. The backends:
//!
//! - **anonymous** (`anon`): private memory for tests and scratch pools; the only backend that takes
//!   explicit huge pages (`MAP_HUGETLB`).
//! - **shm** (`shm:NAME`): the file `/dev/shm/NAME`, mapped `MAP_SHARED`; the embedded default.
//! - **file** (`file:PATH`): a file on any filesystem (fsdax when the filesystem is DAX-mounted).
//! - **device DAX** (`dax:/dev/daxX.Y`): a device-DAX character device. Its size comes from
//!   `/sys/dev/char/MAJ:MIN/size`; mapping offsets and lengths must be multiples of the device's
//!   alignment ([`DAX_ALIGN`], 2 MiB, or the device's larger `align`). `create` maps the first
//!   `size` bytes of the existing device *without clearing them*; `open` maps the whole device.
//! - **fake DAX** (`dax:PATH` where PATH is a regular file, or does not exist and is not under
//!   `/dev`; `fakedax:PATH` is an alias): a file-backed region held to the device-DAX alignment
//!   rules, so that the DAX code path (and every caller's alignment handling) runs on machines
//!   without DAX hardware. `create` makes the file, which must not exist yet.
//! - **NUMA-bound** (`numa:N[:NAME]`): `/dev/shm/NAME` mapped `MAP_SHARED`, bound to node `N` with
//!   `mbind(MPOL_BIND, MPOL_MF_STRICT | MPOL_MF_MOVE)`, always prefaulted, and then checked page by
//!   page with `move_pages(2)` (or `get_mempolicy(2)` where that is refused) so that a region that
//!   maps successfully is known to live on node `N`. A CPU-less node is how a CXL expander appears.
//!
//! [`RegionOptions`] adds prefaulting (`MAP_POPULATE` for anonymous memory,
//! `madvise(MADV_POPULATE_WRITE)` for shared file mappings, which faults pages in writable without
//! changing their contents) and huge pages (transparent through `madvise(MADV_HUGEPAGE)`, explicit
//! through `MAP_HUGETLB`, which fails with [`RegionError::Unavailable`] when none are reserved).
//!
//! Every backend that cannot work on this machine says why through [`RegionError::Unavailable`];
//! none falls back silently to another.

use crate::cacheline::{self as coherence, Coherence, FlushKind};
use crate::mem::{self, RawMemory, SharedMemory};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU8, Ordering};
use thiserror::Error;

/// Alignment that device DAX (and fake DAX) demands of mapping offsets and lengths: 2 MiB, the
/// smallest device-DAX page size used for memory expanders. A device whose `align` attribute is
/// larger (1 GiB) demands that instead.
pub const DAX_ALIGN: u64 = 2 << 20;

/// Root of the sysfs tree this module reads (node existence and memory, device-DAX attributes).
const SYS: &str = "/sys";

/// Where a region's memory comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Private anonymous memory (tests, scratch pools).
    Anonymous,
    /// A shared-memory file `/dev/shm/NAME`.
    Shm(String),
    /// A file on any filesystem (fsdax when the filesystem is DAX-mounted).
    File(PathBuf),
    /// A device-DAX character device (`/dev/daxX.Y`), or a regular file used as *fake DAX*; both
    /// demand 2 MiB-aligned ([`DAX_ALIGN`]) offsets and lengths.
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
    /// Parses `anon`, `shm:NAME`, `file:PATH`, `dax:PATH`, `fakedax:PATH`, `numa:N` or
    /// `numa:N:NAME`. A bare path (starting with `/` or `.`) is a file, except that
    /// `/dev/shm/NAME` is shm and `/dev/dax*` is device DAX.
    ///
    /// `dax:PATH` is device DAX when PATH is a character device, and *fake DAX* when PATH is a
    /// regular file (or, for `create`, does not exist and is not under `/dev`): a file-backed
    /// region held to the same 2 MiB alignment rules, so the DAX code path runs everywhere.
    /// `fakedax:PATH` says so explicitly and parses to the same [`Backend::Dax`]; it refuses paths
    /// under `/dev`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || RegionError::BadSpec(s.to_string());
        if s == "anon" {
            return Ok(Backend::Anonymous);
        }
        if let Some(name) = s.strip_prefix("shm:") {
            return shm_name(name)
                .map(|n| Backend::Shm(n.to_string()))
                .ok_or_else(bad);
        }
        if let Some(p) = s.strip_prefix("file:") {
            return if p.is_empty() {
                Err(bad())
            } else {
                Ok(Backend::File(p.into()))
            };
        }
        if let Some(p) = s.strip_prefix("dax:") {
            return if p.is_empty() {
                Err(bad())
            } else {
                Ok(Backend::Dax(p.into()))
            };
        }
        if let Some(p) = s.strip_prefix("fakedax:") {
            return if p.is_empty() || Path::new(p).starts_with("/dev") {
                Err(bad())
            } else {
                Ok(Backend::Dax(p.into()))
            };
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
            return shm_name(name)
                .map(|n| Backend::Shm(n.to_string()))
                .ok_or_else(bad);
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
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
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
    /// Ask for transparent huge pages (`madvise(MADV_HUGEPAGE)`). Ignored for device DAX, whose
    /// faults already map the device's page size.
    Transparent,
    /// Explicit huge pages (`MAP_HUGETLB`, anonymous regions only): fails when none are reserved.
    /// The mapping is rounded up to whole huge pages; the region's size stays the one asked for.
    Explicit,
}

/// Mapping options.
#[derive(Clone, Copy, Debug, Default)]
pub struct RegionOptions {
    /// Fault every page in at map time (`MAP_POPULATE` for anonymous memory,
    /// `madvise(MADV_POPULATE_WRITE)` for shared mappings), so first touches on the hot path are
    /// cheap. NUMA-bound regions are always prefaulted, since their placement is checked.
    pub prefault: bool,
    /// Huge-page policy.
    pub huge_pages: HugePages,
}

/// Errors of region creation and mapping.
#[derive(Debug, Error)]
pub enum RegionError {
    /// The backend specification could not be parsed.
    #[error(
        "bad backend {0:?}: expected anon, shm:NAME, file:PATH, dax:PATH, fakedax:PATH or \
         numa:N[:NAME]"
    )]
    BadSpec(String),
    /// A size of zero, or one the backend cannot map.
    #[error("bad region size {size}: {why}")]
    BadSize {
        /// The size asked for.
        size: u64,
        /// Why it is refused.
        why: &'static str,
    },
    /// An offset or length that is not a multiple of the alignment the backend demands.
    #[error("{what} {value:#x} is not a multiple of {align:#x}")]
    Misaligned {
        /// What is misaligned (mapping offset, mapping length, device size, ...).
        what: &'static str,
        /// The offending value.
        value: u64,
        /// The alignment the backend demands.
        align: u64,
    },
    /// A mapping window that does not lie inside its backing memory.
    #[error("window of {len} bytes at offset {offset} is outside backing memory of {size} bytes")]
    OutOfRange {
        /// Start of the window.
        offset: u64,
        /// Length of the window.
        len: u64,
        /// Size of the backing file or device.
        size: u64,
    },
    /// A page of a NUMA-bound region is not on the node it was bound to.
    #[error(
        "page at offset {offset} is on node {actual} instead of node {node} (negative: -errno, \
         the page is not resident)"
    )]
    Misplaced {
        /// The node the region is bound to.
        node: u32,
        /// Offset of the first misplaced page in the region.
        offset: u64,
        /// The node it is on, or a negative errno from `move_pages(2)`.
        actual: i32,
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

fn os(
    op: &'static str,
    path: impl std::fmt::Display,
) -> impl FnOnce(std::io::Error) -> RegionError {
    let path = path.to_string();
    move |source| RegionError::Os { op, path, source }
}

fn unavailable(backend: &Backend, why: impl Into<String>) -> RegionError {
    RegionError::Unavailable {
        backend: backend.to_string(),
        why: why.into(),
    }
}

fn check_aligned(what: &'static str, value: u64, align: u64) -> Result<()> {
    if value.is_multiple_of(align) {
        Ok(())
    } else {
        Err(RegionError::Misaligned { what, value, align })
    }
}

fn check_window(offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(RegionError::OutOfRange { offset, len, size }),
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// A device-DAX character device as sysfs describes it.
#[derive(Clone, Copy, Debug)]
struct DaxDeviceInfo {
    size: u64,
    align: u64,
}

/// What a [`Backend::Dax`] path is on this machine.
enum DaxTarget {
    /// A device-DAX character device.
    Device(DaxDeviceInfo),
    /// A regular file used as fake DAX.
    Fake,
    /// Nothing exists at the path yet (fake DAX to be created).
    Missing,
}

fn read_sys_u64(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Looks the character device `rdev` up in sysfs; `None` when it is not a device-DAX device.
fn dax_device_info(sys: &Path, path: &Path, rdev: u64) -> Option<DaxDeviceInfo> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let mut dirs = vec![sys.join(format!("dev/char/{major}:{minor}"))];
    if let Some(name) = path.file_name() {
        dirs.push(sys.join("bus/dax/devices").join(name));
        dirs.push(sys.join("class/dax").join(name).join("device"));
    }
    dirs.into_iter().find_map(|dir| {
        let subsystem = std::fs::read_link(dir.join("subsystem")).ok()?;
        if subsystem.file_name()? != "dax" {
            return None;
        }
        let size = read_sys_u64(&dir.join("size"))?;
        let align = read_sys_u64(&dir.join("align"))
            .unwrap_or(DAX_ALIGN)
            .max(DAX_ALIGN);
        Some(DaxDeviceInfo { size, align })
    })
}

fn dax_target(backend: &Backend, path: &Path) -> Result<DaxTarget> {
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_char_device() => dax_device_info(Path::new(SYS), path, m.rdev())
            .map(DaxTarget::Device)
            .ok_or_else(|| {
                unavailable(
                    backend,
                    format!(
                        "{} is a character device but not device DAX (no dax subsystem \
                             entry with a size under {SYS}/dev/char)",
                        path.display()
                    ),
                )
            }),
        Ok(m) if m.file_type().is_file() => Ok(DaxTarget::Fake),
        Ok(_) => Err(unavailable(
            backend,
            format!(
                "{} is neither a device-DAX character device nor a regular file",
                path.display()
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if path.starts_with("/dev") {
                let found = std::fs::read_dir(Path::new(SYS).join("bus/dax/devices"))
                    .map(|d| {
                        d.filter_map(|e| {
                            e.ok().map(|e| e.file_name().to_string_lossy().into_owned())
                        })
                        .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                let found = if found.is_empty() {
                    "no DAX device found".into()
                } else {
                    found.join(", ")
                };
                Err(unavailable(
                    backend,
                    format!(
                        "no DAX device at {} ({SYS}/bus/dax/devices: {found})",
                        path.display()
                    ),
                ))
            } else {
                Ok(DaxTarget::Missing)
            }
        }
        Err(e) => Err(os("stat", path.display())(e)),
    }
}

/// Checks that NUMA node `node` exists and has memory; the reason when it does not.
fn check_numa_node(backend: &Backend, node: u32) -> Result<()> {
    let nodes = Path::new(SYS).join("devices/system/node");
    if !nodes.is_dir() {
        return Err(unavailable(
            backend,
            format!(
                "this kernel has no NUMA support ({} is missing)",
                nodes.display()
            ),
        ));
    }
    let dir = nodes.join(format!("node{node}"));
    if !dir.is_dir() {
        let online = std::fs::read_to_string(nodes.join("online")).unwrap_or_default();
        return Err(unavailable(
            backend,
            format!(
                "NUMA node {node} does not exist ({} missing; online nodes: {})",
                dir.display(),
                online.trim()
            ),
        ));
    }
    match crate::topo::node_memory_bytes(&dir) {
        Some(0) => Err(unavailable(
            backend,
            format!(
                "NUMA node {node} has no memory (MemTotal 0 in {}/meminfo)",
                dir.display()
            ),
        )),
        Some(_) => Ok(()),
        None => Err(unavailable(
            backend,
            format!(
                "cannot read MemTotal of NUMA node {node} from {}/meminfo",
                dir.display()
            ),
        )),
    }
}

fn huge_page_counts() -> (Option<u64>, Option<u64>, Option<u64>) {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    (
        field("Hugepagesize:").map(|kb| kb * 1024),
        field("HugePages_Total:"),
        field("HugePages_Free:"),
    )
}

/// How a mapping is made and what follows it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Private anonymous memory.
    Anonymous,
    /// A shared mapping of a file or shared-memory file (fake DAX included).
    Shared,
    /// A shared mapping of a device-DAX character device.
    DeviceDax,
    /// A shared mapping of a shared-memory file, bound to a NUMA node.
    Numa(u32),
}

// mbind(2) / get_mempolicy(2) flags the libc crate does not export (linux/mempolicy.h).
const MPOL_MF_STRICT: libc::c_uint = 1 << 0;
const MPOL_MF_MOVE: libc::c_uint = 1 << 1;
const MPOL_F_NODE: libc::c_ulong = 1 << 0;
const MPOL_F_ADDR: libc::c_ulong = 1 << 1;

/// One mapping of pool memory. Unmapped on drop; accessed only through [`SharedMemory`].
#[derive(Debug)]
pub struct Region {
    mem: RawMemory,
    /// Bytes actually mapped: the size, rounded up to whole huge pages for `MAP_HUGETLB`.
    map_len: usize,
    /// Offset of the mapping in its backing file or device.
    offset: u64,
    backend: Backend,
    // Keeps the descriptor open for the mapping's lifetime (device DAX requires it on some kernels).
    _file: Option<File>,
    /// Coherence of publish/acquire: 0 = hardware (fences), else `1 + FlushKind` (software).
    coherence: AtomicU8,
}

impl Region {
    /// Creates fresh memory of `size` bytes. For file-backed backends (shm, file, fake DAX, NUMA)
    /// the file is created and must not exist yet (so a pool is never overwritten by accident).
    /// On a device-DAX device, which always exists, the first `size` bytes are mapped as they are
    /// (not cleared); `size` must be aligned to the device and no larger than it.
    pub fn create(backend: &Backend, size: u64, opts: &RegionOptions) -> Result<Region> {
        if size == 0 {
            return Err(RegionError::BadSize {
                size,
                why: "must be positive",
            });
        }
        match backend {
            Backend::Anonymous => Self::map(backend, Kind::Anonymous, None, 0, size, opts),
            Backend::Shm(_) | Backend::File(_) => {
                Self::create_file(backend, Kind::Shared, size, opts)
            }
            Backend::Numa { node, .. } => {
                check_numa_node(backend, *node)?;
                Self::create_file(backend, Kind::Numa(*node), size, opts)
            }
            Backend::Dax(path) => match dax_target(backend, path)? {
                DaxTarget::Device(info) => {
                    check_aligned("device-DAX mapping length", size, info.align)?;
                    check_window(0, size, info.size)?;
                    let file = Self::open_rw(path)?;
                    Self::map(backend, Kind::DeviceDax, Some(file), 0, size, opts)
                }
                DaxTarget::Fake | DaxTarget::Missing => {
                    check_aligned("fake-DAX mapping length", size, DAX_ALIGN)?;
                    Self::create_file(backend, Kind::Shared, size, opts)
                }
            },
        }
    }

    /// Maps existing memory: the whole file for file-backed backends, the whole device for device
    /// DAX.
    pub fn open(backend: &Backend, opts: &RegionOptions) -> Result<Region> {
        Self::open_window(backend, 0, None, opts)
    }

    /// Maps the window `[offset, offset + len)` of existing memory (a file, shared-memory file or
    /// DAX device). The offset must be page-aligned, and for DAX both offset and length must be
    /// multiples of [`DAX_ALIGN`] (or of the device's larger alignment).
    pub fn open_range(
        backend: &Backend,
        offset: u64,
        len: u64,
        opts: &RegionOptions,
    ) -> Result<Region> {
        if len == 0 {
            return Err(RegionError::BadSize {
                size: len,
                why: "must be positive",
            });
        }
        Self::open_window(backend, offset, Some(len), opts)
    }

    /// Anonymous private memory of `size` bytes, zero-filled.
    pub fn anonymous(size: u64) -> Result<Region> {
        Self::create(&Backend::Anonymous, size, &RegionOptions::default())
    }

    /// The backend this region maps.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Offset of this mapping in its backing file or device (0 unless opened with
    /// [`Region::open_range`]).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Removes the backing file of a file-backed backend (shm, file, fake DAX, NUMA); the mapping
    /// stays valid. A device-DAX device is never removed: unlinking it succeeds without effect.
    pub fn unlink(backend: &Backend) -> Result<()> {
        let Some(p) = backend.path() else {
            return Ok(());
        };
        if matches!(backend, Backend::Dax(_)) {
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_file() => {}
                Ok(_) => return Ok(()),
                Err(e) => return Err(os("unlink", p.display())(e)),
            }
        }
        std::fs::remove_file(&p).map_err(os("unlink", p.display()))
    }

    fn open_rw(path: &Path) -> Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(os("open", path.display()))
    }

    fn create_file(
        backend: &Backend,
        kind: Kind,
        size: u64,
        opts: &RegionOptions,
    ) -> Result<Region> {
        let path = backend.path().expect("file-backed");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(os("create", path.display()))?;
        let r = file
            .set_len(size)
            .map_err(os("ftruncate", path.display()))
            .and_then(|()| Self::map(backend, kind, Some(file), 0, size, opts));
        if r.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        r
    }

    fn open_window(
        backend: &Backend,
        offset: u64,
        len: Option<u64>,
        opts: &RegionOptions,
    ) -> Result<Region> {
        let (kind, align, what_off, what_len) = match backend {
            Backend::Anonymous => {
                return Err(unavailable(backend, "anonymous memory cannot be reopened"));
            }
            Backend::Shm(_) | Backend::File(_) => (Kind::Shared, None, "", ""),
            Backend::Numa { node, .. } => {
                check_numa_node(backend, *node)?;
                (Kind::Numa(*node), None, "", "")
            }
            Backend::Dax(path) => match dax_target(backend, path)? {
                DaxTarget::Device(info) => (
                    Kind::DeviceDax,
                    Some((info.align, info.size)),
                    "device-DAX mapping offset",
                    "device-DAX mapping length",
                ),
                DaxTarget::Fake => (
                    Kind::Shared,
                    Some((DAX_ALIGN, 0)),
                    "fake-DAX mapping offset",
                    "fake-DAX mapping length",
                ),
                DaxTarget::Missing => {
                    let e = std::io::Error::from(std::io::ErrorKind::NotFound);
                    return Err(os("open", path.display())(e));
                }
            },
        };
        let path = backend.path().expect("file-backed");
        let file = Self::open_rw(&path)?;
        let total = match (kind, align) {
            (Kind::DeviceDax, Some((_, dev_size))) => dev_size,
            _ => file.metadata().map_err(os("stat", path.display()))?.len(),
        };
        if total == 0 {
            return Err(RegionError::BadSize {
                size: total,
                why: "the backing file is empty",
            });
        }
        let len = len.unwrap_or(total.saturating_sub(offset));
        match align {
            Some((a, _)) => {
                check_aligned(what_off, offset, a)?;
                check_aligned(what_len, len, a)?;
            }
            None => check_aligned("mapping offset", offset, page_size())?,
        }
        check_window(offset, len, total)?;
        Self::map(backend, kind, Some(file), offset, len, opts)
    }

    fn map(
        backend: &Backend,
        kind: Kind,
        file: Option<File>,
        offset: u64,
        size: u64,
        opts: &RegionOptions,
    ) -> Result<Region> {
        use std::os::fd::AsRawFd;
        let too_big = || RegionError::BadSize {
            size,
            why: "larger than the address space",
        };
        let mut map_len = usize::try_from(size).map_err(|_| too_big())?;
        let mut flags = match kind {
            Kind::Anonymous => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            Kind::Shared | Kind::DeviceDax | Kind::Numa(_) => libc::MAP_SHARED,
        };
        if opts.prefault && kind == Kind::Anonymous {
            // Private writable mappings populate with write faults; shared ones are populated with
            // MADV_POPULATE_WRITE after binding (see `populate`).
            flags |= libc::MAP_POPULATE;
        }
        let explicit = opts.huge_pages == HugePages::Explicit;
        if explicit {
            if kind != Kind::Anonymous {
                return Err(unavailable(
                    backend,
                    "explicit huge pages need anonymous memory or a hugetlbfs file",
                ));
            }
            let (Some(huge), total, _) = huge_page_counts() else {
                return Err(unavailable(
                    backend,
                    "this kernel has no huge pages (no Hugepagesize)",
                ));
            };
            if total == Some(0) {
                return Err(unavailable(
                    backend,
                    "no huge pages are reserved (HugePages_Total 0; reserve some with \
                     `echo N > /proc/sys/vm/nr_hugepages`)",
                ));
            }
            // munmap of a hugetlb mapping needs whole huge pages, so map whole ones.
            let rounded = size.checked_next_multiple_of(huge).ok_or_else(too_big)?;
            map_len = usize::try_from(rounded).map_err(|_| too_big())?;
            flags |= libc::MAP_HUGETLB;
        }
        let off = libc::off_t::try_from(offset).map_err(|_| RegionError::OutOfRange {
            offset,
            len: size,
            size: i64::MAX as u64,
        })?;
        let fd = file.as_ref().map_or(-1, |f| f.as_raw_fd());
        // SAFETY: a fresh mapping at an address of the kernel's choosing; no existing memory is
        // affected. The result is checked for MAP_FAILED below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                off,
            )
        };
        if addr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            if explicit && e.raw_os_error() == Some(libc::ENOMEM) {
                let (huge, total, free) = huge_page_counts();
                return Err(unavailable(
                    backend,
                    format!(
                        "not enough free huge pages for {map_len} bytes ({} free of {} pages of {} \
                         bytes)",
                        free.unwrap_or(0),
                        total.unwrap_or(0),
                        huge.unwrap_or(0)
                    ),
                ));
            }
            return Err(os("mmap", backend)(e));
        }
        let base = NonNull::new(addr.cast::<u8>()).expect("mmap never returns null on success");
        // SAFETY: the mapping is `map_len >= size` bytes, readable and writable, page-aligned, and
        // lives until Drop unmaps it, which also drops the RawMemory.
        let mem = unsafe { RawMemory::new(base.as_ptr(), size) };
        // From here on an error drops the region, which unmaps it.
        let region = Region {
            mem,
            map_len,
            offset,
            backend: backend.clone(),
            _file: file,
            coherence: AtomicU8::new(0),
        };
        if opts.huge_pages == HugePages::Transparent && kind != Kind::DeviceDax {
            region
                .madvise(libc::MADV_HUGEPAGE)
                .map_err(os("madvise(MADV_HUGEPAGE)", backend))?;
        }
        if let Kind::Numa(node) = kind {
            region.bind(node)?;
        }
        if matches!(kind, Kind::Numa(_)) || (opts.prefault && kind != Kind::Anonymous) {
            region.populate()?;
        }
        if let Kind::Numa(node) = kind {
            region.verify_node(node)?;
        }
        Ok(region)
    }

    /// The write-back instruction of software-coherent mode, `None` in hardware-coherent mode.
    fn flush_kind(&self) -> Option<FlushKind> {
        match self.coherence.load(Ordering::Relaxed) {
            0 => None,
            1 => Some(FlushKind::Clwb),
            2 => Some(FlushKind::ClflushOpt),
            3 => Some(FlushKind::Clflush),
            _ => Some(FlushKind::Fence),
        }
    }

    /// The coherence this region's publish and acquire implement.
    pub fn coherence(&self) -> Coherence {
        self.flush_kind()
            .map_or(Coherence::Hardware, Coherence::Software)
    }

    fn base(&self) -> *mut u8 {
        self.mem
            .raw_range(0, 0)
            .expect("empty range at 0 is in bounds")
    }

    fn madvise(&self, advice: libc::c_int) -> std::io::Result<()> {
        // SAFETY: advice on exactly the mapping this region owns; none of the advice used here
        // (MADV_HUGEPAGE, MADV_POPULATE_WRITE) changes its contents.
        let rc = unsafe { libc::madvise(self.base().cast(), self.map_len, advice) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Binds the whole mapping to `node` (MPOL_BIND), moving pages this process alone maps and
    /// failing (EIO) when existing pages cannot be moved.
    fn bind(&self, node: u32) -> Result<()> {
        let bits = u64::BITS as usize;
        let mut mask = vec![0 as libc::c_ulong; node as usize / bits + 1];
        mask[node as usize / bits] |= 1 << (node as usize % bits);
        // The kernel reads maxnode - 1 bits (a historical off-by-one that libnuma also follows).
        let maxnode = (mask.len() * bits + 1) as libc::c_ulong;
        // SAFETY: mbind on exactly the mapping this region owns; `mask` holds `maxnode - 1` bits
        // and outlives the call. It changes placement only, never contents.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                self.base(),
                self.map_len as libc::c_ulong,
                libc::MPOL_BIND as libc::c_ulong,
                mask.as_ptr(),
                maxnode,
                (MPOL_MF_STRICT | MPOL_MF_MOVE) as libc::c_ulong,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) => Err(unavailable(
                &self.backend,
                format!(
                    "mbind refused node {node} ({e}); is it outside this process's cpuset mems?"
                ),
            )),
            Some(libc::ENOSYS) => Err(unavailable(
                &self.backend,
                format!("this kernel has no mbind ({e})"),
            )),
            _ => Err(os("mbind(MPOL_BIND)", &self.backend)(e)),
        }
    }

    /// Faults every page in writable without changing contents (MADV_POPULATE_WRITE, Linux 5.14);
    /// on kernels or mappings that refuse it, reads one byte of every page instead.
    fn populate(&self) -> Result<()> {
        match self.madvise(libc::MADV_POPULATE_WRITE) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let page = page_size();
                let mut byte = [0u8; 1];
                for off in (0..self.mem.size()).step_by(page as usize) {
                    self.mem
                        .read(off, &mut byte)
                        .expect("page offsets are in bounds");
                }
                Ok(())
            }
            Err(e) => Err(os("madvise(MADV_POPULATE_WRITE)", &self.backend)(e)),
        }
    }

    /// Checks that every page of the (prefaulted) mapping lives on `node`.
    fn verify_node(&self, node: u32) -> Result<()> {
        const BATCH: usize = 512;
        let page = page_size();
        let size = self.mem.size();
        let mut pages = Vec::with_capacity(BATCH);
        let mut status: Vec<libc::c_int> = vec![0; BATCH];
        let mut start = 0u64;
        while start < size {
            pages.clear();
            let mut off = start;
            while off < size && pages.len() < BATCH {
                let p = self
                    .mem
                    .raw_range(off, 0)
                    .expect("page offsets are in bounds");
                pages.push(p.cast::<libc::c_void>());
                off += page;
            }
            // SAFETY: move_pages with nodes == NULL only reports where each page is; `pages` and
            // `status` hold `pages.len()` entries and outlive the call; pid 0 is this process.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_move_pages,
                    0 as libc::c_long,
                    pages.len() as libc::c_ulong,
                    pages.as_ptr(),
                    std::ptr::null::<libc::c_int>(),
                    status.as_mut_ptr(),
                    0 as libc::c_long,
                )
            };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) {
                    return self.verify_node_slow(node, start);
                }
                return Err(os("move_pages", &self.backend)(e));
            }
            if let Some(i) = status[..pages.len()]
                .iter()
                .position(|&s| s != node as libc::c_int)
            {
                return Err(RegionError::Misplaced {
                    node,
                    offset: start + i as u64 * page,
                    actual: status[i],
                });
            }
            start = off;
        }
        Ok(())
    }

    /// [`Self::verify_node`] one page at a time with get_mempolicy, for sandboxes that refuse
    /// move_pages.
    fn verify_node_slow(&self, node: u32, from: u64) -> Result<()> {
        let page = page_size();
        for off in (from..self.mem.size()).step_by(page as usize) {
            let addr = self
                .mem
                .raw_range(off, 0)
                .expect("page offsets are in bounds");
            let mut actual: libc::c_int = -1;
            // SAFETY: with MPOL_F_NODE | MPOL_F_ADDR, get_mempolicy writes the node of the page at
            // `addr` (inside our mapping) into `actual`, a live local; no nodemask is passed.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_get_mempolicy,
                    &mut actual as *mut libc::c_int,
                    std::ptr::null_mut::<libc::c_ulong>(),
                    0 as libc::c_ulong,
                    addr,
                    MPOL_F_NODE | MPOL_F_ADDR,
                )
            };
            if rc != 0 {
                return Err(os("get_mempolicy", &self.backend)(
                    std::io::Error::last_os_error(),
                ));
            }
            if actual != node as libc::c_int {
                return Err(RegionError::Misplaced {
                    node,
                    offset: off,
                    actual,
                });
            }
        }
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this region owns (`map_len` bytes from its base);
        // RawMemory is dropped with us, and no reference into the mapping exists (views hand out
        // copies only).
        unsafe { libc::munmap(self.base().cast(), self.map_len) };
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
    fn publish(&self, offset: u64, len: u64) {
        match self.flush_kind() {
            // Hardware-coherent memory: ordering only. Pairs with the fence in `acquire` of the
            // reader.
            None => fence(Ordering::Release),
            Some(kind) => {
                if let Ok(p) = self.mem.raw_range(offset, len) {
                    // SAFETY: the range is inside this region's mapping (checked by raw_range);
                    // write-back does not change its contents. Pairs with the reader's
                    // invalidate in `acquire`.
                    unsafe { coherence::write_back(p, len as usize, kind) };
                }
            }
        }
    }
    fn acquire(&self, offset: u64, len: u64) {
        match self.flush_kind() {
            // Pairs with the Release fence in the writer's `publish`.
            None => fence(Ordering::Acquire),
            Some(kind) => {
                if let Ok(p) = self.mem.raw_range(offset, len) {
                    // SAFETY: as in `publish`; invalidation writes dirty lines back before
                    // dropping them, so no data is lost. Pairs with the writer's write-back.
                    unsafe { coherence::invalidate(p, len as usize, kind) };
                }
            }
        }
    }
    fn write_published(&self, offset: u64, src: &[u8]) -> mem::Result<()> {
        match self.flush_kind() {
            None => {
                self.mem.write(offset, src)?;
                // Pairs with the fence in `acquire` of the reader, as `publish`.
                fence(Ordering::Release);
                Ok(())
            }
            // Non-temporal stores and SFENCE: the bytes are in memory, ordered before later
            // stores, with no write-back pass. Pairs with the reader's invalidate in `acquire`.
            Some(kind) => self.mem.write_streaming(offset, src, kind),
        }
    }
    fn set_coherence(&self, mode: crate::cacheline::CoherenceMode) {
        let code = match Coherence::for_mode(mode) {
            Coherence::Hardware => 0,
            Coherence::Software(FlushKind::Clwb) => 1,
            Coherence::Software(FlushKind::ClflushOpt) => 2,
            Coherence::Software(FlushKind::Clflush) => 3,
            Coherence::Software(FlushKind::Fence) => 4,
        };
        self.coherence.store(code, Ordering::Relaxed);
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
        assert_eq!(
            "shm:pool0".parse::<Backend>().unwrap(),
            Backend::Shm("pool0".into())
        );
        assert_eq!(
            "/dev/shm/p".parse::<Backend>().unwrap(),
            Backend::Shm("p".into())
        );
        assert_eq!(
            "/tmp/x.pool".parse::<Backend>().unwrap(),
            Backend::File("/tmp/x.pool".into())
        );
        assert_eq!(
            "numa:2".parse::<Backend>().unwrap(),
            Backend::Numa {
                node: 2,
                name: "cxlkv-numa2".into()
            }
        );
        assert_eq!(
            "fakedax:/tmp/f".parse::<Backend>().unwrap(),
            Backend::Dax("/tmp/f".into())
        );
        assert!("fakedax:/dev/dax0.0".parse::<Backend>().is_err());
        assert_eq!(
            "/dev/dax1.2".parse::<Backend>().unwrap(),
            Backend::Dax("/dev/dax1.2".into())
        );
        assert!("shm:../etc".parse::<Backend>().is_err());
        assert!("numa:x".parse::<Backend>().is_err());
        assert!("bogus".parse::<Backend>().is_err());
    }

    #[test]
    fn window_and_alignment_checks() {
        assert!(check_window(0, 8, 8).is_ok());
        assert!(matches!(
            check_window(u64::MAX, 2, 8),
            Err(RegionError::OutOfRange { .. })
        ));
        assert!(check_aligned("x", 4 << 20, DAX_ALIGN).is_ok());
        assert!(matches!(
            check_aligned("x", 4096, DAX_ALIGN),
            Err(RegionError::Misaligned {
                value: 4096,
                align: DAX_ALIGN,
                ..
            })
        ));
    }

    #[test]
    fn a_character_device_that_is_not_dax_is_refused() {
        let b = Backend::Dax("/dev/null".into());
        let e = Region::create(&b, DAX_ALIGN, &RegionOptions::default()).unwrap_err();
        assert!(matches!(e, RegionError::Unavailable { .. }), "{e}");
    }

    /// The memory policy mode of the mapping's first page (MPOL_BIND after `bind`).
    fn policy_mode(r: &Region) -> libc::c_int {
        let mut mode: libc::c_int = -1;
        // SAFETY: with MPOL_F_ADDR, get_mempolicy writes the policy mode of the VMA holding `addr`
        // (inside the region's mapping) into `mode`, a live local; no nodemask is passed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_get_mempolicy,
                &mut mode as *mut libc::c_int,
                std::ptr::null_mut::<libc::c_ulong>(),
                0 as libc::c_ulong,
                r.base(),
                MPOL_F_ADDR,
            )
        };
        assert_eq!(rc, 0, "get_mempolicy: {}", std::io::Error::last_os_error());
        mode
    }

    #[test]
    fn numa_binding_is_applied_and_checked() {
        let b = Backend::Numa {
            node: 0,
            name: format!("cxlkv-region-unit-{}", std::process::id()),
        };
        let r = match Region::create(&b, 3 * 4096 + 8, &RegionOptions::default()) {
            Ok(r) => r,
            Err(e @ RegionError::Unavailable { .. }) => return eprintln!("skipped: numa:0: {e}"),
            Err(e) => panic!("{e}"),
        };
        Region::unlink(&b).unwrap();
        assert_eq!(policy_mode(&r), libc::MPOL_BIND);
        r.verify_node(0).unwrap();
        r.verify_node_slow(0, 0).unwrap();
        // Asked about another node, both checks name the first page and where it really is.
        for res in [r.verify_node(1), r.verify_node_slow(1, 0)] {
            match res {
                Err(RegionError::Misplaced {
                    node: 1,
                    offset: 0,
                    actual: 0,
                }) => {}
                other => panic!("expected Misplaced, got {other:?}"),
            }
        }
    }
}
