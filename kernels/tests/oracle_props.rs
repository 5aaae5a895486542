//! Property tests: every fast path (AVX-512, AVX2, threads, pruning) against the scalar oracle,
//! over dtypes, head dimensions, group sizes, k from 1 to 4096, and key counts below k or not a
//! multiple of the block size, on random and adversarial (many exactly equal scores) data.
//!
//! Cases come from a seeded SplitMix64, so a failure names its seed and replays. Debug builds run
//! a smaller sample than release builds (`cargo test --release`) to keep `cargo test` quick.

use cxlkv_kernels::bounds::block_bounds;
use cxlkv_kernels::parallel::scan_topk_parallel;
use cxlkv_kernels::rng::{push_elem, SplitMix64};
use cxlkv_kernels::topk::topk_by_sort;
use cxlkv_kernels::{
    pruned_topk, scan_topk, DType, GroupMode, Hit, KeyRows, QueryGroup, ScoreKernel, TopK,
};

const CASES: u64 = if cfg!(debug_assertions) { 200 } else { 1000 };

/// How a case's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Data {
    /// Approximately normal floats: distinct scores.
    Random,
    /// Elements from {-1, -0.5, 0, 0.5, 1} and small-integer queries: every product and partial
    /// sum is exact, so many keys score exactly the same and ties decide the ranking.
    Ties,
    /// Keys drifting along one direction plus noise: blocks differ, so pruning has work to do.
    Drift,
}

struct Case {
    seed: u64,
    dtype: DType,
    dim: usize,
    n: usize,
    g: usize,
    k: usize,
    data: Data,
}

fn draw_case(seed: u64) -> Case {
    let mut r = SplitMix64::new(seed);
    let dtype = [DType::F16, DType::Bf16, DType::F32][r.below(3) as usize];
    let dim = [16, 32, 64, 64, 128, 128, 256][r.below(7) as usize];
    let g = [1, 1, 2, 3, 4, 5, 8, 9][r.below(8) as usize];
    let data = [Data::Random, Data::Ties, Data::Drift][r.below(3) as usize];
    // Mostly small k; sometimes up to 4096 (with few enough keys to stay quick).
    let k = match r.below(6) {
        0 => 1,
        1..=3 => 1 + r.below(64) as usize,
        4 => 64 + r.below(512) as usize,
        _ => 1024 + r.below(3073) as usize,
    };
    let budget = if cfg!(debug_assertions) {
        200_000
    } else {
        2_000_000
    };
    let max_n = (budget / (dim * g)).max(8);
    // Below k, around k, or larger; rarely a multiple of 16.
    let n = match r.below(4) {
        0 => 1 + r.below(k.min(max_n) as u64) as usize,
        _ => 1 + r.below(max_n as u64) as usize,
    };
    Case {
        seed,
        dtype,
        dim,
        n,
        g,
        k,
        data,
    }
}

fn make_data(c: &Case) -> (Vec<u8>, Vec<f32>) {
    let mut r = SplitMix64::new(c.seed ^ 0xda7a);
    let mut keys = Vec::new();
    let palette = [-1.0, -0.5, 0.0, 0.5, 1.0];
    for i in 0..c.n {
        for d in 0..c.dim {
            let x = match c.data {
                Data::Random => r.normal(),
                Data::Ties => palette[r.below(5) as usize],
                Data::Drift => {
                    if d == 0 {
                        (i as f32 / c.n as f32) * 8.0
                    } else {
                        0.25 * r.normal()
                    }
                }
            };
            push_elem(&mut keys, c.dtype, x);
        }
    }
    let queries = (0..c.g * c.dim)
        .map(|j| match c.data {
            Data::Ties => (r.below(5) as f32) - 2.0,
            Data::Drift if j % c.dim == 0 => 2.0 + r.unit(),
            _ => r.normal(),
        })
        .collect();
    (keys, queries)
}

/// Oracle: scalar scores of every key, full sort per query (or of the group maximum).
fn oracle(q: &QueryGroup<'_>, keys: &KeyRows<'_>, topk: TopK) -> (Vec<f32>, Vec<Vec<Hit>>) {
    let g = q.count();
    let mut scores = vec![0f32; keys.len() * g];
    ScoreKernel::scalar().score(q, keys, &mut scores);
    let lists = match topk.mode {
        GroupMode::PerQuery => (0..g)
            .map(|j| {
                let s: Vec<f32> = scores.iter().skip(j).step_by(g).copied().collect();
                topk_by_sort(&s, topk.k)
            })
            .collect(),
        GroupMode::GroupMax => {
            let m: Vec<f32> = scores
                .chunks(g)
                .map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max))
                .collect();
            vec![topk_by_sort(&m, topk.k)]
        }
    };
    (scores, lists)
}

