//! Writes the golden vectors of the HLS kernel's C-simulation test bench (fpga/tb) from the Rust
//! reference kernels: `cargo run --release -p cxlkv-kernels --example golden -- OUT_DIR`.
//! SCORE_TOPK sets are `NAME.gold` (below), ATTEND sets `NAME.gatt` ([`attend`]).
//!
//! One file per set, `OUT_DIR/NAME.gold`, little-endian (format in fpga/README.md):
//! `b"CXLKVGL1"`, `u32 dtype, dim, tokens, block_tokens, nblocks, ncases`, the keys
//! (`tokens * dim` raw elements), the block bounds (`f32 [nblocks][2][dim]`, min then max), then per
//! case `u32 g, k, flags, expected_pruned` (`u32::MAX` when not pruned), `f32 queries[g][dim]`,
//! `u32 lists, per_list` and `{u32 token, f32 score} [lists][per_list]`, best first.
//!
//! Expected lists come from the scalar oracle's full scan ([`scan_topk`]); `expected_pruned` is
//! the number of blocks [`pruned_topk`] skipped (the device's pruning visits blocks in the same
//! order with the same rule, so the HLS kernel must skip exactly as many).

mod attend;

use attend::AttendSet;
use cxlkv_bench_support::npy;
use cxlkv_kernels::attention::default_scale;
use cxlkv_kernels::rng::{push_elem, SplitMix64};
use cxlkv_kernels::{
    block_bounds, pruned_topk, scan_topk, DType, KeyRows, QueryGroup, ScoreKernel, TopK,
};
use std::io::Write;
use std::path::{Path, PathBuf};

const FLAG_PRUNE: u32 = 1;
const FLAG_GROUP_MAX: u32 = 2;

struct Set {
    name: String,
    dtype: DType,
    dim: usize,
    keys: Vec<u8>,
    block_tokens: usize,
    /// Query groups to test (each `g * dim` f32) with their `g`.
    queries: Vec<(usize, Vec<f32>)>,
    ks: Vec<usize>,
}

