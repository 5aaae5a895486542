//! Trace replay against the reference LRU figures of data/traces/README.md, on the pure policy
//! simulator (the same policy code the real-pool replay uses).

use cxlkv_runtime::policy::PolicyKind;
use cxlkv_tier::replay::{simulate, Trace};
use std::path::PathBuf;

fn trace() -> Trace {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/traces/conversation_trace.jsonl");
    Trace::load(&path).expect("conversation trace")
}

#[test]
fn lru_matches_reference_figures() {
    let t = trace();
    assert_eq!(t.requests.len(), 12_031);
    assert_eq!(t.accesses(), 288_500);
    // data/traces/README.md: LRU prefix hit rate at 4k, 16k, 32k blocks.
    for (cap, reference) in [(4_000, 8.6), (16_000, 26.3), (32_000, 33.2)] {
        let r = simulate(&t, PolicyKind::Lru, cap);
        let got = r.hit_rate_pct();
        assert!(
            (got - reference).abs() <= 0.5,
            "LRU at {cap} blocks: {got:.2} %, reference {reference} %"
        );
    }
}

#[test]
fn belady_bounds_the_online_policies() {
    let t = trace();
    for cap in [2_000, 16_000] {
        let opt = simulate(&t, PolicyKind::Belady, cap).hit_rate_pct();
        for p in [
            PolicyKind::Lru,
            PolicyKind::LfuDecay,
            PolicyKind::PrefixAware,
        ] {
            let got = simulate(&t, p, cap).hit_rate_pct();
            assert!(
                got <= opt + 0.5,
                "{p} at {cap}: {got:.2} % above Belady {opt:.2} %"
            );
        }
    }
}

#[test]
fn tiny_trace_by_hand() {
    // Capacity 2, LRU: [1,2] miss miss; [1,3]: 1 hits, insert 3 evicts 2; [1,2]: 1 hits, 2 misses.
    let t = Trace::parse(
        "{\"timestamp\":0,\"hash_ids\":[1,2]}\n{\"timestamp\":1,\"hash_ids\":[1,3]}\n\n{\"timestamp\":2,\"hash_ids\":[1,2]}\n",
    )
    .unwrap();
    let r = simulate(&t, PolicyKind::Lru, 2);
    assert_eq!((r.prefix_hits, r.accesses), (2, 6));
    let bad = Trace::parse("{\"timestamp\":0}\n");
    assert_eq!(bad.unwrap_err().0, 1);
}

#[test]
fn prefix_aware_beats_lru_at_the_knee() {
    let t = trace();
    for cap in [8_000, 16_000] {
        let lru = simulate(&t, PolicyKind::Lru, cap).hit_rate_pct();
        let pa = simulate(&t, PolicyKind::PrefixAware, cap).hit_rate_pct();
        let lfu = simulate(&t, PolicyKind::LfuDecay, cap).hit_rate_pct();
        let opt = simulate(&t, PolicyKind::Belady, cap).hit_rate_pct();
        println!("{cap}: lru {lru:.2} lfu-decay {lfu:.2} prefix-aware {pa:.2} belady {opt:.2}");
        assert!(
            pa > lru,
            "prefix-aware {pa:.2} % not above LRU {lru:.2} % at {cap} blocks"
        );
    }
}

#[test]
fn real_tiers_replay_matches_the_simulator() {
    // The first 400 requests against a real pool, DRAM cache and SSD spill files: the memory-tier
    // prefix hit rate must equal the pure simulator's (same policy code, same order of operations).
    let t = trace();
    let dir = std::env::temp_dir().join(format!("cxlkv-replay-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let part = dir.join("trace.jsonl");
    let text: String = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/traces/conversation_trace.jsonl"),
    )
    .unwrap()
    .lines()
    .take(400)
    .map(|l| format!("{l}\n"))
    .collect();
    std::fs::write(&part, text).unwrap();
    let opts = cxlkv_tier::replay::ReplayOptions {
        trace: part.clone(),
        capacities: vec![300, 1_000],
        policies: PolicyKind::ALL.to_vec(),
        block_bytes: 1000,
        spill_dir: dir.clone(),
        with_ssd: true,
        dram_blocks: None,
        spill_sync: cxlkv_tier::SyncPolicy::OnBatch,
    };
    let mut calls = 0;
    let report = cxlkv_tier::replay::run_replay(&opts, &mut |done, total| {
        assert!(done <= total);
        calls += 1;
    })
    .unwrap();
    assert!(calls > 0);
    assert_eq!(report.results.len(), 8);
    for r in &report.results {
        assert!(
            (r.prefix_hit_rate - r.simulated_hit_rate).abs() < 1e-9,
            "{r:?}"
        );
        assert!(r.prefix_hit_rate_with_ssd >= r.prefix_hit_rate);
        assert!(
            (r.dram_hit_rate + r.pool_hit_rate + r.ssd_hit_rate - r.prefix_hit_rate_with_ssd).abs()
                < 1e-9
        );
        assert!(r.bytes_pool_to_ssd > 0 && r.ssd_hit_rate > 0.0, "{r:?}");
    }
    let _ = t;
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["results"].as_array().unwrap().len(), 8);
    assert!(json["results"][0]["prefix_hit_rate"].is_f64());
    let _ = std::fs::remove_dir_all(&dir);
}
