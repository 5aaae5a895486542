//! Pool benches, each beside the limit it chases, measured in the same run:
//!
//! - `get` and `put` of 4 KiB, 64 KiB, 256 KiB and 2 MiB blocks against `memcpy` of the same
//!   bytes, on a working set larger than the last-level cache ("cold": every call touches another
//!   block, in the same shuffled order for the pool and for memcpy) and on one block ("hot").
//! - `lookup_prefix` of one key, hit and miss, with 1, 4 and 16 partitions.
//! - `get_into` and `put` of a 64 MiB multi-block object (256 KiB parts) against memcpy of 64 MiB
//!   (target: get >= 0.9 x memcpy, as for the 4 KiB, 256 KiB and 2 MiB gets: issue #24);
//!   `CXLKV_BENCH_OBJECT_ONLY=1` runs only this one; `CXLKV_BENCH_SIZES=4K,2M,lookup,64M` runs the
//!   parts named.
//!
//! The pools live in `/dev/shm` (unlinked after). The memcpy baseline copies between private
//! buffers of the same working-set size and rotation; the summary also gives memcpy out of the
//! pool's own shm mapping (the payloads copied with no check), so both baselines are in the same
//! run. After criterion's groups, a summary table from this bench's own timing loops gives each
//! figure beside its baseline and target, plus the breakdown of a get: memcpy out of the pool,
//! CRC-32C of the copy, the same get and copy from a pool on transparent huge pages (anonymous
//! memory with `MADV_HUGEPAGE`, with the MiB that became huge pages), and the fixed cost of a get
//! (index probe, block header) timed per call.
//!
//! `cargo bench --bench pool` (release, thin LTO). `CXLKV_BENCH_WORKING_SET_MIB` overrides the
//! working set (default 1536 MiB, far over the last-level cache).
mod common;
use common::shuffled;

use criterion::{BenchmarkId, Criterion, Throughput};
use cxlkv_runtime::region::{Backend, HugePages, RegionOptions};
use cxlkv_runtime::{AttachOptions, Key, Participant, Pool, PoolConfig};
use cxlkv_test_support::TempPool;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const SIZES: [(u64, &str); 4] = [
    (4 << 10, "4K"),
    (64 << 10, "64K"),
    (256 << 10, "256K"),
    (2 << 20, "2M"),
];
const PARTITION_COUNTS: [u32; 3] = [1, 4, 16];
/// Keys per partition in the lookup pools (a quarter of the index slots: load factor 0.25).
const LOOKUP_KEYS_PER_PARTITION: u64 = 1024;

/// One line of the closing summary.
static SUMMARY: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn summary(line: String) {
    SUMMARY.lock().unwrap().push(line);
}

fn working_set() -> u64 {
    std::env::var("CXLKV_BENCH_WORKING_SET_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1536u64)
        << 20
}

/// Size and configuration of a pool for `blocks_per_partition` blocks of `block_size` in each of
/// `partitions` partitions.
fn pool_geometry(block_size: u64, blocks_per_partition: u64, partitions: u32) -> (u64, PoolConfig) {
    // Header, device area and participant table, then per partition its index (32 B per slot,
    // 2-4 slots per block), block headers and payloads, with slack for page rounding.
    let per_partition = blocks_per_partition * (block_size + 64 + 128) + (64 << 10);
    let size = (4 << 20) + u64::from(partitions) * per_partition;
    let cfg = PoolConfig {
        block_size,
        participants: partitions,
        partitions: Some(partitions),
        lease: Duration::from_secs(30),
        ..Default::default()
    };
    (size, cfg)
}

/// A pool in `/dev/shm` (4 KiB pages: a tmpfs mount gives huge pages only with `huge=`), removed
/// when dropped.
fn shm_pool(tag: &str, block_size: u64, blocks_per_partition: u64, partitions: u32) -> TempPool {
    let (size, cfg) = pool_geometry(block_size, blocks_per_partition, partitions);
    TempPool::create(&format!("bench-{tag}"), size, &cfg)
}

/// The same pool on private anonymous memory advised for transparent huge pages
/// (`MADV_HUGEPAGE`): the same code path on 2 MiB pages, to show what the page size costs.
fn huge_page_pool(block_size: u64, blocks_per_partition: u64) -> Pool {
    let (size, cfg) = pool_geometry(block_size, blocks_per_partition, 1);
    let opts = RegionOptions {
        huge_pages: HugePages::Transparent,
        ..Default::default()
    };
    Pool::create_on(&Backend::Anonymous, size, &cfg, &opts).expect("anonymous huge-page pool")
}

/// `AnonHugePages` of /proc/meminfo in MiB (memory in transparent huge pages, all processes).
fn anon_huge_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        >> 10
}

