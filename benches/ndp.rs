//! NDP device benchmarks, each beside the figure it chases:
//! - `ndp/nop_round_trip`: a NOP submitted and completed on the same host, both sides polling
//!   (target: median < 5 µs);
//! - `ndp/score_topk_1M`: SCORE_TOPK over N = 1M keys (d = 128, f16, G = 4, k = 256, full scan) in
//!   the device, against `ndp/bare_kernel_1M`, the same scan as one kernel call on private memory
//!   (target: device overhead < 10 %, medians of 15 of each, timed in alternation).

use criterion::{criterion_group, criterion_main, Criterion};
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::{scan_topk, DType, GroupMode, KeyRows, QueryGroup, ScoreKernel, TopK};
use cxlkv_ndp::{Device, DeviceConfig};
use cxlkv_runtime::kv::chunk_kv;
use cxlkv_runtime::ndp::{BlockSpec, NdpDevice, NdpOptions, NdpPath, ScoreRequest};
use cxlkv_runtime::{Backend, Key, KvShape, Pool, PoolConfig, Region, RegionOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

const N: usize = 1 << 20;
const DIM: usize = 128;
const G: usize = 4;
const K: usize = 256;
const PER_BLOCK: usize = 8000;

struct Unlink(Backend);
impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = Region::unlink(&self.0);
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn benches(c: &mut Criterion) {
    let backend = Backend::Shm(format!("cxlkv-bench-ndp-{}", std::process::id()));
    let _u = Unlink(backend.clone());
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
            idle_spin: Duration::from_millis(50),
            ..DeviceConfig::default()
        },
    )
    .expect("device");
    let mut ndp = NdpDevice::open(
        p.clone(),
        NdpOptions {
            spin: Duration::from_millis(50),
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
        scale: 1.0 / (DIM as f32).sqrt(),
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

    // The two are timed in alternation (each going first every other time), so that a change of
    // machine load during the run weighs on both alike.
    let reps = 15;
    let (mut bare, mut device, mut dev_ns) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        for which in [rep % 2, 1 - rep % 2] {
            let t = Instant::now();
            if which == 0 {
                std::hint::black_box(scan_topk(kernel, &group, &rows, TopK::per_query(K)));
                bare.push(t.elapsed());
            } else {
                let r = ndp.score_topk(&req).expect("score");
                device.push(t.elapsed());
                dev_ns.push(Duration::from_nanos(r.stats.device_ns));
            }
        }
    }
    let (bare, device, dev_ns) = (median(bare), median(device), median(dev_ns));
    eprintln!(
        "ndp/score_topk_1M: bare kernel {bare:?}, device round trip {device:?} (device-side {dev_ns:?}); overhead {:.1} % (target < 10 %); kernel {:?}, {:.1} GB/s of keys",
        (device.as_secs_f64() / bare.as_secs_f64() - 1.0) * 100.0,
        kernel.isa(),
        (N * row) as f64 / bare.as_secs_f64() / 1e9
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
}

criterion_group!(ndp_benches, benches);
criterion_main!(ndp_benches);
