//! The kernels on real attention tensors: SmolLM2-135M layers 4 and 17 over 2,048 tokens of text
//! (`data/kv/smollm2_devil_2048`, 9 query heads on 3 KV heads, d = 64, scale 1/8).
//!
//! For the last 64 query positions of every head: the fast kernels' top-k (k = 32, 128, 512)
//! equals the dense reference, the GQA group scan equals the per-head scans, the pruned top-k
//! equals the full top-k, and the mass@k / relerr@k means reproduce `stats.json` within 1e-3.

use cxlkv_bench_support::npy::read_npy;
use cxlkv_kernels::attention::{
    dense_scores, relative_error, softmax_attention_selected, softmax_mass,
};
use cxlkv_kernels::topk::topk_by_sort;
use cxlkv_kernels::{
    block_bounds, pruned_topk, scan_topk, DType, Hit, Isa, KeyRows, QueryGroup, ScoreKernel, TopK,
};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/kv/smollm2_devil_2048");
const TOKENS: usize = 2048;
const DIM: usize = 64;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const LAST: usize = 64;
const KS: [usize; 3] = [32, 128, 512];
const SCALE: f32 = 0.125;

struct Layer {
    /// `[9, 2048, 64]` queries as f32.
    q: Vec<f32>,
    /// `[3, 2048, 64]` f16 keys, raw bytes.
    k: Vec<u8>,
    /// `[3, 2048, 64]` f16 values, raw bytes.
    v: Vec<u8>,
}

fn load(layer: usize) -> Layer {
    let read = |what: &str| {
        let a = read_npy(format!("{DIR}/layer{layer:02}_{what}.npy")).unwrap();
        let heads = if what == "q" { HEADS } else { KV_HEADS };
        assert_eq!(a.shape, vec![heads, TOKENS, DIM], "{what} shape");
        a
    };
    Layer {
        q: read("q").to_f32().unwrap(),
        k: read("k").data,
        v: read("v").data,
    }
}

fn head_rows(bytes: &[u8], kv: usize) -> KeyRows<'_> {
    let per_head = TOKENS * DIM * 2;
    KeyRows::new(&bytes[kv * per_head..(kv + 1) * per_head], DType::F16, DIM).unwrap()
}

/// `layers.<layer>[head].<stat>.mean` from stats.json, by a narrow scan of its fixed layout.
fn stat(json: &str, layer: usize, head: usize, name: &str) -> f64 {
    let layers = json.find("\"layers\"").expect("layers");
    let at = layers
        + json[layers..]
            .find(&format!("\"{layer}\": ["))
            .expect("layer");
    let h = at
        + json[at..]
            .find(&format!("\"head\": {head},"))
            .expect("head");
    let s = h + json[h..].find(&format!("\"{name}\"")).expect("stat");
    let m = s + json[s..].find("\"mean\":").expect("mean") + "\"mean\":".len();
    let end = m + json[m..].find([',', '}', '\n']).expect("end of number");
    json[m..end].trim().parse().expect("a number")
}

fn indices(hits: &[Hit]) -> Vec<u32> {
    hits.iter().map(|h| h.index).collect()
}