fn put_u32(out: &mut Vec<u8>, x: u32) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn put_f32s(out: &mut Vec<u8>, xs: &[f32]) {
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

fn write_set(dir: &Path, s: &Set) -> std::io::Result<usize> {
    let keys = KeyRows::new(&s.keys, s.dtype, s.dim).expect("key shape");
    let bounds = block_bounds(&keys, s.block_tokens);
    let mut out = b"CXLKVGL1".to_vec();
    let mut cases = Vec::new();
    for (g, qv) in &s.queries {
        let q = QueryGroup::new(qv, s.dim).expect("query shape");
        for &k in &s.ks {
            for flags in 0..4u32 {
                let topk = if flags & FLAG_GROUP_MAX != 0 {
                    TopK::group_max(k)
                } else {
                    TopK::per_query(k)
                };
                let want = scan_topk(ScoreKernel::scalar(), &q, &keys, topk);
                let mut pruned = u32::MAX;
                if flags & FLAG_PRUNE != 0 {
                    let (hits, stats) =
                        pruned_topk(ScoreKernel::scalar(), &q, &keys, &bounds, topk);
                    assert_eq!(
                        hits, want,
                        "the Rust pruned scan differs from the full scan"
                    );
                    pruned = stats.blocks_skipped as u32;
                }
                let mut c = Vec::new();
                put_u32(&mut c, *g as u32);
                put_u32(&mut c, k as u32);
                put_u32(&mut c, flags);
                put_u32(&mut c, pruned);
                put_f32s(&mut c, qv);
                let per_list = want[0].len();
                put_u32(&mut c, want.len() as u32);
                put_u32(&mut c, per_list as u32);
                for list in &want {
                    assert_eq!(list.len(), per_list);
                    for h in list {
                        put_u32(&mut c, h.index);
                        put_f32s(&mut c, &[h.score]);
                    }
                }
                cases.push(c);
            }
        }
    }
    for x in [
        s.dtype as u32,
        s.dim as u32,
        keys.len() as u32,
        s.block_tokens as u32,
        bounds.blocks() as u32,
        cases.len() as u32,
    ] {
        put_u32(&mut out, x);
    }
    out.extend_from_slice(&s.keys);
    for b in 0..bounds.blocks() {
        put_f32s(&mut out, bounds.min(b));
        put_f32s(&mut out, bounds.max(b));
    }
    for c in &cases {
        out.extend_from_slice(c);
    }
    std::fs::File::create(dir.join(format!("{}.gold", s.name)))?.write_all(&out)?;
    Ok(cases.len())
}

/// Keys clustered per 128 tokens (so bounds prune), as the device tests store them.
fn clustered(rng: &mut SplitMix64, tokens: usize, dim: usize, dtype: DType) -> Vec<u8> {
    let mut k = Vec::new();
    let mut center = rng.normal_vec(dim);
    for t in 0..tokens {
        if t % 128 == 0 {
            center = rng.normal_vec(dim);
        }
        for c in &center {
            push_elem(&mut k, dtype, c + 0.05 * rng.normal());
        }
    }
    k
}

/// Adversarial ties: keys drawn from {-1, -0.5, 0.5, 1} with many duplicated rows and small
/// integer queries, so many keys share one score exactly and the index tie-break decides.
fn ties(rng: &mut SplitMix64, tokens: usize, dim: usize, dtype: DType) -> Vec<u8> {
    let vals = [-1.0f32, -0.5, 0.5, 1.0];
    let protos: Vec<Vec<f32>> = (0..6)
        .map(|_| (0..dim).map(|_| vals[rng.below(4) as usize]).collect())
        .collect();
    let mut k = Vec::new();
    for _ in 0..tokens {
        let row = if rng.below(4) == 0 {
            (0..dim).map(|_| vals[rng.below(4) as usize]).collect()
        } else {
            protos[rng.below(protos.len() as u64) as usize].clone()
        };
        for x in row {
            push_elem(&mut k, dtype, x);
        }
    }
    k
}

fn small_int_queries(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.below(5) as f32 - 2.0).collect()
}

fn main() {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fpga/golden".into()),
    );
    std::fs::create_dir_all(&dir).expect("create the output directory");
    let mut rng = SplitMix64::new(0x601d);
    let mut sets = Vec::new();
    for dtype in [DType::F16, DType::Bf16] {
        for dim in [64usize, 128] {
            let tokens = 1500;
            let keys = clustered(&mut rng, tokens, dim, dtype);
            let queries = vec![(1, rng.normal_vec(dim)), (4, rng.normal_vec(4 * dim))];
            sets.push(Set {
                name: format!("random_{}_d{dim}", dtype.name()),
                dtype,
                dim,
                keys,
                block_tokens: 128,
                queries,
                ks: vec![1, 32, 256],
            });
        }
        let dim = 64;
        let keys = ties(&mut rng, 700, dim, dtype);
        let queries = vec![
            (1, small_int_queries(&mut rng, dim)),
            (4, small_int_queries(&mut rng, 4 * dim)),
        ];
        sets.push(Set {
            name: format!("ties_{}_d{dim}", dtype.name()),
            dtype,
            dim,
            keys,
            block_tokens: 64,
            queries,
            ks: vec![1, 32, 256],
        });
    }
    // The real SmolLM2-135M tensors: KV head 0 of layers 4 and 17 (2048 tokens, d = 64, f16) and
    // its GQA group (query heads 0..3) at a few positions.
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/kv/smollm2_devil_2048");
    for layer in [4u32, 17] {
        let read = |n: &str| npy::read_npy(data.join(format!("layer{layer:02}_{n}.npy")));
        let (Ok(k), Ok(q)) = (read("k"), read("q")) else {
            eprintln!("golden: no SmolLM2 tensors at {}", data.display());
            std::process::exit(1);
        };
        let (dim, tokens) = (64usize, 2048usize);
        let keys = k.data[..tokens * dim * 2].to_vec();
        let query = |heads: std::ops::Range<usize>, t: usize| -> Vec<f32> {
            heads
                .flat_map(|h| (0..dim).map(move |d| (h, d)))
                .map(|(h, d)| DType::F16.load(&q.data, (h * tokens + t) * dim + d))
                .collect()
        };
        sets.push(Set {
            name: format!("smollm2_l{layer:02}_h0"),
            dtype: DType::F16,
            dim,
            keys,
            block_tokens: 128,
            queries: vec![(1, query(0..1, 2047)), (3, query(0..3, 1500))],
            ks: vec![1, 32, 256],
        });
    }
    let attend_sets = attend_sets(&mut rng, &data);
    let mut total = 0;
    for s in &attend_sets {
        let n = attend::write(&dir, s).expect("write an ATTEND set");
        println!("golden: {} ({n} ATTEND cases)", s.name);
        total += n;
    }
    for s in &sets {
        let n = write_set(&dir, s).expect("write a golden set");
        println!("golden: {} ({n} cases)", s.name);
        total += n;
    }
    println!(
        "golden: {} sets, {total} cases in {}",
        sets.len() + attend_sets.len(),
        dir.display()
    );
}

