//! Randomized protocol tests on the non-coherence simulator (docs/COHERENCE.md).
//!
//! `CXLKV_SIM_SEEDS=N` runs N seeds per host count instead of the default (the skewed-clock run
//! takes a fifth of them); the teeth tests (they need the runtime's `coherence-teeth` feature,
//! which this crate's dev-dependency enables) remove each publish/acquire site in turn, or bring
//! back the old wall-clock liveness rule under clock skew, and require a violation.

use cxlkv_runtime::watch::LivenessRule;
use cxlkv_sim::{run_sim, SimOptions};

fn seeds(default: u64) -> u64 {
    std::env::var("CXLKV_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn protocol_holds_with_every_site() {
    for hosts in [2u32, 3, 5, 8] {
        let r = run_sim(&SimOptions {
            hosts,
            seeds: seeds(25),
            ..Default::default()
        });
        println!("{hosts} hosts: {r}");
        assert!(r.ok(), "{r}");
        assert!(r.crashes > 0, "no seed crashed a host");
    }
}

/// Hosts whose wall clocks are up to 10 s apart and step forward and back during the run, and
/// whose oscillators drift by up to 5 %: the counter rule never needs them to agree.
#[test]
fn protocol_holds_with_clock_skew() {
    for hosts in [2u32, 3, 5, 8] {
        let r = run_sim(&SimOptions {
            hosts,
            seeds: (seeds(25) / 5).max(10),
            clock_skew_ms: 10_000,
            ..Default::default()
        });
        println!("{hosts} hosts: {r}");
        assert!(r.ok(), "{r}");
        assert!(r.takeovers > 0, "no seed took a host over");
        assert!(r.max_skew_ms > 1000, "{r}");
    }
}

/// The old rule (a heartbeat is the writer's wall-clock time, dead when older than a lease by the
/// observer's) holds while clocks agree, and breaks within a few seeds once they do not.
#[test]
fn timestamp_liveness_is_caught_under_clock_skew() {
    if !cxlkv_runtime::coherence::TEETH {
        println!("skipped: this build's runtime lacks the coherence-teeth feature");
        return;
    }
    let old = |hosts, seeds, clock_skew_ms| {
        run_sim(&SimOptions {
            hosts,
            seeds,
            clock_skew_ms,
            liveness: LivenessRule::Timestamp,
            ..Default::default()
        })
    };
    let agreed = old(3, 10, 0);
    println!("clocks agree: {agreed}");
    assert!(agreed.ok(), "{agreed}");
    for hosts in [2u32, 3, 5, 8] {
        let r = old(hosts, 5, 10_000);
        println!("{hosts} hosts, skew 10 s: {r}");
        assert!(r.error.is_none(), "{r}");
        assert!(
            r.violation.is_some(),
            "the old rule survived 5 skewed seeds: {r}"
        );
    }
}

#[test]
fn unknown_site_is_refused() {
    let r = run_sim(&SimOptions {
        drop_site: Some("nope".into()),
        ..Default::default()
    });
    assert!(!r.ok());
    assert!(r.error.is_some());
}

#[test]
fn every_site_is_needed() {
    use cxlkv_sim::sites;
    if !cxlkv_runtime::coherence::TEETH {
        println!(
            "every_site_is_needed skipped: this build's runtime lacks the coherence-teeth feature"
        );
        return;
    }
    let budget = seeds(100);
    let mut missed = Vec::new();
    println!("| site | breaking seed (hosts) | violation |");
    // CXLKV_SIM_SITES=a,b limits the test to those sites.
    let only = std::env::var("CXLKV_SIM_SITES").ok();
    for site in sites() {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|s| s == site))
        {
            continue;
        }
        let mut found = None;
        for hosts in [3u32, 2, 5] {
            let r = run_sim(&SimOptions {
                hosts,
                seeds: budget,
                drop_site: Some(site.into()),
                ..Default::default()
            });
            assert!(r.error.is_none(), "{r}");
            if let Some(v) = r.violation {
                found = Some(v);
                break;
            }
        }
        match found {
            Some(v) => println!("| {site} | {} ({}) | {} |", v.seed, v.hosts, v.what),
            None => {
                println!("| {site} | NOT FOUND in {budget} seeds |");
                missed.push(site);
            }
        }
    }
    assert!(
        missed.is_empty(),
        "sites whose removal no seed detected: {missed:?}"
    );
}
