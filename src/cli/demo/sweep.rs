//! `cxlkv demo --sweep`: near-data top-k selection on stored keys, with its error beside its
//! link ratio. Not part of the default demo: a top-k selection keeps `k` of `N` keys, so its link
//! saving buys an approximate answer, while part 2 (`ndp-exact` on the real model) is exact.
//!
//! [`run`] builds a shared-memory pool, starts the device (a thread, or the `cxlkv-ndpd`
//! process), stores the real SmolLM2 KV tensors (every `layerNN_{q,k,v}.npy` of the KV folder) and
//! a long synthetic sequence as typed blocks, and runs decode steps two ways: the host scan (every
//! key of the sequence pulled across the link, then top-k on the host) and SCORE_TOPK on the
//! device (bound-pruned, group maximum, value rows gathered). For each context length it reports
//! the bytes over the link per step for both, their ratio and, beside it, the attention-output
//! error of the sparse step against dense attention; measured time per step, modeled time over a
//! CXL x8 link (32 GB/s, 250 ns), top-k recall against a dense exact top-k computed on the host
//! from private copies of the keys, and the fraction of blocks pruned. The synthetic sequence's
//! keys cluster by construction, which is why its ratio is large; its attention error says what
//! that ratio costs.

use super::super::{Error, Result};
use super::kv_dir;
use cxlkv::decode::find_ndpd;
use cxlkv::kernels::attention::{
    default_scale, dense_attention, relative_error, softmax_attention_selected,
};
use cxlkv::kernels::rng::SplitMix64;
use cxlkv::kernels::score::dot_canonical;
use cxlkv::kernels::{scan_topk, DType, GroupMode, Hit, KeyRows, QueryGroup, ScoreKernel, TopK};
use cxlkv::ndp::{Device, DeviceConfig, DeviceHandle};
use cxlkv::runtime::kv::chunk_kv;
use cxlkv::runtime::ndp::{
    host_score_topk, BlockSpec, NdpDevice, NdpOptions, NdpPath, ScoreRequest,
};
use cxlkv::runtime::{Backend, Key, KvShape, Participant, Pool, PoolConfig, RegionOptions};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Link model of the report: CXL x8.
pub const LINK_GBPS: f64 = 32.0;
/// Link latency of the model, ns.
pub const LINK_LATENCY_NS: f64 = 250.0;
/// Decode steps per context length.
pub const STEPS: usize = 4;
/// Head dimension of the synthetic sequence.
pub const SYNTH_DIM: usize = 128;
/// Queries per GQA group of the synthetic sequence.
pub const SYNTH_GROUP: usize = 4;
/// Tokens per synthetic block (one KV head, f16: 496 × 128 × 2 × 2 bytes + bounds fit 256 KiB).
pub const SYNTH_BLOCK_TOKENS: usize = 496;
const BLOCK_SIZE: u64 = 256 << 10;

/// Options of [`run`] (the `cxlkv demo --sweep` flags map 1:1).
#[derive(Clone, Debug)]
pub struct SweepOptions {
    /// Tokens of the synthetic sequence (runs at 1/16, 1/4 and all of it).
    pub tokens: usize,
    /// Hits per decode step.
    pub k: usize,
    /// Run the device as the `cxlkv-ndpd` process instead of a thread.
    pub device_process: bool,
    /// Folder of real KV tensors (`layerNN_{q,k,v}.npy`); default `data/kv/smollm2_devil_2048`
    /// when it exists.
    pub kv_dir: Option<PathBuf>,
    /// Pool backend spec; default a unique `/dev/shm` name, removed at the end.
    pub pool: Option<String>,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            tokens: 262_144,
            k: 256,
            device_process: false,
            kv_dir: None,
            pool: None,
        }
    }
}

