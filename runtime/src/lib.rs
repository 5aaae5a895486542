//! # cxlkv-runtime
//!
//! The userspace runtime that turns CXL-attached memory (or DRAM that emulates it) into a shared
//! KV-cache pool.
//!
//! - [`region`]: one owner per mapping (anonymous, `/dev/shm`, file, device DAX, NUMA-bound).
//! - [`mem`]: [`SharedMemory`], the bounds-checked access every protocol path goes through; no Rust
//!   reference ever points into memory another party writes.
//!
//! Invariants: offsets, never addresses, in anything shared; every shared word that another party
//! reads concurrently is an atomic with a named ordering; every `unsafe` block says why it holds.

pub mod mem;
pub mod region;

pub use mem::SharedMemory;
pub use region::{Backend, HugePages, Region, RegionOptions};
