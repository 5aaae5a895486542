//! The device model: serves every participant's queue pair from next to the pool's memory.
//!
//! [`Device::start`] claims the device area (bumping the generation, failing every command a
//! previous instance left pending without running it), then runs `workers` threads, each serving a
//! fixed subset of the queue pairs, and one housekeeping thread (heartbeat, hotlist epochs).
//! A worker spins for a short while after its last command and then sleeps on the doorbell futex.
//!
//! The device trusts nothing it reads. A command is copied out of its ring slot before any check;
//! ring indices, opcodes, flags, k, G, dim, dtype, lengths and offsets are range-checked with
//! checked arithmetic; argument and result buffers must lie inside one block of a partition the
//! submitting participant owns; every named block goes through [`resolve_block`] (header CRC,
//! index sequence, typed layout against the command). Keys are scanned in place only while the
//! device holds a pin on their block (its own read-only participant slot), so their owner cannot
//! reuse or rewrite them mid-scan; value rows are copied out and every block is re-validated with
//! [`Pool::still_valid`] after the command, the results being discarded if one changed. A bad command
//! completes with an error code and the device keeps serving; a panic in a handler becomes
//! `CXLKV_NDP_ERR_INTERNAL`.

use crate::engine_hls::{self, Engine, EngineScan};
use cxlkv_kernels::{DType, GroupMode, Hit, KeyRows, QueryGroup, ScoreKernel};
use cxlkv_runtime::coherence::{self, Site};
use cxlkv_runtime::format::{self};
use cxlkv_runtime::key::Key;
use cxlkv_runtime::mem::SharedMemory;
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::{
    block_mass, check_owned_range, encode_topk_result, futex_wait, futex_wake, locate_token, qpi,
    read_bounds, reg, resolve_block, sorted_ranges, topk_result_size, BlockExpect, DeviceLayout,
    DeviceStatus, ResolvedBlock, ScanStats, DEPTH,
};
use cxlkv_runtime::{AttachOptions, Participant, Pool};
use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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

#[derive(Default, Clone, Copy)]
struct Heat {
    heat: f64,
    accesses: u64,
}

