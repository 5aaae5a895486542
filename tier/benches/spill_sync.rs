//! Spill throughput per sync policy against fio with the same sync, in the same run.
//!
//! For each policy (`none`, `on-batch`, `always`), a fresh spill file takes `MIB` MiB of 256 KiB
//! incompressible blocks (`compress` off, `O_DIRECT`, 32 in flight) in write calls of 32 blocks
//! (the tiers' default step budget), and fio writes the same bytes on the same directory with the
//! same block size, queue depth, engine and sync:
//!
//! | policy | fio |
//! | --- | --- |
//! | `none` | no sync |
//! | `on-batch` | `--fdatasync=32` (one per 32 writes, as one per call of 32 blocks) |
//! | `always` | `--sync=dsync` (`O_DSYNC`, the same mechanism) and `--fdatasync=1` |
//!
//! Rounds alternate ours and fio's; medians are reported with their ratio. Our figure counts
//! payload bytes (a record is 1.56 % longer: header and padding), fio's its own bytes.
//!
//! ```text
//! apt-get install -y fio
//! cargo bench -p cxlkv-tier --bench spill_sync          # CXLKV_BENCH_DIR=DIR (default target/)
//! ```
//! `CXLKV_SPILL_SYNC_MIB` (default 256) and `CXLKV_SPILL_SYNC_ROUNDS` (default 3) size the run.

use cxlkv_bench_support::median;
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_runtime::Key;
use cxlkv_tier::spill::{SpillFile, SpillOptions};
use cxlkv_tier::SyncPolicy;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const BLOCK: usize = 256 << 10;
const QD: usize = 32;
const PER_CALL: usize = 32;

fn env_or(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One block of incompressible bytes from the project's seeded generator.
fn random_block(seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    (0..BLOCK / 8)
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .collect()
}

fn bench_dir() -> PathBuf {
    let d = std::env::var_os("CXLKV_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-spill-sync")
        });
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Payload bytes/s of writing `n` blocks under `sync` into a fresh spill file, and the syncs it
/// issued.
fn ours(dir: &Path, blocks: &[Vec<u8>], n: usize, sync: SyncPolicy) -> (f64, u64) {
    let path = SpillFile::path_for(dir, 0);
    let _ = std::fs::remove_file(&path);
    let (mut sf, _) = SpillFile::open(
        &path,
        SpillOptions {
            max_payload: BLOCK,
            queue_depth: QD,
            compress: false,
            direct: true,
            sync,
        },
    )
    .unwrap();
    assert!(sf.direct(), "buffered: {:?}", sf.buffered_reason());
    let items: Vec<(Key, &[u8])> = (0..n)
        .map(|i| (Key(i as u128), blocks[i % blocks.len()].as_slice()))
        .collect();
    let s = Instant::now();
    for chunk in items.chunks(PER_CALL) {
        sf.write_batch(chunk).unwrap();
    }
    let bw = (n * BLOCK) as f64 / s.elapsed().as_secs_f64();
    let syncs = sf.stats().syncs;
    drop(sf);
    let _ = std::fs::remove_file(&path);
    (bw, syncs)
}

/// fio's write bandwidth (bytes/s) for the same pattern with `sync_args`; `None` without fio.
fn fio(dir: &Path, mib: usize, sync_args: &[&str]) -> Option<f64> {
    let file = dir.join("fio-sync.dat");
    let out = Command::new("fio")
        .args([
            "--name=cxlkv-sync",
            &format!("--filename={}", file.display()),
            "--ioengine=io_uring",
            "--direct=1",
            "--rw=write",
            "--bs=256k",
            &format!("--iodepth={QD}"),
            &format!("--size={mib}M"),
            "--output-format=json",
        ])
        .args(sync_args)
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&file);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["jobs"][0]["write"]["bw_bytes"].as_f64()
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let dir = bench_dir();
    let mib = env_or("CXLKV_SPILL_SYNC_MIB", 256);
    let rounds = env_or("CXLKV_SPILL_SYNC_ROUNDS", 3).max(1);
    let n = (mib << 20) / BLOCK;
    let fs = Command::new("df")
        .args(["--output=fstype,source"])
        .arg(&dir)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .nth(1)
                .unwrap_or("?")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" on ")
        })
        .unwrap_or_default();
    println!(
        "SPILL-SYNC: {} ({fs}), {n} blocks of 256 KiB ({mib} MiB) per pass, O_DIRECT, queue \
         depth {QD}, {PER_CALL} blocks per write call, {rounds} rounds",
        dir.display()
    );
    let blocks: Vec<Vec<u8>> = (0..32).map(|i| random_block(i + 7)).collect();
    let cases: [(SyncPolicy, &[&str], &str); 4] = [
        (SyncPolicy::None, &[], "no sync"),
        (SyncPolicy::OnBatch, &["--fdatasync=32"], "--fdatasync=32"),
        (SyncPolicy::Always, &["--sync=dsync"], "--sync=dsync"),
        (SyncPolicy::Always, &["--fdatasync=1"], "--fdatasync=1"),
    ];
    let mut ours_bw: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut fio_bw: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut syncs = vec![0; cases.len()];
    for round in 0..rounds {
        for (i, (policy, args, what)) in cases.iter().enumerate() {
            let (w, s) = ours(&dir, &blocks, n, *policy);
            let f = fio(&dir, mib, args);
            println!(
                "SPILL-SYNC round {round}: {policy:<8} ours {:>6.0} MB/s ({s} fdatasync), fio {what} {}",
                w / 1e6,
                f.map_or("-".into(), |f| format!("{:.0} MB/s", f / 1e6))
            );
            ours_bw[i].push(w);
            syncs[i] = s;
            if let Some(f) = f {
                fio_bw[i].push(f);
            }
        }
    }
    println!(
        "| policy | ours, MB/s | fio (same sync) | fio, MB/s | ours / fio | fdatasync calls |"
    );
    println!("| --- | ---: | --- | ---: | ---: | ---: |");
    for (i, (policy, _, what)) in cases.iter().enumerate() {
        let o = median(ours_bw[i].clone());
        let (f, ratio) = if fio_bw[i].len() == rounds {
            let f = median(fio_bw[i].clone());
            (format!("{:.0}", f / 1e6), format!("{:.2}", o / f))
        } else {
            ("fio not installed".into(), "-".into())
        };
        println!(
            "| `{policy}` | {:.0} | `{what}` | {f} | {ratio} | {} |",
            o / 1e6,
            syncs[i]
        );
    }
}