/// Median nanoseconds per call of `f` over `order` (batches of the whole order, 5 rounds).
fn ns_per_call(order: &[usize], mut f: impl FnMut(usize)) -> f64 {
    let mut per = (0..5)
        .map(|_| {
            let t = Instant::now();
            for &i in order {
                f(i);
            }
            t.elapsed().as_nanos() as f64 / order.len() as f64
        })
        .collect::<Vec<_>>();
    per.sort_by(|a, b| a.partial_cmp(b).unwrap());
    per[2]
}

/// Bytes per second of `f` called over `order` repeatedly for about `secs`, `bytes` per call.
fn rate(secs: f64, order: &[usize], bytes: u64, mut f: impl FnMut(usize)) -> f64 {
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        for &i in order {
            f(i);
        }
        calls += order.len() as u64;
    }
    (calls * bytes) as f64 / start.elapsed().as_secs_f64()
}

/// Median of `rounds` interleaved measurements of each of `fs` (interleaving spreads the noise of
/// a shared machine evenly over what is compared).
fn interleaved<const N: usize>(rounds: usize, mut fs: [&mut dyn FnMut() -> f64; N]) -> [f64; N] {
    let mut all = vec![Vec::new(); N];
    for _ in 0..rounds {
        for (i, f) in fs.iter_mut().enumerate() {
            all[i].push(f());
        }
    }
    std::array::from_fn(|i| {
        all[i].sort_by(|a, b| a.partial_cmp(b).unwrap());
        all[i][all[i].len() / 2]
    })
}

fn gbs(x: f64) -> f64 {
    x / 1e9
}

fn block_pattern(block: u64, salt: u64) -> Vec<u8> {
    (0..block)
        .map(|i| (i.wrapping_mul(31) ^ salt) as u8)
        .collect()
}

