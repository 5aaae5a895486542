//! Metrics in the Prometheus text format.
//!
//! Two kinds, because only what lies in shared memory can be read by another process:
//!
//! - **Process-local** ([`Metrics`], the process's one [`global`] registry): operation counts by
//!   result, bytes in and out, latency histograms of puts, gets, pins, deletes and device commands,
//!   and device fallbacks, recorded by the libraries' entry points (the C ABI and the Python
//!   package) with [`Metrics::record`] and [`Metrics::record_device`]. [`Metrics::snapshot`] gives
//!   the numbers, [`Metrics::encode`] the text exposition.
//! - **Pool-wide** ([`pool`]): the counters every participant publishes in its pool slot (puts,
//!   hits, misses, retries, evictions, deletes, pins) and each partition's occupancy, read by anyone
//!   through [`crate::pool_stats`] (`cxlkv pool stat --prometheus`).
//!
//! The exposition is written with `prometheus-client`: latencies in seconds, sizes in bytes,
//! counters end in `_total`.

pub mod pool;

use crate::ndp::{FallbackReason, NdpPath, NdpStats};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;
use std::time::Duration;

/// Upper bounds of the latency histograms' buckets, in seconds: 1 µs to about 4.2 s, ×4 apart.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(1e-6, 4.0, 12)
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
}

impl Op {
    /// Every operation, in label order.
    pub const ALL: [Op; 6] = [
        Op::Put,
        Op::Get,
        Op::Pin,
        Op::Delete,
        Op::ScoreTopk,
        Op::Gather,
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

/// The process-local metrics (see the module documentation). Thread-safe; cheap to record.
pub struct Metrics {
    ops: Family<Labels, Counter>,
    bytes_in: Family<Labels, Counter>,
    bytes_out: Family<Labels, Counter>,
    latency: HistogramFamily,
    /// The histograms' sums again, for [`Metrics::snapshot`] (the client keeps them private).
    latency_sum: Family<Labels, Counter<f64, AtomicU64>>,
    link_bytes: Family<Labels, Counter>,
    fallbacks: Family<Labels, Counter>,
}

/// One operation's figures in a [`MetricsSnapshot`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpSnapshot {
    /// Calls that succeeded.
    pub ok: u64,
    /// Calls that missed (gets and pins).
    pub miss: u64,
    /// Calls that failed.
    pub error: u64,
    /// Bytes the caller handed in (put payloads, device arguments).
    pub bytes_in: u64,
    /// Bytes handed back to the caller (get payloads, device results).
    pub bytes_out: u64,
    /// Calls in the latency histogram (all outcomes).
    pub latency_count: u64,
    /// Sum of their latencies, seconds.
    pub latency_sum_s: f64,
}

/// The numbers of [`Metrics`] at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Per operation, in [`Op::ALL`] order.
    pub ops: Vec<(Op, OpSnapshot)>,
    /// Device commands the client computed on the host instead (device absent, dead or late).
    pub device_fallbacks: u64,
    /// Bytes that crossed the link for device commands on the device path.
    pub device_link_bytes: u64,
    /// Bytes a host fallback's scan pulled across the link.
    pub host_link_bytes: u64,
}

impl MetricsSnapshot {
    /// The figures of `op`.
    pub fn op(&self, op: Op) -> OpSnapshot {
        self.ops
            .iter()
            .find(|(o, _)| *o == op)
            .map(|(_, s)| *s)
            .unwrap_or_default()
    }
}

const FALLBACKS: [FallbackReason; 7] = [
    FallbackReason::Absent,
    FallbackReason::Dead,
    FallbackReason::Timeout,
    FallbackReason::Busy,
    FallbackReason::TooLarge,
    FallbackReason::DeviceRetry,
    FallbackReason::Forced,
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
    }
}

