//! Attention on the GPU over K/V in GPU memory or in registered host memory, as partials that
//! equal the CPU ATTEND's ([`cxlkv_kernels::Partial`]) within rounding.
//!
//! A [`Pass`] holds the device buffers of one layer's attention (queries, block partials, merged
//! partials, a selection, the near-data device's partials) and launches the kernels without
//! waiting: a decode step enqueues one pass per layer and waits once ([`Pass::read`]).

use crate::device::Gpu;
use crate::error::{GpuError, Result};
use cudarc::driver::{CudaSlice, DevicePtr};
use cxlkv_kernels::{DType, Partial};
use std::marker::PhantomData;

/// Largest head dimension the kernels take (a multiple of 32 up to this).
pub const MAX_DIM: usize = 128;
/// Largest GQA group (queries per KV head).
pub const MAX_GROUP: usize = 8;
/// Rows of one head a thread block takes at least (the split-K chunk).
const MIN_CHUNK: usize = 256;
/// Chunks per head at most.
const MAX_CHUNKS: usize = 128;

/// The shape of one layer's K (or V): `heads` KV heads of `rows` rows of `dim` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    /// KV heads.
    pub heads: usize,
    /// Rows (tokens) per head.
    pub rows: usize,
    /// Head dimension.
    pub dim: usize,
    /// Element type: f16 or f32.
    pub dtype: DType,
}

impl KvShape {
    /// Checks the shape against what the kernels take.
    pub fn new(heads: usize, rows: usize, dim: usize, dtype: DType) -> Result<KvShape> {
        if !matches!(dtype, DType::F16 | DType::F32) {
            return Err(GpuError::Shape(format!(
                "the GPU kernels take f16 or f32 K/V, not {}",
                dtype.name()
            )));
        }
        if dim == 0 || dim > MAX_DIM || !dim.is_multiple_of(32) {
            return Err(GpuError::Shape(format!(
                "head dimension {dim}: the GPU kernels take multiples of 32 up to {MAX_DIM}"
            )));
        }
        if heads == 0 || heads > 65_535 || rows == 0 || rows > u32::MAX as usize {
            return Err(GpuError::Shape(format!(
                "{heads} heads of {rows} rows: need 1..=65535 heads and 1..=2^32-1 rows"
            )));
        }
        Ok(KvShape {
            heads,
            rows,
            dim,
            dtype,
        })
    }

    /// Bytes of all heads.
    pub fn bytes(&self) -> usize {
        self.dtype.bytes(self.heads * self.rows * self.dim)
    }
}

/// Where K/V rows live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// GPU memory (HBM).
    Device,
    /// Registered host memory, read over the link.
    Host,
}

/// Device addresses of one layer's K and V, borrowed from their owner ([`DeviceKv`] or
/// [`crate::RegisteredMemory`]).
#[derive(Clone, Copy, Debug)]
pub struct KvRows<'a> {
    pub(crate) k: u64,
    pub(crate) v: u64,
    pub(crate) shape: KvShape,
    pub(crate) place: Place,
    _owner: PhantomData<&'a ()>,
}

impl KvRows<'_> {
    pub(crate) fn host(k: u64, v: u64, shape: KvShape) -> KvRows<'static> {
        KvRows {
            k,
            v,
            shape,
            place: Place::Host,
            _owner: PhantomData,
        }
    }

    /// The shape.
    pub fn shape(&self) -> KvShape {
        self.shape
    }

    /// Where the rows live.
    pub fn place(&self) -> Place {
        self.place
    }
}

/// One layer's K/V copied into GPU memory.
pub struct DeviceKv {
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    shape: KvShape,
}

impl DeviceKv {
    /// Copies `k` and `v` (head-major, `shape.bytes()` each) into GPU memory.
    pub fn upload(gpu: &Gpu, shape: KvShape, k: &[u8], v: &[u8]) -> Result<DeviceKv> {
        if k.len() != shape.bytes() || v.len() != shape.bytes() {
            return Err(GpuError::Shape(format!(
                "K has {} and V {} bytes, the shape {shape:?} needs {}",
                k.len(),
                v.len(),
                shape.bytes()
            )));
        }
        let copy = |b: &[u8]| {
            gpu.stream
                .clone_htod(b)
                .map_err(|e| GpuError::cuda("cuMemcpyHtoD", e))
        };
        Ok(DeviceKv {
            k: copy(k)?,
            v: copy(v)?,
            shape,
        })
    }

    /// The rows, for a [`Pass`].
    pub fn rows(&self, gpu: &Gpu) -> KvRows<'_> {
        let (k, _sync) = self.k.device_ptr(&gpu.stream);
        let (v, _sync) = self.v.device_ptr(&gpu.stream);
        KvRows {
            k,
            v,
            shape: self.shape,
            place: Place::Device,
            _owner: PhantomData,
        }
    }
}