#[test]
fn real_tensors_topk_pruning_and_stats() {
    let json = std::fs::read_to_string(format!("{DIR}/stats.json")).unwrap();
    // The SIMD kernels (the scalar oracle is the reference itself, via `dense_scores`).
    let fast: Vec<ScoreKernel> = ScoreKernel::all_available()
        .into_iter()
        .filter(|k| k.isa() != Isa::Scalar)
        .collect();
    // Debug builds check the GQA group scan on every 4th position only, to keep `cargo test`
    // quick; release builds check all.
    let group_step = if cfg!(debug_assertions) { 4 } else { 1 };
    let mut checked = 0;
    for layer in [4, 17] {
        let data = load(layer);
        let bounds: Vec<_> = (0..KV_HEADS)
            .map(|kv| block_bounds(&head_rows(&data.k, kv), 16))
            .collect();
        let query =
            |h: usize, t: usize| &data.q[(h * TOKENS + t) * DIM..(h * TOKENS + t + 1) * DIM];
        for h in 0..HEADS {
            let kv = h / 3;
            let (keys, values) = (head_rows(&data.k, kv), head_rows(&data.v, kv));
            let mut mass = [0f64; 3];
            let mut relerr = [0f64; 3];
            for t in TOKENS - LAST..TOKENS {
                let prefix = keys.slice(0, t + 1);
                let prefix_v = values.slice(0, t + 1);
                let q = query(h, t);
                let group = QueryGroup::new(q, DIM).unwrap();
                let scores = dense_scores(q, &prefix);
                let all = topk_by_sort(&scores, scores.len());
                let dense = softmax_attention_selected(&all, &prefix_v, SCALE);
                for (i, &k) in KS.iter().enumerate() {
                    let want = topk_by_sort(&scores, k);
                    for &kernel in &fast {
                        let got = scan_topk(kernel, &group, &prefix, TopK::per_query(k));
                        assert_eq!(indices(&got[0]), indices(&want), "L{layer} h{h} t{t} k{k}");
                        assert_eq!(got[0], want);
                    }
                    let (pruned, _) = pruned_topk(
                        ScoreKernel::detect(),
                        &group,
                        &prefix,
                        &bounds[kv],
                        TopK::per_query(k),
                    );
                    assert_eq!(pruned[0], want, "pruned L{layer} h{h} t{t} k{k}");
                    mass[i] += softmax_mass(&scores, &want, SCALE);
                    let sparse = softmax_attention_selected(&want, &prefix_v, SCALE);
                    relerr[i] += relative_error(&sparse, &dense);
                    checked += 1;
                }
                // The GQA group (3 query heads on this KV head) in one pass equals per head.
                if h % 3 == 0 && t % group_step == 0 {
                    let gq: Vec<f32> = (h..h + 3).flat_map(|hh| query(hh, t).to_vec()).collect();
                    let g = QueryGroup::new(&gq, DIM).unwrap();
                    let lists = scan_topk(ScoreKernel::detect(), &g, &prefix, TopK::per_query(128));
                    let (pl, _) = pruned_topk(
                        ScoreKernel::detect(),
                        &g,
                        &prefix,
                        &bounds[kv],
                        TopK::per_query(128),
                    );
                    assert_eq!(pl, lists);
                    for (j, list) in lists.iter().enumerate() {
                        let s = dense_scores(query(h + j, t), &prefix);
                        assert_eq!(list, &topk_by_sort(&s, 128), "group L{layer} kv{kv} t{t}");
                    }
                }
            }
            for (i, &k) in KS.iter().enumerate() {
                let m = mass[i] / LAST as f64;
                let e = relerr[i] / LAST as f64;
                let (sm, se) = (
                    stat(&json, layer, h, &format!("mass@{k}")),
                    stat(&json, layer, h, &format!("relerr@{k}")),
                );
                assert!(
                    (m - sm).abs() < 1e-3,
                    "mass@{k} L{layer} h{h}: {m} vs stats {sm}"
                );
                assert!(
                    (e - se).abs() < 1e-3,
                    "relerr@{k} L{layer} h{h}: {e} vs stats {se}"
                );
            }
        }
    }
    assert_eq!(checked, 2 * HEADS * LAST * KS.len());
}

#[test]
fn stats_reader_reads_known_values() {
    let json = std::fs::read_to_string(format!("{DIR}/stats.json")).unwrap();
    // Layer 0 head 0 opens the file (a value checked by hand).
    let v = stat(&json, 0, 0, "mass@32");
    assert!((v - 0.10649937204709688).abs() < 1e-15, "{v}");
    assert!(stat(&json, 17, 8, "relerr@512") > 0.0);
}
