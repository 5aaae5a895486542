//! Errors of region creation and mapping ([`RegionError`], one variant per way a backend refuses),
//! the [`Result`] alias, and the window and alignment checks every backend runs before it maps.

use thiserror::Error;

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
    /// An owner, group or mode that cannot be given (unknown name, bits outside 0777).
    #[error("bad access: {0}")]
    BadAccess(String),
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

/// Turns an OS error of `op` on `path` into [`RegionError::Os`] (for `map_err`).
pub(super) fn os(
    op: &'static str,
    path: impl std::fmt::Display,
) -> impl FnOnce(std::io::Error) -> RegionError {
    let path = path.to_string();
    move |source| RegionError::Os { op, path, source }
}

/// [`RegionError::Unavailable`]: `backend` cannot work on this machine, and why.
pub(super) fn unavailable(backend: impl std::fmt::Display, why: impl Into<String>) -> RegionError {
    RegionError::Unavailable {
        backend: backend.to_string(),
        why: why.into(),
    }
}

/// [`RegionError::BadSize`] for a size that does not fit this address space.
pub(super) fn too_big(size: u64) -> RegionError {
    RegionError::BadSize {
        size,
        why: "larger than the address space",
    }
}

/// `value` (named `what` in the error) is a multiple of `align`.
pub(super) fn check_aligned(what: &'static str, value: u64, align: u64) -> Result<()> {
    if value.is_multiple_of(align) {
        Ok(())
    } else {
        Err(RegionError::Misaligned { what, value, align })
    }
}

/// The window `[offset, offset + len)` lies inside `size` bytes of backing memory.
pub(super) fn check_window(offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(RegionError::OutOfRange { offset, len, size }),
    }
}
