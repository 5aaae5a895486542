//! `cxlkv-ndpd --metrics 127.0.0.1:0` serves the device's Prometheus metrics over HTTP: scraped
//! with a plain GET before and after N SCORE_TOPK commands, the command counter grew by N, the
//! bytes scanned grew, and the score_topk latency histogram counted N more. The same scrape carries
//! the pool's per-participant counters: the client's payload bytes, read from its pool slot.

mod common;
use common::*;
use cxlkv_kernels::{rng::SplitMix64, DType, GroupMode};
use cxlkv_ndp::daemon::Daemon;
use cxlkv_runtime::ndp::{NdpDevice, NdpOptions, NdpPath};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

/// Scrapes `/metrics`: the samples by `name{labels}`, after checking that every sample's family
/// was announced by a `# TYPE` line of the expected kind.
fn scrape(addr: &str) -> HashMap<String, f64> {
    let answer = http_get(addr, "/metrics");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains("Content-Type: application/openmetrics-text"),
        "{head}"
    );
    assert_eq!(body.lines().last(), Some("# EOF"), "{body}");
    let mut types = HashMap::new();
    let mut samples = HashMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_string(), kind.to_string());
        } else if !line.starts_with('#') {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let name = series.split('{').next().unwrap();
            let family = ["_total", "_count", "_sum", "_bucket"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            assert!(types.contains_key(family), "no # TYPE before {line}");
            samples.insert(series.to_string(), value.parse::<f64>().unwrap());
        }
    }
    for (name, kind) in [
        ("cxlkv_ndp_commands", "counter"),
        ("cxlkv_ndp_scanned_bytes", "counter"),
        ("cxlkv_ndp_command_latency_seconds", "histogram"),
    ] {
        assert_eq!(types.get(name).map(String::as_str), Some(kind), "{body}");
    }
    samples
}

#[test]
fn daemon_serves_prometheus_metrics_that_follow_the_commands() {
    let temp = shm_backend("metrics");
    let b = temp.backend().clone();
    let pool = create_pool(&b, 32 << 20, 64 << 10);
    let p = Arc::new(pool.attach().unwrap());
    let mut d = Daemon::spawn(
        Path::new(env!("CARGO_BIN_EXE_cxlkv-ndpd")),
        &b.to_string(),
        &["--metrics", "127.0.0.1:0"],
    )
    .expect("spawn cxlkv-ndpd");
    let mut addr = None;
    for _ in 0..4 {
        let line = d.read_line().unwrap();
        if let Some(rest) = line.trim().strip_prefix("cxlkv-ndpd: metrics on http://") {
            addr = Some(rest.trim_end_matches("/metrics").to_string());
            break;
        }
    }
    let addr = addr.expect("the daemon prints its metrics address");

    let not_found = http_get(&addr, "/other");
    assert!(not_found.starts_with("HTTP/1.1 404"), "{not_found}");

    let (k, v) = random_kv(4, 1, 600, 32, DType::F16);
    let s = store(&p, &k, &v, 1, 600, 32, DType::F16, 100, 4, 0);
    let qs = SplitMix64::new(3).normal_vec(2 * 32);
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    // One command first, so that the score_topk histogram exists before the baseline.
    let req = request(&s, 0, &qs, 8, GroupMode::PerQuery, false, false);
    assert_eq!(
        ndp.score_topk(&req).unwrap().stats.path,
        Some(NdpPath::Device)
    );

    let before = scrape(&addr);
    const N: f64 = 5.0;
    for _ in 0..N as usize {
        let got = ndp.score_topk(&req).unwrap();
        assert_eq!(got.stats.path, Some(NdpPath::Device));
    }
    let after = scrape(&addr);

    let delta = |m: &str| after[m] - before.get(m).copied().unwrap_or(0.0);
    assert_eq!(delta("cxlkv_ndp_commands_total"), N);
    assert_eq!(delta("cxlkv_ndp_errors_total"), 0.0);
    // Six blocks of 100 tokens x 32 f16 dims, all scanned (no pruning asked).
    assert_eq!(delta("cxlkv_ndp_scanned_bytes_total"), N * 600.0 * 64.0);
    assert_eq!(delta("cxlkv_ndp_blocks_scanned_total"), N * 6.0);
    assert!(delta("cxlkv_ndp_returned_bytes_total") > 0.0);
    assert!(delta("cxlkv_ndp_received_bytes_total") > 0.0);
    assert!(delta("cxlkv_ndp_busy_seconds_total") > 0.0);
    let count = "cxlkv_ndp_command_latency_seconds_count{opcode=\"score_topk\"}";
    assert_eq!(delta(count), N);
    let inf = "cxlkv_ndp_command_latency_seconds_bucket{le=\"+Inf\",opcode=\"score_topk\"}";
    assert_eq!(after[inf], after[count]);

    // The client's slot counters, as the daemon's process reads them from the pool.
    let me = |m: &str| {
        let series = format!(
            "cxlkv_pool_participant_{m}_total{{participant=\"{}\",pid=\"{}\"}}",
            p.id(),
            std::process::id()
        );
        after[&series]
    };
    let mine = p.stats();
    assert!(mine.bytes_in > 0 && mine.puts == 6);
    assert_eq!(me("puts"), 6.0);
    assert_eq!(me("bytes_in"), mine.bytes_in as f64);
    assert_eq!(me("fallbacks"), 0.0);
}

#[test]
fn a_taken_metrics_address_is_a_clear_error() {
    let temp = shm_backend("metrics-taken");
    let b = temp.backend().clone();
    let _pool = create_pool(&b, 16 << 20, 64 << 10);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_cxlkv-ndpd"))
        .args(["--pool", &b.to_string(), "--metrics", &addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen on {addr} for metrics")),
        "{err}"
    );
}
