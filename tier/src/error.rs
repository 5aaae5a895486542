//! Errors of the tiers.

use cxlkv_runtime::pool::PoolError;
use std::path::PathBuf;
use thiserror::Error;

/// Errors of the tiers.
#[derive(Debug, Error)]
pub enum TierError {
    /// The pool refused an operation.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A spill file operation failed.
    #[error("spill file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// An io_uring read or write transferred fewer bytes than asked (or failed: `result` < 0 is
    /// `-errno`).
    #[error("spill file {path}: I/O of {expected} bytes at offset {offset} returned {result}")]
    ShortIo {
        /// The file.
        path: PathBuf,
        /// File offset.
        offset: u64,
        /// Bytes asked.
        expected: usize,
        /// Kernel result.
        result: i32,
    },
    /// A payload larger than a spill record holds.
    #[error("payload of {len} bytes exceeds the spill record limit of {max} bytes")]
    TooLarge {
        /// Payload bytes.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The configuration cannot work.
    #[error("bad tier configuration: {0}")]
    BadConfig(String),
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, TierError>;
