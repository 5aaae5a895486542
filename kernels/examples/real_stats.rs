//! Figures on the real SmolLM2 tensors (`data/kv/smollm2_devil_2048`, layers 4 and 17, last 64
//! query positions of all 9 heads, causal prefixes):
//!
//! - the fraction of 16-token key blocks that exact pruned top-k skips, at k = 32 and 128, per
//!   layer (per query head, and per GQA group of 3 heads sharing a KV head);
//! - the recall of the exact top-k by the approximate bit-plane scorer that reads only the sign,
//!   exponent and top 2 mantissa planes (8 of 16 planes), alone and as a pre-filter of 4k
//!   candidates re-scored exactly.
//!
//! `cargo run --release -p cxlkv-kernels --example real_stats`

use cxlkv_bench_support::npy::read_npy;
use cxlkv_kernels::attention::dense_scores;
use cxlkv_kernels::bitplane::{approx_topk, to_bitplanes};
use cxlkv_kernels::score::dot_canonical;
use cxlkv_kernels::topk::topk_by_sort;
use cxlkv_kernels::{
    block_bounds, pruned_topk, DType, KeyRows, PruneStats, QueryGroup, ScoreKernel, TopK,
    TopKSelector,
};
use std::collections::HashSet;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/kv/smollm2_devil_2048");
const TOKENS: usize = 2048;
const DIM: usize = 64;
const LAST: usize = 64;
const BLOCK: usize = 16;
const MANTISSA_BITS: usize = 2;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kernel = ScoreKernel::detect();
    println!("real tensors: {DIR}");
    println!(
        "blocks of {BLOCK} tokens, last {LAST} query positions, causal prefixes, isa {}",
        kernel.isa()
    );
    for layer in [4usize, 17] {
        let q = read_npy(format!("{DIR}/layer{layer:02}_q.npy"))?.to_f32()?;
        let k = read_npy(format!("{DIR}/layer{layer:02}_k.npy"))?.data;
        let per_head = TOKENS * DIM * 2;
        let query = |h: usize, t: usize| &q[(h * TOKENS + t) * DIM..(h * TOKENS + t + 1) * DIM];
        for topk in [32usize, 128] {
            let mut head_stats = PruneStats::default();
            let mut group_stats = PruneStats::default();
            let mut recall_approx = 0usize;
            let mut recall_prefilter = 0usize;
            let mut wanted = 0usize;
            for kv in 0..3 {
                let keys = KeyRows::new(&k[kv * per_head..(kv + 1) * per_head], DType::F16, DIM)?;
                let bounds = block_bounds(&keys, BLOCK);
                let planes = to_bitplanes(&keys);
                for t in TOKENS - LAST..TOKENS {
                    let prefix = keys.slice(0, t + 1);
                    for h in 3 * kv..3 * kv + 3 {
                        let qh = QueryGroup::new(query(h, t), DIM)?;
                        let (_, s) =
                            pruned_topk(kernel, &qh, &prefix, &bounds, TopK::per_query(topk));
                        head_stats.accumulate(&s);
                        // Bit-plane recall against the exact top-k of this causal prefix.
                        let exact = topk_by_sort(&dense_scores(query(h, t), &prefix), topk);
                        let truth: HashSet<u32> = exact.iter().map(|x| x.index).collect();
                        // Approximate ranking of the whole head, restricted to the causal prefix.
                        let ranked: Vec<_> =
                            approx_topk(&planes, query(h, t), MANTISSA_BITS, TOKENS)
                                .into_iter()
                                .filter(|x| (x.index as usize) <= t)
                                .collect();
                        recall_approx += ranked[..topk]
                            .iter()
                            .filter(|x| truth.contains(&x.index))
                            .count();
                        let mut rescored = TopKSelector::new(topk);
                        for cand in ranked.iter().take(4 * topk) {
                            let row = prefix.row_vec(cand.index as usize);
                            rescored.push(cand.index, dot_canonical(query(h, t), &row, DType::F16));
                        }
                        recall_prefilter += rescored
                            .into_sorted()
                            .iter()
                            .filter(|x| truth.contains(&x.index))
                            .count();
                        wanted += topk;
                    }
                    let gq: Vec<f32> = (3 * kv..3 * kv + 3)
                        .flat_map(|h| query(h, t).to_vec())
                        .collect();
                    let g = QueryGroup::new(&gq, DIM)?;
                    let (_, s) = pruned_topk(kernel, &g, &prefix, &bounds, TopK::per_query(topk));
                    group_stats.accumulate(&s);
                }
            }
            println!(
                "layer {layer:2} k={topk:3}: blocks pruned per head {:5.1} % ({} of {}, {:.1} MiB skipped), \
                 per GQA group of 3 {:5.1} %; bit-plane (sign+exp+{MANTISSA_BITS} mantissa, 8/16 planes) \
                 recall {:5.1} %, with 4k-candidate exact re-score {:5.1} %",
                100.0 * head_stats.skipped_fraction(),
                head_stats.blocks_skipped,
                head_stats.blocks_total,
                head_stats.bytes_skipped as f64 / (1 << 20) as f64,
                100.0 * group_stats.skipped_fraction(),
                100.0 * recall_approx as f64 / wanted as f64,
                100.0 * recall_prefilter as f64 / wanted as f64,
            );
        }
    }
    Ok(())
}
