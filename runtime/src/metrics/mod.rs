//! Metrics in the Prometheus text format.
//!
//! Two kinds, because only what lies in shared memory can be read by another process:
//!
//! - **Process-local** ([`Metrics`], the process's one [`global`] registry): operation counts by
//!   result, bytes in and out, latency histograms of puts, gets, pins, deletes and device
//!   commands (`SCORE_TOPK`, `GATHER`, `ATTEND`), and device fallbacks. They are recorded inside
//!   the operations themselves, so every caller (the C ABI, the Python package, a Rust program
//!   such as `cxlkv generate`) counts one call once, the same way:
//!   - [`Participant`](crate::Participant)'s `put`, `put_kv`, `put_if_absent` and
//!     [`Reservation::commit`](crate::Reservation::commit) (`put`), `get` and `get_into` (`get`),
//!     `pin` (`pin`; not `pin_block`, the scanners' own pin), `delete` (`delete`);
//!   - [`NdpDevice`](crate::ndp::NdpDevice)'s SCORE_TOPK and ATTEND, counted when their answer is
//!     collected (`wait`, a `poll` that answers, the synchronous calls, the `*_on_host` calls) or
//!     when a filed command fails; `gather`. A request refused by its own check is not a command
//!     and is not counted; a ticket never collected is not counted.
//!
//!   The rule for bytes: a call that succeeded (or missed) counts what it moved, `bytes_in` the
//!   caller's payload (put payloads, K and V of a typed put, nothing for a put-if-absent that
//!   found the key; device query vectors and token lists) and `bytes_out` what it handed back
//!   (get and pin payloads, device hits, value rows and partials). A failed call counts one
//!   `error` and its latency, and no bytes, whatever the front end.
//!
//!   [`Metrics::snapshot`] gives the numbers, [`Metrics::encode`] the text exposition. Each copy
//!   of the runtime has its own registry: `libcxlkv.so` and Python's extension module each link
//!   one, so a process that loads both has two, each read through its own library.
//! - **Pool-wide** ([`pool`]): the counters every participant publishes in its pool slot (puts,
//!   hits, misses, retries, evictions, deletes, pins, bytes in and out, device fallbacks, refused
//!   pins) and each partition's occupancy, read by anyone through [`crate::pool_stats`] (`cxlkv pool
//!   stat --prometheus`) or [`crate::participant_counters`]. [`Metrics::encode_with_pool`] writes
//!   both kinds in one exposition (the C ABI's `cxlkv_pool_metrics_text`, Python's
//!   `cxlkv.metrics_text(pool)`).
//!
//! The exposition is written with `prometheus-client`: latencies in seconds, sizes in bytes,
//! counters end in `_total`.

pub mod crosspod;
pub mod pool;

use crate::ndp::client::error::FallbackReason;
use crate::ndp::client::request::{NdpPath, NdpStats};
use crosspod::WriteBack;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Upper bounds of the latency histograms' buckets, in seconds: 1 µs to about 4.2 s, ×4 apart.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(1e-6, 4.0, BUCKETS as u16)
}

/// A latency histogram with [`latency_buckets`].
pub fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// Labels of a metric family (`name="value"` pairs).
pub type Labels = Vec<(&'static str, &'static str)>;

/// A family of latency histograms.
pub type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// An operation the process-local metrics count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// A block stored.
    Put,
    /// A block read.
    Get,
    /// A block pinned.
    Pin,
    /// A block deleted.
    Delete,
    /// A device `SCORE_TOPK` (on the device or, falling back, on the host).
    ScoreTopk,
    /// A device `GATHER`.
    Gather,
    /// A device `ATTEND` (each query's partial attention; on the device or, falling back, on the
    /// host).
    Attend,
}

impl Op {
    /// Every operation, in label order.
    pub const ALL: [Op; 7] = [
        Op::Put,
        Op::Get,
        Op::Pin,
        Op::Delete,
        Op::ScoreTopk,
        Op::Gather,
        Op::Attend,
    ];