/// The device state shared by its threads.
pub struct Device {
    pool: Pool,
    /// The device's own participant slot (read-only: no partition), whose pins keep the blocks
    /// it scans in place from being reused or rewritten by their owners.
    reader: Participant,
    layout: DeviceLayout,
    cfg: DeviceConfig,
    generation: u64,
    counters: [AtomicU64; CXLKV_NDP_COUNTERS as usize],
    hot: Mutex<HashMap<(u64, u64), Heat>>,
    stop: AtomicBool,
    sleepers: Mutex<u32>,
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

/// What a handler reports besides the status.
#[derive(Default)]
struct Done {
    result_bytes: u64,
    stats: ScanStats,
}

type Outcome = Result<Done, DeviceStatus>;

fn err(code: u32) -> DeviceStatus {
    DeviceStatus::new(code)
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
                    | CXLKV_NDP_CAP_PACING,
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
        format::write_plain(&*mem, r, &Plain(regs))?;
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
            hot: Mutex::new(HashMap::new()),
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

    fn mem(&self) -> &dyn SharedMemory {
        &**self.pool.memory()
    }

    fn flush_restarted(&self, qp: u32) -> Result<(), DeviceError> {
        let mem = self.mem();
        let base = self.layout.qp(qp);
        coherence::acquire(
            mem,
            Site::NdpSubmitRead,
            base,
            u64::from(CXLKV_NDP_QP_INDICES_SIZE),
        );
        let head = mem.load_u64(base + qpi::SQ_HEAD, Ordering::Relaxed)?;
        let tail = mem.load_u64(base + qpi::SQ_TAIL, Ordering::Acquire)?;
        let mut cq_tail = mem.load_u64(base + qpi::CQ_TAIL, Ordering::Relaxed)?;
        if tail.wrapping_sub(head) <= DEPTH {
            let mut i = head;
            while i != tail {
                let cmd: cxlkv_ndp_cmd = format::read_plain(mem, self.layout.sq_slot(qp, i))?;
                self.write_cpl(
                    qp,
                    &mut cq_tail,
                    cxlkv_ndp_cpl {
                        tag: cmd.tag,
                        status: CXLKV_NDP_ERR_RESTARTED,
                        ..Default::default()
                    },
                )?;
                i = i.wrapping_add(1);
            }
        } else if head != tail {
            self.write_cpl(
                qp,
                &mut cq_tail,
                cxlkv_ndp_cpl {
                    status: CXLKV_NDP_ERR_RING,
                    ..Default::default()
                },
            )?;
        }
        mem.store_u64(base + qpi::SQ_HEAD, tail, Ordering::Release)?;
        coherence::publish(mem, Site::NdpHeadWrite, base + qpi::SQ_HEAD, 8);
        Ok(())
    }

    /// Writes a completion at `cq_tail` and publishes the new tail; wakes a sleeping client.
    fn write_cpl(
        &self,
        qp: u32,
        cq_tail: &mut u64,
        mut c: cxlkv_ndp_cpl,
    ) -> Result<(), DeviceError> {
        let mem = self.mem();
        let base = self.layout.qp(qp);
        c.index = *cq_tail;
        c.generation = self.generation;
        let off = self.layout.cq_slot(qp, *cq_tail);
        format::write_plain(mem, off, &c)?;
        coherence::publish(
            mem,
            Site::NdpCompleteWrite,
            off,
            u64::from(CXLKV_NDP_CPL_SIZE),
        );
        *cq_tail = cq_tail.wrapping_add(1);
        // Release: the entry (and the result buffer written before it) before the index. Pairs
        // with the client's Acquire load of cq_tail in `drain`.
        mem.store_u64(base + qpi::CQ_TAIL, *cq_tail, Ordering::Release)?;
        coherence::publish(mem, Site::NdpCompleteWrite, base + qpi::CQ_TAIL, 8);
        // Dekker pair with the client's SeqCst store of cq_waiters before its re-check of cq_tail.
        fence(Ordering::SeqCst);
        if mem.load_u64(base + qpi::CQ_WAITERS, Ordering::SeqCst)? != 0 {
            futex_wake(mem, base + qpi::CQ_TAIL);
        }
        Ok(())
    }

    fn worker(&self, w: usize, workers: usize) {
        let qps: Vec<u32> = (w as u32..self.layout.queue_pairs)
            .step_by(workers)
            .collect();
        let mem = self.mem();
        // Device-owned indices, cached (nobody else writes them).
        let mut heads: Vec<u64> = qps
            .iter()
            .map(|&q| {
                mem.load_u64(self.layout.qp(q) + qpi::SQ_HEAD, Ordering::Relaxed)
                    .unwrap_or(0)
            })
            .collect();
        let mut cq_tails: Vec<u64> = qps
            .iter()
            .map(|&q| {
                mem.load_u64(self.layout.qp(q) + qpi::CQ_TAIL, Ordering::Relaxed)
                    .unwrap_or(0)
            })
            .collect();
        let mut last_work = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let mut did = false;
            for (i, &qp) in qps.iter().enumerate() {
                did |= self.service(qp, &mut heads[i], &mut cq_tails[i]);
            }
            if did {
                last_work = Instant::now();
                continue;
            }
            if last_work.elapsed() < self.cfg.idle_spin {
                std::hint::spin_loop();
                continue;
            }
            self.sleep(&qps, &heads);
            last_work = Instant::now();
        }
    }

