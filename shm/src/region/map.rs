//! [`Region`]: one owner per mapping. Creating fresh memory and opening existing memory for every
//! backend (the checks each backend demands first), the `mmap` itself, what follows it (huge-page
//! advice, NUMA binding, prefaulting, placement checks), and the `munmap` on drop.

use super::access::Access;
use super::dax::{dax_target, DaxTarget, DAX_ALIGN};
use super::error::{check_aligned, check_window, os, too_big, unavailable, RegionError, Result};
use super::huge;
use super::numa;
use super::spec::{Backend, HugePages, RegionOptions};
use super::sys::page_size;
use crate::mem::RawMemory;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU8;

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

/// One mapping of pool memory. Unmapped on drop; accessed only through
/// [`SharedMemory`](crate::mem::SharedMemory).
#[derive(Debug)]
pub struct Region {
    /// The bounds-checked view of the first `size` bytes of the mapping.
    pub(super) mem: RawMemory,
    /// Bytes actually mapped: the size, rounded up to whole huge pages for `MAP_HUGETLB`.
    map_len: usize,
    /// Offset of the mapping in its backing file or device.
    offset: u64,
    /// Where the memory comes from (named in every error).
    backend: Backend,
    // Keeps the descriptor open for the mapping's lifetime (device DAX requires it on some kernels).
    _file: Option<File>,
    /// Coherence of publish/acquire: 0 = hardware (fences), else `1 + FlushKind` (software);
    /// written by `set_coherence` and read by `flush_kind` (both in `shared.rs`).
    pub(super) coherence: AtomicU8,
    /// Mapped `PROT_READ` only ([`Region::open_read_only`]): every write is refused with
    /// `MemError::ReadOnly` before it reaches the mapping (`shared.rs`).
    pub(super) read_only: bool,
}

impl Region {
    /// Creates fresh memory of `size` bytes. For file-backed backends (shm, file, fake DAX, NUMA)
    /// the file is created and must not exist yet (so a pool is never overwritten by accident).
    /// On a device-DAX device, which always exists, the first `size` bytes are mapped as they are
    /// (not cleared); `size` must be aligned to the device and no larger than it. What it creates
    /// is private to its owner (mode 0600): [`Region::create_with`] with [`Access::default`].
    pub fn create(backend: &Backend, size: u64, opts: &RegionOptions) -> Result<Region> {
        Self::create_with(backend, size, opts, &Access::default())
    }

    /// [`Region::create`] giving a created file the owner, group and mode of `access`, with no
    /// moment where it is open to more (module `access`). A device-DAX device is not changed: it
    /// must already grant no more than `access` asks, else the creation is refused with the
    /// udev or chown/chmod recipe. Anonymous memory has no file and ignores `access`.
    pub fn create_with(
        backend: &Backend,
        size: u64,
        opts: &RegionOptions,
        access: &Access,
    ) -> Result<Region> {
        access.check()?;
        if size == 0 {
            return Err(RegionError::BadSize {
                size,
                why: "must be positive",
            });
        }
        match backend {
            Backend::Anonymous => Self::map(backend, Kind::Anonymous, None, 0, size, opts),
            Backend::Shm(_) | Backend::File(_) => {
                Self::create_file(backend, Kind::Shared, size, opts, access)
            }
            Backend::Numa { node, .. } => {
                numa::check_node(backend, *node)?;
                Self::create_file(backend, Kind::Numa(*node), size, opts, access)
            }
            Backend::Dax(path) => match dax_target(backend, path)? {
                DaxTarget::Device(info) => {
                    check_aligned("device-DAX mapping length", size, info.align)?;
                    check_window(0, size, info.size)?;
                    access.check_device(backend, path)?;
                    let file = Self::open_rw(path)?;
                    Self::map(backend, Kind::DeviceDax, Some(file), 0, size, opts)
                }
                DaxTarget::Fake | DaxTarget::Missing => {
                    check_aligned("fake-DAX mapping length", size, DAX_ALIGN)?;
                    Self::create_file(backend, Kind::Shared, size, opts, access)
                }
            },
        }
    }

    /// Maps existing memory: the whole file for file-backed backends, the whole device for device
    /// DAX.
    pub fn open(backend: &Backend, opts: &RegionOptions) -> Result<Region> {
        Self::open_window(backend, 0, None, opts, true)
    }

    /// Maps existing memory for reading only (`O_RDONLY`, `PROT_READ`), as [`Region::open`]
    /// does for reading and writing: what a user whose permission on the pool is read-only can
    /// open (inspection: `cxlkv pool info|stat|check`). Every write through it fails with
    /// `MemError::ReadOnly`; the mapping is never written, so it never faults. Prefaulting reads.
    pub fn open_read_only(backend: &Backend, opts: &RegionOptions) -> Result<Region> {
        Self::open_window(backend, 0, None, opts, false)
    }

