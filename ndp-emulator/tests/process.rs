//! The device as a separate process (`cxlkv-ndpd`): results equal the host path and the kernels'
//! reference on the real SmolLM2 tensors and on random data; a device killed mid-command leaves
//! the client answering from the host within its timeout, and a restarted device serves again.
//! Each test runs once per compute engine (`--engine rust` and `--engine hls`).

mod common;
use common::*;
use cxlkv_kernels::{rng::SplitMix64, DType, GroupMode};
use cxlkv_ndp::daemon::Daemon;
use cxlkv_runtime::ndp::{host_score_topk, FallbackReason, NdpDevice, NdpOptions, NdpPath};
use cxlkv_runtime::Backend;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `cxlkv-ndpd --pool BACKEND EXTRA..`, serving with the engine that `extra` names.
fn spawn(backend: &Backend, extra: &[&str]) -> Daemon {
    let d = Daemon::spawn(
        Path::new(env!("CARGO_BIN_EXE_cxlkv-ndpd")),
        &backend.to_string(),
        extra,
    )
    .expect("spawn cxlkv-ndpd");
    let engine = extra
        .windows(2)
        .find(|w| w[0] == "--engine")
        .map_or("rust", |w| w[1]);
    assert!(
        d.said().contains(&format!("engine {engine}")),
        "daemon said {:?}",
        d.said()
    );
    d
}

#[test]
fn separate_process_matches_reference_on_real_and_random_data_rust_engine() {
    separate_process_matches_reference("rust");
}

#[test]
fn separate_process_matches_reference_on_real_and_random_data_hls_engine() {
    separate_process_matches_reference("hls");
}

fn separate_process_matches_reference(engine: &str) {
    let temp = shm_backend(&format!("proc-{engine}"));
    let b = temp.backend().clone();
    let pool = create_pool(&b, 96 << 20, 128 << 10);
    let p = Arc::new(pool.attach().unwrap());
    let _d = spawn(&b, &["--workers", "1", "--engine", engine]);
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    // Real tensors: layer 4 of SmolLM2 (3 KV heads, 9 query heads, head dim 64, 2048 tokens).
    let (q, k, v) = smollm2(4).expect("data/kv/smollm2_devil_2048 is part of the repository");
    let real = store(&p, &k, &v, 3, 2048, 64, DType::F16, 128, 1, 4);
    for kvh in 0..3usize {
        let qs = queries_at(&q, 2048, 64, 3 * kvh, 3, 2047);
        for &(mode, prune) in &[
            (GroupMode::PerQuery, false),
            (GroupMode::PerQuery, true),
            (GroupMode::GroupMax, true),
        ] {
            let want = reference(&real, kvh, &qs, 64, mode);
            let req = request(&real, kvh as u32, &qs, 64, mode, prune, true);
            let got = ndp.score_topk(&req).unwrap();
            assert_eq!(got.stats.path, Some(NdpPath::Device));
            assert_eq!(hits_of(&got), want, "head {kvh} {mode:?} prune {prune}");
            assert_eq!(got.values, reference_values(&real, kvh, &want));
            let host = host_score_topk(&pool, &req, Default::default()).unwrap();
            assert_eq!((hits_of(&host), &host.values), (want, &got.values));
        }
    }
    // Random data, f32 and f16.
    let mut rng = SplitMix64::new(77);
    for (seq, dtype) in [(2u64, DType::F32), (3, DType::F16)] {
        let (k, v) = random_kv(seq, 2, 1000, 32, dtype);
        let s = store(&p, &k, &v, 2, 1000, 32, dtype, 100, seq, 9);
        for prune in [false, true] {
            let qs = rng.normal_vec(4 * 32);
            let want = reference(&s, 1, &qs, 20, GroupMode::PerQuery);
            let got = ndp
                .score_topk(&request(&s, 1, &qs, 20, GroupMode::PerQuery, prune, true))
                .unwrap();
            assert_eq!(got.stats.path, Some(NdpPath::Device));
            assert_eq!(hits_of(&got), want);
            assert_eq!(got.values, reference_values(&s, 1, &want));
        }
        let toks: Vec<u32> = (0..50).map(|_| rng.below(1000) as u32).collect();
        let (vals, st) = ndp.gather(&s.blocks, seq, 9, 0, dtype, 32, &toks).unwrap();
        assert_eq!(st.path, Some(NdpPath::Device));
        let rows = s.value_rows(0);
        assert_eq!(
            vals,
            toks.iter()
                .flat_map(|&t| rows.row_vec(t as usize))
                .collect::<Vec<u8>>()
        );
    }
}

#[test]
fn killed_device_falls_back_and_a_restarted_one_serves_rust_engine() {
    killed_device_falls_back_and_a_restarted_one_serves("rust");
}

#[test]
fn killed_device_falls_back_and_a_restarted_one_serves_hls_engine() {
    killed_device_falls_back_and_a_restarted_one_serves("hls");
}

fn killed_device_falls_back_and_a_restarted_one_serves(engine: &str) {
    let temp = shm_backend(&format!("kill-{engine}"));
    let b = temp.backend().clone();
    let pool = create_pool(&b, 64 << 20, 128 << 10);
    let p = Arc::new(pool.attach().unwrap());
    let (k, v) = random_kv(11, 1, 2000, 64, DType::F16);
    let s = store(&p, &k, &v, 1, 2000, 64, DType::F16, 500, 8, 1);
    let qs = SplitMix64::new(5).normal_vec(2 * 64);
    let want = reference(&s, 0, &qs, 32, GroupMode::GroupMax);
    // 256 KB of keys at 1 MB/s: the scan takes about a quarter of a second.
    let mut d = spawn(&b, &["--internal-bw", "0.001", "--engine", engine]);
    let timeout = Duration::from_millis(1500);
    let mut ndp = NdpDevice::open(
        p.clone(),
        NdpOptions {
            timeout,
            stale_after: Duration::from_millis(200),
            ..NdpOptions::default()
        },
    )
    .unwrap();
    let start = Instant::now();
    let t = ndp
        .submit_score(&request(&s, 0, &qs, 32, GroupMode::GroupMax, false, true))
        .unwrap();
    std::thread::sleep(Duration::from_millis(60));
    d.kill().unwrap(); // SIGKILL, mid-scan
    let got = ndp.wait(t).unwrap();
    assert!(
        start.elapsed() < timeout + Duration::from_millis(500),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        matches!(
            got.stats.path,
            Some(NdpPath::Host(
                FallbackReason::Dead | FallbackReason::Timeout
            ))
        ),
        "{:?}",
        got.stats.path
    );
    assert_eq!(hits_of(&got), want);
    assert_eq!(got.values, reference_values(&s, 0, &want));
    // While it is dead, new commands go to the host at once.
    let got = ndp
        .score_topk(&request(&s, 0, &qs, 32, GroupMode::GroupMax, true, false))
        .unwrap();
    assert!(matches!(got.stats.path, Some(NdpPath::Host(_))));
    assert_eq!(hits_of(&got), want);
    let _d2 = spawn(&b, &["--engine", engine]);
    for prune in [false, true] {
        let got = ndp
            .score_topk(&request(&s, 0, &qs, 32, GroupMode::GroupMax, prune, true))
            .unwrap();
        assert_eq!(got.stats.path, Some(NdpPath::Device));
        assert_eq!(hits_of(&got), want);
    }
    ndp.nop().unwrap();
}
