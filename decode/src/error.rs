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
    /// The model's error.
    #[error(transparent)]
    Model(#[from] cxlkv_model::Error),
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;
