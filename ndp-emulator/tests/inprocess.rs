//! The device as an in-process thread: SCORE_TOPK (full and pruned, per query and group max, with
//! values), GATHER, BUILD_BOUNDS, HOTLIST and NOP against the kernels' reference and the host
//! path; fallback when no device is attached. Every end-to-end test runs once with each compute
//! engine (the Rust kernels and the HLS kernel's library), and one test checks that the two
//! engines return identical results, counts and masses.

mod common;
use common::*;
use cxlkv_kernels::{rng::SplitMix64, DType, GroupMode};
use cxlkv_ndp::{Device, DeviceConfig, Engine};
use cxlkv_runtime::ndp::{
    host_score_topk, BlockExpect, FallbackReason, NdpDevice, NdpOptions, NdpPath,
};
use cxlkv_runtime::Pool;
use std::sync::Arc;

fn setup(tag: &str) -> (TempBackend, Pool) {
    let b = shm_backend(tag);
    let pool = create_pool(b.backend(), 64 << 20, 64 << 10);
    (b, pool)
}

fn config(engine: Engine) -> DeviceConfig {
    DeviceConfig {
        engine,
        ..DeviceConfig::default()
    }
}

#[test]
fn score_gather_and_friends_match_the_reference_rust_engine() {
    score_gather_and_friends(Engine::Rust);
}

#[test]
fn score_gather_and_friends_match_the_reference_hls_engine() {
    score_gather_and_friends(Engine::Hls);
}

fn score_gather_and_friends(engine: Engine) {
    let (_c, pool) = setup(&format!("score-{engine}"));
    let p = Arc::new(pool.attach().unwrap());
    let (dim, heads, tokens) = (32, 2, 900);
    let (k, v) = random_kv(7, heads, tokens, dim, DType::F16);
    let s = store(&p, &k, &v, heads, tokens, dim, DType::F16, 100, 42, 3);
    let dev = Device::start(pool.clone(), config(engine)).unwrap();
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    ndp.nop().unwrap();
    let mut rng = SplitMix64::new(9);
    for &(mode, prune, kk, g) in &[
        (GroupMode::PerQuery, false, 10, 3),
        (GroupMode::PerQuery, true, 10, 3),
        (GroupMode::GroupMax, true, 50, 4),
        (GroupMode::GroupMax, false, 1, 1),
        (GroupMode::PerQuery, true, 2000, 1),
    ] {
        let q = rng.normal_vec(g * dim);
        let h = (kk % 2) as u32;
        let want = reference(&s, h as usize, &q, kk, mode);
        // k = 2000 with values would not fit a 64 KiB staging block (that case falls back).
        let req = request(&s, h, &q, kk, mode, prune, kk < 1000);
        let got = ndp.score_topk(&req).unwrap();
        assert_eq!(got.stats.path, Some(NdpPath::Device));
        assert_eq!(hits_of(&got), want, "mode {mode:?} prune {prune} k {kk}");
        if kk < 1000 {
            assert_eq!(got.values, reference_values(&s, h as usize, &want));
        }
        let host = host_score_topk(&pool, &req, Default::default()).unwrap();
        assert_eq!(hits_of(&host), want);
        assert_eq!(host.values, got.values);
        assert_eq!(host.stats.block_mass, got.stats.block_mass);
        assert!(got.stats.link_bytes() < host.stats.link_bytes());
        if prune && kk < 100 {
            assert!(got.stats.blocks_pruned > 0, "{:?}", got.stats);
        }
    }
    let tokens_wanted = [0u32, 899, 450, 99, 100];
    let (vals, _) = ndp
        .gather(&s.blocks, 42, 3, 1, DType::F16, dim, &tokens_wanted)
        .unwrap();
    let rows = s.value_rows(1);
    let want: Vec<u8> = tokens_wanted
        .iter()
        .flat_map(|&t| rows.row_vec(t as usize))
        .collect();
    assert_eq!(vals, want);
    let expect = BlockExpect {
        tenant: 0,
        sequence: 42,
        layer: 3,
        kv_head: 1,
        dtype: DType::F16,
        dim: dim as u32,
    };
    let (lo, hi, same) = ndp.build_bounds(s.blocks[2], &expect).unwrap();
    assert!(same);
    let r = s.key_rows(1).slice(200, 300);
    let b = cxlkv_kernels::block_bounds(&r, 100);
    assert_eq!((lo.as_slice(), hi.as_slice()), (b.min(0), b.max(0)));
    let hot = ndp.hotlist(4).unwrap();
    assert!(!hot.is_empty() && hot.len() <= 4);
    assert!(hot.windows(2).all(|w| w[0].heat >= w[1].heat));
    assert!(dev.device().counter(0) >= 8);
    // Wrong sequence is an error, not a fallback.
    let q = rng.normal_vec(dim);
    let mut bad = request(&s, 0, &q, 5, GroupMode::PerQuery, false, false);
    bad.sequence = 43;
    assert!(ndp.score_topk(&bad).is_err());
    dev.stop();
    // No device: the host answers, says so, and counts it in the participant's slot.
    let want = reference(&s, 0, &q, 5, GroupMode::PerQuery);
    let fallbacks = p.stats().fallbacks;
    let got = ndp
        .score_topk(&request(&s, 0, &q, 5, GroupMode::PerQuery, true, false))
        .unwrap();
    assert_eq!(got.stats.path, Some(NdpPath::Host(FallbackReason::Absent)));
    assert_eq!(hits_of(&got), want);
    assert_eq!(p.stats().fallbacks, fallbacks + 1);
    let slot = cxlkv_runtime::participant_counters(p.pool(), p.id()).unwrap();
    assert_eq!(slot.map(|c| c.fallbacks), Some(fallbacks + 1));
    assert!(ndp.nop().is_err());
}

