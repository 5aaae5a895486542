//! # cxlkv-kernels
//!
//! CPU kernels of the near-data attention path. They are the reference that every other
//! implementation (the device emulator, the HLS kernel, the CUDA kernels) is tested against.
//!
//! This crate knows nothing of pools or devices: it works on plain slices of keys, values and
//! queries. Element types are described by [`DType`]; half-precision values travel as raw `u16`
//! bit patterns so that callers never need a float16 crate.

pub mod dtype;

pub use dtype::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, DType};
