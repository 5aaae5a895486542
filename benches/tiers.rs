//! Tier benchmarks, each beside the limit it chases, measured in the same run:
//! - hotness tracking on the get path: a 256 KiB tiered get with tracking on and off;
//! - io_uring spill and fetch of 256 KiB blocks (O_DIRECT, 32 in flight, 1 GiB per pass)
//!   against `fio --ioengine=io_uring --direct=1 --bs=256k --iodepth=32 --size=1G` on the same
//!   directory, alternating in rounds, medians reported (fio skipped with a note if absent:
//!   apt-get install -y fio);
//! - LZ4 ratio and speed on the real KV tensors (data/kv/smollm2_devil_2048/layer*_k.npy), raw
//!   and in bit-plane layout.
//!
//! `CXLKV_BENCH_DIR` chooses the directory for spill and fio files (default: target/).

use criterion::{criterion_group, criterion_main, Criterion};
use cxlkv_runtime::policy::PolicyKind;
use cxlkv_runtime::{Key, Pool, PoolConfig, Region};
use cxlkv_test_support::median;
use cxlkv_tier::spill::{SpillFile, SpillOptions, SPILL_HEADER_SIZE};
use cxlkv_tier::{TierConfig, Tiers};
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
    // Interleaved manual timing for the headline ratio: medians of 60 rounds each, so a burst of
    // other load on the machine does not land on one side only.
    let mut ns: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..60 {
        for (i, on) in [true, false].into_iter().enumerate() {
            t.hotness().set_enabled(on);
            let s = Instant::now();
            for j in 0..200u128 {
                black_box(t.get(Key((j + round) % 8), &mut out).unwrap());
            }
            ns[i].push(s.elapsed().as_nanos() as f64 / 200.0);
        }
    }
    let [on, off] = ns.map(median);
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
            &format!("--iodepth={SPILL_QD}"),
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

const SPILL_QD: usize = 32;
const SPILL_BLOCKS: usize = 4096; // 1 GiB of payload, as fio's --size=1G
const SPILL_ROUNDS: usize = 5;

