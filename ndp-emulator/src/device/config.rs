//! How a device is configured ([`DeviceConfig`]) and why starting one fails ([`DeviceError`]).

use crate::engine_hls::Engine;
use cxlkv_kernels::ScoreKernel;
use std::time::Duration;
use thiserror::Error;

/// Errors of starting a device.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// A memory access of the device area failed.
    #[error(transparent)]
    Mem(#[from] cxlkv_runtime::mem::MemError),
    /// The pool's device area has no room for a queue pair.
    #[error("the device area of {size} bytes holds no queue pair")]
    NoQueuePairs {
        /// Device area size.
        size: u64,
    },
    /// Spawning a thread failed.
    #[error("spawning a device thread failed: {0}")]
    Spawn(String),
    /// The device could not take a participant slot for its pins.
    #[error("the device needs a participant slot: {0}")]
    Attach(#[from] cxlkv_runtime::PoolError),
}

/// Device configuration.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Worker threads (each serves queue pairs `w, w + workers, ...`).
    pub workers: usize,
    /// Pace scans to this internal bandwidth (GB/s), if set.
    pub internal_bw_gbps: Option<f64>,
    /// Link bandwidth (GB/s) published for reports.
    pub link_bw_gbps: Option<f64>,
    /// Link latency (ns) published for reports.
    pub link_latency_ns: u64,
    /// Length of a hotlist epoch (heat halves at each epoch end).
    pub hot_epoch: Duration,
    /// How long a worker spins after its last command before sleeping on the doorbell.
    pub idle_spin: Duration,
    /// Scoring kernel (of the Rust engine).
    pub kernel: ScoreKernel,
    /// Compute engine of SCORE_TOPK and GATHER: the Rust kernels or the HLS kernel's library.
    pub engine: Engine,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            workers: 1,
            internal_bw_gbps: None,
            link_bw_gbps: None,
            link_latency_ns: 0,
            hot_epoch: Duration::from_secs(1),
            idle_spin: Duration::from_micros(200),
            kernel: ScoreKernel::detect(),
            engine: Engine::Rust,
        }
    }
}