#[test]
fn async_submissions_and_restart_rust_engine() {
    async_submissions_and_restart(Engine::Rust);
}

#[test]
fn async_submissions_and_restart_hls_engine() {
    async_submissions_and_restart(Engine::Hls);
}

fn async_submissions_and_restart(engine: Engine) {
    let (_c, pool) = setup(&format!("async-{engine}"));
    let p = Arc::new(pool.attach().unwrap());
    let (dim, heads, tokens) = (64, 1, 700);
    let (k, v) = random_kv(3, heads, tokens, dim, DType::Bf16);
    let s = store(&p, &k, &v, heads, tokens, dim, DType::Bf16, 128, 5, 0);
    let dev = Device::start(pool.clone(), config(engine)).unwrap();
    let mut ndp = NdpDevice::open(
        p.clone(),
        NdpOptions {
            staging: 3,
            ..NdpOptions::default()
        },
    )
    .unwrap();
    let mut rng = SplitMix64::new(1);
    let qs: Vec<Vec<f32>> = (0..3).map(|_| rng.normal_vec(2 * dim)).collect();
    let tickets: Vec<_> = qs
        .iter()
        .map(|q| {
            ndp.submit_score(&request(&s, 0, q, 16, GroupMode::GroupMax, true, false))
                .unwrap()
        })
        .collect();
    for (t, q) in tickets.into_iter().zip(&qs) {
        let got = ndp.wait(t).unwrap();
        assert_eq!(got.stats.path, Some(NdpPath::Device));
        assert_eq!(hits_of(&got), reference(&s, 0, q, 16, GroupMode::GroupMax));
    }
    let g1 = dev.device().generation();
    dev.stop();
    let dev = Device::start(pool.clone(), config(engine)).unwrap();
    assert_eq!(dev.device().generation(), g1 + 1);
    let got = ndp
        .score_topk(&request(
            &s,
            0,
            &qs[0],
            16,
            GroupMode::GroupMax,
            false,
            true,
        ))
        .unwrap();
    assert_eq!(got.stats.path, Some(NdpPath::Device));
}

/// What a device answered: hits, values, block mass, bytes scanned, blocks scanned and pruned.
type Answer = (
    Vec<Vec<cxlkv_kernels::Hit>>,
    Vec<u8>,
    Vec<f32>,
    u64,
    u32,
    u32,
);

/// A query case: stored keys, queries, k, mode, prune.
type Case<'a> = (&'a Stored, Vec<f32>, usize, GroupMode, bool);

