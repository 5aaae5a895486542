//! Writes the selection golden sets of the HLS kernel's C-simulation test bench (fpga/tb) from the
//! Rust reference, the selection every engine's device and the host fallback run
//! (`cxlkv_runtime::ndp::select::Selection`):
//! `cargo run -p cxlkv-ndp --example golden_select -- OUT_DIR`.
//!
//! One file per set, `OUT_DIR/NAME.gsel`, little-endian: `b"CXLKVGS1"`,
//! `u32 dtype, dim, tokens, block_tokens, nblocks, ncases`, the keys (`tokens * dim` raw
//! elements), then per case `u32 g, k, group_max`, `u64 sinks, window_start, window_end,
//! exclude_start, exclude_end`, `u32 sel_flags` (1 window, 2 exclude, 4 top-p), `f32 top_p, scale`,
//! `f32 queries[g][dim]`, then `u32 status, detail` (a refused selection: status
//! `CXLKV_NDP_ERR_ARGS`, the reference's detail) and, when status is 0, `u32 lists` and per list
//! `u32 count, f32 left_out, {u32 token, f32 score}[count]`, best first.
//!
//! Blocks are fed in order, each block's scores from the crate's canonical kernel.

use cxlkv_bench_support::npy;
use cxlkv_kernels::rng::{push_elem, SplitMix64};
use cxlkv_kernels::{DType, KeyRows, QueryGroup, ScoreKernel};
use cxlkv_runtime::ndp::abi::CXLKV_NDP_ERR_ARGS;
use cxlkv_runtime::ndp::select::{Select, Selection};
use std::io::Write;
use std::path::{Path, PathBuf};

struct Set {
    name: String,
    dtype: DType,
    dim: usize,
    keys: Vec<u8>,
    block_tokens: usize,
    /// `(g, queries, scale)`.
    queries: Vec<(usize, Vec<f32>, f32)>,
}

fn put_u32(out: &mut Vec<u8>, x: u32) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, x: u64) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn put_f32(out: &mut Vec<u8>, x: f32) {
    out.extend_from_slice(&x.to_le_bytes());
}

/// The selections of every set (tokens `n`): forced sinks and windows, exclusions, top-p with
/// `k_max`, and the malformed ones the kernel must refuse with the reference's detail.
fn selections(n: u64) -> Vec<(Select, usize)> {
    let s = |sinks, window, exclude, top_p| Select {
        sinks,
        window,
        exclude,
        top_p,
    };
    vec![
        // Plain top-k with its left-out mass (an empty exclusion makes the selection active).
        (s(0, None, Some((0, 0)), None), 32),
        (s(4, None, None, None), 32),
        (s(2, Some((n - 32, n)), None, None), 64),
        (s(0, Some((100, 200)), Some((150, n)), None), 128),
        (s(0, None, None, Some(0.5)), 64),
        (s(1, Some((n - 16, n)), None, Some(0.9)), 256),
        (s(0, None, None, Some(1.0)), 16),
        (s(4, None, Some((n - 64, n)), Some(0.8)), 64),
        (s(0, Some((0, 0)), Some((3, 3)), Some(0.05)), 8),
        // Refused: p outside (0, 1], a window past the stored tokens or reversed, a reversed
        // exclusion, more forced tokens than k.
        (s(0, None, None, Some(0.0)), 8),
        (s(0, None, None, Some(1.5)), 8),
        (s(0, Some((n - 4, n + 1)), None, None), 8),
        (s(0, Some((9, 8)), None, None), 8),
        (s(0, None, Some((9, 8)), None), 8),
        (s(9, None, None, None), 8),
    ]
}