/// Writes `SPILL_BLOCKS` blocks into a fresh spill file in calls of `per_call` blocks (then
/// fdatasync), reads them back into a caller buffer, and returns payload bytes/s (write, read).
fn spill_round(
    dir: &std::path::Path,
    blocks: &[Vec<u8>],
    per_call: usize,
    compress: bool,
) -> (f64, f64) {
    let path = SpillFile::path_for(dir, 0);
    let _ = std::fs::remove_file(&path);
    let (mut sf, _) = SpillFile::open(
        &path,
        SpillOptions {
            max_payload: BLOCK,
            queue_depth: SPILL_QD,
            compress,
            direct: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        sf.direct(),
        "spill file is buffered: {:?}",
        sf.buffered_reason()
    );
    let items: Vec<(Key, &[u8])> = (0..SPILL_BLOCKS)
        .map(|i| (Key(i as u128), blocks[i % blocks.len()].as_slice()))
        .collect();
    let keys: Vec<Key> = items.iter().map(|(k, _)| *k).collect();
    let s = Instant::now();
    for chunk in items.chunks(per_call) {
        sf.write_batch(chunk).unwrap();
    }
    sf.sync().unwrap();
    let w = (SPILL_BLOCKS * BLOCK) as f64 / s.elapsed().as_secs_f64();
    // The fetch delivers every payload into memory the caller owns, as a consumer would.
    let mut out = vec![0u8; BLOCK];
    let mut n = 0;
    let s = Instant::now();
    for chunk in keys.chunks(per_call) {
        sf.read_with(chunk, |_, bytes| {
            out.copy_from_slice(bytes);
            n += 1;
        })
        .unwrap();
        black_box(&out);
    }
    let r = (SPILL_BLOCKS * BLOCK) as f64 / s.elapsed().as_secs_f64();
    assert_eq!(n, SPILL_BLOCKS);
    assert_eq!(sf.stats().file_bytes_written, sf.stats().file_bytes_read);
    drop(sf);
    let _ = std::fs::remove_file(&path);
    (w, r)
}

fn spill_vs_fio(_c: &mut Criterion) {
    let dir = bench_dir();
    let fs = std::process::Command::new("df")
        .args(["--output=fstype,source"])
        .arg(&dir)
        .output()
        .map(|o| {
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            out.lines()
                .nth(1)
                .unwrap_or("?")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" on ")
        })
        .unwrap_or_default();
    let probe = SpillFile::path_for(&dir, 1);
    let (sf, _) = SpillFile::open(&probe, SpillOptions::default()).unwrap();
    let align = std::fs::File::open(&probe)
        .ok()
        .and_then(|f| cxlkv_tier::uring::dio_alignment(&f).ok().flatten());
    let io = match sf.buffered_reason() {
        None => format!(
            "O_DIRECT, alignment memory/offset {align:?}, registered buffers {}",
            sf.registered_buffers()
        ),
        Some(why) => format!("buffered: {why}"),
    };
    drop(sf);
    let _ = std::fs::remove_file(&probe);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "SPILL: {} ({fs}; {io}), 256 KiB blocks, queue depth {SPILL_QD}, {} MiB per pass, load {}",
        dir.display(),
        (SPILL_BLOCKS * BLOCK) >> 20,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let record = (SPILL_HEADER_SIZE + BLOCK).div_ceil(4096) * 4096;
    println!(
        "SPILL: a 256 KiB payload is a {record}-byte record (64-byte header, padded to pages): the file moves {:.2} % more bytes than the payload counted below",
        100.0 * (record - BLOCK) as f64 / BLOCK as f64
    );
    let blocks: Vec<Vec<u8>> = (0..32).map(|i| random_bytes(BLOCK, i + 11)).collect();
    let mut rows = Vec::new();
    for round in 0..SPILL_ROUNDS {
        let (w, r) = spill_round(&dir, &blocks, SPILL_BLOCKS, false);
        let f = (fio(&dir, "write"), fio(&dir, "read"));
        let _ = std::fs::remove_file(dir.join("fio.dat"));
        println!(
            "SPILL round {round}: ours write {:.0} MB/s, read {:.0} MB/s; fio write {}, read {}",
            w / 1e6,
            r / 1e6,
            f.0.map_or("-".into(), |x| format!("{:.0} MB/s", x / 1e6)),
            f.1.map_or("-".into(), |x| format!("{:.0} MB/s", x / 1e6)),
        );
        rows.push((w, r, f));
    }
    let (w, r) = (
        median(rows.iter().map(|x| x.0).collect()),
        median(rows.iter().map(|x| x.1).collect()),
    );
    let (bw, br) = spill_round(&dir, &blocks, SPILL_QD, false);
    println!(
        "SPILL: in calls of {SPILL_QD} blocks (each call waits for its last write): write {:.0} MB/s, read {:.0} MB/s",
        bw / 1e6,
        br / 1e6
    );
    let (cw, _) = spill_round(&dir, &blocks, SPILL_BLOCKS, true);
    println!(
        "SPILL: with an LZ4 attempt on every block (the tiers' default; these blocks do not compress): write {:.0} MB/s",
        cw / 1e6
    );
    if rows.iter().all(|x| x.2 .0.is_some() && x.2 .1.is_some()) {
        let fw = median(rows.iter().filter_map(|x| x.2 .0).collect());
        let fr = median(rows.iter().filter_map(|x| x.2 .1).collect());
        println!(
            "FIO: io_uring direct bs=256k iodepth={SPILL_QD} size=1G, medians of {SPILL_ROUNDS}: spill write {:.0} MB/s vs fio {:.0} MB/s = {:.0} %; fetch {:.0} MB/s vs fio read {:.0} MB/s = {:.0} % (payload bytes for us, fio's bytes for fio)",
            w / 1e6,
            fw / 1e6,
            100.0 * w / fw,
            r / 1e6,
            fr / 1e6,
            100.0 * r / fr
        );
    } else {
        println!(
            "FIO: not available (apt-get install -y fio); spill write {:.0} MB/s, fetch {:.0} MB/s, no comparison",
            w / 1e6,
            r / 1e6
        );
    }
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
        let arr = cxlkv_bench_support::npy::read_npy(&f).unwrap();
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
                c = cxlkv_tier::spill::lz4_compress(data);
            }
            let ct = s.elapsed().as_secs_f64() / 10.0;
            let s = Instant::now();
            for _ in 0..10 {
                black_box(cxlkv_tier::spill::lz4_decompress(&c, data.len()).unwrap());
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
