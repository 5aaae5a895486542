//! Tier benchmarks, each beside the limit it chases, measured in the same run:
//! - hotness tracking on the get path: a 256 KiB tiered get with tracking on and off;
//! - io_uring spill and fetch of 256 KiB blocks (O_DIRECT, batches of 32) against
//!   `fio --ioengine=io_uring --direct=1` on the same file system (skipped with a note if fio is
//!   absent: apt-get install -y fio);
//! - LZ4 ratio and speed on the real KV tensors (data/kv/smollm2_devil_2048/layer*_k.npy), raw
//!   and in bit-plane layout.
//!
//! `CXLKV_BENCH_DIR` chooses the directory for spill and fio files (default: target/).

use criterion::{criterion_group, criterion_main, Criterion};
use cxlkv_runtime::policy::PolicyKind;
use cxlkv_runtime::tier::spill::{SpillFile, SpillOptions};
use cxlkv_runtime::tier::{TierConfig, Tiers};
use cxlkv_runtime::{Key, Pool, PoolConfig, Region};
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

const BLOCK: usize = 256 << 10;

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

fn bench_dir() -> PathBuf {
    let d = std::env::var_os("CXLKV_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("target")
                .join("bench-tiers")
        });
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tracking_overhead(c: &mut Criterion) {
    let cfg = PoolConfig {
        block_size: BLOCK as u64,
        participants: 2,
        partitions: Some(1),
        ..Default::default()
    };
    let pool = Pool::create(Arc::new(Region::anonymous(64 << 20).unwrap()), &cfg).unwrap();
    let tcfg = TierConfig {
        pool_blocks: 16,
        dram_blocks: 0,
        policy: PolicyKind::Lru,
        spill_dir: None,
        step_budget: 4,
        ..Default::default()
    };
    let (t, _) = Tiers::open(pool.attach().unwrap(), tcfg).unwrap();
    for k in 0..8u128 {
        t.put(Key(k), &random_bytes(BLOCK, k as u64 + 1), None)
            .unwrap();
    }
    let mut out = Vec::with_capacity(BLOCK);
    let mut g = c.benchmark_group("tiered_get_256k");
    let mut k = 0u128;
    for on in [true, false] {
        t.hotness().set_enabled(on);
        g.bench_function(if on { "tracking_on" } else { "tracking_off" }, |b| {
            b.iter(|| {
                k = (k + 1) % 8;
                black_box(t.get(Key(k), &mut out).unwrap())
            })
        });
    }
    g.finish();
    // Interleaved manual timing for the headline ratio.
    let mut ns = [0f64; 2];
    for round in 0..20 {
        for (i, on) in [true, false].into_iter().enumerate() {
            t.hotness().set_enabled(on);
            let s = Instant::now();
            for j in 0..200u128 {
                black_box(t.get(Key((j + round) % 8), &mut out).unwrap());
            }
            ns[i] += s.elapsed().as_nanos() as f64 / 200.0;
        }
    }
    let (on, off) = (ns[0] / 20.0, ns[1] / 20.0);
    println!(
        "TRACKING: 256 KiB get {off:.0} ns without tracking, {on:.0} ns with: overhead {:.2} %",
        100.0 * (on - off) / off
    );
}

fn fio(dir: &std::path::Path, rw: &str) -> Option<f64> {
    let file = dir.join("fio.dat");
    let out = std::process::Command::new("fio")
        .args([
            "--name=cxlkv",
            &format!("--filename={}", file.display()),
            "--ioengine=io_uring",
            "--direct=1",
            &format!("--rw={rw}"),
            "--bs=256k",
            "--iodepth=32",
            "--size=1G",
            "--output-format=json",
        ])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let job = &v["jobs"][0];
    let key = if rw.contains("read") { "read" } else { "write" };
    job[key]["bw_bytes"].as_f64()
}