/// One context length's figures (per decode step, averaged over the steps).
#[derive(Clone, Debug, PartialEq)]
pub struct SweepRun {
    /// What was scanned.
    pub name: String,
    /// Context length.
    pub tokens: usize,
    /// Hits per step.
    pub k: usize,
    /// Queries per group.
    pub group: usize,
    /// Head dimension.
    pub dim: usize,
    /// Bytes the host scan pulls across the link per step.
    pub host_link_bytes: u64,
    /// Bytes NDP moves across the link per step (both directions).
    pub ndp_link_bytes: u64,
    /// `host_link_bytes / ndp_link_bytes`.
    pub link_ratio: f64,
    /// Top-k recall against the dense exact top-k.
    pub recall: f64,
    /// Relative error of the sparse attention output against dense attention.
    pub attn_rel_err: f64,
    /// Fraction of blocks the device skipped on their bounds.
    pub blocks_pruned_frac: f64,
    /// Measured time per step, host scan, ms.
    pub host_ms: f64,
    /// Measured time per step, NDP round trip, ms.
    pub ndp_ms: f64,
    /// Modeled time per step over the link, host scan, ms.
    pub host_model_ms: f64,
    /// Modeled time per step over the link, NDP (device time + link), ms.
    pub ndp_model_ms: f64,
    /// Steps averaged.
    pub steps: usize,
    /// Steps the device answered (the rest fell back to the host).
    pub device_steps: usize,
}

/// The sweep's report: [`fmt::Display`] prints the table, [`SweepReport::to_json`] the JSON object.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepReport {
    /// One entry per context length.
    pub runs: Vec<SweepRun>,
    /// Where the device ran.
    pub device: String,
    /// Scoring kernel.
    pub kernel: String,
    /// Wall time of the whole sweep.
    pub seconds: f64,
}

impl SweepReport {
    /// One JSON object with a `runs` array.
    pub fn to_json(&self) -> serde_json::Value {
        let runs: Vec<serde_json::Value> = self
            .runs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name, "tokens": r.tokens, "k": r.k, "group": r.group, "dim": r.dim,
                    "host_link_bytes": r.host_link_bytes, "ndp_link_bytes": r.ndp_link_bytes,
                    "link_ratio": r.link_ratio, "recall": r.recall, "attn_rel_err": r.attn_rel_err,
                    "blocks_pruned_frac": r.blocks_pruned_frac, "host_ms": r.host_ms, "ndp_ms": r.ndp_ms,
                    "host_model_ms": r.host_model_ms, "ndp_model_ms": r.ndp_model_ms,
                    "steps": r.steps, "device_steps": r.device_steps,
                })
            })
            .collect();
        serde_json::json!({
            "device": self.device, "kernel": self.kernel, "seconds": self.seconds,
            "link_model": {"gbps": LINK_GBPS, "latency_ns": LINK_LATENCY_NS},
            "runs": runs,
        })
    }
}

impl fmt::Display for SweepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "device {}, kernel {}, link model CXL x8 ({LINK_GBPS} GB/s, {LINK_LATENCY_NS} ns)",
            self.device, self.kernel
        )?;
        writeln!(
            f,
            "{:<22} {:>8} {:>5} {:>12} {:>10} {:>8} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>7} {:>9}",
            "run", "tokens", "k", "host B/step", "NDP B/step", "ratio", "attn err", "recall",
            "host ms", "NDP ms", "host mdl", "NDP mdl", "pruned", "dev steps"
        )?;
        for r in &self.runs {
            writeln!(
                f,
                "{:<22} {:>8} {:>5} {:>12} {:>10} {:>7.0}x {:>9.2e} {:>9.4} {:>8.3} {:>8.3} {:>9.3} {:>9.3} {:>6.1}% {:>5}/{}",
                r.name, r.tokens, r.k, r.host_link_bytes, r.ndp_link_bytes, r.link_ratio,
                r.attn_rel_err, r.recall, r.host_ms, r.ndp_ms, r.host_model_ms, r.ndp_model_ms,
                100.0 * r.blocks_pruned_frac, r.device_steps, r.steps
            )?;
        }
        if let Some(r) = self
            .runs
            .iter()
            .max_by(|a, b| a.link_ratio.total_cmp(&b.link_ratio))
        {
            writeln!(
                f,
                "largest ratio: {} ({} tokens, top-{}): {:.0}x fewer link bytes, with an attention \
                 error of {:.2} ({:.0} %) against dense attention",
                r.name,
                r.tokens,
                r.k,
                r.link_ratio,
                r.attn_rel_err,
                100.0 * r.attn_rel_err
            )?;
        }
        writeln!(
            f,
            "attn err: ||top-k attention - dense attention|| / ||dense attention||; a selection's \
             ratio buys an approximate answer (part 2's ndp-exact is exact)"
        )?;
        write!(f, "total {:.1} s", self.seconds)
    }
}

/// A sequence stored in the pool, with private copies for the references.
struct Sequence {
    blocks: Vec<BlockSpec>,
    sequence: u64,
    layer: u32,
    tokens: usize,
    dim: usize,
    /// `[heads][tokens][dim]` f16.
    k: Vec<u8>,
    v: Vec<u8>,
}

