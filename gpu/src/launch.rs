//! Kernel launches: the one place where argument lists meet the CUDA C signatures of
//! gpu/kernels/attention.cu. Callers ([`crate::attention`], [`crate::link`]) check shapes, row
//! counts and selections first; each launch here states what its kernel then reads and writes.

use crate::device::Gpu;
use crate::error::{GpuError, Result};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

/// Threads per attention block: 4 warps (`WARPS` in the source).
const ATTEND_THREADS: u32 = 128;

/// The scalar arguments of an attend kernel (`cxlkv_{dense,pull,gather}_{f16,f32}`).
pub(crate) struct AttendArgs {
    pub k: u64,
    pub v: u64,
    pub head_stride: u64,
    pub n: u32,
    pub dim: u32,
    pub g: u32,
    pub scale: f32,
    pub chunk: u32,
    pub chunks: u32,
    pub heads: u32,
}

/// Launches an attend kernel: grid `chunks × heads`, writing `heads × chunks × g` partials of
/// `dim + 2` floats into `parts`.
pub(crate) fn attend(
    gpu: &Gpu,
    f: &CudaFunction,
    a: &AttendArgs,
    q: &CudaSlice<f32>,
    selection: Option<&CudaSlice<u32>>,
    parts: &mut CudaSlice<f32>,
) -> Result<()> {
    let need = a.heads as usize * a.chunks as usize * a.g as usize * (a.dim as usize + 2);
    if parts.len() < need || q.len() < (a.heads * a.g * a.dim) as usize {
        return Err(GpuError::Shape("attend buffers too small".into()));
    }
    let cfg = LaunchConfig {
        grid_dim: (a.chunks, a.heads, 1),
        block_dim: (ATTEND_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&a.k).arg(&a.v).arg(&a.head_stride);
    if let Some(sel) = selection {
        b.arg(sel);
    }
    b.arg(&a.n)
        .arg(&a.dim)
        .arg(&a.g)
        .arg(q)
        .arg(&a.scale)
        .arg(&a.chunk)
        .arg(parts);
    // SAFETY: the arguments follow the kernel's signature in order and type (two pointers, u64,
    // [u32 pointer for gather], u32 × 3, f32 pointer, f32, u32, f32 pointer). `k` and `v` address
    // `heads × head_stride` elements (device memory or a registered range, checked by their
    // owners); the kernel reads rows below `n` (or the selection's rows, checked below the K/V's
    // row count by `Pass::set_selection` and `Pass::launch`), `heads × g × dim` queries, and
    // writes `heads × chunks × g × (dim + 2)` floats, which `parts` holds (checked above).
    unsafe { b.launch(cfg) }
        .map(|_| ())
        .map_err(|e| GpuError::cuda("cuLaunchKernel", e))
}

/// Launches `cxlkv_merge`: grid `g × heads`, folding `a`'s and `b`'s partials per query into
/// `out` (`heads × g × (dim + 2)` floats).
pub(crate) fn merge(
    gpu: &Gpu,
    f: &CudaFunction,
    a: (&CudaSlice<f32>, u32),
    b: Option<(&CudaSlice<f32>, u32)>,
    (dim, g, heads): (u32, u32, u32),
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let w = (g * (dim + 2)) as usize * heads as usize;
    let fits = |s: &CudaSlice<f32>, c: u32| s.len() >= w * c as usize;
    if !fits(a.0, a.1) || b.is_some_and(|(s, c)| !fits(s, c)) || out.len() < w {
        return Err(GpuError::Shape("merge buffers too small".into()));
    }
    let cfg = LaunchConfig {
        grid_dim: (g, heads, 1),
        block_dim: (dim.min(128), 1, 1),
        shared_mem_bytes: 0,
    };
    let null = 0u64;
    let zero = 0u32;
    let mut l = gpu.stream.launch_builder(f);
    l.arg(a.0).arg(&a.1);
    match &b {
        Some((s, c)) => l.arg(*s).arg(c),
        None => l.arg(&null).arg(&zero),
    };
    l.arg(&dim).arg(&g).arg(out);
    // SAFETY: arguments in the order and types of `cxlkv_merge` (f32 pointer, u32, f32 pointer or
    // null, u32, u32, u32, f32 pointer); each list holds `heads × count × g × (dim + 2)` floats and
    // `out` `heads × g × (dim + 2)` (checked above); a null `b` comes with count 0.
    unsafe { l.launch(cfg) }
        .map(|_| ())
        .map_err(|e| GpuError::cuda("cuLaunchKernel", e))
}

/// Launches `cxlkv_stream` over `words` 16-byte words at device address `p`, one sum per block
/// into `sums` (`blocks` of them).
pub(crate) fn stream(
    gpu: &Gpu,
    f: &CudaFunction,
    p: u64,
    words: u64,
    blocks: u32,
    sums: &mut CudaSlice<u32>,
) -> Result<()> {
    if sums.len() < blocks as usize {
        return Err(GpuError::Shape("stream sums too small".into()));
    }
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&p).arg(&words).arg(sums);
    // SAFETY: `cxlkv_stream(const uint4 *, u64, u32 *)`: it reads `words × 16` bytes from `p`
    // (a registered range of at least that size, checked by the caller) and xors into
    // `sums[blockIdx.x]`, `blocks` of which exist (checked above).
    unsafe { l.launch(cfg) }
        .map(|_| ())
        .map_err(|e| GpuError::cuda("cuLaunchKernel", e))
}
