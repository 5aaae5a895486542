//! Errors of the decoding backends.

use thiserror::Error;

/// A decoding backend's error.
#[derive(Debug, Error)]
pub enum Error {
    /// A mode string that does not parse.
    #[error("attention mode {found:?}: {why}")]
    Mode {
        /// What the user wrote.
        found: String,
        /// What is wrong with it.
        why: String,
    },
    /// The pool could not be created, opened or attached, or is too small for the run.
    #[error("{0}")]
    Setup(String),
    /// The near-data device could not be started or reached.
    #[error("device: {0}")]
    Device(String),
    /// The model's error.
    #[error(transparent)]
    Model(#[from] cxlkv_model::Error),
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;
