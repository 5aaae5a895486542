//! A pool's mapping registered with CUDA: page-locked and mapped into the GPU's address space,
//! so that kernels read K/V rows in place over the link (docs/C-ABI.md, "Registering the pool with
//! a GPU", is the same recipe in C).
//!
//! Registration pins every page of the range for as long as it is registered, which Linux allows
//! only for memory whose pages cannot move under a DMA: anonymous memory, shared-memory files
//! (`shm:`, `numa:`), hugetlbfs and device DAX. Page-cache mappings of disk files (`file:`, and
//! fake DAX, a regular file behind `dax:`) are refused here, before CUDA is asked, with the reason.

use crate::device::Gpu;
use crate::error::{GpuError, Result};
use cudarc::driver::CudaContext;
use cxlkv_kernels::DType;
use cxlkv_runtime::{Backend, Pool, Region, SharedMemory};
use std::sync::Arc;

/// Whether memory on `backend` can be registered; `Err` says why not. `None` (a pool whose backend
/// is not known, e.g. opened from a bare region) is refused: registering it could pin a page-cache
/// mapping.
pub fn check_registrable(backend: Option<&Backend>) -> Result<()> {
    let refuse = |b: String, why| Err(GpuError::Unregistrable { backend: b, why });
    match backend {
        None => refuse(
            "memory of unknown backend".into(),
            "open the pool with Pool::open_on or create it on a backend so that its kind is known",
        ),
        Some(Backend::Anonymous | Backend::Shm(_) | Backend::Numa { .. }) => Ok(()),
        Some(b @ Backend::Dax(p)) => {
            use std::os::unix::fs::FileTypeExt;
            let char_dev = std::fs::metadata(p).is_ok_and(|m| m.file_type().is_char_device());
            if char_dev {
                Ok(())
            } else {
                refuse(
                    b.to_string(),
                    "fake DAX is a page-cache mapping of a regular file, which Linux refuses to \
                     pin long-term; use shm:, numa: or a device-DAX device",
                )
            }
        }
        Some(b @ Backend::File(_)) => refuse(
            b.to_string(),
            "a file mapping's pages belong to the page cache, which Linux refuses to pin \
             long-term; use shm:, numa: or a device-DAX device",
        ),
    }
}

/// A mapping registered with CUDA; unregistered on drop. Holds the memory so that the mapping
/// outlives the registration.
pub struct RegisteredMemory {
    _mem: Arc<dyn SharedMemory>,
    ctx: Arc<CudaContext>,
    base: *mut u8,
    len: u64,
    device: u64,
}

impl RegisteredMemory {
    /// Registers the whole mapping of `pool`.
    pub fn pool(gpu: &Gpu, pool: &Pool) -> Result<RegisteredMemory> {
        check_registrable(pool.backend())?;
        Self::register(gpu, pool.memory().clone())
    }

    /// Registers the whole of `region` (a scratch region the benches fill).
    pub fn region(gpu: &Gpu, region: Arc<Region>) -> Result<RegisteredMemory> {
        check_registrable(Some(region.backend()))?;
        Self::register(gpu, region)
    }

    fn register(gpu: &Gpu, mem: Arc<dyn SharedMemory>) -> Result<RegisteredMemory> {
        let len = mem.size();
        let base = mem
            .raw_range(0, len)
            .map_err(|e| GpuError::Shape(e.to_string()))?
            .ok_or(GpuError::Unregistrable {
                backend: "memory without a stable address".into(),
                why: "only mapped memory can be registered (not a simulator's)",
            })?;
        let size = usize::try_from(len).map_err(|_| GpuError::Shape("mapping too large".into()))?;
        gpu.ctx
            .bind_to_thread()
            .map_err(|e| GpuError::cuda("cuCtxSetCurrent", e))?;
        // SAFETY: `mem` owns the mapping `[base, base + len)` and is kept in the returned value,
        // which unregisters the range in `Drop` before releasing it.
        let device = unsafe { crate::sys::register(base, size) }?;
        Ok(RegisteredMemory {
            _mem: mem,
            ctx: gpu.ctx.clone(),
            base,
            len,
            device,
        })
    }

    /// Bytes registered.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True if nothing is registered (a zero-sized mapping).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of `[offset, offset + len)`, bounds-checked.
    pub fn device_addr(&self, offset: u64, len: u64) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.device + offset),
            _ => Err(GpuError::Shape(format!(
                "range {offset}+{len} outside the registered {} bytes",
                self.len
            ))),
        }
    }

    /// K/V of `heads` KV heads, `rows` rows of `dim` elements each, stored head-major at `k` and
    /// `v` (byte offsets in the mapping, multiples of 16), as kernels read them in place over the
    /// link.
    pub fn kv(
        &self,
        k: u64,
        v: u64,
        heads: usize,
        rows: usize,
        dim: usize,
        dtype: DType,
    ) -> Result<crate::KvRows<'_>> {
        let shape = crate::attention::KvShape::new(heads, rows, dim, dtype)?;
        // The kernels read a row slice per lane with one vector load of up to 16 bytes.
        if !k.is_multiple_of(16) || !v.is_multiple_of(16) {
            return Err(GpuError::Shape(format!(
                "K at {k} and V at {v}: the kernels need 16-byte-aligned offsets"
            )));
        }
        let bytes = shape.bytes() as u64;
        Ok(crate::KvRows::host(
            self.device_addr(k, bytes)?,
            self.device_addr(v, bytes)?,
            shape,
        ))
    }
}

impl Drop for RegisteredMemory {
    fn drop(&mut self) {
        // Kernels still reading the range would fault: wait for them first.
        let _ = self.ctx.synchronize();
        // SAFETY: `base` was registered by `register` and the context is idle.
        if let Err(e) = unsafe { crate::sys::unregister(self.base) } {
            eprintln!("cxlkv-gpu: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_cache_mappings_are_refused_with_the_reason() {
        let e = check_registrable(Some(&Backend::File("/tmp/pool".into()))).unwrap_err();
        assert!(e.to_string().contains("file:/tmp/pool") && e.to_string().contains("page cache"));
        let dir = std::env::temp_dir().join(format!("cxlkv-gpu-fakedax-{}", std::process::id()));
        std::fs::write(&dir, b"x").unwrap();
        let e = check_registrable(Some(&Backend::Dax(dir.clone()))).unwrap_err();
        std::fs::remove_file(&dir).unwrap();
        assert!(e.to_string().contains("fake DAX"), "{e}");
        assert!(check_registrable(None).is_err());
        for ok in [
            Backend::Anonymous,
            Backend::Shm("p".into()),
            Backend::Numa {
                node: 1,
                name: "p".into(),
            },
        ] {
            assert!(check_registrable(Some(&ok)).is_ok(), "{ok}");
        }
    }
}