impl Sequence {
    fn head(&self, x: &[u8], h: usize, tokens: usize) -> Vec<u8> {
        let row = self.dim * 2;
        x[h * self.tokens * row..(h * self.tokens + tokens) * row].to_vec()
    }
}

fn bar(done: usize, total: usize) -> String {
    let w = 30;
    let filled = (done * w).checked_div(total).unwrap_or(w);
    format!(
        "[{}{}] {:>3}%",
        "#".repeat(filled),
        " ".repeat(w - filled),
        (done * 100).checked_div(total).unwrap_or(100)
    )
}

/// Stores `[heads][tokens][dim]` f16 K and V as blocks of `per_block` tokens.
#[allow(clippy::too_many_arguments)]
fn store(
    p: &Participant,
    name: &str,
    k: Vec<u8>,
    v: Vec<u8>,
    heads: usize,
    tokens: usize,
    dim: usize,
    per_block: usize,
    sequence: u64,
    layer: u32,
    progress: &mut dyn FnMut(&str),
) -> Result<Sequence> {
    let mut blocks = Vec::new();
    let nblocks = tokens.div_ceil(per_block);
    for (range, bk, bv) in chunk_kv(&k, &v, heads, dim * 2, 0..tokens, per_block) {
        let (start, end) = (range.start, range.end);
        let shape = KvShape {
            dtype: DType::F16,
            layer,
            kv_heads: heads as u32,
            head_dim: dim as u32,
            tokens: (end - start) as u32,
            sequence,
            token_offset: start as u64,
        };
        let key = Key::from_bytes(
            format!("demo/{name}/seq{sequence}/layer{layer}/tok{start}").as_bytes(),
        );
        p.put_kv(key, &shape, &bk, &bv)?;
        blocks.push(BlockSpec {
            key,
            token_offset: start as u64,
        });
        if blocks.len() % 32 == 0 || end == tokens {
            progress(&format!("loading {name}: {}", bar(blocks.len(), nblocks)));
        }
    }
    Ok(Sequence {
        blocks,
        sequence,
        layer,
        tokens,
        dim,
        k,
        v,
    })
}

/// Synthetic keys: each block of tokens talks about a "topic" (a direction), tokens scatter around
/// it; values are random. Queries of a step point at a few topics, as a decode step attends to a
/// few earlier passages, so the top-k is concentrated and bounds can prune.
fn synthetic(
    tokens: usize,
    seed: u64,
    progress: &mut dyn FnMut(&str),
) -> (Vec<u8>, Vec<u8>, Vec<Vec<f32>>) {
    let mut rng = SplitMix64::new(seed);
    let d = SYNTH_DIM;
    let topics = tokens.div_ceil(SYNTH_BLOCK_TOKENS);
    let centers: Vec<Vec<f32>> = (0..topics)
        .map(|_| rng.normal_vec(d).iter().map(|x| 0.5 * x).collect())
        .collect();
    let mut k = Vec::with_capacity(tokens * d * 2);
    for t in 0..tokens {
        let c = &centers[t / SYNTH_BLOCK_TOKENS];
        for &x in c {
            k.extend_from_slice(&cxlkv::kernels::f32_to_f16(x + 0.05 * rng.normal()).to_le_bytes());
        }
        if t % 32768 == 0 {
            progress(&format!("generating synthetic keys: {}", bar(t, tokens)));
        }
    }
    let v = rng.key_bytes(tokens, d, DType::F16);
    // Per step: a group of queries mixing three topics of the sequence.
    let queries = (0..STEPS)
        .map(|_| {
            let picks: Vec<usize> = (0..3).map(|_| rng.below(topics as u64) as usize).collect();
            let mut q = Vec::with_capacity(SYNTH_GROUP * d);
            for _ in 0..SYNTH_GROUP {
                let mix: Vec<f32> = (0..d)
                    .map(|i| picks.iter().map(|&p| centers[p][i]).sum())
                    .collect();
                for s in mix {
                    q.push(5.0 * s + 0.3 * rng.normal());
                }
            }
            q
        })
        .collect();
    (k, v, queries)
}

