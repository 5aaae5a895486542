//! `cxlkv sim`: the randomized coherence protocol test on the non-coherence simulator.

use super::{Error, Result};
use clap::Args;
use cxlkv::runtime::watch::LivenessRule;
use cxlkv::sim::{run_sim, sites, SimOptions};
use std::process::ExitCode;

/// Arguments of `cxlkv sim`.
#[derive(Args)]
pub struct SimArgs {
    /// Simulated hosts sharing the pool without hardware coherence (2..=8).
    #[arg(long, default_value_t = 4)]
    hosts: u32,
    /// Seeds to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    seed_start: u64,
    /// Operations per host per seed.
    #[arg(long, default_value_t = 40)]
    ops: u32,
    /// Remove one publish/acquire site (see --list-sites): the run should then find a violation.
    #[arg(long)]
    drop_site: Option<String>,
    /// List the publish/acquire sites and exit.
    #[arg(long)]
    list_sites: bool,
    /// Skew each host's wall clock by up to MS milliseconds (either way) and step it, forward or
    /// back, to other offsets within MS during the run; oscillators then also drift by up to ±5 %.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    clock_skew_ms: u64,
    /// Liveness rule: counter (heartbeat counters watched on each observer's own clock), or
    /// timestamp (the old wall-clock rule, kept as the simulator's teeth: needs a build with the
    /// `sim-teeth` feature).
    #[arg(long, default_value = "counter", value_parser = ["counter", "timestamp"])]
    liveness: String,
}

/// Runs `cxlkv sim`: exit 0 when no invariant broke, 1 with the first violation otherwise.
pub fn run(a: &SimArgs) -> Result<ExitCode> {
    if a.list_sites {
        for s in sites() {
            println!("{s}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !(2..=8).contains(&a.hosts) || a.seeds == 0 {
        return Err(Error::Usage(format!(
            "--hosts must be 2..=8 and --seeds positive (got {} and {})",
            a.hosts, a.seeds
        )));
    }
    let report = run_sim(&SimOptions {
        hosts: a.hosts,
        seeds: a.seeds,
        seed_start: a.seed_start,
        drop_site: a.drop_site.clone(),
        ops: a.ops,
        clock_skew_ms: a.clock_skew_ms,
        liveness: if a.liveness == "timestamp" {
            LivenessRule::Timestamp
        } else {
            LivenessRule::Counter
        },
    });
    println!("{report}");
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
