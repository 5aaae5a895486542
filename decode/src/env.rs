//! What the pool backends run in: the pool, this process's participant, the near-data device (a
//! thread, a `cxlkv-ndpd` child process, or none) and the client's queue pair. One [`Env`] per
//! run; [`Env::backend`] builds any number of backends on it, each holding one sequence.

use crate::error::{Error, Result};
use cxlkv_kernels::DType;
use cxlkv_model::AttentionShape;
use cxlkv_ndp::daemon::Daemon;
use cxlkv_ndp::{Device, DeviceConfig, DeviceHandle};
use cxlkv_runtime::kv::Sketch;
use cxlkv_runtime::ndp::abi::{CXLKV_NDP_MAX_CANDIDATES, CXLKV_NDP_MAX_DIM, CXLKV_NDP_MAX_GROUP};
use cxlkv_runtime::ndp::{gathered_dtype, NdpDevice, NdpOptions};
use cxlkv_runtime::pool::plan;
use cxlkv_runtime::region::TempBackend;
use cxlkv_runtime::{Backend, KvShape, Participant, Pool, PoolConfig, RegionOptions};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Which near-data device serves the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// `cxlkv_ndp::Device` in a thread of this process.
    Thread,
    /// A `cxlkv-ndpd` process running this binary, started for the run and stopped after it.
    Ndpd(PathBuf),
    /// No device: the client computes every command on the host (its fallback path).
    Host,
}

/// How to build an [`Env`].
#[derive(Clone, Debug, PartialEq)]
pub struct EnvOptions {
    /// An existing pool (`shm:NAME`, `file:PATH`, `dax:PATH`, `numa:N:NAME`, as `cxlkv pool
    /// create` takes it); `None`: a private shared-memory pool sized for the run, removed after it.
    pub pool: Option<String>,
    /// The device.
    pub device: DeviceChoice,
    /// Positions per stored block (default 256).
    pub block_tokens: usize,
    /// Element type of the stored keys and values (default f32: exact). int8 and int4 quantize
    /// each block when it is sealed (K per channel, V per token; the open block stays f32 on the
    /// host); device commands attend and score the codes, gathered rows come back f32.
    pub dtype: DType,
    /// Attention sinks of the selection modes: positions `0 .. sinks` are always attended
    /// (default 4).
    pub sinks: u64,
    /// Local window of the selection modes: the last `window` positions are always attended
    /// (default 64).
    pub window: u64,
    /// The key sketch the stored blocks carry and how many candidates per query `ndp-topk` /
    /// `ndp-topp` re-score exactly on it (default none: they score every key exactly).
    pub sketch: SketchOption,
}

/// `--sketch`: the key sketch written with every stored block ([`Sketch`]) and the candidates
/// per query that a sketched selection re-scores on the exact keys. Written `none`, `int4`,
/// `sign`, or either with `:C`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SketchOption {
    /// The sketch (none: exact scoring).
    pub kind: Sketch,
    /// Candidates per query re-scored exactly (default [`SketchOption::DEFAULT_CANDIDATES`]).
    pub candidates: usize,
}

impl SketchOption {
    /// Candidates per query when `--sketch` names none.
    pub const DEFAULT_CANDIDATES: usize = 1024;

    /// No sketch.
    pub const NONE: SketchOption = SketchOption {
        kind: Sketch::None,
        candidates: SketchOption::DEFAULT_CANDIDATES,
    };

    /// The candidates of a sparse ATTEND on this sketch (`None` without one).
    pub fn candidates(&self) -> Option<usize> {
        (self.kind != Sketch::None).then_some(self.candidates)
    }
}

impl Default for SketchOption {
    fn default() -> Self {
        SketchOption::NONE
    }
}

impl std::fmt::Display for SketchOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            Sketch::None => write!(f, "none"),
            k => write!(f, "{}:{}", k.name(), self.candidates),
        }
    }
}

impl std::str::FromStr for SketchOption {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<SketchOption, String> {
        let (kind, c) = match s.split_once(':') {
            Some((k, c)) => (k, Some(c)),
            None => (s, None),
        };
        let kind: Sketch = kind.parse()?;
        let max = CXLKV_NDP_MAX_CANDIDATES as usize;
        let candidates = match c {
            None => SketchOption::DEFAULT_CANDIDATES,
            Some(_) if kind == Sketch::None => {
                return Err(format!("{s:?}: `none` takes no candidate count"))
            }
            Some(c) => match c.parse::<usize>() {
                Ok(n) if (1..=max).contains(&n) => n,
                _ => {
                    return Err(format!(
                        "{s:?}: the candidates per query are a count in 1..={max}"
                    ))
                }
            },
        };
        Ok(SketchOption { kind, candidates })
    }
}

impl Default for EnvOptions {
    fn default() -> Self {
        EnvOptions {
            pool: None,
            device: DeviceChoice::Thread,
            block_tokens: 256,
            dtype: DType::F32,
            sinks: 4,
            window: 64,
            sketch: SketchOption::NONE,
        }
    }
}

