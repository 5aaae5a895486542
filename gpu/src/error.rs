//! The crate's one error type: what is missing (the CUDA driver, a device, NVRTC), what CUDA
//! said, and what a caller asked for that cannot be done (a backend that cannot be registered,
//! a shape the kernels do not take).

use std::path::PathBuf;

/// Why a GPU operation failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// `libcuda.so` could not be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver: libcuda.so (the NVIDIA driver's library) could not be loaded")]
    NoDriver,
    /// The driver loaded but has no device of this ordinal.
    #[error("no CUDA device {ordinal}: the driver reports {count} device(s){detail}")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices the driver reports.
        count: usize,
        /// What `cuInit` / `cuDeviceGetCount` said, if they failed.
        detail: String,
    },
    /// `libnvrtc.so` could not be loaded.
    #[error(
        "no NVRTC: {detail}; install it with `pip install nvidia-cuda-nvrtc-cu12` and set \
         CXLKV_NVRTC to its lib/python3.*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 (or \
         put a folder holding libnvrtc.so on LD_LIBRARY_PATH)"
    )]
    NoNvrtc {
        /// The path given in `CXLKV_NVRTC`, if any.
        tried: Option<PathBuf>,
        /// What failed.
        detail: String,
    },
    /// NVRTC refused the kernels' source.
    #[error("NVRTC could not compile the kernels for {arch}: {log}")]
    Compile {
        /// The virtual architecture asked for (`compute_90`).
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA {call}: {code}")]
    Cuda {
        /// The call (`cuMemHostRegister`).
        call: &'static str,
        /// The driver's result code.
        code: String,
    },
    /// The pool's memory cannot be registered with CUDA.
    #[error("cannot register {backend} with CUDA: {why}")]
    Unregistrable {
        /// The backend (`file:/x`, `dax:/f`, or `unknown`).
        backend: String,
        /// Why not, and what to use instead.
        why: &'static str,
    },
    /// A shape or argument the kernels do not take.
    #[error("{0}")]
    Shape(String),
}

impl GpuError {
    /// A failed driver call.
    pub(crate) fn cuda(call: &'static str, e: cudarc::driver::DriverError) -> GpuError {
        GpuError::Cuda {
            call,
            code: format!("{:?}", e.0),
        }
    }

    /// True if the error says this machine has no GPU (no driver, no device): the tests and
    /// benches that need one skip on it.
    pub fn is_no_gpu(&self) -> bool {
        matches!(self, GpuError::NoDriver | GpuError::NoDevice { .. })
    }
}

/// The crate's result.
pub type Result<T> = std::result::Result<T, GpuError>;
