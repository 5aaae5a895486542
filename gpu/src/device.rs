//! One GPU: its context, stream and the kernels compiled for it.

use crate::error::{GpuError, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use std::sync::Arc;

/// An opened GPU with the crate's kernels loaded.
pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// Every kernel of [`crate::nvrtc::KERNELS`], looked up once.
    functions: Vec<(&'static str, CudaFunction)>,
    name: String,
    capability: (i32, i32),
}

impl Gpu {
    /// Opens device `ordinal` and compiles the kernels for it with NVRTC. Errors say what is
    /// missing: the driver ([`GpuError::NoDriver`]), the device ([`GpuError::NoDevice`]), NVRTC
    /// ([`GpuError::NoNvrtc`]).
    pub fn open(ordinal: usize) -> Result<Gpu> {
        if !crate::sys::driver_present() {
            return Err(GpuError::NoDriver);
        }
        let count = CudaContext::device_count().map_err(|e| GpuError::NoDevice {
            ordinal,
            count: 0,
            detail: format!(" (cuInit/cuDeviceGetCount: {:?})", e.0),
        })?;
        let count = usize::try_from(count).unwrap_or(0);
        if ordinal >= count {
            return Err(GpuError::NoDevice {
                ordinal,
                count,
                detail: String::new(),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| GpuError::cuda("cuCtxCreate", e))?;
        let name = ctx
            .name()
            .map_err(|e| GpuError::cuda("cuDeviceGetName", e))?;
        let capability = ctx
            .compute_capability()
            .map_err(|e| GpuError::cuda("cuDeviceGetAttribute", e))?;
        let arch = format!("compute_{}{}", capability.0, capability.1);
        let ptx = crate::nvrtc::compile_ptx(&arch)?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(|e| GpuError::cuda("cuModuleLoadData", e))?;
        let functions = crate::nvrtc::KERNELS
            .iter()
            .map(|&k| {
                module
                    .load_function(k)
                    .map(|f| (k, f))
                    .map_err(|e| GpuError::cuda("cuModuleGetFunction", e))
            })
            .collect::<Result<Vec<_>>>()?;
        let stream = ctx.default_stream();
        Ok(Gpu {
            ctx,
            stream,
            functions,
            name,
            capability,
        })
    }

    /// The device's name (`NVIDIA H100 80GB HBM3`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability `(major, minor)`.
    pub fn capability(&self) -> (i32, i32) {
        self.capability
    }

    /// One of [`crate::nvrtc::KERNELS`].
    pub(crate) fn function(&self, name: &'static str) -> Result<&CudaFunction> {
        self.functions
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, f)| f)
            .ok_or_else(|| GpuError::Shape(format!("no kernel {name}")))
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| GpuError::cuda("cuStreamSynchronize", e))
    }
}
