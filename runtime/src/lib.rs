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

pub mod check;
pub mod clock;
pub mod coherence;
pub mod format;
pub mod hotness;
pub mod key;
pub mod kv;
pub mod locate;
pub mod ndp;
pub mod participant;
pub mod policy;
pub mod pool;
pub mod stats;

pub use check::{check, CheckReport};
pub use cxlkv_shm::{mem, region, topo};
pub use format::{Codec, CoherenceMode};
pub use key::{Key, KeyChain};
pub use kv::{KvBlock, KvShape};
pub use mem::SharedMemory;
pub use participant::{
    AttachOptions, Participant, ParticipantStats, PinnedBlock, RawPin, RawReservation, Reservation,
    CRASH_SITES,
};
pub use pool::{BlockInfo, BlockRef, Location, Pool, PoolConfig, PoolError};
pub use region::{Backend, HugePages, Region, RegionOptions};
pub use stats::{pool_stats, PoolStats};