/// The device serving the pool while the run lasts (dropping it stops it).
enum Running {
    None,
    Thread(#[allow(dead_code)] DeviceHandle),
    Process(#[allow(dead_code)] Daemon),
}

/// Staging blocks of the client: one per KV head, so that a token's commands for all KV heads of
/// a layer are in flight at once.
fn staging_blocks(shape: &AttentionShape) -> usize {
    shape.kv_heads.clamp(2, 64)
}

/// Largest selection the private pool's blocks are sized to return in one command (more falls
/// back to the host).
const SIZED_SELECTION: usize = 2048 + 256;

/// The pool, the participant and the device of one run. Fields drop in order: the client first,
/// then the device, the participant, the pool, and last the private pool's memory.
pub struct Env {
    ndp: Mutex<NdpDevice>,
    running: Running,
    participant: Arc<Participant>,
    pool: Pool,
    /// A private pool's memory, removed when the run ends.
    _unlink: Option<TempBackend>,
    opts: EnvOptions,
    shape: AttentionShape,
    nonce: u64,
    kv_capacity: usize,
    staging: usize,
    spec: String,
    private: bool,
}

impl Env {
    /// Opens (or creates) the pool, attaches, and starts the device, for a model of `shape` and
    /// sequences of up to `max_tokens` positions. A private pool holds two such sequences at once
    /// (say, two backends compared side by side); a given pool must hold one.
    pub fn open(opts: &EnvOptions, shape: AttentionShape, max_tokens: usize) -> Result<Env> {
        Env::open_sized(opts, shape, max_tokens, opts.dtype)
    }

    /// [`Env::open`] with blocks sized for element type `widest` (a mode's `+dtype` wider than
    /// `opts.dtype`).
    pub(crate) fn open_sized(
        opts: &EnvOptions,
        shape: AttentionShape,
        max_tokens: usize,
        widest: DType,
    ) -> Result<Env> {
        let setup = |m: String| Error::Setup(m);
        let d = shape.head_dim;
        // The device's limits, as its ABI states them; the row width, as the kernels take rows.
        let (max_group, max_dim, lanes) = (
            CXLKV_NDP_MAX_GROUP as usize,
            CXLKV_NDP_MAX_DIM as usize,
            cxlkv_kernels::rows::LANES,
        );
        if shape.layers == 0
            || shape.kv_heads == 0
            || !shape.heads.is_multiple_of(shape.kv_heads)
            || shape.group() > max_group
            || d == 0
            || !d.is_multiple_of(lanes)
            || d > max_dim
        {
            return Err(setup(format!(
                "the device takes GQA groups of 1..={max_group} queries of {lanes}..={max_dim} \
                 elements (a multiple of {lanes}); this model has {} heads over {} KV heads of {d}",
                shape.heads, shape.kv_heads
            )));
        }
        if opts.block_tokens == 0 || opts.block_tokens > u32::MAX as usize {
            return Err(setup(format!(
                "{} positions per block: give at least 1",
                opts.block_tokens
            )));
        }
        let kv_block = KvShape {
            dtype: widest,
            layer: 0,
            kv_heads: shape.kv_heads as u32,
            head_dim: d as u32,
            tokens: opts.block_tokens as u32,
            sequence: 0,
            token_offset: 0,
        }
        .offsets_with(opts.sketch.kind)
        .ok_or_else(|| setup("the block size overflows".into()))?
        .len as u64;
        let per_run = shape.layers * max_tokens.max(1).div_ceil(opts.block_tokens);
        let staging = staging_blocks(&shape);
        let nonce = cxlkv_runtime::ndp::now_ns() ^ (u64::from(std::process::id()) << 40);

        let (backend, private) = match &opts.pool {
            Some(s) => (
                s.parse::<Backend>()
                    .map_err(|e| setup(format!("--pool {s}: {e}")))?,
                false,
            ),
            None => (
                Backend::Shm(format!(
                    "cxlkv-decode-{}-{}",
                    std::process::id(),
                    nonce % 1_000_000
                )),
                true,
            ),
        };
        let (pool, unlink) = if private {
            // Results of a selection (indices, scores, value rows per query) come back in a
            // staging block, so blocks are sized for those too.
            let selection = shape.group() as u64
                * SIZED_SELECTION.min(max_tokens.max(1)) as u64
                * (8 + gathered_dtype(widest).bytes(d) as u64)
                + 4096;
            let cfg = PoolConfig {
                block_size: kv_block.max(selection).next_multiple_of(4096),
                participants: 4,
                partitions: Some(1),
                lease: Duration::from_secs(2),
                ..PoolConfig::default()
            };
            let need = (2 * per_run + staging + 4) as u64;
            let mut size = (need * (cfg.block_size + 4096) + (8 << 20)).next_multiple_of(1 << 20);
            while plan(size, &cfg)
                .map(|sb| u64::from(sb.blocks_per_partition) < need)
                .unwrap_or(true)
            {
                size += (size / 8).next_multiple_of(1 << 20);
            }
            let pool = Pool::create_on(&backend, size, &cfg, &RegionOptions::default())
                .map_err(|e| setup(format!("creating a pool on {backend}: {e}")))?;
            (pool, Some(TempBackend::new(backend.clone())))
        } else {
            let pool = Pool::open_on(&backend, &RegionOptions::default()).map_err(|e| {
                setup(format!(
                    "opening the pool {backend}: {e} (create one with `cxlkv pool create`, or \
                     leave --pool out for a private one)"
                ))
            })?;
            (pool, None)
        };
        let sb = *pool.superblock();
        if sb.block_size < kv_block {
            return Err(setup(format!(
                "the pool's blocks hold {} bytes; a block of {} positions x {} KV heads x {d} \
                 x 2 (K and V) of {:?} needs {kv_block}: lower --block-tokens or use a pool with \
                 bigger blocks",
                sb.block_size, opts.block_tokens, shape.kv_heads, widest
            )));
        }
        let participant = Arc::new(
            pool.attach()
                .map_err(|e| setup(format!("attaching to the pool {backend}: {e}")))?,
        );
        let kv_capacity = (sb.blocks_per_partition as usize).saturating_sub(staging);
        if kv_capacity < per_run {
            return Err(setup(format!(
                "the pool {backend} is too small: a partition holds {} blocks of {} bytes; this \
                 run needs {per_run} ({} layers x {} blocks of {} positions for {max_tokens} \
                 positions) + {staging} staging blocks",
                sb.blocks_per_partition,
                sb.block_size,
                shape.layers,
                per_run / shape.layers,
                opts.block_tokens
            )));
        }
        let running = match &opts.device {
            DeviceChoice::Host => Running::None,
            DeviceChoice::Thread => Running::Thread(
                Device::start(pool.clone(), DeviceConfig::default())
                    .map_err(|e| Error::Device(format!("the in-process device: {e}")))?,
            ),
            DeviceChoice::Ndpd(exe) => {
                let d = Daemon::spawn(exe, &backend.to_string(), &[])
                    .map_err(|e| Error::Device(e.to_string()))?;
                Running::Process(d)
            }
        };
        let ndp = NdpDevice::open(
            participant.clone(),
            NdpOptions {
                timeout: Duration::from_secs(10),
                staging,
                ..NdpOptions::default()
            },
        )
        .map_err(|e| Error::Device(format!("opening the device's queue pair: {e}")))?;
        Ok(Env {
            ndp: Mutex::new(ndp),
            running,
            participant,
            pool,
            _unlink: unlink,
            opts: opts.clone(),
            shape,
            nonce,
            kv_capacity,
            staging,
            spec: backend.to_string(),
            private,
        })
    }

    /// One line: the pool, the device, the blocks.
    pub fn describe(&self) -> String {
        let sb = self.pool.superblock();
        let device = match &self.running {
            Running::None => "no device (the client computes every command on the host)".into(),
            Running::Thread(_) => "near-data device in a thread of this process".to_string(),
            Running::Process(d) => format!(
                "near-data device cxlkv-ndpd (pid {}, {})",
                d.pid(),
                d.path().display()
            ),
        };
        format!(
            "pool {} ({}, {} MiB, {} KV blocks of {} KiB per partition); {device}; blocks of {} \
             positions, {:?} K/V{}",
            self.spec,
            if self.private {
                "private, removed after the run"
            } else {
                "given"
            },
            sb.pool_size >> 20,
            self.kv_capacity,
            sb.block_size >> 10,
            self.opts.block_tokens,
            self.opts.dtype,
            match self.opts.sketch.kind {
                Sketch::None => String::new(),
                _ => format!(
                    ", {} key sketch (ndp-topk/ndp-topp re-score {} candidates a query)",
                    self.opts.sketch.kind.name(),
                    self.opts.sketch.candidates
                ),
            }
        )
    }

    /// The options it was opened with.
    pub fn options(&self) -> &EnvOptions {
        &self.opts
    }

    /// The model's attention shape.
    pub fn shape(&self) -> AttentionShape {
        self.shape
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub(crate) fn participant(&self) -> &Participant {
        &self.participant
    }

    pub(crate) fn block_size(&self) -> u64 {
        self.pool.block_size()
    }

    /// KV blocks the participant's partition holds beside the staging blocks.
    pub(crate) fn kv_capacity(&self) -> usize {
        self.kv_capacity
    }

    /// Commands the client can have in flight (its staging blocks).
    pub(crate) fn staging(&self) -> usize {
        self.staging
    }

    /// A number unique to this run, mixed into block keys (several runs may share a pool).
    pub(crate) fn nonce(&self) -> u64 {
        self.nonce
    }

    /// The device client, exclusively for one attention call.
    pub(crate) fn ndp(&self) -> MutexGuard<'_, NdpDevice> {
        self.ndp.lock().unwrap_or_else(|e| e.into_inner())
    }
}
