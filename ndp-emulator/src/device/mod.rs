//! The device model: serves every participant's queue pair from next to the pool's memory.
//!
//! [`Device::start`] claims the device area (bumping the generation, failing every command a
//! previous instance left pending without running it), then runs `workers` threads, each serving a
//! fixed subset of the queue pairs, and one housekeeping thread (heartbeat, hotlist epochs).
//! A worker spins for a short while after its last command and then sleeps on the doorbell futex.
//!
//! The device trusts nothing it reads. A command is copied out of its ring slot before any check;
//! ring indices, opcodes, flags, k, G, dim, dtype, lengths and offsets are range-checked with
//! checked arithmetic; argument and result buffers must lie inside one block of a partition the
//! submitting participant owns; every named block goes through [`cxlkv_runtime::ndp::resolve_block`] (header CRC,
//! index sequence, the block's tenant against the submitting slot's, typed layout against the
//! command), in the control path both engines share. Keys are scanned in place only while the
//! device holds a pin on their block (its own read-only participant slot), so their owner cannot
//! reuse or rewrite them mid-scan; value rows are copied out and every block is re-validated with
//! [`cxlkv_runtime::Pool::still_valid`] after the command, the results being discarded if one changed. A bad command
//! completes with an error code and the device keeps serving; a panic in a handler becomes
//! `CXLKV_NDP_ERR_INTERNAL`.
//!
//! - [`config`]: [`DeviceConfig`] and [`DeviceError`].
//! - [`model`]: [`Device`], its state and start, and the [`DeviceHandle`] that stops it.
//! - [`worker`]: the worker loop (ring indices, sleep on the doorbell, completions) and the
//!   housekeeping thread (heartbeat, hotlist epochs).
//! - [`commands`]: command decoding and validation, and GATHER, BUILD_BOUNDS and HOTLIST.
//! - [`scan`]: SCORE_TOPK, the kernels' block-wise scan over pinned blocks with either engine.
//! - [`attend`]: ATTEND (fused attention over pinned K and V) and SCORE_TOPK's selection scan
//!   (Rust engine).
//! - [`hotlist`]: per-block scan heat.
//! - [`metrics`]: the device's Prometheus metrics (counters and per-opcode latency histograms).

pub mod attend;
pub mod commands;
pub mod config;
pub mod hotlist;
pub mod metrics;
pub mod model;
pub mod scan;
pub mod sparse;
pub mod worker;

pub use config::{DeviceConfig, DeviceError};
pub use hotlist::hot_key;
pub use model::{Device, DeviceHandle};
