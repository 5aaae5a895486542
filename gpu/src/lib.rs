//! cxlkv on a GPU: the pool's memory registered with CUDA, and attention kernels that read it
//! over the link.
//!
//! The near-data device of cxlkv sends a GPU only what attention needs: partials, selected rows,
//! indices. This crate is the GPU's side of that exchange, and the measure of the alternative
//! (the GPU pulling every row over the link):
//!
//! - [`Gpu`]: one device, its context and stream, the kernels compiled for it by NVRTC at run
//!   time ([`nvrtc`]: the CUDA C source, gpu/kernels/attention.cu, embedded in the crate).
//! - [`RegisteredMemory`]: a pool's mapping page-locked and mapped for the GPU
//!   (`cuMemHostRegister`), refused with the reason for backends Linux cannot pin
//!   ([`register::check_registrable`]).
//! - [`Pass`]: one layer's attention for the `G` queries of each KV head, as partials
//!   ([`cxlkv_kernels::Partial`]: unnormalized output, max, sum of exponentials), four ways:
//!   `dense` (K/V in GPU memory, the reference), `pull` (every row read in place from registered
//!   memory), `gather` (only the selected rows), and `merge` (the open block in GPU memory merged
//!   with the near-data device's partials by the log-sum-exp rule of `Partial::merge`).
//! - [`link`]: the host-to-GPU bandwidth, by copy and by a kernel reading in place.
//!
//! Invariants:
//! - **CUDA is loaded at run time** (cudarc's `dynamic-loading`): the crate builds and its tests
//!   run on machines without CUDA. [`Gpu::open`] says what is missing (no driver, no device, no
//!   NVRTC) instead of panicking; [`GpuError::is_no_gpu`] is how tests decide to skip.
//! - **Same math as the CPU ATTEND**: scores scaled before `exp`, partials unnormalized, merged by
//!   the log-sum-exp rule. Sums run in another order and `exp` is the GPU's, so results agree
//!   with `cxlkv_kernels` within rounding (tests/common states the tolerance), not bit for bit.
//!   The kernels' source also runs on the host under gpu/emu/cuda_shim.h (tests/emulated.rs), so
//!   their logic is tested on machines without a GPU.
//! - **Nothing the GPU reads is freed or unregistered under it**: [`RegisteredMemory`] holds the
//!   mapping and waits for the context before unregistering; K/V borrowed by a [`KvRows`] live at
//!   least as long.
//! - `unsafe` is written in two small modules: `sys` (dlopen, host registration, copies) and
//!   `launch` (kernel launches against the CUDA C signatures); [`register`] and [`link`] call
//!   three of `sys`'s unsafe functions, each call with the contract it keeps. Every block says
//!   why it is sound.

pub mod attention;
pub mod bench;
pub mod device;
pub mod error;
mod launch;
pub mod link;
pub mod nvrtc;
pub mod register;
mod sys;

pub use attention::{DeviceKv, Kind, KvRows, KvShape, Pass, Place};
pub use device::Gpu;
pub use error::{GpuError, Result};
pub use register::RegisteredMemory;