/// The device, held until the demo ends (dropping either variant stops it).
enum Running {
    Thread(#[allow(dead_code)] DeviceHandle),
    Process(cxlkv::ndp::daemon::Daemon),
}

fn start_device(pool: &Pool, backend: &Backend, process: bool) -> Result<Running> {
    if !process {
        let cfg = DeviceConfig {
            link_bw_gbps: Some(LINK_GBPS),
            link_latency_ns: LINK_LATENCY_NS as u64,
            ..DeviceConfig::default()
        };
        return Device::start(pool.clone(), cfg)
            .map(Running::Thread)
            .map_err(|e| Error::Other(format!("the in-process device: {e}")));
    }
    let exe = find_ndpd().ok_or_else(|| {
        Error::Other("cxlkv-ndpd: not found next to this executable (set CXLKV_NDPD)".into())
    })?;
    let d = cxlkv::ndp::daemon::Daemon::spawn(
        &exe,
        &backend.to_string(),
        &[
            "--link-bw",
            &LINK_GBPS.to_string(),
            "--link-latency",
            &(LINK_LATENCY_NS as u64).to_string(),
        ],
    )
    .map_err(|e| Error::Other(format!("cxlkv-ndpd: {e}")))?;
    Ok(Running::Process(d))
}

/// The device client's errors, described.
fn ndp_err(e: impl fmt::Display) -> Error {
    Error::Other(format!("near-data device: {e}"))
}

fn model_ms(bytes: u64, round_trips: f64, device_ns: u64) -> f64 {
    (bytes as f64 / (LINK_GBPS * 1e9)
        + round_trips * LINK_LATENCY_NS * 1e-9
        + device_ns as f64 * 1e-9)
        * 1e3
}

/// Decode steps over the first `tokens` tokens of `kv_head` of `seq`.
#[allow(clippy::too_many_arguments)]
fn run_steps(
    pool: &Pool,
    ndp: &mut NdpDevice,
    seq: &Sequence,
    kv_head: usize,
    tokens: usize,
    queries: &[Vec<f32>],
    k: usize,
    name: String,
    progress: &mut dyn FnMut(&str),
) -> Result<SweepRun> {
    let dim = seq.dim;
    let nblocks = seq
        .blocks
        .iter()
        .filter(|b| (b.token_offset as usize) < tokens)
        .count();
    let blocks = &seq.blocks[..nblocks];
    // Whole blocks: the context ends where the first block left out starts.
    let tokens = seq
        .blocks
        .get(nblocks)
        .map_or(seq.tokens, |b| b.token_offset as usize);
    let keys_raw = seq.head(&seq.k, kv_head, tokens);
    let vals_raw = seq.head(&seq.v, kv_head, tokens);
    let keys = KeyRows::new(&keys_raw, DType::F16, dim).expect("dim checked");
    let vals = KeyRows::new(&vals_raw, DType::F16, dim).expect("dim checked");
    let scale = default_scale(dim);
    let kernel = ScoreKernel::detect();
    let mut run = SweepRun {
        name,
        tokens,
        k,
        group: queries[0].len() / dim,
        dim,
        host_link_bytes: 0,
        ndp_link_bytes: 0,
        link_ratio: 0.0,
        recall: 0.0,
        attn_rel_err: 0.0,
        blocks_pruned_frac: 0.0,
        host_ms: 0.0,
        ndp_ms: 0.0,
        host_model_ms: 0.0,
        ndp_model_ms: 0.0,
        steps: queries.len(),
        device_steps: 0,
    };
    let (mut recall, mut err, mut errs, mut pruned) = (0.0, 0.0, 0usize, 0.0);
    for (step, q) in queries.iter().enumerate() {
        progress(&format!(
            "{}: step {}/{}",
            run.name,
            step + 1,
            queries.len()
        ));
        let req = ScoreRequest {
            queries: q,
            dim,
            blocks,
            sequence: seq.sequence,
            layer: seq.layer,
            kv_head: kv_head as u32,
            dtype: DType::F16,
            k,
            mode: GroupMode::GroupMax,
            prune: true,
            gather_values: true,
            scale: Some(scale),
            select: Default::default(),
        };
        let host_req = ScoreRequest {
            prune: false,
            ..req.clone()
        };
        let t = Instant::now();
        let host = host_score_topk(pool, &host_req, kernel).map_err(ndp_err)?;
        run.host_ms += t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let ndp_out = ndp.score_topk(&req).map_err(ndp_err)?;
        run.ndp_ms += t.elapsed().as_secs_f64() * 1e3;
        if ndp_out.stats.path == Some(NdpPath::Device) {
            run.device_steps += 1;
        }
        run.host_link_bytes += host.stats.host_scan_bytes;
        run.ndp_link_bytes += ndp_out.stats.link_bytes();
        run.host_model_ms += model_ms(host.stats.host_scan_bytes, 1.0, 0);
        run.ndp_model_ms += model_ms(ndp_out.stats.link_bytes(), 2.0, ndp_out.stats.device_ns);
        pruned += f64::from(ndp_out.stats.blocks_pruned) / nblocks.max(1) as f64;
        // Dense exact top-k from the private copy of the keys.
        let group = QueryGroup::new(q, dim).expect("dim checked");
        let exact = scan_topk(kernel, &group, &keys, TopK::group_max(k));
        let got: std::collections::HashSet<u32> = ndp_out.indices[0].iter().copied().collect();
        recall += exact[0].iter().filter(|h| got.contains(&h.index)).count() as f64
            / exact[0].len().max(1) as f64;
        // Attention of each query over the selected rows (values as returned) vs dense attention.
        let sel_vals = KeyRows::new(&ndp_out.values, DType::F16, dim).expect("rows of dim");
        for g in 0..group.count() {
            let qg = group.query(g);
            let hits: Vec<Hit> = ndp_out.indices[0]
                .iter()
                .enumerate()
                .map(|(i, &t)| Hit {
                    index: i as u32,
                    score: dot_canonical(qg, &keys.row_vec(t as usize), DType::F16),
                })
                .collect();
            let sparse = softmax_attention_selected(&hits, &sel_vals, scale);
            let dense = dense_attention(qg, &keys, &vals, scale);
            err += relative_error(&sparse, &dense);
            errs += 1;
        }
    }
    let n = queries.len() as f64;
    run.host_link_bytes = (run.host_link_bytes as f64 / n).round() as u64;
    run.ndp_link_bytes = (run.ndp_link_bytes as f64 / n).round() as u64;
    run.link_ratio = run.host_link_bytes as f64 / run.ndp_link_bytes.max(1) as f64;
    run.recall = recall / n;
    run.attn_rel_err = err / errs.max(1) as f64;
    run.blocks_pruned_frac = pruned / n;
    run.host_ms /= n;
    run.ndp_ms /= n;
    run.host_model_ms /= n;
    run.ndp_model_ms /= n;
    Ok(run)
}

/// Runs the demo; `progress` receives one-line status updates (progress bars while loading).
pub fn run(opts: &SweepOptions, progress: &mut dyn FnMut(&str)) -> Result<SweepReport> {
    let t0 = Instant::now();
    if opts.k == 0 || opts.k > 4096 || opts.tokens < 1024 {
        return Err(Error::Usage(format!(
            "need 1 <= k <= 4096 and tokens >= 1024 (k {}, tokens {})",
            opts.k, opts.tokens
        )));
    }
    let dir = opts.kv_dir.clone().or_else(|| {
        let d = kv_dir::default_dir();
        d.join("meta.json").is_file().then_some(d)
    });
    let (heads, dim, real) = match dir {
        Some(d) => {
            let t = kv_dir::load(&d)?;
            (t.heads, t.dim, t.layers)
        }
        None => (0, 0, Vec::new()),
    };
    let real_bytes: usize = real.iter().map(|l| l.k.len() * 2).sum();
    let synth_bytes = opts.tokens * SYNTH_DIM * 2 * 2;
    let payload_per_block = BLOCK_SIZE as f64 * 0.75;
    let blocks =
        (synth_bytes + real_bytes) as f64 / payload_per_block + real.len() as f64 * 64.0 + 64.0;
    let size = ((blocks * BLOCK_SIZE as f64 * 1.1) as u64 + (16 << 20)).next_multiple_of(1 << 20);
    let (backend, owned) = match &opts.pool {
        Some(s) => (
            s.parse::<Backend>()
                .map_err(|e: cxlkv::runtime::region::RegionError| Error::Usage(e.to_string()))?,
            false,
        ),
        None => (
            Backend::Shm(format!(
                "cxlkv-demo-{}-{}",
                std::process::id(),
                cxlkv::runtime::ndp::now_ns() % 1_000_000
            )),
            true,
        ),
    };
    let _unlink = owned.then(|| cxlkv::runtime::region::TempBackend::new(backend.clone()));
    progress(&format!("creating pool {backend} ({} MiB)", size >> 20));
    let cfg = PoolConfig {
        block_size: BLOCK_SIZE,
        participants: 4,
        partitions: Some(1),
        ..PoolConfig::default()
    };
    let pool = Pool::create_on(&backend, size, &cfg, &RegionOptions::default())?;
    let participant = Arc::new(pool.attach()?);
    let running = start_device(&pool, &backend, opts.device_process)?;
    let device = match &running {
        Running::Thread(_) => "in-process thread".to_string(),
        Running::Process(d) => format!("cxlkv-ndpd process (pid {})", d.pid()),
    };
    let mut ndp = NdpDevice::open(
        participant.clone(),
        NdpOptions {
            timeout: Duration::from_secs(10),
            ..NdpOptions::default()
        },
    )
    .map_err(ndp_err)?;
    let mut runs = Vec::new();

    for kv_dir::Layer {
        layer,
        q,
        q_heads,
        k,
        v,
    } in real
    {
        let tokens = k.len() / (heads * dim * 2);
        let g = q_heads / heads;
        let row = heads * dim * 2 * 2;
        let per_block = ((BLOCK_SIZE as usize - 64 - heads * dim * 8) / row).min(256);
        let name = format!("real layer {layer}");
        let seq = store(
            &participant,
            &name,
            k,
            v,
            heads,
            tokens,
            dim,
            per_block,
            1,
            layer,
            progress,
        )?;
        for kvh in 0..heads {
            // Decode steps: the last STEPS tokens' queries over the whole context.
            let steps: Vec<Vec<f32>> = (0..STEPS.min(tokens))
                .map(|s| {
                    let t = tokens - 1 - s;
                    (kvh * g..(kvh + 1) * g)
                        .flat_map(|h| (0..dim).map(move |d| (h, d)))
                        .map(|(h, d)| DType::F16.load(&q, (h * tokens + t) * dim + d))
                        .collect()
                })
                .collect();
            let k = opts.k.min(tokens);
            runs.push(run_steps(
                &pool,
                &mut ndp,
                &seq,
                kvh,
                tokens,
                &steps,
                k,
                format!("L{layer} kv{kvh} (real)"),
                progress,
            )?);
        }
        drop(seq);
    }

    let (k, v, queries) = synthetic(opts.tokens, 0x5eed, progress);
    let seq = store(
        &participant,
        "synthetic",
        k,
        v,
        1,
        opts.tokens,
        SYNTH_DIM,
        SYNTH_BLOCK_TOKENS,
        2,
        0,
        progress,
    )?;
    let mut lengths = vec![opts.tokens / 16, opts.tokens / 4, opts.tokens];
    lengths.retain(|&n| n >= opts.k.max(SYNTH_BLOCK_TOKENS));
    lengths.dedup();
    for n in lengths {
        // Whole blocks: the context ends where the first block left out starts.
        let eff = seq
            .blocks
            .iter()
            .find(|b| b.token_offset as usize >= n)
            .map_or(seq.tokens, |b| b.token_offset as usize);
        runs.push(run_steps(
            &pool,
            &mut ndp,
            &seq,
            0,
            n,
            &queries,
            opts.k,
            format!("synthetic {eff}"),
            progress,
        )?);
    }
    drop(ndp);
    drop(running);
    Ok(SweepReport {
        runs,
        device,
        kernel: format!("{:?}", ScoreKernel::detect().isa()),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sweep on a small synthetic sequence plus the real tensors: exact recall, fewer bytes
    /// over the link for NDP, and a JSON report with the documented fields.
    #[test]
    fn small_sweep_is_exact_and_saves_link_bytes() {
        let opts = SweepOptions {
            tokens: 8192,
            k: 32,
            ..SweepOptions::default()
        };
        let mut lines = 0;
        let r = run(&opts, &mut |_| lines += 1).unwrap();
        assert!(lines > 0);
        assert!(r.runs.len() >= 2, "{r}");
        for run in &r.runs {
            assert_eq!(run.recall, 1.0, "{r}");
            assert_eq!(run.device_steps, run.steps, "{r}");
            assert!(run.link_ratio > 1.0, "{r}");
            assert!(
                run.attn_rel_err.is_finite() && run.ndp_link_bytes > 0,
                "{r}"
            );
        }
        let j = r.to_json();
        for f in [
            "tokens",
            "k",
            "host_link_bytes",
            "ndp_link_bytes",
            "link_ratio",
            "recall",
            "attn_rel_err",
            "blocks_pruned_frac",
            "host_ms",
            "ndp_ms",
        ] {
            assert!(j["runs"][0].get(f).is_some(), "missing {f}");
        }
        println!("{r}");
    }
}