/// get and put of one block size, cold and hot, against memcpy of the same bytes.
fn bench_block_size(c: &mut Criterion, block: u64, label: &str) {
    let ws = working_set();
    let n = (ws / block).max(8);
    let sp = shm_pool(label, block, n + 1, 1);
    let pool = sp.pool();
    let owner = Participant::attach(pool, AttachOptions::default()).expect("attach");
    // One block stays free so that every put replaces a key without evicting.
    let n = (u64::from(pool.superblock().blocks_per_partition) - 1).min(n) as usize;
    let keys: Vec<Key> = (0..n as u64)
        .map(|i| Key::from_bytes(&i.to_le_bytes()))
        .collect();
    let payload = block_pattern(block, 0x5a);
    for &k in &keys {
        owner.put(k, &payload).expect("fill");
    }
    let order = shuffled(n, 0x9e37_79b9);
    let b = block as usize;
    // The memcpy baseline's working set: private, same size, faulted in.
    let mut src = vec![0u8; n * b];
    for chunk in src.chunks_mut(b) {
        chunk.copy_from_slice(&payload);
    }
    let mut big_dst = vec![1u8; n * b];
    let mut dst = vec![0u8; b];
    let mut cold_i = 0usize;
    let next = |cold_i: &mut usize| {
        *cold_i += 1;
        order[*cold_i % n]
    };

    let mut g = c.benchmark_group(format!("get/{label}"));
    g.throughput(Throughput::Bytes(block));
    g.bench_function(BenchmarkId::new("pool_get_into", "cold"), |bch| {
        bch.iter(|| {
            let i = next(&mut cold_i);
            black_box(pool.get_into(keys[i], &mut dst).unwrap().unwrap());
        })
    });
    g.bench_function(BenchmarkId::new("memcpy", "cold"), |bch| {
        bch.iter(|| {
            let i = next(&mut cold_i);
            dst.copy_from_slice(black_box(&src[i * b..(i + 1) * b]));
            black_box(&dst);
        })
    });
    g.bench_function(BenchmarkId::new("pool_get_into", "hot"), |bch| {
        bch.iter(|| black_box(pool.get_into(keys[0], &mut dst).unwrap().unwrap()))
    });
    g.bench_function(BenchmarkId::new("memcpy", "hot"), |bch| {
        bch.iter(|| {
            dst.copy_from_slice(black_box(&src[..b]));
            black_box(&dst);
        })
    });
    g.finish();

    let mut g = c.benchmark_group(format!("put/{label}"));
    g.throughput(Throughput::Bytes(block));
    g.bench_function(BenchmarkId::new("pool_put", "cold"), |bch| {
        bch.iter(|| {
            let i = next(&mut cold_i);
            black_box(owner.put(keys[i], &payload).unwrap());
        })
    });
    g.bench_function(BenchmarkId::new("memcpy", "cold"), |bch| {
        bch.iter(|| {
            let i = next(&mut cold_i);
            big_dst[i * b..(i + 1) * b].copy_from_slice(black_box(&payload));
            black_box(&big_dst);
        })
    });
    g.bench_function(BenchmarkId::new("pool_put", "hot"), |bch| {
        bch.iter(|| black_box(owner.put(keys[0], &payload).unwrap()))
    });
    g.bench_function(BenchmarkId::new("memcpy", "hot"), |bch| {
        bch.iter(|| {
            big_dst[..b].copy_from_slice(black_box(&payload));
            black_box(&big_dst);
        })
    });
    g.finish();

    // The summary's own loops: interleaved, median of five rounds of ~0.4 s each.
    let secs = 0.4;
    let mem = pool.memory().clone();
    let locs: Vec<u64> = keys
        .iter()
        .map(|&k| pool.block_ref(k).unwrap().unwrap().payload_off)
        .collect();
    let (mut d1, mut d2, mut d3) = (vec![0u8; b], vec![0u8; b], vec![0u8; b]);
    // The same blocks in a pool on huge pages (one writer, this process).
    let thp_before = anon_huge_mib();
    let huge = huge_page_pool(block, n as u64 + 1);
    let huge_owner = Participant::attach(&huge, AttachOptions::default()).expect("attach");
    for &k in &keys {
        huge_owner
            .put(k, &payload)
            .expect("fill the huge-page pool");
    }
    let huge_thp_mib = anon_huge_mib().saturating_sub(thp_before);
    let huge_mem = huge.memory().clone();
    let huge_locs: Vec<u64> = keys
        .iter()
        .map(|&k| huge.block_ref(k).unwrap().unwrap().payload_off)
        .collect();
    let (mut d4, mut d5) = (vec![0u8; b], vec![0u8; b]);
    let [get_cold, copy_cold, pool_copy_cold, get_vec_cold, huge_get_cold, huge_copy_cold] =
        interleaved(
            5,
            [
                &mut || {
                    rate(secs, &order, block, |i| {
                        black_box(pool.get_into(keys[i], &mut d1).unwrap());
                    })
                },
                &mut || {
                    rate(secs, &order, block, |i| {
                        d2.copy_from_slice(black_box(&src[i * b..(i + 1) * b]))
                    })
                },
                &mut || {
                    rate(secs, &order, block, |i| {
                        mem.read(locs[i], black_box(&mut d3[..])).unwrap()
                    })
                },
                &mut || {
                    rate(secs, &order, block, |i| {
                        black_box(pool.get(keys[i]).unwrap());
                    })
                },
                &mut || {
                    rate(secs, &order, block, |i| {
                        black_box(huge.get_into(keys[i], &mut d4).unwrap());
                    })
                },
                &mut || {
                    rate(secs, &order, block, |i| {
                        huge_mem.read(huge_locs[i], black_box(&mut d5[..])).unwrap()
                    })
                },
            ],
        );
    // What a get pays before its copy, per call on the same cold order: finding the key (index
    // probe), then also reading and checking its block header.
    let probe_ns = ns_per_call(&order, |i| {
        black_box(pool.contains(keys[i]).unwrap());
    });
    let header_ns = ns_per_call(&order, |i| {
        black_box(pool.block_ref(keys[i]).unwrap());
    });
    drop(huge_owner);
    drop(huge);
    let one = [0usize; 64];
    let [get_hot, copy_hot, crc_hot] = interleaved(
        5,
        [
            &mut || {
                rate(secs, &one, block, |_| {
                    black_box(pool.get_into(keys[0], &mut d1).unwrap());
                })
            },
            &mut || {
                rate(secs, &one, block, |_| {
                    d2.copy_from_slice(black_box(&src[..b]))
                })
            },
            &mut || {
                rate(secs, &one, block, |_| {
                    black_box(cxlkv_runtime::format::crc32c(black_box(&d3)));
                })
            },
        ],
    );
    let [put_cold, wcopy_cold] = interleaved(
        5,
        [
            &mut || {
                rate(secs, &order, block, |i| {
                    black_box(owner.put(keys[i], &payload).unwrap());
                })
            },
            &mut || {
                rate(secs, &order, block, |i| {
                    big_dst[i * b..(i + 1) * b].copy_from_slice(black_box(&payload))
                })
            },
        ],
    );
    let [put_hot, wcopy_hot] = interleaved(
        5,
        [
            &mut || {
                rate(secs, &one, block, |_| {
                    black_box(owner.put(keys[0], &payload).unwrap());
                })
            },
            &mut || {
                rate(secs, &one, block, |_| {
                    big_dst[..b].copy_from_slice(black_box(&payload))
                })
            },
        ],
    );
    let pct = |a: f64, m: f64| 100.0 * a / m;
    // Issue #24: every get from 4 KiB to 64 MiB at >= 0.9 of memcpy.
    let target = if label == "64K" {
        ""
    } else {
        "  (target >= 90 %)"
    };
    summary(format!(
        "get {label:>4} cold: {:6.2} GB/s vs memcpy {:6.2} GB/s = {:5.1} %{target}; vs memcpy out of the pool's shm mapping {:6.2} GB/s = {:5.1} %",
        gbs(get_cold),
        gbs(copy_cold),
        pct(get_cold, copy_cold),
        gbs(pool_copy_cold),
        pct(get_cold, pool_copy_cold)
    ));
    summary(format!(
        "  huge pages {label}: get {:6.2} GB/s = {:5.1} % of memcpy, memcpy out of the pool {:6.2} GB/s = {:5.1} % ({huge_thp_mib} MiB in transparent huge pages)",
        gbs(huge_get_cold),
        pct(huge_get_cold, copy_cold),
        gbs(huge_copy_cold),
        pct(huge_copy_cold, copy_cold),
    ));
    summary(format!(
        "  fixed cost {label}: {:.0} ns per get (cold) = index probe {probe_ns:.0} ns + block header {:.0} ns + copy and CRC {:.0} ns; memcpy {:.0} ns",
        1e9 * block as f64 / get_cold,
        (header_ns - probe_ns).max(0.0),
        (1e9 * block as f64 / get_cold - header_ns).max(0.0),
        1e9 * block as f64 / copy_cold,
    ));
    summary(format!(
        "get {label:>4} hot:  {:6.2} GB/s vs memcpy {:6.2} GB/s = {:5.1} %",
        gbs(get_hot),
        gbs(copy_hot),
        pct(get_hot, copy_hot)
    ));
    summary(format!(
        "put {label:>4} cold: {:6.2} GB/s vs memcpy {:6.2} GB/s = {:5.1} %",
        gbs(put_cold),
        gbs(wcopy_cold),
        pct(put_cold, wcopy_cold)
    ));
    summary(format!(
        "put {label:>4} hot:  {:6.2} GB/s vs memcpy {:6.2} GB/s = {:5.1} %",
        gbs(put_hot),
        gbs(wcopy_hot),
        pct(put_hot, wcopy_hot)
    ));
    summary(format!(
        "  breakdown {label}: memcpy out of the pool's shm mapping (cold, no check) {:.2} GB/s, CRC-32C of an L2-resident copy {:.2} GB/s, get into a new Vec (cold) {:.2} GB/s; \
         copy then CRC predicts {:.2} GB/s",
        gbs(pool_copy_cold),
        gbs(crc_hot),
        gbs(get_vec_cold),
        gbs(1.0 / (1.0 / pool_copy_cold + 1.0 / crc_hot))
    ));
    drop(owner);
}

