//! # cxlkv-bench-support
//!
//! Tooling for measuring the kernels and feeding them real data, kept out of the kernels library:
//!
//! - [`qk`]: the `cxlkv bench qk` harness, fused Q·K + top-k on cold keys beside a plain read of
//!   the same bytes ([`qk::run_qk_bench`]), and [`qk::synthetic_keys`] for the benches;
//! - [`cold`]: [`cold::evict`], which flushes a buffer from every cache level (`clflush`) so that
//!   a timed run reads memory, not a last-level cache;
//! - [`npy`]: a small `.npy` reader and writer for the real SmolLM2 tensors under `data/` that the
//!   demo, the golden-vector examples and the real-data tests load.
//!
//! The `cxlkv` command line uses it (`cxlkv bench qk`, the demo's real tensors), so unlike
//! `cxlkv-test-support` it is a normal crate; no library below the command line depends on it.

pub mod cold;
pub mod npy;
pub mod qk;
