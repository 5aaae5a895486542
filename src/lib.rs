//! # cxlkv
//!
//! CXL memory as a first-class tier for LLM inference: a shared KV-cache pool on CXL (or emulated
//! CXL) memory, and a near-data device that scores attention keys where they live.
//! This facade re-exports the member crates; the `cxlkv` binary is the command line.

pub mod render;

pub use cxlkv_kernels as kernels;
pub use cxlkv_model as model;
pub use cxlkv_ndp as ndp;
pub use cxlkv_runtime as runtime;
pub use cxlkv_shm as shm;
pub use cxlkv_sim as sim;
pub use cxlkv_tier as tier;
