//! The `cxlkv bench qk` harness: fused Q·K + top-k on cold keys, measured in the same run as a
//! plain streaming read of the same bytes with the same thread count, so the kernel's key
//! bandwidth is reported as a fraction of what the machine can read.
//!
//! Keys are made cold before every timed run with [`crate::cold::evict`] (`clflush`), which
//! matters because last-level caches can exceed the key buffer. Each repeat times the kernel and
//! the read back to back; the report gives medians (the headline figures) and bests.
//!
//! With [`QkBenchConfig::attend`] the kernel is the fused attention instead
//! ([`attend_block_scaled`], the NDP `ATTEND` computation): over `N` key rows and `N` value rows
//! (value scales for a quantized dtype), one thread, and the read is of the same K + V bytes.
//! Every ratio is in bytes read: int8 and int4 rows count their own (smaller) size.

use crate::cold::evict;
use cxlkv_kernels::attend::attend_block_scaled;
use cxlkv_kernels::dtype::DType;
use cxlkv_kernels::parallel::{scan_topk_parallel, stream_sum_parallel};
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::rows::{KeyRows, QueryGroup, ShapeError};
use cxlkv_kernels::score::ScoreKernel;
use cxlkv_kernels::topk::{Hit, TopK};
use std::fmt;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QkBenchConfig {
    /// Keys `N`.
    pub tokens: usize,
    /// Head dimension.
    pub dim: usize,
    /// Key element type.
    pub dtype: DType,
    /// Queries per GQA group `G`.
    pub group: usize,
    /// Hits per query.
    pub k: usize,
    /// Threads for both the kernel and the read.
    pub threads: usize,
    /// Timed repeats of each (at least 1).
    pub repeats: usize,
    /// Seed of the synthetic keys and queries.
    pub seed: u64,
    /// Flush the keys from the caches before every timed run (true: cold keys, the point of the
    /// benchmark; false: warm, to see the kernel's compute limit).
    pub flush: bool,
    /// Time the fused attention over K and V (one thread) instead of scoring and top-k.
    pub attend: bool,
}

impl Default for QkBenchConfig {
    fn default() -> Self {
        QkBenchConfig {
            tokens: 1 << 20,
            dim: 128,
            dtype: DType::F16,
            group: 1,
            k: 256,
            threads: 1,
            repeats: 5,
            seed: 1,
            flush: true,
            attend: false,
        }
    }
}

/// What was measured.
#[derive(Clone, Debug)]
pub struct QkBenchReport {
    /// The configuration.
    pub config: QkBenchConfig,
    /// Scoring implementation used.
    pub isa: &'static str,
    /// Whether the keys were flushed from the caches before each timed run.
    pub flushed: bool,
    /// Key bytes scanned per run.
    pub key_bytes: u64,
    /// Median and best kernel time per run, seconds.
    pub kernel_secs: (f64, f64),
    /// Median and best streaming-read time per run, seconds.
    pub read_secs: (f64, f64),
    /// Key bytes per second of the kernel (median run), GB/s (1e9 bytes).
    pub key_gbps: f64,
    /// Bytes per second of the streaming read (median run), GB/s.
    pub read_gbps: f64,
    /// `key_gbps / read_gbps`.
    pub ratio: f64,
    /// The best hit of query 0 (a result check and a guard against dead-code elimination).
    pub best_hit: Option<Hit>,
}

/// Synthetic keys: `tokens` rows of `dim` elements with random signs and magnitudes in
/// `[1/8, 2)`, generated straight as bit patterns (fast enough for gigabytes); for a quantized
/// `dtype`, uniform codes in `-qmax..=qmax`.
pub fn synthetic_keys(tokens: usize, dim: usize, dtype: DType, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let elems = tokens * dim;
    if let Some(qmax) = dtype.qmax() {
        return synthetic_codes(&mut rng, elems, dtype, qmax);
    }
    let mut out = Vec::with_capacity(dtype.bytes(elems));
    let mut word = 0u64;
    for e in 0..elems {
        if e % 4 == 0 {
            word = rng.next_u64();
        }
        let r = (word >> (16 * (e % 4))) as u16;
        // 16 random bits: sign, 2 exponent bits (4 binades), 13 mantissa bits.
        let sign = (r >> 15) as u32;
        let exp = ((r >> 13) & 3) as u32; // 0..3 -> 2^-3 .. 2^0
        let man = (r & 0x1fff) as u32;
        let f32_bits = (sign << 31) | ((124 + exp) << 23) | (man << 10);
        match dtype {
            DType::F16 => out.extend_from_slice(
                &cxlkv_kernels::dtype::f32_to_f16(f32::from_bits(f32_bits)).to_le_bytes(),
            ),
            DType::Bf16 => out.extend_from_slice(&((f32_bits >> 16) as u16).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&f32_bits.to_le_bytes()),
            DType::I8 | DType::I4 => unreachable!("codes are drawn by synthetic_codes"),
        }
    }
    out
}

