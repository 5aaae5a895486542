//! The sparse ATTEND on key sketches (ABI 1.3, `CXLKV_NDP_SEL_SKETCH`) and over quantized
//! blocks: the device equals the host fallback bit for bit (partials, union size, left-out mass,
//! rows re-scored, bytes read) for f32, f16, bf16, int8 and int4 blocks; enough candidates give
//! the exact selection's answer; a small candidate count still finds most of the exact top-k while
//! reading a fraction of the keys; over every token a quantized sparse ATTEND is ATTEND; blocks
//! without a sketch, bad candidate counts and the HLS engine (no sketch datapath) are handled.

mod common;
use common::*;
use cxlkv_kernels::attention::default_scale;
use cxlkv_kernels::{rng::SplitMix64, DType};
use cxlkv_ndp::{Device, DeviceConfig, Engine};
use cxlkv_runtime::kv::{chunk_kv, Sketch};
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::client::Sparse;
use cxlkv_runtime::ndp::{
    host_attend, AttendRequest, BlockSpec, FallbackReason, NdpDevice, NdpError, NdpOptions,
    NdpPath, Select,
};
use cxlkv_runtime::{Key, KvShape, Participant, Pool};
use std::sync::Arc;

struct Layer {
    blocks: Vec<BlockSpec>,
    dtype: DType,
    dim: usize,
    sequence: u64,
}

/// Stores `tokens` random clustered keys and values of 2 heads in blocks of `per_block` tokens,
/// with key sketch `sketch`.
fn store(
    p: &Participant,
    seed: u64,
    dtype: DType,
    dim: usize,
    tokens: usize,
    per_block: usize,
    sketch: Sketch,
) -> Layer {
    // Quantized blocks take f32 elements; the others their stored type.
    let input = if dtype.is_quantized() {
        DType::F32
    } else {
        dtype
    };
    let (k, v) = random_kv(seed, 2, tokens, dim, input);
    let sequence = 7000 + seed;
    let mut blocks = Vec::new();
    for (range, bk, bv) in chunk_kv(&k, &v, 2, input.bytes(dim), 0..tokens, per_block) {
        let shape = KvShape {
            dtype,
            layer: 0,
            kv_heads: 2,
            head_dim: dim as u32,
            tokens: range.len() as u32,
            sequence,
            token_offset: range.start as u64,
        };
        let key = Key::from_bytes(format!("sk{sequence}/{}", range.start).as_bytes());
        p.put_kv_with(key, &shape, &bk, &bv, sketch).unwrap();
        blocks.push(BlockSpec {
            key,
            token_offset: range.start as u64,
        });
    }
    Layer {
        blocks,
        dtype,
        dim,
        sequence,
    }
}

fn request<'a>(l: &'a Layer, q: &'a [f32], sparse: Option<Sparse>) -> AttendRequest<'a> {
    AttendRequest {
        queries: q,
        dim: l.dim,
        blocks: &l.blocks,
        sequence: l.sequence,
        layer: 0,
        kv_head: 1,
        dtype: l.dtype,
        scale: Some(default_scale(l.dim)),
        sparse,
    }
}

