//! Memory regions: one owner per mapping.
//!
//! A [`Region`] owns exactly one mapping and unmaps it on drop. It is where pool memory comes from,
//! and it implements [`SharedMemory`](crate::mem::SharedMemory), so nothing outside this module and
//! [`crate::mem`] sees its address. The backends:
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
//! [`Access`] gives what a region creates its owner, group and mode, private (0600) by default,
//! with no moment where the file is open to more than asked ([`Region::create_with`]).
//!
//! Every backend that cannot work on this machine says why through [`RegionError::Unavailable`];
//! none falls back silently to another.
//!
//! ## Files
//!
//! - `access.rs`: [`Access`]: owner, group and mode of created files, the device-DAX check, user
//!   and group names.
//! - `spec.rs`: [`Backend`] and its spec strings, [`RegionOptions`], [`HugePages`].
//! - `error.rs`: [`RegionError`], [`Result`], and the window and alignment checks.
//! - `map.rs`: [`Region`]: creating, opening and mapping memory of every backend, and unmapping it.
//! - `dax.rs`: what a `dax:` path is (device DAX as sysfs describes it, or fake DAX), [`DAX_ALIGN`].
//! - `numa.rs`: NUMA node checks, `mbind` binding and page-placement verification.
//! - `huge.rs`: explicit huge pages (`MAP_HUGETLB`): reservation checks and mapping length.
//! - `shared.rs`: the [`SharedMemory`](crate::mem::SharedMemory) impl of [`Region`] and its
//!   coherence (fences, or cache-line write-back and invalidation).
//! - `sys.rs`: what the kernel reports (sysfs root, page size).
//! - `temp.rs`: [`TempBackend`], a backend removed when its guard is dropped (private and test
//!   pools).

mod access;
mod dax;
mod error;
mod huge;
mod map;
mod numa;
mod shared;
mod spec;
mod sys;
mod temp;

pub use access::{group_id, user_id, Access, PRIVATE_MODE};
pub use dax::DAX_ALIGN;
pub use error::{RegionError, Result};
pub use map::Region;
pub use spec::{Backend, HugePages, RegionOptions};
pub use temp::TempBackend;
