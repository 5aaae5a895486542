//! Randomized protocol tests on the non-coherence simulator (docs/COHERENCE.md).
//!
//! `CXLKV_SIM_SEEDS=N` runs N seeds per host count instead of the default; the teeth test (needs
//! the runtime's `coherence-teeth` feature, which this crate's dev-dependency enables) removes
//! each publish/acquire site in turn and requires a violation.

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
