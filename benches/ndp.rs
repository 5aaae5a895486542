//! NDP device benchmarks, each beside the figure it chases:
//! - `ndp/nop_round_trip`: a NOP submitted and completed on the same host, both sides polling
//!   (target: median < 5 µs);
//! - `ndp/score_topk_1M`: SCORE_TOPK over N = 1M keys (d = 128, f16, G = 4, k = 256, full scan) in
//!   the device, against `ndp/bare_kernel_1M`, the same scan as one kernel call on private memory
//!   (target: device overhead < 10 %, medians of 15 of each, timed in rotation), and against the
//!   same scan over the pool's own key pages block by block (what the pool's memory costs apart
//!   from the command);
//! - `ndp/attend_1M`: ATTEND over the same N = 1M tokens (d = 128, f16, G = 4: key and value
//!   bytes), against `ndp/bare_attend_1M`, the fused kernel (`attend_block`) called per block on
//!   the blocks' K and V rows in place in the pool mapping (the memory the device reads, same
//!   pages) and merged as the device merges, and the machine's single-thread read bandwidth
//!   measured in the same run (the faster of `stream_sum` and `stream_sum_wide`, the plain loop
//!   and the widest vector loads, over a 1 GiB private buffer in transparent huge pages), with the
//!   same reads over the blocks' own K and V pages in the pool beside it (what the pool's base
//!   pages cost). Targets: key+value bytes/s >= 0.8 of the faster of the two reads, device
//!   overhead < 10 %. The six are timed in rotation (medians of 11); each reads more than the
//!   last-level cache holds, so each starts mostly cold.
//!
//! Every timed run starts after a pause longer than the device's idle spin, so that the device
//! thread polling for its next command does not take CPU time from the run that follows a device
//! command (on a loaded machine it took ~15 % from the bare kernel and the read).

use criterion::{criterion_group, criterion_main, Criterion};
use cxlkv_kernels::attention::relative_error;
use cxlkv_kernels::parallel::{stream_sum, stream_sum_wide};
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::scan::{new_selectors, scan_chunks};
use cxlkv_kernels::{
    attend_block, scan_topk, DType, GroupMode, KeyRows, Partial, QueryGroup, ScoreKernel, TopK,
    TopKSelector,
};
use cxlkv_ndp::{Device, DeviceConfig};
use cxlkv_runtime::kv::chunk_kv;
use cxlkv_runtime::mem::SharedMemory;
use cxlkv_runtime::ndp::abi::cxlkv_ndp_block;
use cxlkv_runtime::ndp::{
    resolve_block, AttendRequest, BlockExpect, BlockSpec, NdpDevice, NdpOptions, NdpPath,
    ScoreRequest,
};
use cxlkv_runtime::{Backend, HugePages, Key, KvShape, Pool, PoolConfig, Region, RegionOptions};
use cxlkv_test_support::{median, TempBackend};
use std::sync::Arc;
use std::time::{Duration, Instant};

const N: usize = 1 << 20;
const DIM: usize = 128;
const G: usize = 4;
const K: usize = 256;
const PER_BLOCK: usize = 8000;
/// The device's idle spin (`DeviceConfig::idle_spin`) and the client's (`NdpOptions::spin`).
const SPIN: Duration = Duration::from_millis(50);

/// Waits out the device thread's idle spin before a timed run (see the module documentation).
fn settle() {
    std::thread::sleep(SPIN + Duration::from_millis(10));
}