    /// The `op` label's value.
    pub fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
            Op::Pin => "pin",
            Op::Delete => "delete",
            Op::ScoreTopk => "score_topk",
            Op::Gather => "gather",
            Op::Attend => "attend",
        }
    }
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It did what was asked.
    Ok,
    /// The key was not there (a get or pin that missed).
    Miss,
    /// It failed.
    Error,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Outcome; 3] = [Outcome::Ok, Outcome::Miss, Outcome::Error];

    /// The `result` label's value.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Miss => "miss",
            Outcome::Error => "error",
        }
    }
}

/// The reasons of a host fallback, in label order.
pub const FALLBACKS: [FallbackReason; 8] = [
    FallbackReason::Absent,
    FallbackReason::Dead,
    FallbackReason::Timeout,
    FallbackReason::Busy,
    FallbackReason::TooLarge,
    FallbackReason::DeviceRetry,
    FallbackReason::Forced,
    FallbackReason::Unsupported,
];

/// The `reason` label of a host fallback.
pub fn fallback_name(why: FallbackReason) -> &'static str {
    match why {
        FallbackReason::Absent => "absent",
        FallbackReason::Dead => "dead",
        FallbackReason::Timeout => "timeout",
        FallbackReason::Busy => "busy",
        FallbackReason::TooLarge => "too_large",
        FallbackReason::DeviceRetry => "device_retry",
        FallbackReason::Forced => "forced",
        FallbackReason::Unsupported => "unsupported",
    }
}

/// A latency histogram of atomics with [`latency_buckets`]' bounds (lock-free to record, no
/// allocation after construction).
#[derive(Debug, Default)]
pub struct AtomicHistogram {
    /// Observations per bucket (not cumulative); the last is above every bound.
    buckets: [AtomicU64; BUCKETS + 1],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

const BUCKETS: usize = 12;

impl AtomicHistogram {
    /// Counts one observation.
    pub fn observe(&self, took: Duration) {
        let s = took.as_secs_f64();
        let i = latency_buckets().position(|b| s <= b).unwrap_or(BUCKETS);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Its figures now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: latency_buckets()
                .chain(std::iter::once(f64::MAX))
                .zip(&self.buckets)
                .map(|(b, n)| (b, n.load(Ordering::Relaxed)))
                .collect(),
            count: self.count.load(Ordering::Relaxed),
            sum_s: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// An [`AtomicHistogram`] read at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// (upper bound in seconds, observations in this bucket alone); the last bound is `f64::MAX`.
    pub buckets: Vec<(f64, u64)>,
    /// Observations.
    pub count: u64,
    /// Their sum, seconds.
    pub sum_s: f64,
}

const OPS: usize = Op::ALL.len();
const OUTCOMES: usize = Outcome::ALL.len();

/// The process-local metrics (see the module documentation): fixed arrays of atomics, so that
/// recording takes no lock and allocates nothing. Thread-safe.
#[derive(Debug, Default)]
pub struct Metrics {
    ops: [[AtomicU64; OUTCOMES]; OPS],
    bytes_in: [AtomicU64; OPS],
    bytes_out: [AtomicU64; OPS],
    latency: [AtomicHistogram; OPS],
    /// Per [`FALLBACKS`] reason.
    fallbacks: [AtomicU64; FALLBACKS.len()],
    device_link_bytes: AtomicU64,
    host_link_bytes: AtomicU64,
}

/// One operation's figures in a [`MetricsSnapshot`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpSnapshot {
    /// Calls that succeeded.
    pub ok: u64,
    /// Calls that missed (gets, pins and deletes of an absent key).
    pub miss: u64,
    /// Calls that failed.
    pub error: u64,
    /// Bytes the caller handed in (put payloads, device arguments).
    pub bytes_in: u64,
    /// Bytes handed back to the caller (get payloads, device results).
    pub bytes_out: u64,
    /// The latencies of all its calls (every outcome).
    pub latency: HistogramSnapshot,
}

/// The numbers of [`Metrics`] at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Per operation, in [`Op::ALL`] order.
    pub ops: Vec<(Op, OpSnapshot)>,
    /// Device commands the client computed on the host instead, by reason.
    pub fallbacks: Vec<(FallbackReason, u64)>,
    /// Bytes that crossed the link for device commands on the device path.
    pub device_link_bytes: u64,
    /// Bytes a host fallback's scan pulled across the link.
    pub host_link_bytes: u64,
    /// Cross-pod write-backs of evicted blocks, by result.
    pub write_backs: Vec<(WriteBack, u64)>,
    /// Cross-pod write-through publishes of put keys, by result.
    pub publishes: Vec<(WriteBack, u64)>,
}

