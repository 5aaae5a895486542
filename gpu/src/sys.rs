//! The unsafe edge: loading NVRTC from a path, and registering host memory with the CUDA driver
//! (`cuMemHostRegister`, `cuMemHostGetDevicePointer`, `cuMemHostUnregister`). Everything else in
//! the crate goes through cudarc's safe API or [`crate::launch`].

use crate::error::{GpuError, Result};
use cudarc::driver::sys;
use std::ffi::CString;
use std::path::Path;

/// True if the CUDA driver library can be loaded. cudarc panics on its first driver call when it
/// cannot load the library: ask first.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries `dlopen` on the driver library's names; loading libcuda runs no code of
    // ours and the handle is dropped again.
    unsafe { sys::is_culib_present() }
}

/// True if NVRTC can be loaded by cudarc (by one of its library names).
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: as [`driver_present`], for libnvrtc.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Loads the NVRTC library at `path` for the life of the process (`RTLD_GLOBAL`), so that
/// cudarc's `dlopen` by soname (`libnvrtc.so.12`) finds it already loaded.
pub(crate) fn preload(path: &Path) -> Result<()> {
    let fail = |detail: String| GpuError::NoNvrtc {
        tried: Some(path.to_path_buf()),
        detail,
    };
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| fail("CXLKV_NVRTC holds a NUL byte".into()))?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call. The handle is deliberately
    // never closed: cudarc keeps function pointers into the library for the process's life.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a NUL-terminated message owned by libc (or NULL), read at once.
        let e = unsafe { libc::dlerror() };
        let why = if e.is_null() {
            "dlopen failed".to_string()
        } else {
            // SAFETY: non-NULL, NUL-terminated, valid until the next dl* call on this thread.
            unsafe { std::ffi::CStr::from_ptr(e) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(fail(format!("CXLKV_NVRTC={}: {why}", path.display())));
    }
    Ok(())
}

/// Page-locks `[base, base + len)` and maps it for device access: `DEVICEMAP | PORTABLE`, plus
/// `READ_ONLY` (the GPU only reads the pool; the driver may then skip write permission) where the
/// driver takes it, else without. Returns the device address of `base`.
///
/// # Safety
/// `[base, base + len)` must be a mapping that stays mapped until [`unregister`] is called on
/// `base` (the caller holds the mapping's owner).
pub(crate) unsafe fn register(base: *mut u8, len: usize) -> Result<u64> {
    let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
    let p = base.cast::<std::ffi::c_void>();
    // SAFETY: the caller keeps the range mapped; the driver only pins and maps its pages.
    let mut r =
        unsafe { sys::cuMemHostRegister_v2(p, len, flags | sys::CU_MEMHOSTREGISTER_READ_ONLY) };
    if r == sys::CUresult::CUDA_ERROR_NOT_SUPPORTED || r == sys::CUresult::CUDA_ERROR_INVALID_VALUE
    {
        // SAFETY: as above; drivers or devices without read-only registration.
        r = unsafe { sys::cuMemHostRegister_v2(p, len, flags) };
    }
    r.result()
        .map_err(|e| GpuError::cuda("cuMemHostRegister", e))?;
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: `dev` is a valid out-parameter; `p` was registered just above.
    let g = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) };
    if let Err(e) = g.result() {
        // SAFETY: `p` was registered above and nothing uses the mapping yet.
        let _ = unsafe { sys::cuMemHostUnregister(p) };
        return Err(GpuError::cuda("cuMemHostGetDevicePointer", e));
    }
    Ok(dev)
}

/// Undoes [`register`].
///
/// # Safety
/// `base` was registered by [`register`] and no kernel reading it is still running.
pub(crate) unsafe fn unregister(base: *mut u8) -> Result<()> {
    // SAFETY: per the contract, `base` is a registered range no kernel uses any more.
    unsafe { sys::cuMemHostUnregister(base.cast()) }
        .result()
        .map_err(|e| GpuError::cuda("cuMemHostUnregister", e))
}

/// NVRTC's version, `(major, minor)`; the library must be loadable ([`crate::nvrtc::ensure_nvrtc`]).
pub(crate) fn nvrtc_version() -> Option<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-parameters; the caller made sure the library loads (cudarc panics
    // otherwise).
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// Copies `len` bytes from host address `src` to device address `dst` (`cuMemcpyHtoD`: for
/// page-locked memory, one DMA, the measure of the link's copy bandwidth).
///
/// # Safety
/// `[src, src + len)` is mapped and stays so during the call; `dst` addresses `len` bytes of
/// device memory; the caller's context is current.
pub(crate) unsafe fn copy_to_device(dst: u64, src: *const u8, len: usize) -> Result<()> {
    // SAFETY: per the contract.
    unsafe { sys::cuMemcpyHtoD_v2(dst, src.cast(), len) }
        .result()
        .map_err(|e| GpuError::cuda("cuMemcpyHtoD", e))
}
