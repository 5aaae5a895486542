//! Errors of the NDP client and why a command ran on the host instead of the device.

use crate::ndp::layout::DeviceStatus;
use thiserror::Error;

/// Errors of the NDP client.
#[derive(Debug, Error)]
pub enum NdpError {
    /// A pool access failed.
    #[error(transparent)]
    Pool(#[from] crate::pool::PoolError),
    /// A memory access failed.
    #[error(transparent)]
    Mem(#[from] cxlkv_shm::mem::MemError),
    /// The device rejected the command (the request itself is wrong: the host path would fail too).
    #[error(transparent)]
    Device(#[from] DeviceStatus),
    /// The request is malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// This participant has no queue pair (its slot number is beyond the device area's room).
    #[error("participant {participant} has no queue pair (the device serves {queue_pairs})")]
    NoQueuePair {
        /// The participant.
        participant: u32,
        /// Queue pairs in the device area.
        queue_pairs: u32,
    },
    /// The device did not answer a command that has no host fallback (NOP, HOTLIST, ...).
    #[error("device unavailable: {0:?}")]
    Unavailable(FallbackReason),
    /// A block kept changing while the host scanned it.
    #[error("block {0} kept changing during the host scan")]
    Stale(usize),
    /// The device's result did not decode.
    #[error("malformed result from the device ({0} bytes)")]
    BadResult(u64),
    /// Unknown ticket.
    #[error("unknown ticket {0}")]
    UnknownTicket(u64),
}

/// Result alias of the client.
pub type Result<T> = std::result::Result<T, NdpError>;

/// Why a command ran on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackReason {
    /// No device registers (magic or ABI version missing).
    Absent,
    /// The device's heartbeat is stale.
    Dead,
    /// The command did not complete within the timeout.
    Timeout,
    /// The submission ring or every staging buffer is busy.
    Busy,
    /// Arguments and result do not fit one staging block.
    TooLarge,
    /// The device reported that a block changed under its scan, or that it restarted.
    DeviceRetry,
    /// The caller asked for the host path.
    Forced,
    /// The device lacks the capability the command needs (ATTEND, SCORE_TOPK selection).
    Unsupported,
}
