//! Trace replay: Mooncake-format request traces against the eviction policies and the tiers.
//!
//! A trace line is one request, `{"timestamp", "input_length", "output_length", "hash_ids"}`, with
//! one id per 512-token prompt block; equal ids are the same prefix block. Replay follows the
//! reference procedure of `data/traces/README.md`: requests in timestamp order (file order on
//! ties); a request's *prefix hits* are its leading ids that are cached, up to the first absent one;
//! then every block is touched in prompt order (present: an access; absent: inserted), and blocks
//! are evicted while more than the capacity are cached. The hit rate is the sum of prefix hits over
//! the sum of prompt blocks.
//!
//! Two drivers share one [`cxlkv_runtime::policy`] implementation:
//! - [`simulate`]: a pure cache simulator (ids only), fast enough for tests in debug builds;
//! - [`run_replay`]: the same procedure against a real pool with real tiers (DRAM cache, the CXL
//!   pool partition, SSD spill files), scaled block payloads and per-tier accounting, producing a
//!   [`ReplayReport`] (text, JSON, SVG).

use crate::durability::SyncPolicy;
use crate::slots::SlotMap;
use cxlkv_runtime::policy::PolicyKind;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Errors of trace replay.
#[derive(Debug, Error)]
pub enum ReplayError {
    /// The trace file could not be read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A trace line is not a request.
    #[error("trace {path} line {line}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Line number (1-based).
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// Options that cannot run.
    #[error("bad replay options: {0}")]
    BadOptions(String),
    /// The pool refused an operation.
    #[error(transparent)]
    Pool(#[from] cxlkv_runtime::pool::PoolError),
    /// A tier refused an operation.
    #[error(transparent)]
    Tier(#[from] crate::TierError),
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, ReplayError>;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Request {
    /// Arrival, milliseconds from the trace start.
    pub timestamp: u64,
    /// Prompt tokens.
    #[serde(default)]
    pub input_length: u64,
    /// Generated tokens.
    #[serde(default)]
    pub output_length: u64,
    /// One id per prompt block; equal ids are the same prefix block.
    pub hash_ids: Vec<u64>,
}

/// A trace: requests in replay order (sorted by timestamp, stable).
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The requests.
    pub requests: Vec<Request>,
}

impl Trace {
    /// Reads a Mooncake-format JSON-lines trace (blank lines are skipped).
    pub fn load(path: &Path) -> Result<Trace> {
        let text = std::fs::read_to_string(path).map_err(|source| ReplayError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Trace::parse(&text).map_err(|(line, message)| ReplayError::Parse {
            path: path.to_path_buf(),
            line,
            message,
        })
    }

    /// Parses trace text; on error, the 1-based line and the message.
    pub fn parse(text: &str) -> std::result::Result<Trace, (usize, String)> {
        let mut requests = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let r: Request = serde_json::from_str(line).map_err(|e| (i + 1, e.to_string()))?;
            requests.push(r);
        }
        requests.sort_by_key(|r| r.timestamp);
        Ok(Trace { requests })
    }

    /// Block accesses in replay order.
    pub fn accesses(&self) -> u64 {
        self.requests.iter().map(|r| r.hash_ids.len() as u64).sum()
    }

    /// For every access in replay order, the index of the next access to the same id
    /// (`u64::MAX`: never): the knowledge Belady's policy needs.
    pub fn next_uses(&self) -> Vec<u64> {
        let n = self.accesses() as usize;
        let mut next = vec![u64::MAX; n];
        let mut seen: HashMap<u64, u64> = HashMap::new();
        let flat: Vec<u64> = self
            .requests
            .iter()
            .flat_map(|r| r.hash_ids.iter().copied())
            .collect();
        for i in (0..n).rev() {
            if let Some(&j) = seen.get(&flat[i]) {
                next[i] = j;
            }
            seen.insert(flat[i], i as u64);
        }
        next
    }
}

/// Outcome of one simulated (policy, capacity) pair.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimResult {
    /// The policy.
    pub policy: PolicyKind,
    /// Cache capacity in blocks.
    pub capacity_blocks: usize,
    /// Sum of prefix hits.
    pub prefix_hits: u64,
    /// Sum of prompt blocks.
    pub accesses: u64,
}

impl SimResult {
    /// Prefix hits over prompt blocks, in percent.
    pub fn hit_rate_pct(&self) -> f64 {
        if self.accesses == 0 {
            0.0
        } else {
            100.0 * self.prefix_hits as f64 / self.accesses as f64
        }
    }
}

/// Replays `trace` against a pure cache of `capacity` blocks under `policy`, following the
/// reference procedure (module docs).
pub fn simulate(trace: &Trace, policy: PolicyKind, capacity: usize) -> SimResult {
    // One slot more than the capacity: a block is inserted, then blocks are evicted while over.
    let mut pol = policy.build(capacity + 1);
    let (prefix_hits, accesses) = simulate_with(trace, &mut *pol, policy.is_offline(), capacity);
    SimResult {
        policy,
        capacity_blocks: capacity,
        prefix_hits,
        accesses,
    }
}

/// [`simulate`] with a caller's policy over `capacity + 1` blocks (for tuning experiments);
/// `offline` feeds it next-use hints. Returns (prefix hits, prompt blocks).
pub fn simulate_with(
    trace: &Trace,
    pol: &mut dyn cxlkv_runtime::policy::EvictionPolicy,
    offline: bool,
    capacity: usize,
) -> (u64, u64) {
    let next = if offline {
        trace.next_uses()
    } else {
        Vec::new()
    };
    let mut map = SlotMap::new(capacity + 1);
    let (mut hits, mut accesses, mut t) = (0u64, 0u64, 0usize);
    for r in &trace.requests {
        hits += r
            .hash_ids
            .iter()
            .take_while(|id| map.get(**id).is_some())
            .count() as u64;
        accesses += r.hash_ids.len() as u64;
        let mut prev: Option<u64> = None;
        for &id in &r.hash_ids {
            let slot = match map.get(id) {
                Some(s) => {
                    if let Some(&n) = next.get(t) {
                        pol.next_use(s, n);
                    }
                    pol.touch(s);
                    s
                }
                None => {
                    let s = map.assign(id).expect("capacity + 1 slots");
                    if let Some(&n) = next.get(t) {
                        pol.next_use(s, n);
                    }
                    pol.insert(s);
                    s
                }
            };
            if let Some(p) = prev.and_then(|p| map.get(p)) {
                pol.link(slot, p);
            }
            while map.len() > capacity {
                let Some(v) = pol.victim() else { break };
                map.release(v);
            }
            prev = Some(id);
            t += 1;
        }
    }
    (hits, accesses)
}

/// Options of [`run_replay`].
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// The Mooncake-format trace.
    pub trace: PathBuf,
    /// Pool-tier capacities to replay, in blocks.
    pub capacities: Vec<usize>,
    /// Policies to replay ([`PolicyKind::Belady`] is the offline reference line).
    pub policies: Vec<PolicyKind>,
    /// Payload bytes of one (scaled) block.
    pub block_bytes: usize,
    /// Where spill files go (a subdirectory per run, removed afterwards).
    pub spill_dir: PathBuf,
    /// Demote to SSD spill files (else blocks evicted from the pool are dropped).
    pub with_ssd: bool,
    /// DRAM cache entries (`None`: capacity / 16, at least 16).
    pub dram_blocks: Option<usize>,
    /// Sync policy of the spill files ([`crate::durability`]).
    pub spill_sync: SyncPolicy,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            trace: PathBuf::from("data/traces/conversation_trace.jsonl"),
            capacities: vec![2_000, 4_000, 8_000, 16_000, 32_000, 64_000],
            policies: PolicyKind::ALL.to_vec(),
            // One spill record (64-byte header + payload) fills exactly one 4 KiB page.
            block_bytes: 4096 - spill_header_size(),
            spill_dir: std::env::temp_dir().join("cxlkv-replay"),
            with_ssd: true,
            dram_blocks: None,
            spill_sync: SyncPolicy::None,
        }
    }
}