impl MetricsSnapshot {
    /// The figures of `op`.
    pub fn op(&self, op: Op) -> OpSnapshot {
        self.ops
            .iter()
            .find(|(o, _)| *o == op)
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    }

    /// Device commands computed on the host, all reasons.
    pub fn device_fallbacks(&self) -> u64 {
        self.fallbacks.iter().map(|f| f.1).sum()
    }
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one operation: how it ended, the bytes it took in and gave out, how long it took.
    pub fn record(&self, op: Op, outcome: Outcome, bytes_in: u64, bytes_out: u64, took: Duration) {
        let i = op as usize;
        self.ops[i][outcome as usize].fetch_add(1, Ordering::Relaxed);
        self.bytes_in[i].fetch_add(bytes_in, Ordering::Relaxed);
        self.bytes_out[i].fetch_add(bytes_out, Ordering::Relaxed);
        self.latency[i].observe(took);
    }

    /// Records a device command that succeeded, from its [`NdpStats`] (path, link bytes, time):
    /// a host fallback counts in `cxlkv_device_fallbacks_total` under its reason.
    pub fn record_device(&self, op: Op, stats: &NdpStats, bytes_in: u64, bytes_out: u64) {
        self.record(op, Outcome::Ok, bytes_in, bytes_out, stats.elapsed);
        match stats.path {
            Some(NdpPath::Device) => {
                self.device_link_bytes.fetch_add(
                    stats.bytes_to_device + stats.bytes_from_device,
                    Ordering::Relaxed,
                );
            }
            Some(NdpPath::Host(why)) => {
                if let Some(r) = FALLBACKS.iter().position(|&f| f == why) {
                    self.fallbacks[r].fetch_add(1, Ordering::Relaxed);
                }
                self.host_link_bytes
                    .fetch_add(stats.link_bytes(), Ordering::Relaxed);
            }
            None => {}
        }
    }

    /// Records how one cross-pod write-back of an evicted block ended (a count of the process,
    /// [`crosspod::record_write_back`], whichever `Metrics` is asked).
    pub fn record_write_back(&self, result: WriteBack) {
        crosspod::record_write_back(result);
    }

    /// The numbers now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            ops: Op::ALL
                .iter()
                .map(|&op| {
                    let i = op as usize;
                    let n = |o: Outcome| ld(&self.ops[i][o as usize]);
                    (
                        op,
                        OpSnapshot {
                            ok: n(Outcome::Ok),
                            miss: n(Outcome::Miss),
                            error: n(Outcome::Error),
                            bytes_in: ld(&self.bytes_in[i]),
                            bytes_out: ld(&self.bytes_out[i]),
                            latency: self.latency[i].snapshot(),
                        },
                    )
                })
                .collect(),
            fallbacks: FALLBACKS
                .iter()
                .zip(&self.fallbacks)
                .map(|(&r, n)| (r, ld(n)))
                .collect(),
            device_link_bytes: ld(&self.device_link_bytes),
            host_link_bytes: ld(&self.host_link_bytes),
            write_backs: crosspod::write_backs(),
            publishes: crosspod::publishes(),
        }
    }

    /// The text exposition of these metrics now (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(self.snapshot()));
        encode_registry(&reg)
    }

    /// These metrics and the pool-wide ones of `st` ([`pool::register_pool`]) in one exposition.
    pub fn encode_with_pool(&self, st: &crate::stats::PoolStats) -> String {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(self.snapshot()));
        pool::register_pool(st, &mut reg);
        encode_registry(&reg)
    }
}

