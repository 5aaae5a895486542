//! The link between host (or CXL) memory and the GPU, measured: a `cuMemcpyHtoD` of page-locked
//! memory (the DMA engines) and a kernel streaming registered memory in place (what `pull` and
//! `gather` read through).

use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::register::RegisteredMemory;
use cudarc::driver::DevicePtrMut;
use cxlkv_runtime::{Region, SharedMemory};
use std::sync::Arc;
use std::time::Instant;

/// Host-to-GPU bandwidth, best of the repeats.
#[derive(Clone, Copy, Debug)]
pub struct LinkBandwidth {
    /// Bytes moved per measurement.
    pub bytes: u64,
    /// `cuMemcpyHtoD` from page-locked memory, bytes/s.
    pub copy_bytes_per_s: f64,
    /// A kernel reading registered memory in place, bytes/s.
    pub kernel_bytes_per_s: f64,
}

/// Measures both over `bytes` of registered anonymous memory (rounded up to 16 bytes).
pub fn measure(gpu: &Gpu, bytes: u64, repeats: usize) -> Result<LinkBandwidth> {
    let bytes = bytes.div_ceil(16).max(1) * 16;
    let region = Arc::new(Region::anonymous(bytes).map_err(|e| GpuError::Shape(e.to_string()))?);
    region
        .fill(0, bytes, 0x5a)
        .map_err(|e| GpuError::Shape(e.to_string()))?;
    let base = region
        .raw_range(0, bytes)
        .map_err(|e| GpuError::Shape(e.to_string()))?
        .ok_or_else(|| GpuError::Shape("anonymous region without an address".into()))?;
    let reg = RegisteredMemory::region(gpu, region.clone())?;
    let mut dst = gpu
        .stream
        .alloc_zeros::<u8>(bytes as usize)
        .map_err(|e| GpuError::cuda("cuMemAlloc", e))?;
    let mut copy = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let (d, _sync) = dst.device_ptr_mut(&gpu.stream);
        gpu.synchronize()?;
        gpu.ctx
            .bind_to_thread()
            .map_err(|e| GpuError::cuda("cuCtxSetCurrent", e))?;
        let t = Instant::now();
        // SAFETY: `base` maps `bytes` bytes held by `region`; `d` is a device buffer of `bytes`
        // bytes; the context is current (bound by the stream's allocation above).
        unsafe { crate::sys::copy_to_device(d, base, bytes as usize) }?;
        copy = copy.min(t.elapsed().as_secs_f64());
    }
    let f = gpu.function("cxlkv_stream")?;
    let blocks = 1024u32;
    let mut sums = gpu
        .stream
        .alloc_zeros::<u32>(blocks as usize)
        .map_err(|e| GpuError::cuda("cuMemAlloc", e))?;
    let p = reg.device_addr(0, bytes)?;
    let mut kernel = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        gpu.synchronize()?;
        let t = Instant::now();
        crate::launch::stream(gpu, f, p, bytes / 16, blocks, &mut sums)?;
        gpu.synchronize()?;
        kernel = kernel.min(t.elapsed().as_secs_f64());
    }
    Ok(LinkBandwidth {
        bytes,
        copy_bytes_per_s: bytes as f64 / copy,
        kernel_bytes_per_s: bytes as f64 / kernel,
    })
}
