//! The host side of the NDP device: [`NdpDevice`] submits commands on the queue pair of its
//! participant slot, polls for completions (spinning briefly, then sleeping on a futex that the
//! device wakes), and falls back to scanning on the host with the same kernels when the device is
//! absent, dead, slow or busy — so a caller always gets the same answer, and the stats say which
//! path produced it and how many bytes crossed the link.
//!
//! - [`error`]: [`NdpError`] and [`FallbackReason`].
//! - [`request`]: [`ScoreRequest`] (with its [`Select`]ion), [`AttendRequest`], [`BlockSpec`],
//!   the answers [`TopK`] and [`Attended`] and their [`NdpStats`], [`NdpOptions`].
//! - [`ring`]: [`NdpDevice`] and its queue pair (staging buffers, submission, completion, waits).
//! - [`commands`]: SCORE_TOPK and ATTEND (submit, poll, wait, fallback) and the other commands.
//! - [`fallback`]: the host path ([`host_score_topk`], [`host_attend`], [`host_gather`]), which
//!   reads as a tenant ([`host_score_topk_as`], [`host_attend_as`]) and refuses another tenant's
//!   blocks as the device does.

pub mod commands;
pub mod error;
pub mod fallback;
mod host_rows;
pub mod request;
pub mod ring;

pub use error::{FallbackReason, NdpError, Result};
pub use fallback::{
    host_attend, host_attend_as, host_attend_with, host_gather, host_score_topk,
    host_score_topk_as, HOST_META_BYTES_PER_BLOCK,
};
pub use request::{
    AttendRequest, Attended, BlockSpec, NdpOptions, NdpPath, NdpStats, ScoreRequest, Select,
    Sparse, TopK,
};
pub use ring::{NdpDevice, Ticket};