/// A 64 MiB multi-block object (256 KiB parts): `get_into` of all of it against memcpy of 64 MiB
/// between private buffers, and its put against the same memcpy, interleaved in the same run.
fn bench_object(c: &mut Criterion) {
    const OBJ: usize = 64 << 20;
    const BLOCK: u64 = 256 << 10;
    let sp = shm_pool("object", BLOCK, OBJ as u64 / BLOCK + 8, 1);
    let pool = sp.pool();
    let owner = Participant::attach(pool, AttachOptions::default()).expect("attach");
    let key = Key::from_bytes(b"bench 64 MiB object");
    let payload = block_pattern(OBJ as u64, 0x3c);
    owner.put(key, &payload).expect("put object");
    let (mut dst, mut copy_dst) = (vec![1u8; OBJ], vec![1u8; OBJ]);
    assert_eq!(
        pool.get_into(key, &mut dst).unwrap().unwrap().len,
        OBJ as u64
    );
    assert!(dst == payload, "object read back wrong");
    let mut g = c.benchmark_group("object/64M");
    g.throughput(Throughput::Bytes(OBJ as u64));
    g.sample_size(10);
    g.bench_function("pool_get_into", |bch| {
        bch.iter(|| black_box(pool.get_into(key, &mut dst).unwrap().unwrap()))
    });
    g.bench_function("memcpy", |bch| {
        bch.iter(|| {
            copy_dst.copy_from_slice(black_box(&payload));
            black_box(&copy_dst);
        })
    });
    g.finish();
    let secs = 0.5;
    let one = [0usize; 1];
    let obj = OBJ as u64;
    // The breakdown: the parts' bytes copied out of the pool with no check at all.
    let mem = pool.memory().clone();
    let parts: Vec<(u64, usize)> = pool
        .object_manifest(key)
        .unwrap()
        .expect("an object")
        .parts
        .iter()
        .map(|p| {
            let r = pool.block_ref(Key::from_parts(p.key_lo, p.key_hi));
            (r.unwrap().unwrap().payload_off, p.len as usize)
        })
        .collect();
    let mut raw_dst = vec![1u8; OBJ];
    let [get, copy, raw, put] = interleaved(
        7,
        [
            &mut || {
                rate(secs, &one, obj, |_| {
                    black_box(pool.get_into(key, &mut dst).unwrap());
                })
            },
            &mut || {
                rate(secs, &one, obj, |_| {
                    copy_dst.copy_from_slice(black_box(&payload))
                })
            },
            &mut || {
                rate(secs, &one, obj, |_| {
                    let mut at = 0;
                    for &(off, len) in &parts {
                        mem.read(off, black_box(&mut raw_dst[at..at + len]))
                            .unwrap();
                        at += len;
                    }
                })
            },
            &mut || {
                rate(secs, &one, obj, |_| {
                    black_box(owner.put(key, &payload).unwrap());
                })
            },
        ],
    );
    summary(format!(
        "get 64 MiB object: {:6.2} GB/s vs memcpy {:6.2} GB/s = {:5.1} %  (target >= 90 %)",
        gbs(get),
        gbs(copy),
        100.0 * get / copy
    ));
    summary(format!(
        "put 64 MiB object: {:6.2} GB/s vs memcpy {:6.2} GB/s = {:5.1} %",
        gbs(put),
        gbs(copy),
        100.0 * put / copy
    ));
    summary(format!(
        "  breakdown: the parts copied out with no check {:.2} GB/s = {:5.1} % of memcpy (what skipping the per-part CRC-32C would give at most)",
        gbs(raw),
        100.0 * raw / copy
    ));
    drop(owner);
}