    /// True when the region was opened with [`Region::open_read_only`].
    pub fn read_only(&self) -> bool {
        self.read_only
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
        Self::open_window(backend, offset, Some(len), opts, true)
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

    /// Creates the backing file: private from the moment it has a name (`O_EXCL`, mode 0600),
    /// then given `access` on the open descriptor while still empty (module `access`).
    fn create_file(
        backend: &Backend,
        kind: Kind,
        size: u64,
        opts: &RegionOptions,
        access: &Access,
    ) -> Result<Region> {
        let path = backend.path().expect("file-backed");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(os("create", path.display()))?;
        let r = access
            .apply(&file, &path)
            .and_then(|()| file.set_len(size).map_err(os("ftruncate", path.display())))
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
        writable: bool,
    ) -> Result<Region> {
        let (kind, align, what_off, what_len) = match backend {
            Backend::Anonymous => {
                return Err(unavailable(backend, "anonymous memory cannot be reopened"));
            }
            Backend::Shm(_) | Backend::File(_) => (Kind::Shared, None, "", ""),
            Backend::Numa { node, .. } => {
                numa::check_node(backend, *node)?;
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
        let file = if writable {
            Self::open_rw(&path)?
        } else {
            File::open(&path).map_err(os("open", path.display()))?
        };
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
        Self::map_as(backend, kind, Some(file), offset, len, opts, writable)
    }

    fn map(
        backend: &Backend,
        kind: Kind,
        file: Option<File>,
        offset: u64,
        size: u64,
        opts: &RegionOptions,
    ) -> Result<Region> {
        Self::map_as(backend, kind, file, offset, size, opts, true)
    }

    /// [`Self::map`], read-only unless `writable`.
    fn map_as(
        backend: &Backend,
        kind: Kind,
        file: Option<File>,
        offset: u64,
        size: u64,
        opts: &RegionOptions,
        writable: bool,
    ) -> Result<Region> {
        use std::os::fd::AsRawFd;
        let mut map_len = usize::try_from(size).map_err(|_| too_big(size))?;
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
            map_len = huge::explicit_map_len(backend, size)?;
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
                if writable {
                    libc::PROT_READ | libc::PROT_WRITE
                } else {
                    libc::PROT_READ
                },
                flags,
                fd,
                off,
            )
        };
        if addr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            if explicit && e.raw_os_error() == Some(libc::ENOMEM) {
                return Err(huge::exhausted(backend, map_len));
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
            read_only: !writable,
        };
        if opts.huge_pages == HugePages::Transparent && kind != Kind::DeviceDax {
            region
                .madvise(libc::MADV_HUGEPAGE)
                .map_err(os("madvise(MADV_HUGEPAGE)", backend))?;
        }
        if let Kind::Numa(node) = kind {
            numa::bind(&region.mem, region.map_len, node, backend)?;
        }
        if matches!(kind, Kind::Numa(_)) || (opts.prefault && kind != Kind::Anonymous) {
            region.populate()?;
        }
        if let Kind::Numa(node) = kind {
            numa::verify_node(&region.mem, node, backend)?;
        }
        Ok(region)
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

    /// Faults every page in writable without changing contents (MADV_POPULATE_WRITE, Linux 5.14);
    /// on kernels or mappings that refuse it, reads one byte of every page instead.
    fn populate(&self) -> Result<()> {
        let advice = if self.read_only {
            libc::MADV_POPULATE_READ
        } else {
            libc::MADV_POPULATE_WRITE
        };
        match self.madvise(advice) {
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
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this region owns (`map_len` bytes from its base);
        // RawMemory is dropped with us, and no reference into the mapping exists (views hand out
        // copies only).
        unsafe { libc::munmap(self.base().cast(), self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::numa::{mempolicy_at, verify_node, verify_node_slow, MPOL_F_ADDR};

    #[test]
    fn a_character_device_that_is_not_dax_is_refused() {
        let b = Backend::Dax("/dev/null".into());
        let e = Region::create(&b, DAX_ALIGN, &RegionOptions::default()).unwrap_err();
        assert!(matches!(e, RegionError::Unavailable { .. }), "{e}");
    }

    /// The memory policy mode of the mapping's first page (MPOL_BIND after `bind`).
    fn policy_mode(r: &Region) -> libc::c_int {
        mempolicy_at(r.base(), MPOL_F_ADDR).unwrap_or_else(|e| panic!("get_mempolicy: {e}"))
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "mmap of /dev/shm and get_mempolicy(2) are foreign calls Miri does not emulate"
    )]
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
        verify_node(&r.mem, 0, &b).unwrap();
        verify_node_slow(&r.mem, 0, 0, &b).unwrap();
        // Asked about another node, both checks name the first page and where it really is.
        for res in [
            verify_node(&r.mem, 1, &b),
            verify_node_slow(&r.mem, 1, 0, &b),
        ] {
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