fn benches(c: &mut Criterion) {
    let temp = TempBackend::unique_shm("cxlkv-bench-ndp");
    let backend = temp.backend().clone();
    let cfg = PoolConfig {
        block_size: 4 << 20,
        participants: 2,
        partitions: Some(1),
        ..PoolConfig::default()
    };
    let pool = Pool::create_on(&backend, 640 << 20, &cfg, &RegionOptions::default()).expect("pool");
    let p = Arc::new(pool.attach().expect("attach"));
    let _dev = Device::start(
        pool.clone(),
        DeviceConfig {
            idle_spin: SPIN,
            ..DeviceConfig::default()
        },
    )
    .expect("device");
    let mut ndp = NdpDevice::open(
        p.clone(),
        NdpOptions {
            spin: SPIN,
            ..NdpOptions::default()
        },
    )
    .expect("client");

    // NOP round trip.
    for _ in 0..2000 {
        ndp.nop().expect("nop");
    }
    let samples: Vec<Duration> = (0..20000)
        .map(|_| {
            let t = Instant::now();
            ndp.nop().expect("nop");
            t.elapsed()
        })
        .collect();
    eprintln!(
        "ndp/nop_round_trip: median {:?} over 20000 (target < 5 µs)",
        median(samples)
    );
    c.bench_function("ndp/nop_round_trip", |b| b.iter(|| ndp.nop().expect("nop")));

    // SCORE_TOPK at 1M keys.
    let mut rng = SplitMix64::new(1);
    let keys = rng.key_bytes(N, DIM, DType::F16);
    let values = rng.key_bytes(N, DIM, DType::F16);
    let row = DIM * 2;
    let mut blocks = Vec::new();
    for (range, bk, bv) in chunk_kv(&keys, &values, 1, row, 0..N, PER_BLOCK) {
        let (start, end) = (range.start, range.end);
        let shape = KvShape {
            dtype: DType::F16,
            layer: 0,
            kv_heads: 1,
            head_dim: DIM as u32,
            tokens: (end - start) as u32,
            sequence: 1,
            token_offset: start as u64,
        };
        let key = Key::from_bytes(format!("bench/{start}").as_bytes());
        p.put_kv(key, &shape, &bk, &bv).expect("put");
        blocks.push(BlockSpec {
            key,
            token_offset: start as u64,
        });
    }
    // Every block's K and V rows in place in the pool mapping: the very memory (same pages) the
    // device reads, for the bare kernels that run beside it.
    let expect = BlockExpect {
        tenant: 0,
        sequence: 1,
        layer: 0,
        kv_head: 0,
        dtype: DType::F16,
        dim: DIM as u32,
    };
    let mem = pool.memory();
    let in_pool: Vec<(KeyRows<'_>, KeyRows<'_>)> = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let entry = cxlkv_ndp_block {
                key_lo: b.key.lo(),
                key_hi: b.key.hi(),
                token_offset: b.token_offset,
            };
            let r = resolve_block(&pool, &entry, &expect, i).expect("block");
            let len = r.head_bytes;
            let kp = mem.raw_range(r.k_off, len).expect("range").expect("mapped");
            let vp = mem.raw_range(r.v_off, len).expect("range").expect("mapped");
            // SAFETY: `raw_range` checked both ranges against the mapping, which `pool` keeps
            // mapped until the end of this function, after the last use of these views. Nobody
            // writes the blocks after the puts above: this bench is the pool's only writer and
            // puts nothing more, and the device only reads.
            unsafe {
                (
                    KeyRows::from_raw(kp, len as usize, DType::F16, DIM).expect("keys"),
                    KeyRows::from_raw(vp, len as usize, DType::F16, DIM).expect("values"),
                )
            }
        })
        .collect();
    let q = rng.normal_vec(G * DIM);
    let kernel = ScoreKernel::detect();
    let req = ScoreRequest {
        queries: &q,
        dim: DIM,
        blocks: &blocks,
        sequence: 1,
        layer: 0,
        kv_head: 0,
        dtype: DType::F16,
        k: K,
        mode: GroupMode::PerQuery,
        prune: false,
        gather_values: false,
        scale: None,
        select: Default::default(),
    };
    let rows = KeyRows::new(&keys, DType::F16, DIM).expect("rows");
    let group = QueryGroup::new(&q, DIM).expect("queries");
    let want = scan_topk(kernel, &group, &rows, TopK::per_query(K));
    let got = ndp.score_topk(&req).expect("score");
    assert_eq!(got.stats.path, Some(NdpPath::Device));
    assert_eq!(
        (0..G).map(|l| got.hits(l)).collect::<Vec<_>>(),
        want,
        "device and kernel agree"
    );

    // The same scan over the pool's own key pages, block by block in the order the device visits
    // them: what the device would cost if the command itself cost nothing.
    let bare_pool = || {
        let mut selectors = new_selectors(&group, TopK::per_query(K));
        let mut scores = Vec::new();
        for ((k, _), b) in in_pool.iter().zip(&blocks) {
            let base = b.token_offset as u32;
            scan_chunks(
                kernel,
                &group,
                k,
                base,
                GroupMode::PerQuery,
                &mut selectors,
                &mut scores,
            );
        }
        selectors
            .into_iter()
            .map(TopKSelector::into_sorted)
            .collect::<Vec<_>>()
    };
    assert_eq!(bare_pool(), want, "the scan over the pool's pages agrees");

    // The three are timed in rotation (each going first in turn), so that a change of machine
    // load during the run weighs on all alike.
    let reps = 15;
    let (mut bare, mut in_place, mut device, mut dev_ns) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        for which in (0..3).map(|i| (rep + i) % 3) {
            settle();
            let t = Instant::now();
            match which {
                0 => {
                    std::hint::black_box(scan_topk(kernel, &group, &rows, TopK::per_query(K)));
                    bare.push(t.elapsed());
                }
                1 => {
                    std::hint::black_box(bare_pool());
                    in_place.push(t.elapsed());
                }
                _ => {
                    let r = ndp.score_topk(&req).expect("score");
                    device.push(t.elapsed());
                    dev_ns.push(Duration::from_nanos(r.stats.device_ns));
                }
            }
        }
    }
    let (bare, in_place, device, dev_ns) = (
        median(bare),
        median(in_place),
        median(device),
        median(dev_ns),
    );
    let over = |base: Duration| (device.as_secs_f64() / base.as_secs_f64() - 1.0) * 100.0;
    eprintln!(
        "ndp/score_topk_1M: bare kernel {bare:?} (private rows), {in_place:?} (the pool's own key pages, block by block), device round trip {device:?} (device-side {dev_ns:?}); overhead {:.1} % against the bare kernel (target < 10 %), {:.1} % against the same scan on the pool's pages; kernel {:?}, {:.1} GB/s of keys; load {}",
        over(bare),
        over(in_place),
        kernel.isa(),
        (N * row) as f64 / bare.as_secs_f64() / 1e9,
        load_average(),
    );
    let mut g = c.benchmark_group("ndp");
    g.sample_size(10);
    g.bench_function("bare_kernel_1M", |b| {
        b.iter(|| scan_topk(kernel, &group, &rows, TopK::per_query(K)))
    });
    g.bench_function("score_topk_1M", |b| {
        b.iter(|| ndp.score_topk(&req).expect("score"))
    });
    g.finish();

    // ATTEND at 1M tokens, beside the bare fused kernel and the read bandwidth.
    let scale = cxlkv_kernels::attention::default_scale(DIM);
    let areq = AttendRequest {
        queries: &q,
        dim: DIM,
        blocks: &blocks,
        sequence: 1,
        layer: 0,
        kv_head: 0,
        dtype: DType::F16,
        scale: Some(scale),
        sparse: None,
    };
    // The bare kernel reads the very memory the device reads (`in_pool`), one `attend_block` per
    // block merged in block order, which is the device's answer bit for bit.
    let bare_attend = || {
        let mut parts: Vec<Partial> = (0..G).map(|_| Partial::empty(DIM)).collect();
        for (k, v) in &in_pool {
            for (p, x) in parts
                .iter_mut()
                .zip(&attend_block(kernel, &group, k, v, scale))
            {
                p.merge(x);
            }
        }
        parts
    };
    let want = bare_attend();
    let got = ndp.attend(&areq).expect("attend");
    assert_eq!(got.stats.path, Some(NdpPath::Device));
    assert_eq!(got.partials, want, "device and kernel agree");
    // The same over the private copies (other pages, same rows) agrees bit for bit, and the
    // single-call kernel to f32 summation order.
    let vrows = KeyRows::new(&values, DType::F16, DIM).expect("rows");
    let mut private: Vec<Partial> = (0..G).map(|_| Partial::empty(DIM)).collect();
    for start in (0..N).step_by(PER_BLOCK) {
        let end = (start + PER_BLOCK).min(N);
        let ks = rows.slice(start, end);
        for (w, p) in private.iter_mut().zip(&attend_block(
            kernel,
            &group,
            &ks,
            &vrows.slice(start, end),
            scale,
        )) {
            w.merge(p);
        }
    }
    assert_eq!(private, want, "pool and private rows agree");
    for (a, b) in want
        .iter()
        .zip(&attend_block(kernel, &group, &rows, &vrows, scale))
    {
        assert_eq!(a.max, b.max);
        assert!(relative_error(&[a.sum], &[b.sum]) < 1e-3);
    }
    let kv_bytes = 2 * (N * row) as u64;
    assert_eq!(got.stats.bytes_scanned, kv_bytes);
    let read_buf = ReadBuffer::new(1 << 30);
    eprintln!(
        "ndp/attend_1M: read buffer 1 GiB, {} MiB of it in transparent huge pages",
        read_buf.huge_mib()
    );
    // The same read over the blocks' own K and V pages in the pool (base pages, the device's
    // memory): shows what the pool's mapping costs against the huge-page yardstick. Each read is
    // timed in both forms, the plain loop and the widest vector loads, and the faster counts: which
    // one wins depends on the CPU (`stream_sum_wide`).
    let pool_read = |read: fn(&[u8]) -> u64| {
        let mut acc = 0u64;
        for (k, v) in &in_pool {
            for rows in [k, v] {
                // SAFETY: the views lie inside the pool mapping, which `pool` keeps mapped until
                // the end of this function; nobody writes these blocks any more (see `in_pool`),
                // so a shared slice over them for the duration of the read is sound.
                let bytes = unsafe { std::slice::from_raw_parts(rows.as_ptr(), rows.byte_len()) };
                acc = acc.wrapping_add(read(std::hint::black_box(bytes)));
            }
        }
        acc
    };
    let reads: [fn(&[u8]) -> u64; 2] = [stream_sum, stream_sum_wide];
    let (mut bare, mut device, mut dev_ns) = (Vec::new(), Vec::new(), Vec::new());
    let (mut read, mut pread) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for rep in 0..11 {
        for which in (0..6).map(|i| (rep + i) % 6) {
            settle();
            let t = Instant::now();
            match which {
                0 => {
                    std::hint::black_box(bare_attend());
                    bare.push(t.elapsed());
                }
                1 => {
                    let r = ndp.attend(&areq).expect("attend");
                    device.push(t.elapsed());
                    dev_ns.push(Duration::from_nanos(r.stats.device_ns));
                }
                2 | 3 => {
                    let form = which - 2;
                    std::hint::black_box(reads[form](std::hint::black_box(read_buf.bytes())));
                    read[form].push(t.elapsed());
                }
                _ => {
                    let form = which - 4;
                    std::hint::black_box(pool_read(reads[form]));
                    pread[form].push(t.elapsed());
                }
            }
        }
    }
    let faster = |[a, b]: [Vec<Duration>; 2]| median(a).min(median(b));
    let (bare, device, dev_ns, read, pread) = (
        median(bare),
        median(device),
        median(dev_ns),
        faster(read),
        faster(pread),
    );
    let gbps = |bytes: u64, t: Duration| bytes as f64 / t.as_secs_f64() / 1e9;
    let read_gbps = gbps(read_buf.bytes().len() as u64, read);
    let pool_gbps = gbps(kv_bytes, pread);
    // The limit is the faster of the two reads.
    let limit = read_gbps.max(pool_gbps);
    eprintln!(
        "ndp/attend_1M: read bandwidth {read_gbps:.2} GB/s (1 thread, 1 GiB in huge pages), {pool_gbps:.2} GB/s (the blocks' own K+V pages in the pool); bare fused kernel on the pool's rows {bare:?} = {:.2} GB/s of K+V = {:.2} x the faster read (target >= 0.8); device round trip {device:?} (device-side {dev_ns:?}) = {:.2} GB/s = {:.2} x the faster read; device overhead {:.1} % (target < 10 %); kernel {:?}; medians of 11, load {}",
        gbps(kv_bytes, bare),
        gbps(kv_bytes, bare) / limit,
        gbps(kv_bytes, device),
        gbps(kv_bytes, device) / limit,
        (device.as_secs_f64() / bare.as_secs_f64() - 1.0) * 100.0,
        kernel.isa(),
        load_average(),
    );
    drop(read_buf);
    let mut g = c.benchmark_group("ndp");
    g.sample_size(10);
    g.bench_function("bare_attend_1M", |b| b.iter(bare_attend));
    g.bench_function("attend_1M", |b| {
        b.iter(|| ndp.attend(&areq).expect("attend"))
    });
    g.finish();
}