/// `elems` uniform codes in `-qmax..=qmax` in `dtype`'s layout (two per byte for I4).
fn synthetic_codes(rng: &mut SplitMix64, elems: usize, dtype: DType, qmax: i32) -> Vec<u8> {
    let span = (2 * qmax + 1) as u64;
    let mut code = || (rng.next_u64() % span) as i32 - qmax;
    match dtype {
        DType::I4 => (0..elems.div_ceil(2))
            .map(|_| ((code() as u8) & 0x0f) | ((code() as u8) << 4))
            .collect(),
        _ => (0..elems).map(|_| code() as u8).collect(),
    }
}

/// Runs the benchmark on synthetic data (see the module documentation).
pub fn run_qk_bench(cfg: &QkBenchConfig) -> QkBenchReport {
    let mut keys = synthetic_keys(cfg.tokens, cfg.dim, cfg.dtype, cfg.seed);
    if cfg.attend {
        keys.extend(synthetic_keys(cfg.tokens, cfg.dim, cfg.dtype, cfg.seed + 1));
    }
    let queries = SplitMix64::new(cfg.seed ^ 0x5eed).normal_vec(cfg.group * cfg.dim);
    measure_qk(cfg, &keys, &queries).expect("synthetic data has a valid shape")
}

/// Runs the benchmark on given keys (rows of `cfg.dim` elements of `cfg.dtype`; with
/// `cfg.attend`, the key rows followed by as many value rows) and `cfg.group` queries;
/// `cfg.tokens` and `cfg.group` are taken from the data.
pub fn measure_qk(
    cfg: &QkBenchConfig,
    keys: &[u8],
    queries: &[f32],
) -> Result<QkBenchReport, ShapeError> {
    let all = KeyRows::new(keys, cfg.dtype, cfg.dim)?;
    if cfg.attend && all.len() % 2 == 1 {
        return Err(ShapeError::RaggedRows {
            len: keys.len(),
            row_bytes: 2 * all.row_bytes(),
        });
    }
    let half = if cfg.attend { all.len() / 2 } else { all.len() };
    let rows = all.slice(0, half);
    let vrows = all.slice(half, all.len());
    // Per-token value scales for quantized values (their values do not change the timing).
    let vscales: Vec<f32> = (0..half).map(|i| 1e-2 * (1 + i % 7) as f32).collect();
    let vscales = cfg.dtype.is_quantized().then_some(&vscales[..]);
    let group = QueryGroup::new(queries, cfg.dim)?;
    let mut config = cfg.clone();
    config.tokens = half;
    config.group = group.count();
    config.threads = cfg.threads.max(1);
    config.repeats = cfg.repeats.max(1);
    let kernel = ScoreKernel::detect();
    let topk = TopK::per_query(config.k);
    let scale = 1.0 / (cfg.dim as f32).sqrt();
    let run = || -> Option<Hit> {
        if config.attend {
            let p = attend_block_scaled(kernel, &group, &rows, &vrows, vscales, scale);
            // The attention's largest score stands in for a hit (a result check).
            return p.first().map(|p| Hit {
                index: 0,
                score: p.max,
            });
        }
        let hits = scan_topk_parallel(kernel, &group, &rows, topk, config.threads);
        hits.first().and_then(|h| h.first().copied())
    };
    let mut kernel_times = Vec::with_capacity(config.repeats);
    let mut read_times = Vec::with_capacity(config.repeats);
    let mut flushed = false;
    let mut best_hit = None;
    // One untimed warm-up of each: page tables, thread start-up, code.
    black_box(run());
    black_box(stream_sum_parallel(keys, config.threads));
    for _ in 0..config.repeats {
        flushed = config.flush && evict(keys);
        let t = Instant::now();
        best_hit = black_box(run());
        kernel_times.push(t.elapsed());

        if config.flush {
            evict(keys);
        }
        let t = Instant::now();
        black_box(stream_sum_parallel(black_box(keys), config.threads));
        read_times.push(t.elapsed());
    }
    let kernel_secs = median_and_best(&kernel_times);
    let read_secs = median_and_best(&read_times);
    let bytes = keys.len() as f64;
    let key_gbps = bytes / kernel_secs.0 / 1e9;
    let read_gbps = bytes / read_secs.0 / 1e9;
    Ok(QkBenchReport {
        config,
        isa: kernel.isa().name(),
        flushed,
        key_bytes: keys.len() as u64,
        kernel_secs,
        read_secs,
        key_gbps,
        read_gbps,
        ratio: key_gbps / read_gbps,
        best_hit,
    })
}

fn median_and_best(times: &[Duration]) -> (f64, f64) {
    let median = crate::median(times.to_vec()).as_secs_f64().max(1e-12);
    let best = times.iter().min().expect("timed at least once");
    (median, best.as_secs_f64().max(1e-12))
}