const fn spill_header_size() -> usize {
    crate::spill::SPILL_HEADER_SIZE
}

/// One (policy, capacity) run of [`run_replay`].
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ReplayResult {
    /// Policy name.
    pub policy: String,
    /// Pool-tier capacity in blocks.
    pub capacity_blocks: usize,
    /// Prefix hit rate from memory tiers (DRAM + pool), percent: the figure the README's LRU
    /// reference describes.
    pub prefix_hit_rate: f64,
    /// The same run on the pure simulator (must agree: same policy code, same operation order).
    pub simulated_hit_rate: f64,
    /// Prefix hit rate counting SSD blocks too (the prefix continues through spilled blocks).
    pub prefix_hit_rate_with_ssd: f64,
    /// Prefix-hit blocks served from DRAM, percent of prompt blocks.
    pub dram_hit_rate: f64,
    /// … from the pool.
    pub pool_hit_rate: f64,
    /// … from SSD.
    pub ssd_hit_rate: f64,
    /// Payload bytes moved pool → SSD.
    pub bytes_pool_to_ssd: u64,
    /// Payload bytes moved SSD → pool.
    pub bytes_ssd_to_pool: u64,
    /// Payload bytes copied pool → DRAM.
    pub bytes_pool_to_dram: u64,
    /// Bytes written to spill files (headers and padding included, after LZ4).
    pub ssd_file_bytes_written: u64,
    /// Bytes read from spill files.
    pub ssd_file_bytes_read: u64,
    /// SSD throughput while in io_uring submissions, MB/s (10^6 bytes).
    pub ssd_mb_per_s: f64,
    /// Wall time of the run, seconds.
    pub seconds: f64,
}

