//! The results the cross-pod client counts ([`crate::crosspod`]): the `result` label of
//! `cxlkv_crosspod_write_backs_total` and `cxlkv_crosspod_publishes_total`. Defined here, below
//! both, so that the client can count into the metrics without a module circle. The counts are
//! the process's (one bridge per process environment): every [`super::Metrics`] snapshot shows them.

use std::sync::atomic::{AtomicU64, Ordering};

/// How a write-back of an evicted block ([`crate::crosspod::write_back`]), or a write-through
/// publish of put keys ([`crate::crosspod::on_put`]), ended. Every result but `Published` and
/// `Off` is a failure: the block was dropped as without the tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteBack {
    /// The bridge published the block before its space was reused.
    Published,
    /// The bridge answered but did not publish it (a store error, the block gone); its own
    /// metrics say why.
    NotPublished,
    /// The bridge's policy does not serve the request (for write-back `--publish on-put` or
    /// `never`; for write-through `on-eviction` or `never`): not a failure.
    Off,
    /// No bridge listens on the socket.
    NoBridge,
    /// The bridge did not answer within the write-back timeout.
    Timeout,
    /// The bridge answered something else than `ok N` or `off`.
    BadAnswer,
    /// Not asked: a bridge timed out shortly before, so evictions do not wait on it for a while.
    Quiet,
    /// Not asked: the asynchronous publish queue was full (write-through only).
    Dropped,
}

impl WriteBack {
    /// Every result, in label order.
    pub const ALL: [WriteBack; 8] = [
        WriteBack::Published,
        WriteBack::NotPublished,
        WriteBack::Off,
        WriteBack::NoBridge,
        WriteBack::Timeout,
        WriteBack::BadAnswer,
        WriteBack::Quiet,
        WriteBack::Dropped,
    ];

    /// The `result` label's value.
    pub fn name(self) -> &'static str {
        match self {
            WriteBack::Published => "published",
            WriteBack::NotPublished => "not_published",
            WriteBack::Off => "off",
            WriteBack::NoBridge => "no_bridge",
            WriteBack::Timeout => "timeout",
            WriteBack::BadAnswer => "bad_answer",
            WriteBack::Quiet => "quiet",
            WriteBack::Dropped => "dropped",
        }
    }
}

static WRITE_BACKS: [AtomicU64; WriteBack::ALL.len()] =
    [const { AtomicU64::new(0) }; WriteBack::ALL.len()];
static PUBLISHES: [AtomicU64; WriteBack::ALL.len()] =
    [const { AtomicU64::new(0) }; WriteBack::ALL.len()];

/// Counts one write-back of an evicted block that ended with `result`.
pub fn record_write_back(result: WriteBack) {
    WRITE_BACKS[result as usize].fetch_add(1, Ordering::Relaxed);
}

/// Counts `n` put keys whose write-through publish ended with `result`.
pub fn record_publish(result: WriteBack, n: u64) {
    PUBLISHES[result as usize].fetch_add(n, Ordering::Relaxed);
}

fn counts(of: &[AtomicU64]) -> Vec<(WriteBack, u64)> {
    WriteBack::ALL
        .iter()
        .zip(of)
        .map(|(&r, n)| (r, n.load(Ordering::Relaxed)))
        .collect()
}

/// The process's write-backs by result, in [`WriteBack::ALL`] order.
pub fn write_backs() -> Vec<(WriteBack, u64)> {
    counts(&WRITE_BACKS)
}

/// The process's write-through publishes by result, in [`WriteBack::ALL`] order.
pub fn publishes() -> Vec<(WriteBack, u64)> {
    counts(&PUBLISHES)
}
