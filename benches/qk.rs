//! Q·K + top-k on cold keys beside the machine's read bandwidth, measured in the same run.
//!
//! For every key count N (d = 128, f16) and thread count, the bench times a plain streaming sum
//! over the same key buffer (the yardstick) and the fused score + top-k kernel for each group size
//! G and k, flushing the keys from every cache level before each timed iteration. Besides
//! criterion's own output it prints key-bytes/s as a fraction of the read bandwidth.
//!
//! The full matrix is N = 32K, 256K, 1M, 4M × G = 1, 4, 8 × k = 64, 256, 2048 × threads = 1, 2.
//! Narrow it with environment variables (comma lists) so that unused data is not even generated:
//! `QK_N=262144,1048576 QK_G=1,4 QK_K=256 QK_THREADS=1 cargo bench --bench qk`; criterion's
//! name filter (`cargo bench --bench qk -- 'qk/N=1048576'`) works too.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cxlkv_bench_support::cold::evict;
use cxlkv_bench_support::qk::synthetic_keys;
use cxlkv_kernels::parallel::{scan_topk_parallel, stream_sum_parallel};
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::{DType, KeyRows, QueryGroup, ScoreKernel, TopK};
use cxlkv_test_support::median;
use std::cell::RefCell;
use std::hint::black_box;
use std::time::{Duration, Instant};

const DIM: usize = 128;

fn list(var: &str, default: &[usize]) -> Vec<usize> {
    match std::env::var(var) {
        Ok(s) => s
            .split(',')
            .map(|x| x.trim().parse().expect("a comma list of integers"))
            .collect(),
        Err(_) => default.to_vec(),
    }
}

/// The median of the recorded times in seconds (NaN before any).
fn median_s(times: &RefCell<Vec<Duration>>) -> f64 {
    let t = times.borrow().clone();
    if t.is_empty() {
        return f64::NAN;
    }
    median(t).as_secs_f64()
}

fn qk(c: &mut Criterion) {
    let ns = list("QK_N", &[32 << 10, 256 << 10, 1 << 20, 4 << 20]);
    let gs = list("QK_G", &[1, 4, 8]);
    let ks = list("QK_K", &[64, 256, 2048]);
    let threads = list("QK_THREADS", &[1, 2]);
    let max_n = ns.iter().copied().max().unwrap_or(0);
    // One buffer for the largest N; smaller N use a prefix.
    let all_keys = synthetic_keys(max_n, DIM, DType::F16, 1);
    let kernel = ScoreKernel::detect();
    let mut summary = Vec::new();
    for &n in &ns {
        let keys = &all_keys[..n * DIM * 2];
        let rows = KeyRows::new(keys, DType::F16, DIM).expect("whole rows");
        let bytes = keys.len() as u64;
        for &t in &threads {
            let mut group = c.benchmark_group(format!("qk/N={n}/threads={t}"));
            group.throughput(Throughput::Bytes(bytes));
            group.sample_size(10);
            group.warm_up_time(Duration::from_millis(500));
            group.measurement_time(Duration::from_secs(2));

            let read_times = RefCell::new(Vec::new());
            group.bench_function("read", |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        evict(keys);
                        let start = Instant::now();
                        black_box(stream_sum_parallel(black_box(keys), t));
                        let d = start.elapsed();
                        read_times.borrow_mut().push(d);
                        total += d;
                    }
                    total
                })
            });
            let read = median_s(&read_times);

            for &g in &gs {
                let q = SplitMix64::new(g as u64).normal_vec(g * DIM);
                let queries = QueryGroup::new(&q, DIM).expect("g queries");
                for &k in &ks {
                    let times = RefCell::new(Vec::new());
                    group.bench_function(
                        BenchmarkId::new("score_topk", format!("G={g}/k={k}")),
                        |b| {
                            b.iter_custom(|iters| {
                                let mut total = Duration::ZERO;
                                for _ in 0..iters {
                                    evict(keys);
                                    let start = Instant::now();
                                    black_box(scan_topk_parallel(
                                        kernel,
                                        &queries,
                                        &rows,
                                        TopK::per_query(k),
                                        t,
                                    ));
                                    let d = start.elapsed();
                                    times.borrow_mut().push(d);
                                    total += d;
                                }
                                total
                            })
                        },
                    );
                    let secs = median_s(&times);
                    if secs.is_finite() && read.is_finite() {
                        let line = format!(
                            "N={n:>8} threads={t} G={g} k={k:>4} {}: key {:6.2} GB/s, read {:6.2} GB/s, ratio {:5.1} %",
                            kernel.isa(),
                            bytes as f64 / secs / 1e9,
                            bytes as f64 / read / 1e9,
                            100.0 * read / secs
                        );
                        println!("{line}");
                        summary.push(line);
                    }
                }
            }
            group.finish();
        }
    }
    println!(
        "\nsummary: fused score + top-k on cold keys vs streaming read of the same bytes (medians)"
    );
    for line in summary {
        println!("{line}");
    }
}

criterion_group!(benches, qk);
criterion_main!(benches);