/// Writes a counter family of `(labels, value)` rows.
fn counters<'a, L: EncodeLabelSet + 'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: impl IntoIterator<Item = (L, u64)>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (l, v) in rows {
        m.encode_family(&l)?
            .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
    }
    Ok(())
}

/// The exposition of a snapshot: `cxlkv_ops_total{op,result}`, `cxlkv_op_in_bytes_total{op}`,
/// `cxlkv_op_out_bytes_total{op}`, `cxlkv_op_latency_seconds{op}` (histogram),
/// `cxlkv_device_fallbacks_total{reason}`, `cxlkv_device_link_bytes_total{path}` and
/// `cxlkv_crosspod_write_backs_total{result}` and `cxlkv_crosspod_publishes_total{result}`.
impl Collector for MetricsSnapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        counters(
            &mut enc,
            "cxlkv_ops",
            "Operations of this process by op and result",
            None,
            self.ops.iter().flat_map(|(op, s)| {
                [
                    (Outcome::Ok, s.ok),
                    (Outcome::Miss, s.miss),
                    (Outcome::Error, s.error),
                ]
                .map(|(o, n)| ([("op", op.name()), ("result", o.name())], n))
            }),
        )?;
        counters(
            &mut enc,
            "cxlkv_op_in",
            "Bytes handed in by the caller (put payloads, device arguments)",
            Some(&Unit::Bytes),
            self.ops
                .iter()
                .map(|(op, s)| ([("op", op.name())], s.bytes_in)),
        )?;
        counters(
            &mut enc,
            "cxlkv_op_out",
            "Bytes handed back to the caller (get payloads, device results)",
            Some(&Unit::Bytes),
            self.ops
                .iter()
                .map(|(op, s)| ([("op", op.name())], s.bytes_out)),
        )?;
        {
            let mut m = enc.encode_descriptor(
                "cxlkv_op_latency",
                "Latency of an operation as its caller saw it",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for (op, s) in &self.ops {
                let h = &s.latency;
                m.encode_family(&[("op", op.name())])?
                    .encode_histogram::<NoLabelSet>(h.sum_s, h.count, &h.buckets, None)?;
            }
        }
        counters(
            &mut enc,
            "cxlkv_device_fallbacks",
            "Device commands computed on the host, by reason",
            None,
            self.fallbacks
                .iter()
                .map(|&(r, n)| ([("reason", fallback_name(r))], n)),
        )?;
        counters(
            &mut enc,
            "cxlkv_device_link",
            "Bytes that crossed the link for device commands, by the path that computed them",
            Some(&Unit::Bytes),
            [
                ([("path", "device")], self.device_link_bytes),
                ([("path", "host")], self.host_link_bytes),
            ],
        )?;
        counters(
            &mut enc,
            "cxlkv_crosspod_write_backs",
            "Evicted blocks offered to the cross-pod bridge for write-back, by result",
            None,
            self.write_backs
                .iter()
                .map(|&(r, n)| ([("result", r.name())], n)),
        )?;
        counters(
            &mut enc,
            "cxlkv_crosspod_publishes",
            "Keys of single-block puts handed to the cross-pod bridge for write-through, by result",
            None,
            self.publishes
                .iter()
                .map(|&(r, n)| ([("result", r.name())], n)),
        )
    }
}

/// The text exposition of `reg`.
pub fn encode_registry(reg: &Registry) -> String {
    let mut s = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut s, reg);
    s
}

