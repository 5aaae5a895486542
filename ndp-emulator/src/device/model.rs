//! The device's state shared by its threads ([`Device`]), how it claims a pool's device area and
//! starts them ([`Device::start`]), and the [`DeviceHandle`] that stops them.

use crate::device::config::{DeviceConfig, DeviceError};
use crate::device::hotlist::HotTable;
use crate::engine_hls::Engine;
use cxlkv_runtime::coherence::{self, Site};
use cxlkv_runtime::format;
use cxlkv_runtime::mem::SharedMemory;
use cxlkv_runtime::metrics::{latency_histogram, HistogramFamily};
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::{futex_wake, reg, DeviceLayout};
use cxlkv_runtime::{AttachOptions, Participant, Pool};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The device state shared by its threads.
pub struct Device {
    pub(super) pool: Pool,
    /// The device's own participant slot (read-only: no partition), whose pins keep the blocks
    /// it scans in place from being reused or rewritten by their owners.
    pub(super) reader: Participant,
    pub(super) layout: DeviceLayout,
    pub(super) cfg: DeviceConfig,
    pub(super) generation: u64,
    pub(super) counters: [AtomicU64; CXLKV_NDP_COUNTERS as usize],
    /// Command latency per opcode (process-local; `metrics`).
    pub(super) latency: HistogramFamily,
    /// Scan heat per block (the HOTLIST).
    pub(super) hot: HotTable,
    pub(super) stop: AtomicBool,
    pub(super) sleepers: Mutex<u32>,
}

/// A running device; stopping (or dropping) it joins its threads and detaches it (magic cleared).
pub struct DeviceHandle {
    device: Arc<Device>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl DeviceHandle {
    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device, shared (for a thread that outlives this borrow, such as a metrics endpoint).
    pub fn shared(&self) -> Arc<Device> {
        self.device.clone()
    }

    /// Stops the threads and clears the magic so clients fall back at once.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.device.stop.store(true, Ordering::SeqCst);
        let mem = self.device.pool.memory();
        let bell = self.device.layout.regs + reg::DOORBELL;
        let _ = mem.store_u64(
            bell,
            mem.load_u64(bell, Ordering::Relaxed)
                .unwrap_or(0)
                .wrapping_add(1),
            Ordering::SeqCst,
        );
        futex_wake(&**mem, bell);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = mem.store_u64(self.device.layout.regs + reg::MAGIC, 0, Ordering::Release);
        coherence::publish(&**mem, Site::NdpRegsWrite, self.device.layout.regs, 64);
    }
}

impl Drop for DeviceHandle {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.shutdown();
        }
    }
}

