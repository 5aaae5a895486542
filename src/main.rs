//! The `cxlkv` command line: pools, topology, the demo and the benchmarks.

use clap::{Args, Parser, Subcommand};
use std::process::ExitCode;

mod cli;

#[derive(Parser)]
#[command(name = "cxlkv", version, about = "CXL memory as a KV-cache tier: shared pool, near-data top-k", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show NUMA nodes, CXL candidates (CPU-less nodes) and DAX devices.
    Topo {
        /// Print JSON instead of a report.
        #[arg(long)]
        json: bool,
    },
    /// Create, inspect and check pools.
    Pool {
        #[command(subcommand)]
        command: cli::pool::PoolCommand,
    },
    /// The tier between pods: the bridge to Mooncake Store and its metrics (docs/CROSSPOD.md).
    Crosspod {
        #[command(subcommand)]
        command: cli::crosspod::CrosspodCommand,
    },
    /// What cxlkv is for: processes sharing a real KV cache through the pool, then the real model
    /// decoding with its attention next to the memory (ndp-exact), tokens checked against dense,
    /// link bytes and the device's numbers read from the run.
    Demo(cli::demo::DemoArgs),
    /// Generate text with a GGUF model and a chosen attention backend (greedy; text to stdout,
    /// prefill and decode tokens/s to stderr).
    Generate(cli::generate::GenerateArgs),
    /// Quality against link bytes: perplexity, top-1 agreement and KL divergence from dense of each
    /// attention mode over the last tokens of a text window, with the bytes each moves and a
    /// pass-key retrieval test.
    Eval(cli::eval::EvalArgs),
    /// Replay a Mooncake-format KV-cache trace against a real pool with DRAM, pool and SSD tiers,
    /// per eviction policy and capacity (with Belady's optimum as the reference line).
    Replay(cli::replay::ReplayArgs),
    /// The randomized coherence protocol test: simulated hosts share a pool without hardware
    /// coherence (private write-back caches), with crashes and takeovers.
    Sim(cli::sim::SimArgs),
    /// Benchmarks with their limits measured in the same run.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// QEMU test bed: `up` boots a guest that sees the pool as CXL memory with the device on the
    /// host; `test` runs the scenarios (testbed/qemu/testbed.sh; `--help` there).
    #[command(disable_help_flag = true)]
    Testbed {
        /// `up` or `test`, then the script's options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 1..)]
        args: Vec<String>,
    },
    /// Internal: one participant process of `cxlkv demo`.
    #[command(hide = true)]
    DemoWorker(cli::demo::WorkerArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Q·K scoring + top-k on cold keys against a plain streaming read of the same bytes.
    Qk(QkArgs),
    /// Attention on a GPU over the same KV four ways (dense in HBM, pull over the link, gather
    /// of the top-k rows, CPU-device ATTEND with a GPU merge), the host-to-GPU bandwidth and the
    /// crossovers. Needs an NVIDIA GPU, its driver and NVRTC (docs/GPU.md).
    Gpu(cli::gpu::GpuArgs),
}

#[derive(Args)]
struct QkArgs {
    /// Keys (tokens) to score.
    #[arg(long, default_value_t = 1 << 20)]
    tokens: usize,
    /// Head dimension (a multiple of 16, at most 256).
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Key (and value) element type: f16, bf16, f32, int8 or int4. Ratios are in bytes read, so
    /// int8 and int4 rows count their own size.
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Queries per GQA group.
    #[arg(long, default_value_t = 1)]
    group: usize,
    /// Results per query.
    #[arg(long, default_value_t = 256)]
    k: usize,
    /// Threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Timed repetitions (the best is reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Time the fused attention (ATTEND's kernel) over N keys and N values instead of scoring
    /// and top-k (one thread); the read is of the same K + V bytes.
    #[arg(long)]
    attend: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Topo { json } => cli::topo(json),
        Command::Pool { command } => cli::pool::run(command),
        Command::Crosspod { command } => cli::crosspod::run(command),
        Command::Demo(a) => cli::demo::run(&a),
        Command::Generate(a) => cli::generate::run(&a),
        Command::Eval(a) => cli::eval::run(&a),
        Command::Replay(a) => cli::replay::run(&a),
        Command::Sim(a) => cli::sim::run(&a),
        Command::DemoWorker(a) => cli::demo::worker(&a),
        Command::Testbed { args } => cli::testbed(&args),
        Command::Bench {
            command: BenchCommand::Qk(a),
        } => bench_qk(&a),
        Command::Bench {
            command: BenchCommand::Gpu(a),
        } => cli::gpu::run(&a),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cxlkv: {e}");
            ExitCode::from(2)
        }
    }
}

fn bench_qk(a: &QkArgs) -> cli::Result<ExitCode> {
    use cxlkv_bench_support::qk::{run_qk_bench, QkBenchConfig};
    let dtype = a.dtype.parse().map_err(cli::Error::Usage)?;
    if a.dim == 0 || !a.dim.is_multiple_of(16) || a.dim > 256 {
        return Err(cli::Error::Usage(format!(
            "--dim {} must be a multiple of 16 up to 256",
            a.dim
        )));
    }
    if a.attend && a.threads != 1 {
        return Err(cli::Error::Usage(
            "--attend runs on one thread: leave --threads at 1".into(),
        ));
    }
    if a.tokens == 0 || a.group == 0 || a.k == 0 || a.k > 4096 || a.threads == 0 || a.repeats == 0 {
        return Err(cli::Error::Usage(
            "--tokens, --group, --threads, --repeats must be positive and --k in 1..=4096".into(),
        ));
    }
    let cfg = QkBenchConfig {
        tokens: a.tokens,
        dim: a.dim,
        dtype,
        group: a.group,
        k: a.k,
        threads: a.threads,
        repeats: a.repeats,
        attend: a.attend,
        ..QkBenchConfig::default()
    };
    let report = run_qk_bench(&cfg);
    if a.json {
        println!("{}", report.to_json());
    } else {
        println!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}
