//! `cxlkv replay`: a Mooncake-format trace against a real pool with real tiers.

use super::{Error, Result};
use clap::Args;
use cxlkv::runtime::policy::PolicyKind;
use cxlkv::tier::replay::{run_replay, ReplayOptions};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `cxlkv replay`.
#[derive(Args)]
pub struct ReplayArgs {
    /// The trace (one JSON request per line: timestamp, input_length, output_length, hash_ids).
    #[arg(long, default_value = "data/traces/conversation_trace.jsonl")]
    trace: PathBuf,
    /// Pool capacities in blocks, comma-separated or repeated (default 2000..64000).
    #[arg(long, value_delimiter = ',')]
    capacity: Vec<usize>,
    /// Policies: lru, lfu-decay, prefix-aware, belady (default: all).
    #[arg(long, value_delimiter = ',')]
    policy: Vec<String>,
    /// Payload bytes of a (scaled) block.
    #[arg(long)]
    block_bytes: Option<usize>,
    /// Directory for SSD spill files.
    #[arg(long)]
    spill_dir: Option<PathBuf>,
    /// When the spill files are flushed to stable storage: none (a process crash loses no
    /// acknowledged spill, a power loss may), on-batch (one fdatasync per spilled batch and per
    /// removal: acknowledged spills survive a power loss) or always (every write O_DSYNC).
    #[arg(long, default_value = "none")]
    spill_sync: String,
    /// Drop blocks evicted from the pool instead of spilling them to SSD.
    #[arg(long)]
    no_ssd: bool,
    /// Write an SVG plot of hit rate against capacity per policy.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print one JSON object with a `results` array.
    #[arg(long)]
    json: bool,
}

/// Runs `cxlkv replay`.
pub fn run(a: &ReplayArgs) -> Result<ExitCode> {
    let mut opts = ReplayOptions {
        trace: a.trace.clone(),
        with_ssd: !a.no_ssd,
        spill_sync: a
            .spill_sync
            .parse()
            .map_err(|e: cxlkv::tier::TierError| Error::Usage(e.to_string()))?,
        ..Default::default()
    };
    if !a.capacity.is_empty() {
        opts.capacities = a.capacity.clone();
    }
    if !a.policy.is_empty() {
        opts.policies = a
            .policy
            .iter()
            .map(|p| {
                PolicyKind::parse(p).ok_or_else(|| {
                    Error::Usage(format!(
                        "unknown policy {p:?}: use lru, lfu-decay, prefix-aware or belady"
                    ))
                })
            })
            .collect::<Result<_>>()?;
    }
    if let Some(b) = a.block_bytes {
        opts.block_bytes = b;
    }
    if let Some(d) = &a.spill_dir {
        opts.spill_dir = d.clone();
    }
    let tty = std::io::stderr().is_terminal();
    let mut last = 0u64;
    let report = run_replay(&opts, &mut |done, total| {
        // A bar on a terminal; a line every 10 % otherwise.
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        if tty {
            let filled = (pct / 4) as usize;
            eprint!(
                "\rreplaying [{}{}] {pct:>3}% ({done}/{total} runs x requests)",
                "#".repeat(filled),
                " ".repeat(25 - filled.min(25))
            );
            let _ = std::io::stderr().flush();
        } else if pct >= last + 10 || done == total {
            last = pct;
            eprintln!("replaying: {pct}%");
        }
    })
    .map_err(|e| Error::Other(format!("replay: {e}")))?;
    if tty {
        eprintln!();
    }
    if let Some(p) = &a.plot {
        std::fs::write(p, cxlkv::render::replay_svg(&report))
            .map_err(|e| Error::Other(format!("write {}: {e}", p.display())))?;
        eprintln!("plot written to {}", p.display());
    }
    if a.json {
        println!("{}", report.to_json());
    } else {
        println!("{}", cxlkv::render::ReplayTable(&report));
    }
    Ok(ExitCode::SUCCESS)
}
