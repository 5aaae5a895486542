//! One Q·K + top-k measurement on cold keys beside a streaming read of the same bytes.
//!
//! ```text
//! cargo run --release -p cxlkv-kernels --example qk_once -- \
//!     [--tokens N] [--dim D] [--dtype f16|bf16|f32] [--group G] [--k K] [--threads T]
//!     [--repeats R] [--warm] [--attend] [--keys keys.npy --queries q.npy] [--topk-out idx.npy] [--json]
//! ```
//!
//! With `--keys`/`--queries` the data come from `.npy` files (`[N, D]` keys of `<f2` or `<f4`,
//! `[G, D]` or `[D]` `<f4` queries) instead of being synthetic; `--topk-out` writes the top-k
//! indices of query 0 (`<i4`, best first) so another implementation can be checked against them.

use cxlkv_bench_support::npy::{read_npy, write_npy, NpyDType};
use cxlkv_bench_support::qk::{measure_qk, run_qk_bench, QkBenchConfig};
use cxlkv_kernels::{scan_topk, DType, KeyRows, QueryGroup, ScoreKernel, TopK};
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qk_once: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = QkBenchConfig::default();
    let (mut keys_path, mut queries_path, mut topk_out, mut json) = (None, None, None, false);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--json" {
            json = true;
            continue;
        }
        if flag == "--warm" {
            cfg.flush = false;
            continue;
        }
        if flag == "--attend" {
            cfg.attend = true;
            continue;
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--tokens" => cfg.tokens = value.parse()?,
            "--dim" => cfg.dim = value.parse()?,
            "--dtype" => cfg.dtype = value.parse()?,
            "--group" => cfg.group = value.parse()?,
            "--k" => cfg.k = value.parse()?,
            "--threads" => cfg.threads = value.parse()?,
            "--repeats" => cfg.repeats = value.parse()?,
            "--seed" => cfg.seed = value.parse()?,
            "--keys" => keys_path = Some(value),
            "--queries" => queries_path = Some(value),
            "--topk-out" => topk_out = Some(value),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    let report = match (keys_path, queries_path) {
        (Some(kp), Some(qp)) => {
            let keys = read_npy(kp)?;
            let queries = read_npy(qp)?;
            cfg.dtype = match keys.dtype {
                NpyDType::F16 => DType::F16,
                NpyDType::F32 => DType::F32,
                NpyDType::I32 => return Err("keys must be <f2 or <f4".into()),
            };
            cfg.dim = *keys.shape.last().ok_or("keys need a shape [N, D]")?;
            let q = queries.to_f32()?;
            let report = measure_qk(&cfg, &keys.data, &q)?;
            if let Some(out) = topk_out {
                let rows = KeyRows::new(&keys.data, cfg.dtype, cfg.dim)?;
                let group = QueryGroup::new(&q[..cfg.dim], cfg.dim)?;
                let hits = scan_topk(ScoreKernel::detect(), &group, &rows, TopK::per_query(cfg.k));
                let idx: Vec<u8> = hits[0]
                    .iter()
                    .flat_map(|h| (h.index as i32).to_le_bytes())
                    .collect();
                write_npy(out, NpyDType::I32, &[hits[0].len()], &idx)?;
            }
            report
        }
        (None, None) => run_qk_bench(&cfg),
        _ => return Err("--keys and --queries go together".into()),
    };
    if json {
        println!("{}", report.to_json());
    } else {
        println!("{report}");
    }
    Ok(())
}