/// The read-bandwidth yardstick's buffer: private anonymous memory asked for in transparent huge
/// pages (fewer TLB misses than the pool's base pages: the strongest simple read), filled.
struct ReadBuffer {
    region: Region,
    len: usize,
}

impl ReadBuffer {
    fn new(len: usize) -> ReadBuffer {
        let opts = RegionOptions {
            huge_pages: HugePages::Transparent,
            ..RegionOptions::default()
        };
        let region = Region::create(&Backend::Anonymous, len as u64, &opts).expect("read buffer");
        let chunk: Vec<u8> = (0..64usize << 20).map(|i| (i >> 12) as u8).collect();
        for off in (0..len).step_by(chunk.len()) {
            let n = chunk.len().min(len - off);
            region.write(off as u64, &chunk[..n]).expect("fill");
        }
        ReadBuffer { region, len }
    }

    fn bytes(&self) -> &[u8] {
        let p = self.region.raw_range(0, self.len as u64).expect("range");
        let p = p.expect("an anonymous region is mapped");
        // SAFETY: `raw_range` checked the range against the mapping, which lives as long as
        // `self` (the returned slice borrows it); the region is this process's private anonymous
        // memory, written only in `new`, before any slice exists.
        unsafe { std::slice::from_raw_parts(p, self.len) }
    }

    /// MiB of this process's anonymous memory in transparent huge pages (`AnonHugePages`).
    fn huge_mib(&self) -> u64 {
        std::fs::read_to_string("/proc/self/smaps_rollup")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("AnonHugePages:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .map_or(0, |kb| kb >> 10)
    }
}

/// The 1-minute load average (`/proc/loadavg`), to print beside a figure.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

criterion_group!(ndp_benches, benches);
criterion_main!(ndp_benches);
