//! The crate's error: one enum for loading, tokenizing and running a model, each variant carrying
//! the offending values.

use std::path::PathBuf;

/// What went wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file does not start with the GGUF magic, or its header is malformed.
    #[error("{path}: not a GGUF file ({reason})")]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },
    /// `general.architecture` names a model family this decoder does not implement.
    #[error("unsupported architecture {found:?} (supported: {supported})")]
    UnsupportedArchitecture {
        /// The architecture in the file.
        found: String,
        /// The ones this crate runs.
        supported: &'static str,
    },
    /// A required metadata key is absent.
    #[error("GGUF metadata key {0} is missing")]
    MissingMetadata(String),
    /// A metadata key has the wrong type or an impossible value.
    #[error("GGUF metadata key {key}: {reason}")]
    BadMetadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor the architecture needs is absent or has the wrong shape.
    #[error("tensor {name}: {reason}")]
    BadTensor {
        /// The tensor's GGUF name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The tokenizer kind or pre-tokenizer is not one this crate implements.
    #[error("unsupported tokenizer {found:?} (supported: {supported})")]
    UnsupportedTokenizer {
        /// `tokenizer.ggml.model` / `tokenizer.ggml.pre` as found.
        found: String,
        /// What this crate implements.
        supported: &'static str,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// More positions than the model was trained for.
    #[error("context of {requested} tokens exceeds the model's {max}")]
    ContextTooLong {
        /// Positions the request needs.
        requested: usize,
        /// `context_length` of the model (or the limit the caller set).
        max: usize,
    },
    /// Nothing to run.
    #[error("empty input: at least one token is needed")]
    EmptyInput,
    /// An attention backend failed or was given inconsistent input.
    #[error("attention backend {backend}: {reason}")]
    Attention {
        /// The backend's name.
        backend: String,
        /// What went wrong.
        reason: String,
    },
    /// A tensor operation in candle failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