fn answers(engine: Engine, pool: &Pool, cases: &[Case<'_>]) -> Vec<Answer> {
    let p = Arc::new(pool.attach().unwrap());
    let dev = Device::start(pool.clone(), config(engine)).unwrap();
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    let mut out = Vec::new();
    for (s, q, k, mode, prune) in cases {
        let got = ndp
            .score_topk(&request(s, 0, q, *k, *mode, *prune, *k < 500))
            .unwrap();
        assert_eq!(got.stats.path, Some(NdpPath::Device), "{engine}");
        assert_eq!(hits_of(&got), reference(s, 0, q, *k, *mode), "{engine}");
        out.push((
            hits_of(&got),
            got.values.clone(),
            got.stats.block_mass.clone(),
            got.stats.bytes_scanned,
            got.stats.blocks_scanned,
            got.stats.blocks_pruned,
        ));
    }
    let toks: Vec<u32> = (0..40).map(|i| (i * 37 % 700) as u32).collect();
    let s = cases[0].0;
    let (vals, st) = ndp
        .gather(&s.blocks, s.sequence, s.layer, 0, s.dtype, s.dim, &toks)
        .unwrap();
    assert_eq!(st.path, Some(NdpPath::Device));
    out.push((Vec::new(), vals, Vec::new(), 0, 0, 0));
    dev.stop();
    out
}

#[test]
fn rust_and_hls_engines_return_identical_results() {
    let (_c, pool) = setup("engines");
    let p = Arc::new(pool.attach().unwrap());
    let mut stored = Vec::new();
    for (seq, dtype, dim) in [
        (1u64, DType::F16, 64usize),
        (2, DType::Bf16, 128),
        (3, DType::F32, 32),
    ] {
        let (k, v) = random_kv(seq, 1, 700, dim, dtype);
        stored.push(store(&p, &k, &v, 1, 700, dim, dtype, 64, seq, 2));
    }
    let mut rng = SplitMix64::new(21);
    let mut cases = Vec::new();
    for s in &stored {
        for &(k, mode, prune, g) in &[
            (1, GroupMode::PerQuery, true, 1),
            (16, GroupMode::PerQuery, true, 4),
            (16, GroupMode::GroupMax, true, 4),
            (100, GroupMode::PerQuery, false, 2),
            (700, GroupMode::GroupMax, false, 3),
        ] {
            cases.push((s, rng.normal_vec(g * s.dim), k, mode, prune));
        }
    }
    let rust = answers(Engine::Rust, &pool, &cases);
    let hls = answers(Engine::Hls, &pool, &cases);
    assert_eq!(rust.len(), hls.len());
    for (i, (r, h)) in rust.iter().zip(&hls).enumerate() {
        assert_eq!(r, h, "case {i}");
    }
    // Pruning happened, identically, on both.
    assert!(rust.iter().any(|a| a.5 > 0));
}

#[test]
fn device_scans_and_attention_mass_feed_hotness() {
    let (_c, pool) = setup("hotness");
    let p = Arc::new(pool.attach().unwrap());
    let (dim, tokens) = (32, 400);
    let (k, v) = random_kv(11, 1, tokens, dim, DType::F16);
    let s = store(&p, &k, &v, 1, tokens, dim, DType::F16, 100, 5, 2);
    assert_eq!(s.blocks.len(), 4);
    let dev = Device::start(pool.clone(), config(Engine::Rust)).unwrap();
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    let hot = cxlkv_runtime::hotness::Hotness::default();
    let mut rng = SplitMix64::new(3);
    // The device scans only the first two blocks, three times: its HOTLIST names them.
    let q = rng.normal_vec(dim);
    let mut req = request(&s, 0, &q, 5, GroupMode::PerQuery, false, false);
    req.blocks = &s.blocks[..2];
    for _ in 0..3 {
        assert_eq!(
            ndp.score_topk(&req).unwrap().stats.path,
            Some(NdpPath::Device)
        );
    }
    assert!(ndp.feed_hotness(&hot, 16).unwrap() >= 2);
    assert!(hot.heat(s.blocks[0].key) > 0 && hot.heat(s.blocks[1].key) > 0);
    assert_eq!(hot.heat(s.blocks[2].key), 0);
    assert_eq!(hot.heat(s.blocks[3].key), 0);
    // Attention mass of a top-k over all four blocks: blocks 2 and 3 heat by exactly their mass.
    let got = ndp
        .score_topk(&request(&s, 0, &q, 64, GroupMode::PerQuery, false, false))
        .unwrap();
    let mass = got.attention_mass(&s.blocks);
    assert_eq!(mass.len(), 4);
    let total: f32 = mass.iter().map(|m| m.1).sum();
    assert!((total - 1.0).abs() < 1e-3, "mass sums to {total}");
    hot.record_attention_mass(&mass);
    for &(key, m) in &mass[2..] {
        let want = (f64::from(m) * f64::from(cxlkv_runtime::hotness::ATTENTION_ACCESSES)) as u32;
        assert_eq!(hot.heat(key), want);
    }
    // The merged view ranks a block hot in two signals above one hot in none.
    let merged = hot.merged(4);
    assert!(merged.iter().any(|e| e.0 == s.blocks[0].key));
    dev.stop();
}