impl Device {
    /// Attaches to `pool`'s device area and starts serving.
    pub fn start(pool: Pool, cfg: DeviceConfig) -> Result<DeviceHandle, DeviceError> {
        let layout = DeviceLayout::of(&pool);
        if layout.queue_pairs == 0 {
            return Err(DeviceError::NoQueuePairs {
                size: pool.superblock().device_area_size,
            });
        }
        let mem = pool.memory().clone();
        let r = layout.regs;
        // Detach whoever was here first: clients that see no magic fall back.
        mem.store_u64(r + reg::MAGIC, 0, Ordering::Release)?;
        coherence::publish(&*mem, Site::NdpRegsWrite, r, 64);
        coherence::acquire(&*mem, Site::NdpRegsRead, r, u64::from(CXLKV_NDP_REGS_SIZE));
        let generation = mem
            .load_u64(r + reg::GENERATION, Ordering::Relaxed)?
            .wrapping_add(1);
        let mut regs = cxlkv_ndp_regs {
            magic: 0,
            abi_major: CXLKV_NDP_ABI_MAJOR,
            abi_minor: CXLKV_NDP_ABI_MINOR,
            capabilities: u64::from(
                CXLKV_NDP_CAP_SCORE_TOPK
                    | CXLKV_NDP_CAP_GATHER
                    | CXLKV_NDP_CAP_BUILD_BOUNDS
                    | CXLKV_NDP_CAP_HOTLIST
                    | CXLKV_NDP_CAP_PRUNE
                    | CXLKV_NDP_CAP_FUTEX_WAKE
                    | CXLKV_NDP_CAP_PACING
                    | CXLKV_NDP_CAP_ATTEND
                    | CXLKV_NDP_CAP_SELECT
                    | CXLKV_NDP_CAP_SPARSE_ATTEND
                    | CXLKV_NDP_CAP_QUANT
                    | CXLKV_NDP_CAP_TENANT
                    // The sparse ATTEND on sketches and quantized blocks: the Rust kernels only.
                    | if cfg.engine == Engine::Rust {
                        CXLKV_NDP_CAP_SKETCH
                    } else {
                        0
                    },
            ),
            generation,
            pid: u64::from(std::process::id()),
            queue_pairs: layout.queue_pairs,
            queue_depth: CXLKV_NDP_QUEUE_DEPTH,
            qp_offset: layout.qp0 - layout.regs,
            qp_stride: layout.qp_stride,
            max_k: CXLKV_NDP_MAX_K,
            max_group: CXLKV_NDP_MAX_GROUP,
            max_blocks: CXLKV_NDP_MAX_BLOCKS,
            max_dim: CXLKV_NDP_MAX_DIM,
            internal_bw_mbps: cfg.internal_bw_gbps.map_or(0, |g| (g * 1000.0) as u64),
            link_bw_mbps: cfg.link_bw_gbps.map_or(0, |g| (g * 1000.0) as u64),
            link_latency_ns: cfg.link_latency_ns,
            heartbeat_ns: cxlkv_runtime::ndp::now_ns(),
            hot_epoch_ns: cfg.hot_epoch.as_nanos() as u64,
            ..Default::default()
        };
        regs.doorbell = mem.load_u64(r + reg::DOORBELL, Ordering::Relaxed)?;
        cxlkv_runtime::mem::write_obj(&*mem, r, &Plain(regs))?;
        let reader = Participant::attach(
            &pool,
            AttachOptions {
                own_partition: false,
                ..Default::default()
            },
        )?;
        let device = Arc::new(Device {
            pool: pool.clone(),
            reader,
            layout,
            cfg: cfg.clone(),
            generation,
            counters: Default::default(),
            latency: HistogramFamily::new_with_constructor(latency_histogram),
            hot: HotTable::default(),
            stop: AtomicBool::new(false),
            sleepers: Mutex::new(0),
        });
        // Fail what a previous instance left pending: those commands' clients have timed out and
        // may have reused their buffers, so they must not run now.
        for qp in 0..layout.queue_pairs {
            device.flush_restarted(qp)?;
        }
        coherence::publish(&*mem, Site::NdpRegsWrite, r, u64::from(CXLKV_NDP_REGS_SIZE));
        // Release: everything above before the magic. Pairs with the client's Acquire load of it.
        mem.store_u64(r + reg::MAGIC, CXLKV_NDP_MAGIC, Ordering::Release)?;
        coherence::publish(&*mem, Site::NdpRegsWrite, r, 64);

        let mut threads = Vec::new();
        let workers = cfg.workers.clamp(1, layout.queue_pairs as usize);
        for w in 0..workers {
            let d = device.clone();
            let t = std::thread::Builder::new()
                .name(format!("cxlkv-ndp-worker-{w}"))
                .spawn(move || d.worker(w, workers))
                .map_err(|e| DeviceError::Spawn(e.to_string()))?;
            threads.push(t);
        }
        let d = device.clone();
        threads.push(
            std::thread::Builder::new()
                .name("cxlkv-ndp-housekeeping".into())
                .spawn(move || d.housekeeping())
                .map_err(|e| DeviceError::Spawn(e.to_string()))?,
        );
        Ok(DeviceHandle { device, threads })
    }

    /// The generation of this device instance.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The participant slot the device holds for its pins (it writes nothing else outside the
    /// device area and the submitters' result buffers).
    pub fn participant_slot(&self) -> u32 {
        self.reader.id()
    }

    /// A counter (`CXLKV_NDP_CTR_*`).
    pub fn counter(&self, i: u32) -> u64 {
        self.counters[i as usize].load(Ordering::Relaxed)
    }

    pub(super) fn mem(&self) -> &dyn SharedMemory {
        &**self.pool.memory()
    }

    pub(super) fn count(&self, c: u32, n: u64) {
        let v = self.counters[c as usize].fetch_add(n, Ordering::Relaxed) + n;
        let _ = self.mem().store_u64(
            self.layout.regs + reg::COUNTERS + 8 * u64::from(c),
            v,
            Ordering::Relaxed,
        );
    }

    /// The hottest blocks, hottest first.
    pub fn hottest(&self, max: usize) -> Vec<cxlkv_ndp_hot_entry> {
        self.hot.hottest(max)
    }
}

/// The register block as plain data for one copy at start.
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
struct Plain(cxlkv_ndp_regs);
// SAFETY: a transparent wrapper of the bindgen struct, whose layout assertions (abi.rs) leave no
// padding; all fields are integers or arrays of integers, valid for every bit pattern.
unsafe impl format::Plain for Plain {}
