//! `cxlkv bench gpu`: the four GPU attention paths of `cxlkv-gpu` over the same KV (the real
//! SmolLM2 KV of data/kv, a Llama-3-8B-shaped sequence at each `--tokens`), the host-to-GPU
//! bandwidth, and where the paths cross. Without a GPU it exits 2 with what is missing.

use super::{Error, Result};
use clap::Args;
use cxlkv_gpu::bench::{self, Report, Workload};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

/// The link's datasheet figure the measured bandwidth is set against: PCIe 5.0 x16 (what CXL x16
/// runs on and what an H100 attaches by), 32 GT/s × 16 lanes, 128b/130b ≈ 63.0 GB/s per direction.
const DATASHEET_BYTES_PER_S: f64 = 63.0e9;

/// Options of `cxlkv bench gpu`.
#[derive(Args)]
pub struct GpuArgs {
    /// Folder of real KV tensors (data/kv/smollm2_devil_2048 by default).
    #[arg(long)]
    kv: Option<PathBuf>,
    /// Lengths of the Llama-3-8B-shaped sequence, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "32768,131072")]
    tokens: Vec<usize>,
    /// Rows per KV head that `gather` reads (the top-k).
    #[arg(long, default_value_t = 2048)]
    topk: usize,
    /// Timed repetitions of each step (the best is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn gpu_err(e: cxlkv_gpu::GpuError) -> Error {
    Error::Other(format!("bench gpu: {e}"))
}

/// Runs the bench.
pub fn run(a: &GpuArgs) -> Result<ExitCode> {
    if a.tokens.iter().any(|&t| t <= bench::OPEN_ROWS) || a.repeats == 0 || a.topk == 0 {
        return Err(Error::Usage(format!(
            "--tokens must each exceed {} (the open block), --repeats and --topk be positive",
            bench::OPEN_ROWS
        )));
    }
    // The KV folder first: bad input fails before any GPU work.
    let kv =
        a.kv.clone()
            .unwrap_or_else(super::demo::kv_dir::default_dir);
    let small = Workload::smollm2(&kv).map_err(gpu_err)?;
    let gpu = cxlkv_gpu::Gpu::open(a.device).map_err(gpu_err)?;
    eprintln!("bench gpu: {} (compute {:?})", gpu.name(), gpu.capability());
    let link = bench::link(&gpu, 256 << 20).map_err(gpu_err)?;
    let mut reports = vec![
        bench::run(&gpu, &small, a.topk.min(small.shape.rows / 4), a.repeats).map_err(gpu_err)?,
    ];
    for &t in &a.tokens {
        let w = Workload::llama3_8b(t).map_err(gpu_err)?;
        reports.push(bench::run(&gpu, &w, a.topk, a.repeats).map_err(gpu_err)?);
    }
    let llama: Vec<&Report> = reports[1..].iter().collect();
    let pairs = [
        ("pull", "ndp+merge"),
        ("pull", "gather"),
        ("dense", "ndp+merge"),
    ];
    let crossings: Vec<_> = pairs
        .iter()
        .map(|&(x, y)| (x, y, bench::crossover(&llama, x, y)))
        .collect();
    if a.json {
        let reports: Vec<_> = reports
            .iter()
            .map(|r| {
                json!({
                    "workload": r.workload, "tokens": r.tokens, "layers": r.layers, "topk": r.topk,
                    "paths": r.paths.iter().map(|p| json!({
                        "path": p.name, "ms_per_step": p.step_s * 1e3,
                        "link_bytes_per_step": p.link_bytes, "relative_error": p.error,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let out = json!({
            "device": gpu.name(),
            "compute_capability": [gpu.capability().0, gpu.capability().1],
            "link": {
                "bytes": link.bytes,
                "memcpy_htod_pinned_bytes_per_s": link.copy_bytes_per_s,
                "kernel_read_registered_bytes_per_s": link.kernel_bytes_per_s,
                "datasheet_bytes_per_s": DATASHEET_BYTES_PER_S,
            },
            "reports": reports,
            "crossover_tokens": crossings.iter().map(|(x, y, n)| json!({"a": x, "b": y, "tokens": n})).collect::<Vec<_>>(),
        });
        println!("{out}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "GPU: {} (compute {}.{})",
        gpu.name(),
        gpu.capability().0,
        gpu.capability().1
    );
    println!(
        "link, host to GPU over {} MiB: cuMemcpyHtoD of pinned memory {:.1} GB/s, a kernel reading registered memory {:.1} GB/s; datasheet PCIe 5.0 x16 {:.1} GB/s ({:.2} and {:.2} of it)",
        link.bytes >> 20,
        link.copy_bytes_per_s / 1e9,
        link.kernel_bytes_per_s / 1e9,
        DATASHEET_BYTES_PER_S / 1e9,
        link.copy_bytes_per_s / DATASHEET_BYTES_PER_S,
        link.kernel_bytes_per_s / DATASHEET_BYTES_PER_S
    );
    for r in &reports {
        println!(
            "\n{} — {} layers per step, gather top-{} rows per head",
            r.workload, r.layers, r.topk
        );
        println!(
            "{:<10} {:>12} {:>16} {:>10}",
            "path", "ms/step", "link MB/step", "rel err"
        );
        for p in &r.paths {
            println!(
                "{:<10} {:>12.3} {:>16.1} {:>10.1e}",
                p.name,
                p.step_s * 1e3,
                p.link_bytes as f64 / 1e6,
                p.error
            );
        }
    }
    println!();
    for (x, y, n) in crossings {
        match n {
            Some(n) => println!("{x} and {y} cross at about {n:.0} tokens (straight line through the Llama-shaped lengths)"),
            None => println!("{x} and {y}: no crossing (one is faster at every length, or one length only)"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