    /// Sleeps on the doorbell unless a submission arrived meanwhile.
    fn sleep(&self, qps: &[u32], heads: &[u64]) {
        let mem = self.mem();
        let bell = self.layout.regs + reg::DOORBELL;
        let seen = mem.load_u64(bell, Ordering::SeqCst).unwrap_or(0);
        {
            let mut n = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            *n += 1;
            let _ = mem.store_u64(self.layout.regs + reg::SLEEPING, 1, Ordering::SeqCst);
        }
        // Dekker pair with the client's fence between its sq_tail store and its `sleeping` load.
        fence(Ordering::SeqCst);
        let pending = qps.iter().zip(heads).any(|(&q, &h)| {
            mem.load_u64(self.layout.qp(q) + qpi::SQ_TAIL, Ordering::SeqCst)
                .is_ok_and(|t| t != h)
        });
        if !pending && !self.stop.load(Ordering::SeqCst) {
            futex_wait(mem, bell, seen as u32, Duration::from_millis(10));
        }
        let mut n = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        if *n == 0 {
            let _ = mem.store_u64(self.layout.regs + reg::SLEEPING, 0, Ordering::SeqCst);
        }
    }

    /// Takes at most one command from queue pair `qp`; true if it did any work.
    fn service(&self, qp: u32, head: &mut u64, cq_tail: &mut u64) -> bool {
        let mem = self.mem();
        let base = self.layout.qp(qp);
        coherence::acquire(mem, Site::NdpSubmitRead, base + qpi::SQ_TAIL, 8);
        // Acquire pairs with the client's Release store of sq_tail after writing the slot.
        let Ok(tail) = mem.load_u64(base + qpi::SQ_TAIL, Ordering::Acquire) else {
            return false;
        };
        if tail == *head {
            return false;
        }
        if tail.wrapping_sub(*head) > DEPTH {
            // The client's index is not one it could have produced: resynchronise, then report
            // (in this order, so a client that sees the error completion or counter and resyncs
            // from SQ_HEAD reads the new head, not the old one).
            *head = tail;
            let _ = mem.store_u64(base + qpi::SQ_HEAD, *head, Ordering::Release);
            coherence::publish(mem, Site::NdpHeadWrite, base + qpi::SQ_HEAD, 8);
            let _ = self.write_cpl(
                qp,
                cq_tail,
                cxlkv_ndp_cpl {
                    status: CXLKV_NDP_ERR_RING,
                    ..Default::default()
                },
            );
            self.count(CXLKV_NDP_CTR_ERRORS, 1);
            return true;
        }
        // Room in the completion ring? A cq_head that is not a plausible index is ignored (the
        // entry is written in the ring either way; only that client's view suffers).
        coherence::acquire(mem, Site::NdpHeadRead, base + qpi::CQ_HEAD, 8);
        let cq_head = mem
            .load_u64(base + qpi::CQ_HEAD, Ordering::Acquire)
            .unwrap_or(*cq_tail);
        let used = cq_tail.wrapping_sub(cq_head);
        if used == DEPTH {
            return false;
        }
        let slot = self.layout.sq_slot(qp, *head);
        coherence::acquire(
            mem,
            Site::NdpSubmitRead,
            slot,
            u64::from(CXLKV_NDP_CMD_SIZE),
        );
        // A private copy: the client may rewrite the slot; we check and use only this copy.
        let cmd: cxlkv_ndp_cmd = match format::read_plain(mem, slot) {
            Ok(c) => c,
            Err(_) => return false,
        };
        *head = head.wrapping_add(1);
        // Release: our read of the slot before the client may reuse it. Pairs with the client's
        // Acquire load of sq_head when it checks for space.
        let _ = mem.store_u64(base + qpi::SQ_HEAD, *head, Ordering::Release);
        coherence::publish(mem, Site::NdpHeadWrite, base + qpi::SQ_HEAD, 8);
        let cpl = self.execute(qp, &cmd);
        let _ = self.write_cpl(qp, cq_tail, cpl);
        true
    }

    fn count(&self, c: u32, n: u64) {
        let v = self.counters[c as usize].fetch_add(n, Ordering::Relaxed) + n;
        let _ = self.mem().store_u64(
            self.layout.regs + reg::COUNTERS + 8 * u64::from(c),
            v,
            Ordering::Relaxed,
        );
    }