fn assert_same(got: &[Vec<Hit>], want: &[Vec<Hit>], what: &str, seed: u64) {
    assert_eq!(got.len(), want.len(), "{what}: list count, seed {seed}");
    for (gl, wl) in got.iter().zip(want) {
        let gi: Vec<u32> = gl.iter().map(|h| h.index).collect();
        let wi: Vec<u32> = wl.iter().map(|h| h.index).collect();
        assert_eq!(gi, wi, "{what}: top-k indices differ, seed {seed}");
        for (a, b) in gl.iter().zip(wl) {
            let tol = 1e-5 * a.score.abs().max(b.score.abs()).max(f32::MIN_POSITIVE);
            assert!(
                (a.score - b.score).abs() <= tol,
                "{what}: score {} vs {}, seed {seed}",
                a.score,
                b.score
            );
        }
    }
}

#[test]
fn fast_kernels_equal_the_scalar_oracle() {
    let kernels = ScoreKernel::all_available();
    for seed in 0..CASES {
        let c = draw_case(seed);
        let (kb, qv) = make_data(&c);
        let keys = KeyRows::new(&kb, c.dtype, c.dim).unwrap();
        let q = QueryGroup::new(&qv, c.dim).unwrap();
        for mode in [GroupMode::PerQuery, GroupMode::GroupMax] {
            let topk = TopK { k: c.k, mode };
            let (scores, want) = oracle(&q, &keys, topk);
            for &kernel in &kernels {
                // Raw scores: bit-identical by the canonical summation order.
                let mut s = vec![0f32; scores.len()];
                kernel.score(&q, &keys, &mut s);
                assert!(
                    s.iter()
                        .zip(&scores)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{kernel:?} scores differ, seed {seed}"
                );
                let got = scan_topk(kernel, &q, &keys, topk);
                assert_same(&got, &want, &format!("{:?} {mode:?}", kernel.isa()), seed);
            }
            let par = scan_topk_parallel(
                ScoreKernel::detect(),
                &q,
                &keys,
                topk,
                1 + seed as usize % 4,
            );
            assert_same(&par, &want, "parallel", seed);
        }
    }
}

#[test]
fn pruned_topk_equals_the_full_scan() {
    let mut skipped = 0;
    for seed in 0..CASES {
        let c = draw_case(seed + 10_000);
        let (kb, qv) = make_data(&c);
        let keys = KeyRows::new(&kb, c.dtype, c.dim).unwrap();
        let q = QueryGroup::new(&qv, c.dim).unwrap();
        let block = [1, 7, 16, 64][seed as usize % 4];
        let bounds = block_bounds(&keys, block);
        for mode in [GroupMode::PerQuery, GroupMode::GroupMax] {
            let topk = TopK { k: c.k, mode };
            let (_, want) = oracle(&q, &keys, topk);
            for kernel in ScoreKernel::all_available() {
                let (got, stats) = pruned_topk(kernel, &q, &keys, &bounds, topk);
                assert_same(
                    &got,
                    &want,
                    &format!("pruned {:?} {mode:?}", kernel.isa()),
                    seed,
                );
                assert_eq!(stats.blocks_total, c.n.div_ceil(block));
                assert_eq!(
                    stats.blocks_scanned + stats.blocks_skipped,
                    stats.blocks_total
                );
                assert_eq!(
                    stats.bytes_scanned + stats.bytes_skipped,
                    kb.len() as u64,
                    "seed {seed}"
                );
                skipped += stats.blocks_skipped;
            }
            // A causal prefix with bounds built over all keys.
            let prefix = keys.slice(0, c.n.div_ceil(2));
            let (_, want) = oracle(&q, &prefix, topk);
            let (got, _) = pruned_topk(ScoreKernel::detect(), &q, &prefix, &bounds, topk);
            assert_same(&got, &want, "pruned prefix", seed);
        }
    }
    assert!(
        skipped > 0,
        "pruning never skipped a block: the test would prove nothing"
    );
}

#[test]
fn constant_keys_tie_everywhere_and_prune_exactly() {
    // All keys equal: every score ties, the top-k is the k lowest indices, and a bound equal to
    // the k-th score must not prune (strict inequality).
    for dtype in [DType::F16, DType::Bf16, DType::F32] {
        let (n, dim) = (1000, 64);
        let mut kb = Vec::new();
        for _ in 0..n {
            for d in 0..dim {
                push_elem(&mut kb, dtype, if d % 3 == 0 { 0.3 } else { -0.7 });
            }
        }
        let keys = KeyRows::new(&kb, dtype, dim).unwrap();
        let qv: Vec<f32> = (0..dim).map(|d| (d as f32 * 0.37).sin()).collect();
        let q = QueryGroup::new(&qv, dim).unwrap();
        let bounds = block_bounds(&keys, 16);
        for k in [1, 17, 999, 1000, 4096] {
            let want: Vec<u32> = (0..k.min(n) as u32).collect();
            for kernel in ScoreKernel::all_available() {
                let full = scan_topk(kernel, &q, &keys, TopK::per_query(k));
                let (pruned, _) = pruned_topk(kernel, &q, &keys, &bounds, TopK::per_query(k));
                let idx: Vec<u32> = full[0].iter().map(|h| h.index).collect();
                assert_eq!(idx, want);
                assert_eq!(pruned, full);
            }
        }
    }
}
