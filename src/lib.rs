//! # cxlkv
//!
//! CXL memory as a first-class tier for LLM inference: a shared KV-cache pool on CXL (or emulated
//! CXL) memory, and a near-data device that scores attention keys where they live.
//! This crate is the top layer: it re-exports the member crates under one name and holds what the
//! command line renders ([`render`]); the `cxlkv` binary (src/main.rs, src/cli/) is the command
//! line. The layers below it, bottom-up: [`kernels`] and [`shm`] (the memory substrate), [`runtime`]
//! (the pool protocol and the device client), then [`tier`], [`sim`] and [`ndp`] (the device).
//! docs/ARCHITECTURE.md is the map.

pub mod render;

pub use cxlkv_decode as decode;
pub use cxlkv_kernels as kernels;
pub use cxlkv_model as model;
pub use cxlkv_ndp as ndp;
pub use cxlkv_runtime as runtime;
pub use cxlkv_shm as shm;
pub use cxlkv_sim as sim;
pub use cxlkv_tier as tier;