fn write_set(dir: &Path, s: &Set) -> std::io::Result<usize> {
    let keys = KeyRows::new(&s.keys, s.dtype, s.dim).expect("key shape");
    let n = keys.len();
    let ranges: Vec<(u64, u64)> = (0..n)
        .step_by(s.block_tokens)
        .map(|a| (a as u64, (a + s.block_tokens).min(n) as u64))
        .collect();
    let mut out = b"CXLKVGS1".to_vec();
    let mut cases = Vec::new();
    for (g, qv, scale) in &s.queries {
        let q = QueryGroup::new(qv, s.dim).expect("query shape");
        for (sel, k) in selections(n as u64) {
            for group_max in [false, true] {
                let lists = if group_max { 1 } else { *g };
                let mut c = Vec::new();
                put_u32(&mut c, *g as u32);
                put_u32(&mut c, k as u32);
                put_u32(&mut c, u32::from(group_max));
                put_u64(&mut c, sel.sinks);
                let (w, x) = (sel.window.unwrap_or((0, 0)), sel.exclude.unwrap_or((0, 0)));
                for v in [w.0, w.1, x.0, x.1] {
                    put_u64(&mut c, v);
                }
                let flags = u32::from(sel.window.is_some())
                    | u32::from(sel.exclude.is_some()) << 1
                    | u32::from(sel.top_p.is_some()) << 2;
                put_u32(&mut c, flags);
                put_f32(&mut c, sel.top_p.unwrap_or(0.0));
                put_f32(&mut c, *scale);
                for x in qv {
                    put_f32(&mut c, *x);
                }
                match Selection::new(sel, k, *scale, lists, &ranges) {
                    Err(e) => {
                        assert_eq!(e.code, CXLKV_NDP_ERR_ARGS);
                        put_u32(&mut c, e.code);
                        put_u32(&mut c, e.detail);
                    }
                    Ok(mut selection) => {
                        for &(a, b) in &ranges {
                            let block = keys.slice(a as usize, b as usize);
                            let mut scores = vec![0f32; block.len() * g];
                            ScoreKernel::scalar().score(&q, &block, &mut scores);
                            selection.feed(a as u32, &scores, *g, group_max);
                        }
                        let got = selection.finish();
                        put_u32(&mut c, 0);
                        put_u32(&mut c, 0);
                        put_u32(&mut c, got.lists.len() as u32);
                        for (list, left) in got.lists.iter().zip(&got.left_out) {
                            put_u32(&mut c, list.len() as u32);
                            put_f32(&mut c, *left);
                            for h in list {
                                put_u32(&mut c, h.index);
                                put_f32(&mut c, h.score);
                            }
                        }
                    }
                }
                cases.push(c);
            }
        }
    }
    for x in [
        s.dtype as u32,
        s.dim as u32,
        n as u32,
        s.block_tokens as u32,
        ranges.len() as u32,
        cases.len() as u32,
    ] {
        put_u32(&mut out, x);
    }
    out.extend_from_slice(&s.keys);
    for c in &cases {
        out.extend_from_slice(c);
    }
    std::fs::File::create(dir.join(format!("{}.gsel", s.name)))?.write_all(&out)?;
    Ok(cases.len())
}

/// Keys clustered per 128 tokens.
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

/// Keys from {-1, -0.5, 0.5, 1}, most rows copies of 4 prototypes: many exact score ties.
fn ties(rng: &mut SplitMix64, tokens: usize, dim: usize, dtype: DType) -> Vec<u8> {
    let vals = [-1.0f32, -0.5, 0.5, 1.0];
    let protos: Vec<Vec<f32>> = (0..4)
        .map(|_| (0..dim).map(|_| vals[rng.below(4) as usize]).collect())
        .collect();
    let mut k = Vec::new();
    for _ in 0..tokens {
        let row: Vec<f32> = if rng.below(4) == 0 {
            (0..dim).map(|_| vals[rng.below(4) as usize]).collect()
        } else {
            protos[rng.below(4) as usize].clone()
        };
        for x in row {
            push_elem(&mut k, dtype, x);
        }
    }
    k
}

fn main() {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fpga/golden".into()),
    );
    std::fs::create_dir_all(&dir).expect("create the output directory");
    let mut rng = SplitMix64::new(0x5e1ec7);
    let mut sets = Vec::new();
    for (dtype, dim, tokens, block) in [
        (DType::F16, 64usize, 1000usize, 128usize),
        (DType::F32, 128, 400, 96),
    ] {
        let keys = clustered(&mut rng, tokens, dim, dtype);
        let scale = cxlkv_kernels::attention::default_scale(dim);
        sets.push(Set {
            name: format!("select_{}_d{dim}", dtype.name()),
            dtype,
            dim,
            keys,
            block_tokens: block,
            queries: vec![
                (1, rng.normal_vec(dim), scale),
                (4, rng.normal_vec(4 * dim), scale),
            ],
        });
    }
    let keys = ties(&mut rng, 600, 64, DType::Bf16);
    let small = |rng: &mut SplitMix64, n: usize| -> Vec<f32> {
        (0..n).map(|_| rng.below(5) as f32 - 2.0).collect()
    };
    sets.push(Set {
        name: "select_ties_bf16_d64".into(),
        dtype: DType::Bf16,
        dim: 64,
        keys,
        block_tokens: 64,
        queries: vec![
            (1, small(&mut rng, 64), 0.125),
            (3, small(&mut rng, 192), 0.125),
        ],
    });
    // The real SmolLM2-135M keys of layer 4, KV head 0, with its GQA group at the last token:
    // a peaked distribution with a heavy attention sink.
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/kv/smollm2_devil_2048");
    let read = |n: &str| npy::read_npy(data.join(format!("layer04_{n}.npy")));
    let (Ok(k), Ok(q)) = (read("k"), read("q")) else {
        eprintln!("golden_select: no SmolLM2 tensors at {}", data.display());
        std::process::exit(1);
    };
    let (dim, tokens) = (64usize, 2048usize);
    let qv: Vec<f32> = (0..3 * dim)
        .map(|i| DType::F16.load(&q.data, ((i / dim) * tokens + tokens - 1) * dim + i % dim))
        .collect();
    sets.push(Set {
        name: "select_smollm2_l04_h0".into(),
        dtype: DType::F16,
        dim,
        keys: k.data[..tokens * dim * 2].to_vec(),
        block_tokens: 128,
        queries: vec![(3, qv, 0.125)],
    });
    let mut total = 0;
    for s in &sets {
        let n = write_set(&dir, s).expect("write a selection set");
        println!("golden_select: {} ({n} cases)", s.name);
        total += n;
    }
    println!(
        "golden_select: {} sets, {total} cases in {}",
        sets.len(),
        dir.display()
    );
}