/// The process's metrics (this copy of the runtime's), which the operations record into.
pub fn global() -> &'static Metrics {
    static G: OnceLock<Metrics> = OnceLock::new();
    G.get_or_init(Metrics::new)
}

/// Records in [`global`] one call of `op` that started at `t0`, from its result: `counts` gives
/// the outcome and bytes of a success; a failure is one `error` with no bytes (the module's rule).
pub(crate) fn count_call<T, E>(
    op: Op,
    t0: Instant,
    r: &Result<T, E>,
    counts: impl FnOnce(&T) -> (Outcome, u64, u64),
) {
    let (outcome, bytes_in, bytes_out) = match r {
        Ok(v) => counts(v),
        Err(_) => (Outcome::Error, 0, 0),
    };
    global().record(op, outcome, bytes_in, bytes_out, t0.elapsed());
}

/// Records in [`global`] one failed call of `op` that started at `t0`.
pub(crate) fn count_failure(op: Op, t0: Instant) {
    global().record(op, Outcome::Error, 0, 0, t0.elapsed());
}

/// Records in [`global`] a device command's result: an answer with its path, link bytes and own
/// elapsed time ([`Metrics::record_device`]), or a failure that started at `t0`.
pub(crate) fn count_device<T, E>(
    op: Op,
    t0: Instant,
    r: &Result<T, E>,
    answer: impl FnOnce(&T) -> (&NdpStats, u64, u64),
) {
    match r {
        Ok(v) => {
            let (stats, bytes_in, bytes_out) = answer(v);
            global().record_device(op, stats, bytes_in, bytes_out);
        }
        Err(_) => count_failure(op, t0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_show_in_snapshot_and_text() {
        let m = Metrics::new();
        m.record(Op::Put, Outcome::Ok, 100, 0, Duration::from_micros(3));
        m.record(Op::Put, Outcome::Ok, 50, 0, Duration::from_micros(5));
        m.record(Op::Get, Outcome::Miss, 0, 0, Duration::from_micros(1));
        m.record(Op::Get, Outcome::Ok, 0, 70, Duration::from_micros(2));
        let s = m.snapshot();
        let put = s.op(Op::Put);
        assert_eq!((put.ok, put.bytes_in, put.latency.count), (2, 150, 2));
        assert!((put.latency.sum_s - 8e-6).abs() < 1e-12);
        // 3 µs and 5 µs both fall in (1 µs, 4 µs] and (4 µs, 16 µs] respectively.
        assert_eq!(put.latency.buckets[1], (4e-6, 1));
        assert_eq!(put.latency.buckets[2], (16e-6, 1));
        let get = s.op(Op::Get);
        assert_eq!((get.ok, get.miss, get.bytes_out), (1, 1, 70));
        let pin = s.op(Op::Pin);
        assert_eq!(
            (pin.ok, pin.miss, pin.error, pin.latency.count),
            (0, 0, 0, 0)
        );
        let text = m.encode();
        assert!(text.contains("# TYPE cxlkv_ops counter"), "{text}");
        assert!(
            text.contains("cxlkv_ops_total{op=\"put\",result=\"ok\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("cxlkv_op_in_bytes_total{op=\"put\"} 150"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE cxlkv_op_latency_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("cxlkv_op_latency_seconds_count{op=\"get\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("cxlkv_op_latency_seconds_bucket{le=\"+Inf\",op=\"put\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("cxlkv_op_latency_seconds_bucket{le=\"0.000004\",op=\"put\"} 1"),
            "{text}"
        );
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }

    #[test]
    fn device_fallbacks_count_host_paths_only() {
        let m = Metrics::new();
        let dev = NdpStats {
            path: Some(NdpPath::Device),
            bytes_to_device: 10,
            bytes_from_device: 5,
            ..Default::default()
        };
        let host = NdpStats {
            path: Some(NdpPath::Host(FallbackReason::Absent)),
            host_scan_bytes: 1000,
            ..Default::default()
        };
        m.record_device(Op::ScoreTopk, &dev, 0, 0);
        m.record_device(Op::ScoreTopk, &host, 0, 0);
        m.record_device(Op::ScoreTopk, &host, 0, 0);
        let s = m.snapshot();
        assert_eq!(s.device_fallbacks(), 2);
        assert_eq!((s.device_link_bytes, s.host_link_bytes), (15, 2000));
        assert_eq!(s.op(Op::ScoreTopk).ok, 3);
        assert!(
            m.encode()
                .contains("cxlkv_device_fallbacks_total{reason=\"absent\"} 2"),
            "{}",
            m.encode()
        );
    }

    /// Every operation has its own slot (its index is its place in `ALL`) and its own label, so
    /// that a new operation cannot share another's counters or be left out of the exposition.
    #[test]
    fn every_op_has_its_own_slot_and_label() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i, "{op:?}");
        }
        let mut names: Vec<_> = Op::ALL.iter().map(|o| o.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Op::ALL.len(), "{names:?}");
        let m = Metrics::new();
        for (i, &op) in Op::ALL.iter().enumerate() {
            m.record(op, Outcome::Ok, i as u64 + 1, 0, Duration::from_micros(1));
        }
        let text = m.encode();
        for (i, &op) in Op::ALL.iter().enumerate() {
            let line = format!(
                "cxlkv_op_in_bytes_total{{op=\"{}\"}} {}\n",
                op.name(),
                i + 1
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
    }

    /// An ATTEND is counted under `op="attend"` with its bytes, its latency (the command's own
    /// elapsed time) and its path: a host fallback counts under its reason, apart from SCORE_TOPK.
    #[test]
    fn attend_counts_apart_from_score_topk() {
        let m = Metrics::new();
        let dev = NdpStats {
            path: Some(NdpPath::Device),
            bytes_to_device: 100,
            bytes_from_device: 40,
            elapsed: Duration::from_micros(20),
            ..Default::default()
        };
        let host = NdpStats {
            path: Some(NdpPath::Host(FallbackReason::Unsupported)),
            host_scan_bytes: 4096,
            elapsed: Duration::from_micros(30),
            ..Default::default()
        };
        // Two queries of dim 16 in (2 × 16 × 4 bytes); partials out (2 × (16 + 2) × 4 bytes).
        m.record_device(Op::Attend, &dev, 128, 144);
        m.record_device(Op::Attend, &host, 128, 144);
        m.record(Op::Attend, Outcome::Error, 0, 0, Duration::from_micros(2));
        let s = m.snapshot();
        let a = s.op(Op::Attend);
        assert_eq!(
            (a.ok, a.miss, a.error, a.bytes_in, a.bytes_out),
            (2, 0, 1, 256, 288)
        );
        assert_eq!(a.latency.count, 3);
        assert!(
            (a.latency.sum_s - 52e-6).abs() < 1e-12,
            "{}",
            a.latency.sum_s
        );
        let top = s.op(Op::ScoreTopk);
        assert_eq!((top.ok, top.error, top.latency.count), (0, 0, 0));
        assert_eq!(s.device_fallbacks(), 1);
        assert_eq!((s.device_link_bytes, s.host_link_bytes), (140, 4096));
        let text = m.encode();
        for line in [
            "cxlkv_ops_total{op=\"attend\",result=\"ok\"} 2\n",
            "cxlkv_ops_total{op=\"attend\",result=\"error\"} 1\n",
            "cxlkv_op_in_bytes_total{op=\"attend\"} 256\n",
            "cxlkv_op_out_bytes_total{op=\"attend\"} 288\n",
            "cxlkv_op_latency_seconds_count{op=\"attend\"} 3\n",
            "cxlkv_ops_total{op=\"score_topk\",result=\"ok\"} 0\n",
            "cxlkv_device_fallbacks_total{reason=\"unsupported\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