/// Which attention a [`Pass`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Every row: `dense` for rows in GPU memory, `pull` for rows in registered host memory.
    Full,
    /// Only the rows of the selection ([`Pass::set_selection`]): `gather`.
    Gather,
    /// Every row (the open block), merged with the near-data device's partials
    /// ([`Pass::set_device_partials`]): `merge`.
    Merge,
}

/// The buffers of one layer's attention for `heads × g` queries.
pub struct Pass {
    heads: usize,
    g: usize,
    dim: usize,
    scale: f32,
    q: CudaSlice<f32>,
    parts: CudaSlice<f32>,
    out: CudaSlice<f32>,
    selection: Option<(CudaSlice<u32>, usize, usize)>,
    device_parts: Option<(CudaSlice<f32>, usize)>,
}

/// Chunks per head and rows per chunk for `rows` rows.
fn split(rows: usize) -> (usize, usize) {
    let chunks = rows.div_ceil(MIN_CHUNK).clamp(1, MAX_CHUNKS);
    (chunks, rows.div_ceil(chunks))
}

impl Pass {
    /// Buffers for `heads` KV heads of `g` queries of dimension `dim`; `queries` holds
    /// `heads × g × dim` f32 (head-major), each score scaled by `scale`.
    pub fn new(
        gpu: &Gpu,
        heads: usize,
        g: usize,
        dim: usize,
        queries: &[f32],
        scale: f32,
    ) -> Result<Pass> {
        KvShape::new(heads, 1, dim, DType::F32)?;
        if g == 0 || g > MAX_GROUP {
            return Err(GpuError::Shape(format!(
                "GQA group {g}: the GPU kernels take 1..={MAX_GROUP} queries per KV head"
            )));
        }
        if queries.len() != heads * g * dim {
            return Err(GpuError::Shape(format!(
                "{} query values for {heads} heads × {g} queries × {dim}",
                queries.len()
            )));
        }
        let w = dim + 2;
        let alloc = |n: usize| {
            gpu.stream
                .alloc_zeros::<f32>(n)
                .map_err(|e| GpuError::cuda("cuMemAlloc", e))
        };
        Ok(Pass {
            heads,
            g,
            dim,
            scale,
            q: gpu
                .stream
                .clone_htod(queries)
                .map_err(|e| GpuError::cuda("cuMemcpyHtoD", e))?,
            parts: alloc(heads * MAX_CHUNKS * g * w)?,
            out: alloc(heads * g * w)?,
            selection: None,
            device_parts: None,
        })
    }