/// `lookup_prefix` of one key, hit and miss, with `parts` partitions (keys spread evenly).
fn bench_lookup(c: &mut Criterion, parts: u32) {
    let blocks = LOOKUP_KEYS_PER_PARTITION * 2;
    let sp = shm_pool(&format!("lookup{parts}"), 4096, blocks, parts);
    let pool = sp.pool();
    let owners: Vec<Participant> = (0..parts)
        .map(|_| Participant::attach(pool, AttachOptions::default()).unwrap())
        .collect();
    let mut hits = Vec::new();
    for (o, owner) in owners.iter().enumerate() {
        for i in 0..LOOKUP_KEYS_PER_PARTITION {
            let k = Key::from_bytes(&[o as u64, i].map(u64::to_le_bytes).concat());
            owner.put(k, &k.0.to_le_bytes()).unwrap();
            hits.push(k);
        }
    }
    let order = shuffled(hits.len(), 0x1234_5678);
    let hits: Vec<Key> = order.iter().map(|&i| hits[i]).collect();
    let misses: Vec<Key> = (0..hits.len() as u64)
        .map(|i| Key::from_bytes(&[u64::MAX, i].map(u64::to_le_bytes).concat()))
        .collect();
    assert_eq!(pool.lookup_prefix(&hits[..1]).unwrap(), 1);
    assert_eq!(pool.lookup_prefix(&misses[..1]).unwrap(), 0);

    let mut g = c.benchmark_group(format!("lookup/{parts}_partitions"));
    let mut i = 0usize;
    g.bench_function("hit", |b| {
        b.iter(|| {
            i = (i + 1) % hits.len();
            black_box(pool.lookup_prefix(std::slice::from_ref(&hits[i])).unwrap())
        })
    });
    g.bench_function("miss", |b| {
        b.iter(|| {
            i = (i + 1) % misses.len();
            black_box(
                pool.lookup_prefix(std::slice::from_ref(&misses[i]))
                    .unwrap(),
            )
        })
    });
    g.finish();

    // Per-call latency for the median: batches of 16 calls timed together (clock overhead
    // amortized), 20 000 batches, over every key in turn.
    let latency = |keys: &[Key], expect: usize| {
        let mut per_call = Vec::with_capacity(20_000);
        let mut j = 0;
        for _ in 0..20_000 {
            let t = Instant::now();
            for _ in 0..16 {
                j = (j + 1) % keys.len();
                assert_eq!(
                    black_box(pool.lookup_prefix(std::slice::from_ref(&keys[j])).unwrap()),
                    expect
                );
            }
            per_call.push(t.elapsed().as_nanos() as f64 / 16.0);
        }
        per_call.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (
            per_call[per_call.len() / 2],
            per_call[per_call.len() * 99 / 100],
        )
    };
    let (hit_med, hit_p99) = latency(&hits, 1);
    let (miss_med, miss_p99) = latency(&misses, 0);
    let target = if parts == 16 {
        "  (target: hit median < 1000 ns)"
    } else {
        ""
    };
    summary(format!(
        "lookup_prefix, {parts:>2} partition(s): hit median {hit_med:6.0} ns (p99 {hit_p99:6.0}), miss median {miss_med:6.0} ns (p99 {miss_p99:6.0}){target}"
    ));
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    // CXLKV_BENCH_OBJECT_ONLY=1: only the 64 MiB object bench (a quick run).
    let object_only = std::env::var("CXLKV_BENCH_OBJECT_ONLY").is_ok_and(|v| v == "1");
    // CXLKV_BENCH_SIZES=4K,2M: only these block sizes (and no lookups or object unless named:
    // "lookup", "64M").
    let only: Option<Vec<String>> = std::env::var("CXLKV_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    let wanted = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == name));
    if !object_only {
        for (block, label) in SIZES {
            if wanted(label) {
                bench_block_size(&mut c, block, label);
            }
        }
        for parts in PARTITION_COUNTS {
            if wanted("lookup") {
                bench_lookup(&mut c, parts);
            }
        }
    }
    if wanted("64M") {
        bench_object(&mut c);
    }
    c.final_summary();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "\n=== cxlkv pool bench summary (working set {} MiB, one thread; load average {}) ===",
        working_set() >> 20,
        load.trim()
    );
    for line in SUMMARY.lock().unwrap().iter() {
        println!("{line}");
    }
}