fn setup(tag: &str, engine: Engine) -> (TempBackend, Pool, cxlkv_ndp::DeviceHandle, NdpDevice) {
    let b = shm_backend(tag);
    let pool = create_pool(b.backend(), 96 << 20, 256 << 10);
    let dev = Device::start(
        pool.clone(),
        DeviceConfig {
            engine,
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    let p = Arc::new(pool.attach().unwrap());
    let ndp = NdpDevice::open(p, NdpOptions::default()).unwrap();
    (b, pool, dev, ndp)
}

fn selections(tokens: u64) -> Vec<(Select, usize)> {
    vec![
        (Select::default(), 16),
        (
            Select {
                sinks: 4,
                window: Some((tokens - 32, tokens)),
                ..Default::default()
            },
            60,
        ),
        (
            Select {
                top_p: Some(0.9),
                sinks: 2,
                ..Default::default()
            },
            200,
        ),
        (
            Select {
                sinks: 1,
                exclude: Some((tokens - 40, tokens + 10)),
                top_p: Some(0.6),
                ..Default::default()
            },
            64,
        ),
    ]
}

fn sparse(select: Select, k: usize, candidates: Option<usize>) -> Sparse {
    Sparse {
        select,
        k,
        candidates,
    }
}

#[test]
fn sketched_and_quantized_sparse_attend_equal_the_host() {
    let (_b, pool, _dev, mut ndp) = setup("sketch-host", Engine::Rust);
    let p = pool.attach().unwrap();
    let mut rng = SplitMix64::new(41);
    let mut cases = 0;
    for (i, (dtype, dim, tokens, per_block, g, sketch)) in [
        (DType::F16, 64, 700, 128, 3, Sketch::Int4),
        (DType::F32, 32, 333, 64, 4, Sketch::Int4),
        (DType::Bf16, 128, 260, 48, 1, Sketch::Int4),
        (DType::I8, 64, 500, 100, 3, Sketch::Int4),
        (DType::I4, 32, 300, 64, 2, Sketch::Int4),
        (DType::F32, 64, 400, 128, 3, Sketch::Sign),
        (DType::I8, 32, 350, 64, 2, Sketch::Sign),
    ]
    .into_iter()
    .enumerate()
    {
        let l = store(&p, i as u64, dtype, dim, tokens, per_block, sketch);
        let nblocks = tokens.div_ceil(per_block) as u64;
        let row = dtype.bytes(dim) as u64;
        for (select, k) in selections(tokens as u64) {
            let q: Vec<f32> = rng.normal_vec(g * dim).iter().map(|x| 3.0 * x).collect();
            let exact_only = dtype.is_quantized().then_some(None);
            for candidates in exact_only.into_iter().chain([Some(24), Some(96)]) {
                let sp = sparse(select, k, candidates);
                let req = request(&l, &q, Some(sp));
                let got = ndp.attend(&req).unwrap();
                assert_eq!(got.stats.path, Some(NdpPath::Device), "{dtype:?}");
                let host = host_attend(&pool, &req).unwrap();
                assert_eq!(got.partials, host.partials, "{dtype:?} {sp:?}: bit for bit");
                assert_eq!(got.selection, host.selection);
                assert_eq!(got.rescored, host.rescored);
                assert_eq!(got.stats.bytes_scanned, host.stats.bytes_scanned);
                assert_eq!(got.selection.len(), g);
                let union = got.selection[0].0 as u64;
                assert!(union > 0 && union < tokens as u64, "{sp:?}: {union}");
                assert!(got.selection.iter().all(|s| (0.0..=1.0).contains(&s.1)));
                match candidates {
                    Some(c) => {
                        let c_all = got.rescored.unwrap() as u64;
                        let forced = select.sinks + select.window.map_or(0, |w| w.1 - w.0);
                        assert!(c_all >= union && c_all <= g as u64 * c as u64 + forced);
                        if !dtype.is_quantized() {
                            // The sketch (codes and scales), C's keys, U's values.
                            let sk =
                                (tokens * sketch.row_bytes(dim)) as u64 + nblocks * 4 * dim as u64;
                            assert_eq!(
                                got.stats.bytes_scanned,
                                sk + (c_all + union) * row,
                                "{dtype:?} {sp:?}"
                            );
                        }
                    }
                    None => assert_eq!(got.rescored, None),
                }
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 4 * (4 * 2 + 3 * 3));
}

#[test]
fn candidates_holding_every_token_give_the_exact_selection() {
    let (_b, pool, _dev, mut ndp) = setup("sketch-all", Engine::Rust);
    let p = pool.attach().unwrap();
    let mut rng = SplitMix64::new(3);
    for (i, (dtype, g, sketch)) in [
        (DType::F16, 3, Sketch::Int4),
        (DType::F32, 2, Sketch::Int4),
        (DType::I8, 3, Sketch::Int4),
        (DType::F32, 3, Sketch::Sign),
        (DType::I8, 2, Sketch::Sign),
    ]
    .into_iter()
    .enumerate()
    {
        let (dim, tokens) = (32, 256);
        let l = store(&p, 50 + i as u64, dtype, dim, tokens, 64, sketch);
        for (select, k) in selections(tokens as u64) {
            let q = rng.normal_vec(g * dim);
            let exact = ndp
                .attend(&request(&l, &q, Some(sparse(select, k, None))))
                .unwrap();
            let sketched = ndp
                .attend(&request(&l, &q, Some(sparse(select, k, Some(tokens)))))
                .unwrap();
            // Every token is a candidate, re-scored exactly and fed in token order, which is
            // block order here: the same selection, partials and mass.
            assert_eq!(sketched.partials, exact.partials, "{dtype:?} {select:?}");
            assert_eq!(sketched.selection, exact.selection);
            let excluded = select.exclude.map_or(0, |(a, b)| b.min(tokens as u64) - a);
            assert_eq!(sketched.rescored, Some(tokens - excluded as usize));
        }
    }
}

#[test]
fn a_few_candidates_find_the_exact_top_k() {
    let (_b, pool, _dev, mut ndp) = setup("sketch-recall", Engine::Rust);
    let p = pool.attach().unwrap();
    let mut rng = SplitMix64::new(8);
    let (dim, tokens, g, k) = (64, 2048, 1, 32);
    for (seed, sketch, c) in [(77, Sketch::Int4, 4 * k), (78, Sketch::Sign, 8 * k)] {
        a_few_candidates_find(
            &mut ndp,
            &p,
            &mut rng,
            (seed, sketch, c),
            (dim, tokens, g, k),
        );
    }
}

fn a_few_candidates_find(
    ndp: &mut NdpDevice,
    p: &Participant,
    rng: &mut SplitMix64,
    (seed, sketch, c): (u64, Sketch, usize),
    (dim, tokens, g, k): (usize, usize, usize, usize),
) {
    let l = store(p, seed, DType::F32, dim, tokens, 128, sketch);
    let (mut found, mut total) = (0.0, 0.0);
    let mut mass = (0.0, 0.0);
    for _ in 0..20 {
        // A query near a stored key, as decode queries are: a clear top-k.
        let q: Vec<f32> = rng.normal_vec(g * dim).iter().map(|x| 2.0 * x).collect();
        let exact = ndp
            .attend(&request(&l, &q, Some(sparse(Select::default(), k, None))))
            .unwrap();
        let sk = ndp
            .attend(&request(
                &l,
                &q,
                Some(sparse(Select::default(), k, Some(c))),
            ))
            .unwrap();
        assert!(sk.stats.bytes_scanned * 4 < exact.stats.bytes_scanned);
        // The share of the exact selection's mass the sketched one keeps.
        mass.0 += 1.0 - f64::from(exact.selection[0].1);
        mass.1 += 1.0 - f64::from(sk.selection[0].1);
        found += sk.selection[0].0 as f64;
        total += exact.selection[0].0 as f64;
    }
    assert_eq!(found, total, "top-k unions have k tokens either way");
    assert!(
        mass.1 >= 0.9 * mass.0,
        "{sketch:?}: the sketch's selection holds {:.3} of the mass, the exact one {:.3}",
        mass.1 / 20.0,
        mass.0 / 20.0
    );
}

#[test]
fn quantized_sparse_attend_over_every_token_is_attend() {
    let (_b, pool, _dev, mut ndp) = setup("sketch-qall", Engine::Rust);
    let p = pool.attach().unwrap();
    let mut rng = SplitMix64::new(12);
    for dtype in [DType::I8, DType::I4] {
        let (dim, tokens, g) = (32, 300, 4);
        let l = store(&p, 90, dtype, dim, tokens, 128, Sketch::None);
        let q = rng.normal_vec(g * dim);
        let all = sparse(Select::default(), tokens, None);
        let s = ndp.attend(&request(&l, &q, Some(all))).unwrap();
        let a = ndp.attend(&request(&l, &q, None)).unwrap();
        // Runs of whole blocks, merged in token (= block) order: ATTEND's computation.
        assert_eq!(s.partials, a.partials, "{dtype:?}");
        assert!(s.selection.iter().all(|&(c, m)| c == 300 && m < 1e-5));
    }
}

#[test]
fn blocks_without_a_sketch_and_bad_counts_are_refused() {
    let (_b, pool, _dev, mut ndp) = setup("sketch-bad", Engine::Rust);
    let p = pool.attach().unwrap();
    let l = store(&p, 5, DType::F16, 32, 200, 64, Sketch::None);
    let q = SplitMix64::new(2).normal_vec(2 * 32);
    let sp = sparse(Select::default(), 8, Some(16));
    match ndp.attend(&request(&l, &q, Some(sp))) {
        Err(NdpError::Device(s)) => {
            assert_eq!((s.code, s.detail), (CXLKV_NDP_ERR_LAYOUT, 0), "{s:?}")
        }
        other => panic!("a block without a sketch: {other:?}"),
    }
    assert!(host_attend(&pool, &request(&l, &q, Some(sp))).is_err());
    for c in [0, CXLKV_NDP_MAX_CANDIDATES as usize + 1] {
        let bad = sparse(Select::default(), 8, Some(c));
        assert!(matches!(
            ndp.attend(&request(&l, &q, Some(bad))),
            Err(NdpError::BadRequest(_))
        ));
    }
    // The device keeps serving.
    let ok = sparse(Select::default(), 8, None);
    assert!(ndp.attend(&request(&l, &q, Some(ok))).is_ok());
}

#[test]
fn the_hls_engine_leaves_sketches_to_the_host() {
    let (_b, pool, _dev, mut ndp) = setup("sketch-hls", Engine::Hls);
    let p = pool.attach().unwrap();
    let l = store(&p, 6, DType::F16, 32, 300, 64, Sketch::Int4);
    let q = SplitMix64::new(4).normal_vec(3 * 32);
    let req = request(&l, &q, Some(sparse(Select::default(), 12, Some(40))));
    let got = ndp.attend(&req).unwrap();
    assert_eq!(
        got.stats.path,
        Some(NdpPath::Host(FallbackReason::Unsupported))
    );
    let host = host_attend(&pool, &req).unwrap();
    assert_eq!(got.partials, host.partials);
    assert_eq!(got.rescored, host.rescored);
    // Without the sketch option the HLS engine serves the same blocks itself.
    let plain = request(&l, &q, Some(sparse(Select::default(), 12, None)));
    let r = ndp.attend(&plain).unwrap();
    assert_eq!(r.stats.path, Some(NdpPath::Device));
}