    /// The rows a [`Kind::Gather`] pass reads: `n` per head, head-major (`rows[h * n .. h * n + n]`),
    /// each below `limit` (the K/V rows per head it will read).
    pub fn set_selection(&mut self, gpu: &Gpu, rows: &[u32], limit: usize) -> Result<()> {
        let n = rows.len() / self.heads;
        if n == 0 || rows.len() != n * self.heads {
            return Err(GpuError::Shape(format!(
                "a selection of {} rows for {} heads: need the same positive count per head",
                rows.len(),
                self.heads
            )));
        }
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= limit) {
            return Err(GpuError::Shape(format!("selected row {bad} of {limit}")));
        }
        let d = gpu
            .stream
            .clone_htod(rows)
            .map_err(|e| GpuError::cuda("cuMemcpyHtoD", e))?;
        self.selection = Some((d, n, limit));
        Ok(())
    }

    /// The near-data device's partials for a [`Kind::Merge`] pass: `count` per query and head,
    /// laid out `[head][partial][query]`.
    pub fn set_device_partials(
        &mut self,
        gpu: &Gpu,
        parts: &[Partial],
        count: usize,
    ) -> Result<()> {
        if parts.len() != self.heads * count * self.g
            || parts.iter().any(|p| p.out.len() != self.dim)
        {
            return Err(GpuError::Shape(format!(
                "{} device partials: need {} heads × {count} × {} queries of dimension {}",
                parts.len(),
                self.heads,
                self.g,
                self.dim
            )));
        }
        let mut flat = Vec::with_capacity(parts.len() * (self.dim + 2));
        for p in parts {
            flat.extend_from_slice(&p.out);
            flat.push(p.max);
            flat.push(p.sum);
        }
        // A decode step sends new partials every layer: reuse the buffer when they fit.
        match &mut self.device_parts {
            Some((d, c)) if d.len() == flat.len() => {
                gpu.stream
                    .memcpy_htod(&flat, d)
                    .map_err(|e| GpuError::cuda("cuMemcpyHtoD", e))?;
                *c = count;
            }
            _ => {
                let d = gpu
                    .stream
                    .clone_htod(&flat)
                    .map_err(|e| GpuError::cuda("cuMemcpyHtoD", e))?;
                self.device_parts = Some((d, count));
            }
        }
        Ok(())
    }

    /// Enqueues the pass over `kv` (no wait).
    pub fn launch(&mut self, gpu: &Gpu, kv: &KvRows<'_>, kind: Kind) -> Result<()> {
        let s = kv.shape;
        if s.heads != self.heads || s.dim != self.dim {
            return Err(GpuError::Shape(format!(
                "K/V of {} heads × dim {} for a pass of {} heads × dim {}",
                s.heads, s.dim, self.heads, self.dim
            )));
        }
        let f16 = s.dtype == DType::F16;
        let name = match (kind, kv.place, f16) {
            (Kind::Gather, Place::Device, _) => {
                return Err(GpuError::Shape(
                    "gather reads registered host memory: register the K/V first".into(),
                ))
            }
            (Kind::Gather, Place::Host, true) => "cxlkv_gather_f16",
            (Kind::Gather, Place::Host, false) => "cxlkv_gather_f32",
            (_, Place::Device, true) => "cxlkv_dense_f16",
            (_, Place::Device, false) => "cxlkv_dense_f32",
            (_, Place::Host, true) => "cxlkv_pull_f16",
            (_, Place::Host, false) => "cxlkv_pull_f32",
        };
        let selection = match kind {
            Kind::Gather => {
                let (sel, n, limit) = self.selection.as_ref().ok_or_else(|| {
                    GpuError::Shape("a gather pass needs a selection (set_selection)".into())
                })?;
                if *limit > s.rows {
                    return Err(GpuError::Shape(format!(
                        "the selection indexes {limit} rows, the K/V has {}",
                        s.rows
                    )));
                }
                Some((sel, *n))
            }
            _ => None,
        };
        let device = match kind {
            Kind::Merge => Some(self.device_parts.as_ref().ok_or_else(|| {
                GpuError::Shape("a merge pass needs the device's partials".into())
            })?),
            _ => None,
        };
        let n = selection.map_or(s.rows, |(_, n)| n);
        let (chunks, chunk) = split(n);
        let args = crate::launch::AttendArgs {
            k: kv.k,
            v: kv.v,
            head_stride: (s.rows * s.dim) as u64,
            n: n as u32,
            dim: self.dim as u32,
            g: self.g as u32,
            scale: self.scale,
            chunk: chunk as u32,
            chunks: chunks as u32,
            heads: self.heads as u32,
        };
        let f = gpu.function(name)?;
        crate::launch::attend(
            gpu,
            f,
            &args,
            &self.q,
            selection.map(|s| s.0),
            &mut self.parts,
        )?;
        let m = gpu.function("cxlkv_merge")?;
        crate::launch::merge(
            gpu,
            m,
            (&self.parts, chunks as u32),
            device.map(|(d, c)| (d, *c as u32)),
            (self.dim as u32, self.g as u32, self.heads as u32),
            &mut self.out,
        )
    }

    /// Waits for the pass and returns its partials, `heads × g`, head-major.
    pub fn read(&self, gpu: &Gpu) -> Result<Vec<Partial>> {
        let flat = gpu
            .stream
            .clone_dtoh(&self.out)
            .map_err(|e| GpuError::cuda("cuMemcpyDtoH", e))?;
        // A copy into pageable memory is complete when the call returns; wait anyway, so the
        // partials are final whatever memory cudarc stages through.
        gpu.synchronize()?;
        Ok(flat
            .chunks_exact(self.dim + 2)
            .map(|c| Partial {
                out: c[..self.dim].to_vec(),
                max: c[self.dim],
                sum: c[self.dim + 1],
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_the_kernels_do_not_take_are_refused() {
        assert!(KvShape::new(8, 1024, 128, DType::F16).is_ok());
        assert!(KvShape::new(8, 1024, 64, DType::F32).is_ok());
        assert!(KvShape::new(8, 1024, 96, DType::F16).is_ok());
        for (h, r, d, t) in [
            (8, 1024, 256, DType::F16),
            (8, 1024, 80, DType::F16),
            (8, 1024, 128, DType::I8),
            (0, 1024, 128, DType::F16),
            (8, 0, 128, DType::F16),
        ] {
            assert!(KvShape::new(h, r, d, t).is_err(), "{h} {r} {d} {t:?}");
        }
    }

    #[test]
    fn the_split_covers_every_row_once() {
        for rows in [1, 255, 256, 257, 2048, 32_768, 131_072, 1_000_003] {
            let (chunks, chunk) = split(rows);
            assert!((1..=MAX_CHUNKS).contains(&chunks));
            assert!(
                chunks * chunk >= rows && (chunks - 1) * chunk < rows,
                "{rows}"
            );
        }
    }
}