fn op_labels(op: Op) -> Labels {
    vec![("op", op.name())]
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Metrics {
            ops: Family::default(),
            bytes_in: Family::default(),
            bytes_out: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            latency_sum: Family::default(),
            link_bytes: Family::default(),
            fallbacks: Family::default(),
        }
    }

    /// Records one operation: how it ended, the bytes it took in and gave out, how long it took.
    pub fn record(&self, op: Op, outcome: Outcome, bytes_in: u64, bytes_out: u64, took: Duration) {
        self.ops
            .get_or_create(&vec![("op", op.name()), ("result", outcome.name())])
            .inc();
        let l = op_labels(op);
        if bytes_in > 0 {
            self.bytes_in.get_or_create(&l).inc_by(bytes_in);
        }
        if bytes_out > 0 {
            self.bytes_out.get_or_create(&l).inc_by(bytes_out);
        }
        self.latency.get_or_create(&l).observe(took.as_secs_f64());
        self.latency_sum
            .get_or_create(&l)
            .inc_by(took.as_secs_f64());
    }

    /// Records a device command that succeeded, from its [`NdpStats`] (path, link bytes, time):
    /// a host fallback counts in `cxlkv_device_fallbacks_total`.
    pub fn record_device(&self, op: Op, stats: &NdpStats, bytes_in: u64, bytes_out: u64) {
        self.record(op, Outcome::Ok, bytes_in, bytes_out, stats.elapsed);
        match stats.path {
            Some(NdpPath::Device) => {
                self.link_bytes
                    .get_or_create(&vec![("path", "device")])
                    .inc_by(stats.bytes_to_device + stats.bytes_from_device);
            }
            Some(NdpPath::Host(why)) => {
                self.fallbacks
                    .get_or_create(&vec![("reason", fallback_name(why))])
                    .inc();
                self.link_bytes
                    .get_or_create(&vec![("path", "host")])
                    .inc_by(stats.link_bytes());
            }
            None => {}
        }
    }

    /// The numbers now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |f: &Family<Labels, Counter>, l: &Labels| f.get(l).map_or(0, |c| c.get());
        let ops = Op::ALL
            .iter()
            .map(|&op| {
                let n = |o: Outcome| get(&self.ops, &vec![("op", op.name()), ("result", o.name())]);
                let l = op_labels(op);
                let (ok, miss, error) = (n(Outcome::Ok), n(Outcome::Miss), n(Outcome::Error));
                (
                    op,
                    OpSnapshot {
                        ok,
                        miss,
                        error,
                        bytes_in: get(&self.bytes_in, &l),
                        bytes_out: get(&self.bytes_out, &l),
                        latency_count: ok + miss + error,
                        latency_sum_s: self.latency_sum.get(&l).map_or(0.0, |c| c.get()),
                    },
                )
            })
            .collect();
        MetricsSnapshot {
            ops,
            device_fallbacks: FALLBACKS
                .iter()
                .map(|&r| get(&self.fallbacks, &vec![("reason", fallback_name(r))]))
                .sum(),
            device_link_bytes: get(&self.link_bytes, &vec![("path", "device")]),
            host_link_bytes: get(&self.link_bytes, &vec![("path", "host")]),
        }
    }

    /// Adds these metrics to `reg` (the families are shared, so later records show in it).
    pub fn register(&self, reg: &mut Registry) {
        reg.register(
            "cxlkv_ops",
            "Operations of this process by op and result",
            self.ops.clone(),
        );
        reg.register_with_unit(
            "cxlkv_op_in",
            "Bytes handed in by the caller (put payloads, device arguments)",
            Unit::Bytes,
            self.bytes_in.clone(),
        );
        reg.register_with_unit(
            "cxlkv_op_out",
            "Bytes handed back to the caller (get payloads, device results)",
            Unit::Bytes,
            self.bytes_out.clone(),
        );
        reg.register_with_unit(
            "cxlkv_op_latency",
            "Latency of an operation as its caller saw it",
            Unit::Seconds,
            self.latency.clone(),
        );
        reg.register(
            "cxlkv_device_fallbacks",
            "Device commands computed on the host, by reason",
            self.fallbacks.clone(),
        );
        reg.register_with_unit(
            "cxlkv_device_link",
            "Bytes that crossed the link for device commands, by the path that computed them",
            Unit::Bytes,
            self.link_bytes.clone(),
        );
    }

    /// The text exposition of these metrics (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut reg = Registry::default();
        self.register(&mut reg);
        encode_registry(&reg)
    }
}

/// The text exposition of `reg`.
pub fn encode_registry(reg: &Registry) -> String {
    let mut s = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut s, reg);
    s
}

/// The process's metrics, which the C ABI and the Python package record into.
pub fn global() -> &'static Metrics {
    static G: OnceLock<Metrics> = OnceLock::new();
    G.get_or_init(Metrics::new)
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
        assert_eq!((put.ok, put.bytes_in, put.latency_count), (2, 150, 2));
        assert!((put.latency_sum_s - 8e-6).abs() < 1e-9);
        let get = s.op(Op::Get);
        assert_eq!((get.ok, get.miss, get.bytes_out), (1, 1, 70));
        assert_eq!(s.op(Op::Pin), OpSnapshot::default());
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
        assert_eq!(s.device_fallbacks, 2);
        assert_eq!((s.device_link_bytes, s.host_link_bytes), (15, 2000));
        assert_eq!(s.op(Op::ScoreTopk).ok, 3);
        assert!(
            m.encode()
                .contains("cxlkv_device_fallbacks_total{reason=\"absent\"} 2"),
            "{}",
            m.encode()
        );
    }
}