impl QkBenchReport {
    /// The report as one JSON object (config, results, and the ratio).
    pub fn to_json(&self) -> String {
        let c = &self.config;
        let hit = match self.best_hit {
            Some(h) => format!(
                "{{\"index\":{},\"score\":{}}}",
                h.index,
                json_f64(h.score as f64)
            ),
            None => "null".to_string(),
        };
        format!(
            concat!(
                "{{\"tokens\":{},\"dim\":{},\"dtype\":\"{}\",\"group\":{},\"k\":{},",
                "\"threads\":{},\"repeats\":{},\"seed\":{},\"flush\":{},\"attend\":{},",
                "\"isa\":\"{}\",\"flushed\":{},",
                "\"key_bytes\":{},\"kernel_secs\":{},\"kernel_secs_best\":{},",
                "\"read_secs\":{},\"read_secs_best\":{},\"key_gbps\":{},\"read_gbps\":{},",
                "\"ratio\":{},\"best_hit\":{}}}"
            ),
            c.tokens,
            c.dim,
            c.dtype.name(),
            c.group,
            c.k,
            c.threads,
            c.repeats,
            c.seed,
            c.flush,
            c.attend,
            self.isa,
            self.flushed,
            self.key_bytes,
            json_f64(self.kernel_secs.0),
            json_f64(self.kernel_secs.1),
            json_f64(self.read_secs.0),
            json_f64(self.read_secs.1),
            json_f64(self.key_gbps),
            json_f64(self.read_gbps),
            json_f64(self.ratio),
            hit
        )
    }
}

/// A finite float as JSON, `null` otherwise.
fn json_f64(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".to_string()
    }
}

impl fmt::Display for QkBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(
            f,
            "qk bench: N={} d={} {} G={} k={} threads={} repeats={} isa={} keys {}",
            c.tokens,
            c.dim,
            c.dtype.name(),
            c.group,
            c.k,
            c.threads,
            c.repeats,
            self.isa,
            if self.flushed {
                "flushed (cold)"
            } else {
                "not flushed"
            }
        )?;
        writeln!(
            f,
            "{:<22} {:>12} {:>12} {:>10}",
            "", "median ms", "best ms", "GB/s"
        )?;
        writeln!(
            f,
            "{:<22} {:>12.3} {:>12.3} {:>10.2}",
            if c.attend {
                "attend (K + V)"
            } else {
                "score + top-k"
            },
            self.kernel_secs.0 * 1e3,
            self.kernel_secs.1 * 1e3,
            self.key_gbps
        )?;
        writeln!(
            f,
            "{:<22} {:>12.3} {:>12.3} {:>10.2}",
            "streaming read (sum)",
            self.read_secs.0 * 1e3,
            self.read_secs.1 * 1e3,
            self.read_gbps
        )?;
        write!(
            f,
            "bytes read/s = {:.1} % of read bandwidth ({} MiB read per run)",
            self.ratio * 100.0,
            self.key_bytes >> 20
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn small_run_reports_consistent_figures() {
        let cfg = QkBenchConfig {
            tokens: 5000,
            dim: 64,
            group: 2,
            k: 16,
            threads: 2,
            repeats: 2,
            ..QkBenchConfig::default()
        };
        for (dtype, row) in [(DType::I8, 64), (DType::I4, 32)] {
            let q = QkBenchConfig {
                dtype,
                ..cfg.clone()
            };
            let r = run_qk_bench(&q);
            assert_eq!((r.key_bytes, r.config.tokens), (5000 * row, 5000));
            let a = run_qk_bench(&QkBenchConfig {
                attend: true,
                threads: 1,
                ..q
            });
            assert_eq!((a.key_bytes, a.config.tokens), (2 * 5000 * row, 5000));
            assert!(a.best_hit.is_some() && a.ratio > 0.0);
            assert!(a.to_json().contains("\"attend\":true"));
        }
        let r = run_qk_bench(&cfg);
        assert_eq!(r.key_bytes, 5000 * 64 * 2);
        assert!(r.key_gbps > 0.0 && r.read_gbps > 0.0);
        assert!((r.ratio - r.key_gbps / r.read_gbps).abs() < 1e-9);
        let json = r.to_json();
        for field in [
            "\"key_gbps\":",
            "\"read_gbps\":",
            "\"ratio\":",
            "\"tokens\":5000",
        ] {
            assert!(json.contains(field), "{json}");
        }
        assert!(json.starts_with('{') && json.ends_with('}'));
        assert!(r.to_string().contains("% of read bandwidth"));
        // The reported best hit is the true best of query 0.
        let keys = synthetic_keys(5000, 64, DType::F16, cfg.seed);
        let q = SplitMix64::new(cfg.seed ^ 0x5eed).normal_vec(2 * 64);
        let rows = KeyRows::new(&keys, DType::F16, 64).unwrap();
        let scores = cxlkv_kernels::attention::dense_scores(&q[..64], &rows);
        assert_eq!(
            r.best_hit,
            cxlkv_kernels::topk::topk_by_sort(&scores, 1)
                .first()
                .copied()
        );
    }
}
