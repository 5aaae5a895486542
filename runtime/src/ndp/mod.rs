//! The near-data-processing (NDP) device as the runtime sees it: its ABI, the checks both sides
//! apply to what they read, the result format both sides write, and the host client.
//!
//! The device lives next to the pool's memory and serves one queue pair per participant slot in
//! the pool's device area ([`abi`], generated from `ndp-emulator/include/cxlkv_ndp.h`; prose in
//! docs/ABI.md). A command names typed KV blocks by key and carries the offsets of an argument
//! buffer and a result buffer, both inside blocks of the submitter's own partition; the device
//! answers with the top-k `(token, score)` hits and, if asked, the selected value rows, so only
//! those bytes cross the link instead of every key.
//!
//! - [`layout`]: [`DeviceLayout`] (where the registers and queue pairs are, from the superblock
//!   alone), register and ring-index offsets, [`DeviceStatus`].
//! - [`queue`]: [`Ring`], the shared-memory steps of a submission or completion ring, for both
//!   ends (the client here, the device in `cxlkv-ndp`); the loom models run them.
//! - [`block`]: [`resolve_block`], the block validation both the device and the host fallback
//!   apply (header CRC and index sequence via [`crate::pool::Pool::block_ref`], the block's tenant
//!   against the reader's ([`Pool::reads_tenant`](crate::Pool::reads_tenant)), then the typed layout against the command, scales
//!   of a quantized block included), token lookup and the owned-buffer check.
//! - [`quant`]: scores, ATTEND and gathered rows over quantized (int8, int4) blocks: queries folded
//!   with each block's key scales, values weighted by their token scales, rows dequantized.
//! - [`result`]: [`encode_topk_result`] / [`decode_topk_result`], the result buffer format.
//! - [`select`]: SCORE_TOPK selection ([`Select`]: sinks, window, exclusion, top-p) and the mass
//!   each list leaves out, one streaming implementation for the device and the host.
//! - [`sparse`]: the sparse ATTEND (ATTEND with selection): the union of a group's lists, the
//!   mass it leaves out and the result format, for the device and the host.
//! - [`sketch`]: the sparse ATTEND over rows picked one by one: on the blocks' key sketches
//!   (score the sketch, re-score the best candidates exactly, attend the selection) and over
//!   quantized blocks, for the device and the host.
//! - [`client`]: [`NdpDevice`]: submit, poll, wait with a timeout, and the host fallback.
//!
//! The scan itself is not here: the device's engines and the host fallback all run the kernels'
//! block-wise scan ([`cxlkv_kernels::PrunedScan`]: visiting order, skip rule, exact pruning on the
//! stored per-head key bounds), so both paths return bit-identical results.
//!
//! Invariants: offsets, never addresses, cross the ABI; the device copies its arguments out of
//! shared memory before checking them; every shared ring index is an atomic with a named ordering.

#[allow(
    missing_docs,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
// Generated code: bindgen's `Default` for the register block zeroes it with `write_bytes`
// (sound: every field is an integer or an array of integers).
    clippy::undocumented_unsafe_blocks
)]
#[rustfmt::skip] // bindgen's output verbatim: the drift test compares it byte for byte.
pub mod abi;
pub mod block;
pub mod client;
pub mod layout;
pub mod quant;
pub mod queue;
pub mod result;
pub mod select;
pub mod sketch;
pub mod sparse;

pub use cxlkv_shm::futex::{wait as futex_wait, wake as futex_wake};

pub use block::{
    check_owned_range, gathered_dtype, locate_token, read_bounds, read_scales, read_sketch_scales,
    resolve_block, slot_tenant, sorted_ranges, BlockExpect, ResolvedBlock,
};
pub use client::{
    host_attend, host_attend_as, host_attend_with, host_gather, host_score_topk,
    host_score_topk_as, AttendRequest, Attended, BlockSpec, FallbackReason, NdpDevice, NdpError,
    NdpOptions, NdpPath, NdpStats, ScoreRequest, Select, Ticket, TopK,
};
pub use layout::{now_ns, qpi, reg, status_name, DeviceLayout, DeviceStatus, DEPTH};
pub use queue::Ring;
pub use result::{
    attend_result_size, block_mass, decode_attend_result, decode_list_info, decode_topk_result,
    encode_attend_result, encode_host_result, encode_list_info, encode_topk_result,
    topk_result_size, DecodedTopK, ScanStats,
};