fn spill_vs_fio(_c: &mut Criterion) {
    let dir = bench_dir();
    let path = SpillFile::path_for(&dir, 0);
    let _ = std::fs::remove_file(&path);
    let (mut sf, _) = SpillFile::open(
        &path,
        SpillOptions {
            max_payload: BLOCK,
            queue_depth: 32,
            compress: false,
            direct: true,
        },
    )
    .unwrap();
    let blocks: Vec<Vec<u8>> = (0..32).map(|i| random_bytes(BLOCK, i + 11)).collect();
    let n = 4096usize; // 1 GiB of payload
    let s = Instant::now();
    for b in 0..n / 32 {
        let items: Vec<(Key, &[u8])> = (0..32)
            .map(|i| (Key((b * 32 + i) as u128), blocks[i].as_slice()))
            .collect();
        sf.write_batch(&items).unwrap();
    }
    sf.sync().unwrap();
    let w = (n * BLOCK) as f64 / s.elapsed().as_secs_f64();
    let s = Instant::now();
    for b in 0..n / 32 {
        let keys: Vec<Key> = (0..32).map(|i| Key((b * 32 + i) as u128)).collect();
        black_box(sf.read_batch(&keys).unwrap());
    }
    let r = (n * BLOCK) as f64 / s.elapsed().as_secs_f64();
    println!(
        "SPILL: {} (O_DIRECT {}, registered buffers {}): write {:.0} MB/s, read {:.0} MB/s of 256 KiB payload",
        path.display(),
        sf.direct(),
        sf.registered_buffers(),
        w / 1e6,
        r / 1e6
    );
    drop(sf);
    let _ = std::fs::remove_file(&path);
    match (fio(&dir, "write"), fio(&dir, "read")) {
        (Some(fw), Some(fr)) => println!(
            "FIO: io_uring direct bs=256k iodepth=32 size=1G: write {:.0} MB/s, read {:.0} MB/s; spill/fio: write {:.0} %, read {:.0} %",
            fw / 1e6,
            fr / 1e6,
            100.0 * w / fw,
            100.0 * r / fr
        ),
        _ => println!("FIO: not available (apt-get install -y fio); no comparison"),
    }
    let _ = std::fs::remove_file(dir.join("fio.dat"));
}

fn lz4_on_kv(_c: &mut Criterion) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/kv/smollm2_devil_2048");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_string_lossy().ends_with("_k.npy"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    for f in files {
        let arr = cxlkv_kernels::npy::read_npy(&f).unwrap();
        let Ok(bits) = arr.to_f16_bits() else {
            continue;
        };
        let raw: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let dim = *arr.shape.last().unwrap();
        let rows = cxlkv_kernels::rows::KeyRows::new(&raw, cxlkv_kernels::DType::F16, dim).unwrap();
        let planes = cxlkv_kernels::bitplane::to_bitplanes(&rows);
        let bp: Vec<u8> = (0..cxlkv_kernels::bitplane::PLANES)
            .flat_map(|p| planes.plane(p).to_vec())
            .collect();
        for (name, data) in [("raw", &raw), ("bit-plane", &bp)] {
            let s = Instant::now();
            let mut c = Vec::new();
            for _ in 0..10 {
                c = cxlkv_runtime::tier::spill::lz4_compress(data);
            }
            let ct = s.elapsed().as_secs_f64() / 10.0;
            let s = Instant::now();
            for _ in 0..10 {
                black_box(cxlkv_runtime::tier::spill::lz4_decompress(&c, data.len()).unwrap());
            }
            let dt = s.elapsed().as_secs_f64() / 10.0;
            println!(
                "LZ4: {} {name}: {} -> {} bytes, ratio {:.3}, compress {:.0} MB/s, decompress {:.0} MB/s",
                f.file_name().unwrap().to_string_lossy(),
                data.len(),
                c.len(),
                data.len() as f64 / c.len() as f64,
                data.len() as f64 / ct / 1e6,
                data.len() as f64 / dt / 1e6
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = tracking_overhead, spill_vs_fio, lz4_on_kv
}
criterion_main!(benches);