    /// Runs one command; never panics, always answers.
    pub(crate) fn execute(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> cxlkv_ndp_cpl {
        let t0 = Instant::now();
        self.count(CXLKV_NDP_CTR_COMMANDS, 1);
        let run = || -> Outcome {
            match u32::from(cmd.opcode) {
                CXLKV_NDP_OP_NOP => Ok(Done::default()),
                CXLKV_NDP_OP_SCORE_TOPK => self.score_topk(qp, cmd),
                CXLKV_NDP_OP_GATHER => self.gather(qp, cmd),
                CXLKV_NDP_OP_BUILD_BOUNDS => self.build_bounds(qp, cmd),
                CXLKV_NDP_OP_HOTLIST => self.hotlist(qp, cmd),
                _ => Err(err(CXLKV_NDP_ERR_OPCODE)),
            }
        };
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
            .unwrap_or(Err(err(CXLKV_NDP_ERR_INTERNAL)));
        let ns = t0.elapsed().as_nanos() as u64;
        self.count(CXLKV_NDP_CTR_BUSY_NS, ns);
        match out {
            Ok(d) => {
                self.count(CXLKV_NDP_CTR_BYTES_SCANNED, d.stats.bytes_scanned);
                self.count(
                    CXLKV_NDP_CTR_BYTES_RETURNED,
                    d.result_bytes + u64::from(CXLKV_NDP_CPL_SIZE),
                );
                self.count(
                    CXLKV_NDP_CTR_BYTES_RECEIVED,
                    u64::from(CXLKV_NDP_CMD_SIZE) + u64::from(cmd.args_len),
                );
                self.count(
                    CXLKV_NDP_CTR_BLOCKS_SCANNED,
                    u64::from(d.stats.blocks_scanned),
                );
                self.count(
                    CXLKV_NDP_CTR_BLOCKS_PRUNED,
                    u64::from(d.stats.blocks_pruned),
                );
                cxlkv_ndp_cpl {
                    tag: cmd.tag,
                    status: CXLKV_NDP_OK,
                    result_bytes: d.result_bytes,
                    bytes_scanned: d.stats.bytes_scanned,
                    device_ns: ns,
                    blocks_scanned: d.stats.blocks_scanned,
                    blocks_pruned: d.stats.blocks_pruned,
                    ..Default::default()
                }
            }
            Err(s) => {
                self.count(CXLKV_NDP_CTR_ERRORS, 1);
                cxlkv_ndp_cpl {
                    tag: cmd.tag,
                    status: s.code,
                    detail: s.detail,
                    device_ns: ns,
                    ..Default::default()
                }
            }
        }
    }

    /// Copies a command's arguments (exactly `need` bytes) out of shared memory after checking
    /// that both buffers lie in blocks the submitter owns.
    fn args(
        &self,
        qp: u32,
        cmd: &cxlkv_ndp_cmd,
        need: u64,
        result_need: u64,
    ) -> Result<Vec<u8>, DeviceStatus> {
        if u64::from(cmd.args_len) != need || u64::from(cmd.result_len) < result_need {
            return Err(if u64::from(cmd.args_len) != need {
                err(CXLKV_NDP_ERR_ARGS)
            } else {
                err(CXLKV_NDP_ERR_RESULT_SIZE)
            });
        }
        if need > 0 {
            check_owned_range(&self.pool, qp, cmd.args_off, need)?;
        }
        check_owned_range(&self.pool, qp, cmd.result_off, u64::from(cmd.result_len))?;
        let mut buf = vec![0u8; need as usize];
        coherence::acquire(self.mem(), Site::NdpSubmitRead, cmd.args_off, need);
        self.mem()
            .read(cmd.args_off, &mut buf)
            .map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
        Ok(buf)
    }

    fn common(cmd: &cxlkv_ndp_cmd) -> Result<(DType, BlockExpect), DeviceStatus> {
        let dtype = DType::from_code(cmd.dtype).ok_or(err(CXLKV_NDP_ERR_ARGS))?;
        let dim = cmd.dim;
        if dim == 0
            || dim & 15 != 0
            || dim > CXLKV_NDP_MAX_DIM
            || cmd.nblocks == 0
            || cmd.nblocks > CXLKV_NDP_MAX_BLOCKS
        {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        Ok((
            dtype,
            BlockExpect {
                sequence: cmd.sequence,
                layer: cmd.layer,
                kv_head: u32::from(cmd.kv_head),
                dtype,
                dim,
            },
        ))
    }

    fn resolve(
        &self,
        raw: &[u8],
        n: usize,
        want: &BlockExpect,
    ) -> Result<(Vec<ResolvedBlock>, Vec<usize>), DeviceStatus> {
        let mut blocks = Vec::with_capacity(n);
        for i in 0..n {
            let e: cxlkv_ndp_block = format::from_bytes(&raw[24 * i..24 * (i + 1)]);
            blocks.push(resolve_block(&self.pool, &e, want, i)?);
        }
        let order = sorted_ranges(&blocks)?;
        Ok((blocks, order))
    }

    fn still_valid(&self, blocks: &[ResolvedBlock]) -> Result<(), DeviceStatus> {
        for (i, b) in blocks.iter().enumerate() {
            if !self.pool.still_valid(&b.block).unwrap_or(false) {
                return Err(DeviceStatus::at(CXLKV_NDP_ERR_STALE, i));
            }
        }
        Ok(())
    }

    fn touch(&self, b: &ResolvedBlock) {
        let mut hot = self.hot.lock().unwrap_or_else(|e| e.into_inner());
        let h = hot.entry((b.block.key.lo(), b.block.key.hi())).or_default();
        h.heat += 1.0;
        h.accesses += 1;
    }

    /// Calls `f` with the bytes of `[off, off + len)` of block `b`'s payload: in place when the
    /// memory has a stable address, else through a private copy. The block is pinned for the
    /// duration, so its owner neither reuses nor rewrites it while `f` reads.
    fn with_bytes<R>(
        &self,
        b: &ResolvedBlock,
        off: u64,
        len: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, DeviceStatus> {
        let payload = b.block.payload_off..b.block.payload_off + b.block.header.len;
        if off < payload.start || off.checked_add(len).is_none_or(|e| e > payload.end) {
            return Err(err(CXLKV_NDP_ERR_RANGE));
        }
        let pin = match self.reader.pin_block(&b.block) {
            Ok(Some(pin)) => pin,
            Ok(None) => return Err(err(CXLKV_NDP_ERR_STALE)),
            Err(_) => return Err(err(CXLKV_NDP_ERR_INTERNAL)),
        };
        let mem = self.mem();
        coherence::acquire(mem, Site::PayloadRead, off, len);
        let r = match mem.raw_range(off, len) {
            Ok(Some(ptr)) => {
                // SAFETY: `raw_range` checked that [off, off + len) lies inside the mapping, which
                // outlives this call (the pool holds it), and the range lies inside block `b`'s
                // payload (checked above). `pin` is held until after `f` returns: while a live
                // pin names the block, its owner neither reuses nor rewrites it (the pin protocol,
                // docs/FORMAT.md), so nobody writes these bytes while the slice exists. It is only
                // read, and dropped before the pin.
                let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len as usize) };
                Ok(f(bytes))
            }
            Ok(None) => {
                let mut buf = vec![0u8; len as usize];
                mem.read(off, &mut buf)
                    .map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
                Ok(f(&buf))
            }
            Err(_) => Err(err(CXLKV_NDP_ERR_RANGE)),
        };
        drop(pin);
        r
    }

    fn pace(&self, t0: Instant, bytes: u64) {
        if let Some(gbps) = self.cfg.internal_bw_gbps.filter(|g| *g > 0.0) {
            let target = Duration::from_secs_f64(bytes as f64 / (gbps * 1e9));
            while t0.elapsed() < target {
                let left = target - t0.elapsed();
                if left > Duration::from_micros(200) {
                    std::thread::sleep(left - Duration::from_micros(100));
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }

    fn write_result(&self, cmd: &cxlkv_ndp_cmd, bytes: &[u8]) -> Result<u64, DeviceStatus> {
        if bytes.len() as u64 > u64::from(cmd.result_len) {
            return Err(err(CXLKV_NDP_ERR_RESULT_SIZE));
        }
        self.mem()
            .write(cmd.result_off, bytes)
            .map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
        coherence::publish(
            self.mem(),
            Site::NdpCompleteWrite,
            cmd.result_off,
            bytes.len() as u64,
        );
        Ok(bytes.len() as u64)
    }

    fn score_topk(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> Outcome {
        let (dtype, want) = Self::common(cmd)?;
        let flags = u32::from(cmd.flags);
        let (k, g, dim, n) = (
            cmd.k as usize,
            usize::from(cmd.group),
            cmd.dim as usize,
            cmd.nblocks as usize,
        );
        if flags & !CXLKV_NDP_FLAGS_ALL != 0
            || k == 0
            || k > CXLKV_NDP_MAX_K as usize
            || g == 0
            || g > CXLKV_NDP_MAX_GROUP as usize
        {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        let mode = if flags & CXLKV_NDP_FLAG_GROUP_MAX != 0 {
            GroupMode::GroupMax
        } else {
            GroupMode::PerQuery
        };
        let gather = flags & CXLKV_NDP_FLAG_GATHER_V != 0;
        let lists = if mode == GroupMode::PerQuery { g } else { 1 };
        let need = (g * dim * 4 + n * 24) as u64;
        // The smallest result possible (one hit per list); the exact size is checked once the
        // token count is known.
        let min_result = topk_result_size(lists, 1, dim, dtype.size(), gather, n)
            .ok_or(err(CXLKV_NDP_ERR_ARGS))?;
        let raw = self.args(qp, cmd, need, min_result)?;
        let qv: Vec<f32> = raw[..g * dim * 4]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let queries = QueryGroup::new(&qv, dim).map_err(|_| err(CXLKV_NDP_ERR_ARGS))?;
        let (blocks, order) = self.resolve(&raw[g * dim * 4..], n, &want)?;
        let total_tokens: u64 = blocks.iter().map(|b| u64::from(b.tokens)).sum();
        let per_list = (k as u64).min(total_tokens) as usize;
        let size = topk_result_size(lists, per_list, dim, dtype.size(), gather, n)
            .ok_or(err(CXLKV_NDP_ERR_ARGS))?;
        if size > u64::from(cmd.result_len) {
            return Err(err(CXLKV_NDP_ERR_RESULT_SIZE));
        }
        let t0 = Instant::now();
        let mut scan = EngineScan::new(self.cfg.engine, self.cfg.kernel, &queries, k, mode)
            .ok_or(err(CXLKV_NDP_ERR_INTERNAL))?;
        let mut visit: Vec<usize> = (0..n).collect();
        let mut ub = Vec::new();
        if flags & CXLKV_NDP_FLAG_PRUNE != 0 {
            let mut bounds = Vec::with_capacity(n);
            for b in &blocks {
                bounds.push(read_bounds(self.mem(), b, dim).map_err(|_| err(CXLKV_NDP_ERR_RANGE))?);
            }
            (ub, visit) = scan.visit_order(&queries, &bounds);
        }
        for &b in &visit {
            if !ub.is_empty() && scan.can_skip(&ub[b * g..(b + 1) * g]) {
                scan.skipped();
                continue;
            }
            let rb = &blocks[b];
            self.with_bytes(
                rb,
                rb.k_off,
                rb.head_bytes,
                |bytes| -> Result<(), DeviceStatus> {
                    let keys =
                        KeyRows::new(bytes, dtype, dim).map_err(|_| err(CXLKV_NDP_ERR_LAYOUT))?;
                    scan.scan(&queries, &keys, rb.base);
                    Ok(())
                },
            )??;
            self.touch(rb);
            self.pace(t0, scan.stats().bytes_scanned);
        }
        let (hits, stats) = scan.finish();
        let values = if gather {
            Some(self.gather_rows(
                &blocks,
                &order,
                hits.iter().flatten().map(|h| h.index),
                dim * dtype.size(),
            )?)
        } else {
            None
        };
        self.still_valid(&blocks)?;
        let mass = block_mass(&hits[0], &blocks, &order, 1.0 / (dim as f32).sqrt());
        let out = encode_topk_result(
            &hits,
            per_list,
            dim,
            dtype,
            values.as_deref(),
            &mass,
            &stats,
        );
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats,
        })
    }

    fn gather_rows(
        &self,
        blocks: &[ResolvedBlock],
        order: &[usize],
        tokens: impl Iterator<Item = u32>,
        row: usize,
    ) -> Result<Vec<u8>, DeviceStatus> {
        let mut out = Vec::new();
        let mut r = vec![0u8; row];
        for (j, t) in tokens.enumerate() {
            let (b, i) =
                locate_token(blocks, order, t).ok_or(DeviceStatus::at(CXLKV_NDP_ERR_TOKEN, j))?;
            let off = blocks[b].v_off + (i * row) as u64;
            if self.cfg.engine == Engine::Hls {
                // The HLS kernel's GATHER row mover reads the row in place (pinned).
                self.with_bytes(&blocks[b], off, row as u64, |src| {
                    engine_hls::copy_row(Engine::Hls, src, &mut r)
                })?;
                out.extend_from_slice(&r);
                continue;
            }
            coherence::acquire(self.mem(), Site::PayloadRead, off, row as u64);
            self.mem()
                .read(off, &mut r)
                .map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
            out.extend_from_slice(&r);
        }
        Ok(out)
    }

    fn gather(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> Outcome {
        let (dtype, want) = Self::common(cmd)?;
        let (k, dim, n) = (cmd.k as usize, cmd.dim as usize, cmd.nblocks as usize);
        if k == 0 || k > CXLKV_NDP_MAX_K as usize || cmd.flags != 0 {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        let size =
            topk_result_size(1, k, dim, dtype.size(), true, 0).ok_or(err(CXLKV_NDP_ERR_ARGS))?;
        let raw = self.args(qp, cmd, (n * 24 + k * 4) as u64, size)?;
        let (blocks, order) = self.resolve(&raw[..n * 24], n, &want)?;
        let tokens: Vec<u32> = raw[n * 24..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let values =
            self.gather_rows(&blocks, &order, tokens.iter().copied(), dim * dtype.size())?;
        self.still_valid(&blocks)?;
        let hits: Vec<Hit> = tokens
            .iter()
            .map(|&index| Hit { index, score: 0.0 })
            .collect();
        let out = encode_topk_result(
            &[hits],
            k,
            dim,
            dtype,
            Some(&values),
            &[],
            &ScanStats::default(),
        );
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats: ScanStats::default(),
        })
    }

    fn build_bounds(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> Outcome {
        let (dtype, want) = Self::common(cmd)?;
        let dim = cmd.dim as usize;
        if cmd.nblocks != 1 || cmd.flags != 0 {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        let raw = self.args(qp, cmd, 24, 64 + 8 * dim as u64)?;
        let (blocks, _) = self.resolve(&raw, 1, &want)?;
        let b = &blocks[0];
        if !self.pool.verify_payload(&b.block).unwrap_or(false) {
            return Err(err(CXLKV_NDP_ERR_CHECKSUM));
        }
        let (lo, hi) = self.with_bytes(b, b.k_off, b.head_bytes, |bytes| {
            let mut lo = vec![f32::INFINITY; dim];
            let mut hi = vec![f32::NEG_INFINITY; dim];
            for i in 0..bytes.len() / dtype.size() {
                let x = dtype.load(bytes, i);
                lo[i % dim] = lo[i % dim].min(x);
                hi[i % dim] = hi[i % dim].max(x);
            }
            (lo, hi)
        })?;
        let (slo, shi) = read_bounds(self.mem(), b, dim).map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
        self.still_valid(&blocks)?;
        let same = lo
            .iter()
            .zip(&slo)
            .chain(hi.iter().zip(&shi))
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let header = cxlkv_ndp_result {
            lists: 1,
            per_list: 2,
            dim: dim as u32,
            dtype: 3,
            bounds_off: 64,
            bounds_match: u32::from(same),
            total_bytes: 64 + 8 * dim as u64,
            ..Default::default()
        };
        let mut out = format::as_bytes(&header).to_vec();
        for x in lo.iter().chain(&hi) {
            out.extend_from_slice(&x.to_le_bytes());
        }
        self.touch(b);
        let stats = ScanStats {
            bytes_scanned: b.head_bytes,
            blocks_scanned: 1,
            blocks_pruned: 0,
        };
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats,
        })
    }

    /// The hottest blocks, hottest first.
    pub fn hottest(&self, max: usize) -> Vec<cxlkv_ndp_hot_entry> {
        let hot = self.hot.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<cxlkv_ndp_hot_entry> = hot
            .iter()
            .map(|(&(lo, hi), h)| cxlkv_ndp_hot_entry {
                key_lo: lo,
                key_hi: hi,
                heat: (h.heat * 256.0) as u64,
                accesses: h.accesses,
            })
            .collect();
        v.sort_by(|a, b| b.heat.cmp(&a.heat).then(a.key_lo.cmp(&b.key_lo)));
        v.truncate(max);
        v
    }

    fn hotlist(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> Outcome {
        let max = cmd.k as usize;
        if max == 0 || max > CXLKV_NDP_MAX_K as usize {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        self.args(qp, cmd, 0, 64)?;
        let n = max.min(((u64::from(cmd.result_len) - 64) / 32) as usize);
        let entries = self.hottest(n);
        let header = cxlkv_ndp_result {
            lists: 1,
            per_list: entries.len() as u32,
            bounds_off: 64,
            total_bytes: 64 + 32 * entries.len() as u64,
            ..Default::default()
        };
        let mut out = format::as_bytes(&header).to_vec();
        for e in &entries {
            out.extend_from_slice(format::as_bytes(e));
        }
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats: ScanStats::default(),
        })
    }

    fn housekeeping(&self) {
        let mem = self.mem();
        let r = self.layout.regs;
        let mut epoch_start = Instant::now();
        let mut epochs = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            let _ = mem.store_u64(
                r + reg::HEARTBEAT,
                cxlkv_runtime::ndp::now_ns(),
                Ordering::Release,
            );
            mem.publish(r + reg::HEARTBEAT, 8);
            if epoch_start.elapsed() >= self.cfg.hot_epoch {
                epoch_start = Instant::now();
                epochs += 1;
                let top = self.hottest(CXLKV_NDP_HOTLIST_WINDOW as usize);
                for (i, e) in top.iter().enumerate() {
                    let _ = format::write_plain(mem, r + reg::HOT + 32 * i as u64, e);
                }
                let _ = mem.store_u64(r + reg::HOT_COUNT, top.len() as u64, Ordering::Relaxed);
                let _ = mem.store_u64(r + reg::HOT_EPOCH, epochs, Ordering::Release);
                mem.publish(
                    r + reg::HOT_EPOCH,
                    64 + 32 * CXLKV_NDP_HOTLIST_WINDOW as u64,
                );
                let mut hot = self.hot.lock().unwrap_or_else(|e| e.into_inner());
                hot.retain(|_, h| {
                    h.heat *= 0.5;
                    h.heat >= 1.0 / 256.0
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The register block as plain data for one copy at start.
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
struct Plain(cxlkv_ndp_regs);
// SAFETY: a transparent wrapper of the bindgen struct, whose layout assertions (abi.rs) leave no
// padding; all fields are integers or arrays of integers, valid for every bit pattern.
unsafe impl format::Plain for Plain {}

/// Keys of the blocks named in hotlist entries.
pub fn hot_key(e: &cxlkv_ndp_hot_entry) -> Key {
    Key::from_parts(e.key_lo, e.key_hi)
}