/// ATTEND sets: f16, bf16 and f32 K/V; blocks shorter than, equal to and longer than the HLS
/// kernel's tile (CXLKV_HLS_TMAX = 256 rows); the default scale and a 4x sharper one (so most
/// weights underflow); and the real SmolLM2 K/V of layer 17 with its GQA group.
fn attend_sets(rng: &mut SplitMix64, data: &Path) -> Vec<AttendSet> {
    let mut sets = Vec::new();
    for (dtype, dim, tokens, block_tokens) in [
        (DType::F16, 64usize, 1000usize, 128usize),
        (DType::Bf16, 128, 700, 300),
        (DType::F32, 64, 500, 96),
        (DType::F32, 128, 333, 256),
    ] {
        let keys = clustered(rng, tokens, dim, dtype);
        let values = rng.key_bytes(tokens, dim, dtype);
        let s = default_scale(dim);
        let cases = vec![
            (1, rng.normal_vec(dim), s),
            (4, rng.normal_vec(4 * dim), s),
            (3, rng.normal_vec(3 * dim), 4.0 * s),
        ];
        sets.push(AttendSet {
            name: format!("attend_{}_d{dim}_b{block_tokens}", dtype.name()),
            dtype,
            dim,
            keys,
            values,
            block_tokens,
            cases,
        });
    }
    let read = |n: &str| npy::read_npy(data.join(format!("layer17_{n}.npy")));
    let (Ok(k), Ok(v), Ok(q)) = (read("k"), read("v"), read("q")) else {
        eprintln!("golden: no SmolLM2 tensors at {}", data.display());
        std::process::exit(1);
    };
    let (dim, tokens) = (64usize, 2048usize);
    let query = |heads: std::ops::Range<usize>, t: usize| -> Vec<f32> {
        heads
            .flat_map(|h| (0..dim).map(move |d| (h, d)))
            .map(|(h, d)| DType::F16.load(&q.data, (h * tokens + t) * dim + d))
            .collect()
    };
    sets.push(AttendSet {
        name: "attend_smollm2_l17_h0".into(),
        dtype: DType::F16,
        dim,
        keys: k.data[..tokens * dim * 2].to_vec(),
        values: v.data[..tokens * dim * 2].to_vec(),
        block_tokens: 128,
        cases: vec![
            (3, query(0..3, 2047), default_scale(dim)),
            (1, query(0..1, 1500), default_scale(dim)),
        ],
    });
    sets
}
