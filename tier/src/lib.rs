//! # cxlkv-tier
//!
//! Tiers: process-local DRAM ↔ the shared CXL pool ↔ SSD spill files.
//!
//! [`Tiers`] manages one participant's partition as the middle tier:
//! - **DRAM** ([`dram::DramCache`]): replicas of hot pool blocks, promoted when their hotness
//!   ([`cxlkv_runtime::hotness::Hotness::heat`]: local gets, device scans, attention mass) reaches a threshold;
//!   lock-free reads, epoch-based reclamation.
//! - **Pool**: the participant's partition, holding at most `pool_blocks` blocks chosen by a
//!   pluggable [`cxlkv_runtime::policy`] (the same code the trace simulator runs).
//! - **SSD** ([`spill::SpillFile`]): blocks demoted from the pool, one spill file per partition,
//!   io_uring with `O_DIRECT` and up to a queue depth of reads or writes in flight, LZ4 where it
//!   saves space.
//!
//! Invariant: a block lives in exactly one of pool and SSD; the DRAM cache may hold a replica of a
//! pool block with the same bytes. [`Tiers::get`] looks in DRAM, then the pool, then SSD. Moves
//! happen in [`Tiers::step`], bounded by a budget per call, from a background thread
//! ([`Tiers::spawn`]) or inline (trace replay, which needs determinism). A move writes the block to
//! its new tier before removing it from the old one, so a crash between the two leaves a
//! duplicate, never a loss; [`Tiers::open`] resolves duplicates (the pool copy wins, the SSD
//! record is forgotten) and the spill file's own recovery scan discards torn records.
//!
//! ## Layers
//!
//! This crate sits above `cxlkv-runtime` (the pool protocol) and below the `cxlkv` binary; nothing
//! in the runtime depends on it. [`replay`] drives a real pool with real tiers from a KV-cache
//! access trace (Mooncake's format) and reports data; the command line renders it.
//!
//! - [`tiers`]: [`Tiers`], the moves and their crash rules; [`dram`], [`spill`] (spill-file
//!   format, recovery), [`uring`] (io_uring with registered buffers and `O_DIRECT`).
//! - [`durability`]: the [`SyncPolicy`] of a spill file (`none`, `on-batch`, `always`), the
//!   order of its writes and syncs, what each policy promises against a process crash and a
//!   power loss, and the crash points of a spill.
//! - `record`: a spill record's header, versions and decoding (re-exported by [`spill`]).
//! - `slots`: the id ↔ policy-slot map shared by the tiers and both replay drivers.
//!
//! A new eviction policy goes into `cxlkv_runtime::policy` (the pool, the tiers and the replay
//! all run the same code); a new tier is a new [`Tier`] variant with its moves in [`Tiers::step`].

pub mod dram;
pub mod durability;
pub mod error;
mod record;
pub mod replay;
mod slots;
pub mod spill;
pub mod tiers;
pub mod uring;

pub use dram::DramCache;
pub use durability::{SyncPolicy, SPILL_CRASH_SITES};
pub use error::{Result, TierError};
pub use spill::{SpillFile, SpillOptions, SpillRecovery, SpillStats};
pub use tiers::{
    FaultPoint, StepReport, Tier, TierConfig, TierRecovery, TierStats, TieringThread, Tiers,
};
