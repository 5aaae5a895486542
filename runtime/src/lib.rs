//! # cxlkv-runtime
//!
//! The pool protocol: how many processes and hosts share a KV-cache pool in CXL memory (or what
//! emulates it), and how they ask the near-data device for attention inputs. Memory itself comes
//! from `cxlkv-shm` (regions and the bounds-checked [`SharedMemory`] view); the kernels the host
//! fallback runs come from `cxlkv-kernels`. Tiers, the simulator, the device, the C ABI and the
//! command line build on this crate; it depends on none of them. The repository's
//! docs/ARCHITECTURE.md draws the whole map.
//!
//! ## Modules
//!
//! - [`api`]: what every front end shares: the result codes ([`api::Code`], the C ABI's and
//!   Python's numbers) and the one mapping from the runtime's errors to them ([`api::Failure`]).
//! - [`format`]: the on-memory format (superblock, participant slots, partition headers, index
//!   entries, block headers, typed KV layouts), its constants and CRCs; docs/FORMAT.md in prose.
//! - [`pool`]: [`Pool`], a formatted pool in some memory: create, open (validating the superblock),
//!   geometry, the index probe and optimistic validated reads shared by every reader.
//! - [`object`]: multi-block objects: payloads over one block stored as parts plus a manifest
//!   published last, so readers see them only whole ([`Participant::put`] makes them,
//!   [`Participant::put_if_absent`] skips keys any partition holds).
//! - [`participant`]: [`Participant`], one attached process: its slot and heartbeat, the claim of a
//!   partition and the takeover of a dead owner's, writes (put, reserve/commit, delete, eviction),
//!   and pins. Each participant writes only its own slot and its own partition.
//! - [`coherence`]: the protocol's named publish/acquire sites ([`coherence::Site`]); the memory
//!   decides what a site costs (fences, or cache-line write-back and invalidation).
//! - [`clock`]: the clock seam: a party's wall clock ([`Pool::now_ns`], stamps only) and its own
//!   monotonic clock ([`Pool::monotonic_ns`], which leases are measured on); the system clocks in
//!   production, a simulated per-host clock in `cxlkv-sim`.
//! - [`watch`]: liveness without a shared clock: holders advance a heartbeat counter, observers
//!   declare a holder dead once they watched it stand still for a lease on their own clock.
//! - [`key`] ([`Key`], [`KeyChain`]), [`kv`] (typed KV blocks: [`KvShape`], [`KvBlock`], chunking a
//!   sequence into blocks), [`check`] (`cxlkv pool check`), [`stats`], [`locate`] (finding a pool
//!   inside a larger file), [`hotness`] (access sketch and hotlists), [`policy`] (eviction policies
//!   shared by the pool, the tiers and trace replay).
//! - [`tenant`]: tenants inside one pool (format 3.2): the tenant table, [`Tenant`] (name and
//!   secret salt), tenant-scoped reads, quotas and per-tenant use.
//! - `sync`: the fences of the lock-free protocols, from loom under `--cfg loom`; `lockfree` (only
//!   then) hands the index-slot seqlock and the NDP ring steps to `tests/loom_models.rs`, which
//!   runs them on loom-backed memory.
//! - [`ndp`]: the device client: the ABI bindings generated from the one C header, the device area
//!   layout, command rings, requests (`SCORE_TOPK`, `GATHER`, ...) and the host fallback that
//!   computes the same answer when the device is absent or late.
//!
//! ## The path of a `get`
//!
//! [`Participant::get`] probes each partition's index at the key's home slot. The slot is a seqlock
//! (version, key, entry): the reader acquires it, copies the block header and payload into private
//! memory, checks key, generation and CRC-32C, and re-reads the version; only an unchanged version
//! returns the copy, otherwise it retries a bounded number of times and reports a miss. Readers never
//! write shared memory, except pins, which live in the reader's own slot.
//!
//! ## The path of a `SCORE_TOPK`
//!
//! [`ndp::NdpDevice::score_topk`] stages the queries in the client's partition, writes a command
//! into its submission ring in the device area and wakes the device; the device (crate
//! `cxlkv-ndp`) validates everything, pins each block, scans its keys in place with the kernels'
//! pruned scan and writes the result and a completion. The client decodes and validates the result,
//! or falls back to the same scan on the host.
//!
//! ## Where to make the common changes
//!
//! - A new coherence site: a [`coherence::Site`] variant, the `publish`/`acquire` call at the
//!   protocol point, a row in docs/COHERENCE.md and a simulator step that breaks without it.
//! - A new device command: the ABI header, then [`ndp`]'s request, result decoding and host
//!   fallback (the device side is in `cxlkv-ndp`).
//! - A format change: [`format`] and docs/FORMAT.md together, with a version bump.
//! - A new memory backend is not made here but in `cxlkv-shm`.
//!
//! Invariants: offsets, never addresses, in anything shared; every shared word that another party
//! reads concurrently is an atomic with a named ordering; no Rust reference points into memory
//! another party writes.

// Items are `pub` only where a user of the crate can reach them.
#![warn(unreachable_pub)]

pub mod api;
pub mod check;
pub mod clock;
pub mod coherence;
pub mod crosspod;
pub mod format;
pub mod hotness;
pub mod key;
pub mod kv;
pub mod locate;
#[cfg(loom)]
pub mod lockfree;
pub mod metrics;
pub mod ndp;
pub mod object;
pub mod participant;
pub mod policy;
pub mod pool;
mod read;
pub mod stats;
mod sync;
pub mod tenant;
pub mod watch;

pub use check::{check, CheckReport};
pub use cxlkv_shm::{mem, region, topo};
pub use format::{Codec, CoherenceMode};
pub use key::{Key, KeyChain};
pub use kv::{KvBlock, KvShape};
pub use mem::SharedMemory;
pub use object::Manifest;
pub use participant::{
    AttachOptions, Participant, ParticipantStats, PinnedBlock, PutOutcome, RawPin, RawReservation,
    Reservation, CRASH_SITES, OBJECT_CRASH_SITES,
};
pub use pool::{BlockInfo, BlockRef, Location, Pool, PoolConfig, PoolError};
pub use region::{Backend, HugePages, Region, RegionOptions};
pub use stats::{participant_counters, pool_stats, PoolStats};
pub use tenant::Tenant;
