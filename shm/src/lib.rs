//! # cxlkv-shm
//!
//! The memory substrate of cxlkv: how CXL memory (or what emulates it) is mapped and touched. It
//! knows nothing of the pool protocol; everything above it reaches shared bytes through the
//! [`SharedMemory`] trait defined here.
//!
//! Nearly all of the project's `unsafe` lives in this crate, each block with a `// SAFETY:` comment.
//! Nothing here hands out a Rust reference into memory another party writes.
//!
//! ## Modules
//!
//! - [`region`]: one [`Region`] per mapping (anonymous, `/dev/shm`, file, device DAX, fake DAX,
//!   NUMA-bound), chosen by a [`Backend`] spec (`shm:NAME`, `file:PATH`, `dax:/dev/daxX.Y`,
//!   `numa:N`). A region implements [`SharedMemory`].
//! - [`mem`]: [`SharedMemory`], the bounds-checked view: copies and 64-bit atomics by offset,
//!   `publish`/`acquire` for coherence, `raw_range` for zero-copy users that need an address.
//! - [`checksum`]: CRC-32C, and the copy out of shared memory that checksums what it copies in the
//!   same pass (AVX-512 VPCLMULQDQ folding over the copy's registers where the CPU has it), behind
//!   [`SharedMemory::read_checksummed`].
//! - [`cacheline`]: the CPU side of coherence: [`CoherenceMode`] (recorded in a pool), CLWB /
//!   CLFLUSHOPT / CLFLUSH write-back and invalidation chosen by CPUID, non-temporal streaming
//!   copies.
//! - [`topo`]: NUMA nodes, CXL candidates (CPU-less nodes with memory), DAX devices; `/sys` and,
//!   with the `hwloc` feature, the system libhwloc.
//! - [`futex`]: sleep and wake on a 32-bit word of shared memory (client and device on one host).
//! - [`time`]: the host's monotonic clock (`CLOCK_BOOTTIME`), for liveness watches.
//!
//! ## Common changes
//!
//! - **A new memory backend**: a [`Backend`] variant and its parser (`region/spec.rs`), its
//!   creation and opening in `Region::create` / `Region::open` (`region/map.rs`), and a case in
//!   `shm/tests/region_conformance.rs`, which every backend passes.
//! - **A new cache-maintenance instruction**: a [`cacheline::FlushKind`] variant, its detection in
//!   [`cacheline::detect`] and its line loop in [`cacheline::write_back`] /
//!   [`cacheline::invalidate`].

// Items are `pub` only where a user of the crate can reach them.
#![warn(unreachable_pub)]

pub mod cacheline;
pub mod checksum;
pub mod futex;
pub mod mem;
pub mod region;
pub mod time;
pub mod topo;

pub use cacheline::CoherenceMode;
pub use mem::{MemError, SharedMemory};
pub use region::{Backend, HugePages, Region, RegionOptions};
