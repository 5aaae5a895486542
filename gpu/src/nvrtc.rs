//! The kernels' CUDA C source and its compilation to PTX by NVRTC at run time.
//!
//! NVRTC is found, in order: the library file named by `CXLKV_NVRTC` (loaded first, so that
//! cudarc's `dlopen("libnvrtc.so.12")` finds it by soname), then cudarc's usual library names on
//! the loader's path (`LD_LIBRARY_PATH`, `/etc/ld.so.conf`). The registry wheel
//! `nvidia-cuda-nvrtc-cu12` carries the library, so the PTX test runs on machines without CUDA.

use crate::error::{GpuError, Result};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The kernels (gpu/kernels/attention.cu).
pub const SOURCE: &str = include_str!("../kernels/attention.cu");

/// Every entry point of [`SOURCE`]; the PTX test checks that each is in the compiled module.
pub const KERNELS: [&str; 8] = [
    "cxlkv_dense_f16",
    "cxlkv_dense_f32",
    "cxlkv_pull_f16",
    "cxlkv_pull_f32",
    "cxlkv_gather_f16",
    "cxlkv_gather_f32",
    "cxlkv_merge",
    "cxlkv_stream",
];

/// The environment variable naming the NVRTC library file.
pub const NVRTC_ENV: &str = "CXLKV_NVRTC";

/// Makes NVRTC loadable, once per process: loads `CXLKV_NVRTC` if set, then checks that cudarc
/// finds the library by one of its names (`libnvrtc.so`, `libnvrtc.so.12`, ...). A library of
/// another soname (CUDA 13's `libnvrtc.so.13`) loads but is not found by those names: put a
/// `libnvrtc.so` link to it on `LD_LIBRARY_PATH` instead (scripts/gpu-check.sh does).
pub fn ensure_nvrtc() -> Result<()> {
    type Outcome = std::result::Result<(), (Option<PathBuf>, String)>;
    static LOADED: OnceLock<Outcome> = OnceLock::new();
    let r = LOADED.get_or_init(|| {
        let given = std::env::var_os(NVRTC_ENV)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        if let Some(p) = &given {
            if let Err(e) = crate::sys::preload(p) {
                let detail = match e {
                    GpuError::NoNvrtc { detail, .. } => detail,
                    other => other.to_string(),
                };
                return Err((given.clone(), detail));
            }
        }
        if crate::sys::nvrtc_present() {
            return Ok(());
        }
        let detail = match &given {
            Some(p) => format!(
                "{} loaded, but not under a name cudarc opens (libnvrtc.so, libnvrtc.so.12)",
                p.display()
            ),
            None => "libnvrtc.so could not be loaded and CXLKV_NVRTC is not set".into(),
        };
        Err((given, detail))
    });
    r.clone()
        .map_err(|(tried, detail)| GpuError::NoNvrtc { tried, detail })
}

/// NVRTC's version, `(major, minor)`.
pub fn version() -> Result<(i32, i32)> {
    ensure_nvrtc()?;
    crate::sys::nvrtc_version().ok_or_else(|| GpuError::Compile {
        arch: String::new(),
        log: "nvrtcVersion failed".into(),
    })
}

/// Compiles [`SOURCE`] to PTX for the virtual architecture `arch` (`compute_90`).
pub fn compile_ptx(arch: &str) -> Result<String> {
    ensure_nvrtc()?;
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++14".into()],
        name: Some("attention.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts)
        .map(|p| p.to_src())
        .map_err(|e| GpuError::Compile {
            arch: arch.to_string(),
            log: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_in_the_source() {
        for k in KERNELS {
            assert!(
                SOURCE.contains(&format!("__global__ void {k}(")),
                "{k} missing from attention.cu"
            );
        }
        assert_eq!(SOURCE.matches("__global__").count(), KERNELS.len());
    }
}
