//! # cxlkv-model
//!
//! A reference decoder: it loads a Llama-architecture (or Gemma 3, `gemma3.rs`) model from a GGUF
//! file and generates text
//! with a pluggable attention backend. It exists so that the KV cache the rest of cxlkv stores
//! and scores is a real model's, produced and consumed by a real forward pass, and so that a
//! backend keeping K/V in the cxlkv pool can be checked token for token against one keeping it
//! in private memory.
//!
//! ## What is read from the file
//!
//! [`Gguf`] checks the magic and reads the header with candle's GGUF reader. [`Config`] takes
//! every hyper-parameter from the `{arch}.*` metadata (layers, widths, heads, KV heads, RoPE
//! base and dimensions, RMSNorm epsilon, context length) and refuses what this crate does not
//! implement (another architecture, RoPE scaling) instead of running a different model.
//! [`Tokenizer`] is byte-level BPE built from `tokenizer.ggml.tokens` and `.merges`, with the
//! pre-tokenizer named by `tokenizer.ggml.pre` ([`PreTokenizer`]), or SentencePiece
//! (`tokenizer.ggml.model = llama`, `spm.rs`) from the tokens, scores and token types. The weights
//! ([`WeightFormat`]) are either dequantized to f32 at load (exact, the reference) or kept
//! quantized and multiplied by candle's quantized kernels (smaller, llama.cpp's arithmetic).
//!
//! ## The forward
//!
//! [`Model::forward`] runs a block of tokens at the positions after those the backend already
//! holds; one token is a decode step, many a prefill. Per layer: RMSNorm; Q, K, V projections;
//! RoPE in llama.cpp's "normal" mode (pairs `(2i, 2i+1)` in GGUF dimension order); the backend
//! stores K and V and computes causal grouped-query attention; the output projection joins the
//! residual; RMSNorm and the SwiGLU MLP join it again. A final RMSNorm and the output head (the
//! embedding table when the file ties them) give the logits. [`generate`] is greedy decoding on
//! top, with prefill and decode timed apart.
//!
//! ## The backend seam
//!
//! [`Attention`] is the only place K and V exist. The model calls `append(layer, k, v)` with the
//! new positions' keys and values head-major (`[kv_heads][t][head_dim]`, the layout of a typed
//! cxlkv pool block) and then `attend(layer, q, out)` with their queries token-major
//! (`[t][heads][head_dim]`); the backend owns storage, the GQA mapping and causality. [`Dense`]
//! is the reference: private memory, f32 or f16, exact softmax over every position.
//!
//! [`HostAttention`] is the one attention loop over rows the host holds: scores from
//! `cxlkv_kernels`' Q·K kernel, softmax and value sum from [`Partial`]. [`Dense`] runs it over its
//! private rows, and the pool backends of `cxlkv-decode` over the rows they read back, so a
//! backend that stores K/V elsewhere and reads them back gives the reference's outputs bit for
//! bit.
//!
//! [`Partial`] is the currency for splitting the work: the unnormalized output, the maximum score
//! and the sum of exponentials over a subset of keys. Partials over disjoint subsets merge by the
//! log-sum-exp rule into the exact result, which is how a backend combines the near-data
//! device's share (keys in the pool) with the host's (recent keys not yet published).
//!
//! ## Adding a backend
//!
//! This crate knows no backend names: attention modes (`dense`, `pool`, `ndp-exact`, ...) are
//! named, parsed and built in one place, the registry of `cxlkv-decode`, whose crate docs give
//! the five-step recipe for a new mode. On this side of the seam:
//!
//! 1. Implement [`Attention`] (see `attention/dense.rs`; [`attention::check_append`] and
//!    [`attention::check_attend`] validate the slices). Keep `len(layer)` the number of positions
//!    appended: the model derives positions from it and refuses layers that disagree.
//! 2. Compute attention over rows on the host with [`HostAttention`] (whole causal blocks with
//!    `causal`, one GQA group's share with `group`); where the keys live in several places,
//!    compute [`Partial`]s over each and [`Partial::merge`] them.
//! 3. Register it as a mode in `cxlkv-decode` (a name, its argument, a constructor); the command
//!    line (`cxlkv generate --attention NAME`, `cxlkv eval --modes`) picks it up from there.
//! 4. Check it against [`Dense`] on the real model: the tests in `model/tests/` compare keys,
//!    values and logits with tensors from an independent implementation (`data/kv/`), and
//!    `decode/tests/greedy.rs` compares greedy tokens mode by mode.
//!
//! ## Invariants
//!
//! - Nothing is specific to one model: every size comes from the file's metadata and is checked
//!   against the tensors' shapes before use.
//! - No panics on bad input: a missing file, a non-GGUF file, an unsupported architecture or
//!   tokenizer, an out-of-range token and a context beyond the model's are [`Error`]s.

pub mod attention;
mod config;
mod error;
mod gemma3;
mod generate;
mod gguf;
mod model;
mod ops;
mod pretokenize;
mod spm;
mod tokenizer;
mod weights;

pub use attention::{
    Attention, AttentionShape, AttentionStats, Dense, HeadRows, HostAttention, Partial,
};
pub use config::{Config, SUPPORTED_ARCHITECTURES};
pub use error::{Error, Result};
pub use generate::{argmax, generate, GenerationStats};
pub use gguf::Gguf;
pub use model::Model;
pub use pretokenize::PreTokenizer;
pub use tokenizer::{TokenStream, Tokenizer};
pub use weights::WeightFormat;