/// What [`run_replay`] measured.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    /// Trace file.
    pub trace: String,
    /// Requests replayed.
    pub requests: usize,
    /// Prompt blocks per run.
    pub accesses: u64,
    /// Payload bytes per block.
    pub block_bytes: usize,
    /// SSD tier enabled.
    pub with_ssd: bool,
    /// Spill files used `O_DIRECT` (`None` without SSD).
    pub ssd_direct: Option<bool>,
    /// One entry per (policy, capacity).
    pub results: Vec<ReplayResult>,
}

/// Replays `opts.trace` against a real pool with real tiers for every policy and capacity.
/// `progress(done, total)` is called with prompt blocks replayed over all runs.
pub fn run_replay(
    opts: &ReplayOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ReplayReport> {
    use crate::{SpillOptions, Tier, TierConfig, Tiers};
    use cxlkv_runtime::key::Key;
    if opts.capacities.is_empty() || opts.policies.is_empty() || opts.capacities.contains(&0) {
        return Err(ReplayError::BadOptions(
            "need at least one policy and positive capacities".into(),
        ));
    }
    if opts.block_bytes == 0 || opts.block_bytes > 16 << 20 {
        return Err(ReplayError::BadOptions(format!(
            "block bytes {} outside 1..=16 MiB",
            opts.block_bytes
        )));
    }
    let trace = Trace::load(&opts.trace)?;
    let per_run = trace.accesses();
    let total = per_run * (opts.capacities.len() * opts.policies.len()) as u64;
    let next = if opts.policies.iter().any(|p| p.is_offline()) {
        trace.next_uses()
    } else {
        Vec::new()
    };
    let block_size = (opts.block_bytes as u64).div_ceil(4096) * 4096;
    let step_budget = 64;
    let mut report = ReplayReport {
        trace: opts.trace.display().to_string(),
        requests: trace.requests.len(),
        accesses: per_run,
        block_bytes: opts.block_bytes,
        with_ssd: opts.with_ssd,
        ssd_direct: None,
        results: Vec::new(),
    };
    let mut done = 0u64;
    for &policy in &opts.policies {
        for &cap in &opts.capacities {
            let started = std::time::Instant::now();
            let pool = replay_pool(block_size, cap + 4 * step_budget + 4)?;
            let run_dir =
                opts.spill_dir
                    .join(format!("{}-{cap}-{}", policy.name(), std::process::id()));
            let _ = std::fs::remove_dir_all(&run_dir);
            let cfg = TierConfig {
                pool_blocks: cap,
                dram_blocks: opts.dram_blocks.unwrap_or((cap / 16).max(16)),
                policy,
                spill_dir: opts.with_ssd.then(|| run_dir.clone()),
                spill: SpillOptions {
                    max_payload: opts.block_bytes,
                    queue_depth: 64,
                    sync: opts.spill_sync,
                    ..Default::default()
                },
                step_budget,
                dram_threshold: 4,
            };
            let (tiers, _) = Tiers::open(pool.attach()?, cfg)?;
            let (mut mem_hits, mut any_hits) = (0u64, 0u64);
            let mut by_tier = [0u64; 3];
            let mut buf = Vec::new();
            let mut t = 0usize;
            let key = |id: u64| Key(u128::from(id) | (1u128 << 127));
            for r in &trace.requests {
                mem_hits += r
                    .hash_ids
                    .iter()
                    .take_while(|id| tiers.in_memory(key(**id)))
                    .count() as u64;
                for id in &r.hash_ids {
                    let at = tiers.locate(key(*id));
                    let Some(first) = at.first() else { break };
                    any_hits += 1;
                    by_tier[match first {
                        Tier::Dram => 0,
                        Tier::Pool => 1,
                        Tier::Ssd => 2,
                    }] += 1;
                }
                let mut prev: Option<Key> = None;
                for &id in &r.hash_ids {
                    let k = key(id);
                    if policy.is_offline() {
                        tiers.hint_next_use(k, next[t]);
                    }
                    match tiers.get(k, &mut buf)? {
                        Some(_) => {
                            if let Some(p) = prev {
                                tiers.link(k, p);
                            }
                        }
                        None => tiers.put(k, &scaled_payload(id, opts.block_bytes), prev)?,
                    }
                    tiers.step()?;
                    prev = Some(k);
                    t += 1;
                    done += 1;
                    if done.is_multiple_of(4096) {
                        progress(done, total);
                    }
                }
            }
            let s = tiers.stats();
            let sp = tiers.spill_stats().unwrap_or_default();
            report.ssd_direct = report.ssd_direct.or(tiers.spill_direct());
            drop(tiers);
            let _ = std::fs::remove_dir_all(&run_dir);
            let pct = |x: u64| 100.0 * x as f64 / per_run.max(1) as f64;
            let io_bytes = sp.file_bytes_written + sp.file_bytes_read;
            report.results.push(ReplayResult {
                policy: policy.name().to_string(),
                capacity_blocks: cap,
                prefix_hit_rate: pct(mem_hits),
                simulated_hit_rate: simulate(&trace, policy, cap).hit_rate_pct(),
                prefix_hit_rate_with_ssd: pct(any_hits),
                dram_hit_rate: pct(by_tier[0]),
                pool_hit_rate: pct(by_tier[1]),
                ssd_hit_rate: pct(by_tier[2]),
                bytes_pool_to_ssd: s.bytes_pool_to_ssd,
                bytes_ssd_to_pool: s.bytes_ssd_to_pool,
                bytes_pool_to_dram: s.bytes_pool_to_dram,
                ssd_file_bytes_written: sp.file_bytes_written,
                ssd_file_bytes_read: sp.file_bytes_read,
                ssd_mb_per_s: if sp.io_ns == 0 {
                    0.0
                } else {
                    io_bytes as f64 * 1e3 / sp.io_ns as f64
                },
                seconds: started.elapsed().as_secs_f64(),
            });
        }
    }
    progress(total, total);
    Ok(report)
}

/// A private anonymous pool with one partition of at least `blocks` blocks of `block_size`.
fn replay_pool(block_size: u64, blocks: usize) -> Result<cxlkv_runtime::pool::Pool> {
    use cxlkv_runtime::pool::{plan, Pool, PoolConfig};
    let cfg = PoolConfig {
        block_size,
        participants: 2,
        partitions: Some(1),
        ..Default::default()
    };
    let mut size = (2 << 20) + blocks as u64 * (block_size + 256);
    loop {
        let sb = plan(size, &cfg)?;
        if sb.blocks_per_partition as usize >= blocks {
            let region = cxlkv_runtime::region::Region::anonymous(size)
                .map_err(cxlkv_runtime::pool::PoolError::from)?;
            return Ok(Pool::create(std::sync::Arc::new(region), &cfg)?);
        }
        size += size / 8;
    }
}

/// Deterministic stand-in bytes for trace block `id` (a scaled KV block: pseudo-random, so LZ4
/// rightly leaves most of them raw).
fn scaled_payload(id: u64, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    v.extend_from_slice(&id.to_le_bytes());
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

impl ReplayReport {
    /// The report as one JSON object with a `results` array.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plain data serializes")
    }

    fn rate(&self, policy: &str, cap: usize) -> Option<f64> {
        self.results
            .iter()
            .find(|r| r.policy == policy && r.capacity_blocks == cap)
            .map(|r| r.prefix_hit_rate)
    }

    /// For `cap`: (best online policy, its rate, LRU rate, Belady rate, share of the LRU→Belady
    /// gap it closes in percent), when all three were run.
    pub fn gap_closed(&self, cap: usize) -> Option<(String, f64, f64, f64, f64)> {
        let lru = self.rate("lru", cap)?;
        let opt = self.rate("belady", cap)?;
        let best = self
            .results
            .iter()
            .filter(|r| r.capacity_blocks == cap && r.policy != "belady")
            .max_by(|a, b| a.prefix_hit_rate.total_cmp(&b.prefix_hit_rate))?;
        let gap = opt - lru;
        let closed = if gap > 0.0 {
            100.0 * (best.prefix_hit_rate - lru) / gap
        } else {
            0.0
        };
        Some((best.policy.clone(), best.prefix_hit_rate, lru, opt, closed))
    }
}
