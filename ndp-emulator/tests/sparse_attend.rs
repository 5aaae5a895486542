//! The sparse ATTEND (ATTEND with `CXLKV_NDP_FLAG_SELECT`): the device equals the host fallback
//! bit for bit, both equal a brute-force reference (the union of the per-query selections, the
//! partial over it, the mass it leaves out), a budget that holds every token gives ATTEND's
//! answer, and malformed commands get error completions.

mod common;
use common::*;
use cxlkv_kernels::attention::{default_scale, relative_error};
use cxlkv_kernels::{rng::SplitMix64, DType, Hit, Partial, QueryGroup, ScoreKernel};
use cxlkv_ndp::Engine;
use cxlkv_runtime::format;
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::client::Sparse;
use cxlkv_runtime::ndp::{host_attend, AttendRequest, NdpDevice, NdpOptions, NdpPath, Select};
use cxlkv_runtime::Pool;
use std::sync::Arc;

fn setup(tag: &str) -> (TempBackend, Pool) {
    let b = shm_backend(tag);
    let pool = create_pool(b.backend(), 64 << 20, 64 << 10);
    (b, pool)
}

fn request<'a>(
    s: &'a Stored,
    q: &'a [f32],
    scale: f32,
    sparse: Option<Sparse>,
) -> AttendRequest<'a> {
    AttendRequest {
        queries: q,
        dim: s.dim,
        blocks: &s.blocks,
        sequence: s.sequence,
        layer: s.layer,
        kv_head: 1,
        dtype: s.dtype,
        scale: Some(scale),
        sparse,
    }
}

/// Scores of every stored token of head 1, key-major `[token][g]`.
fn scores(s: &Stored, q: &[f32]) -> Vec<f32> {
    let qg = QueryGroup::new(q, s.dim).unwrap();
    let keys = s.key_rows(1);
    let mut raw = vec![0f32; keys.len() * qg.count()];
    ScoreKernel::scalar().score(&qg, &keys, &mut raw);
    raw
}

/// Brute force: per query the forced tokens then the best others (to k, or to mass p); the union;
/// each query's partial over the union (f64 reference) and the mass the union leaves out.
fn reference(s: &Stored, q: &[f32], scale: f32, sp: &Sparse) -> (Vec<u32>, Vec<Partial>, Vec<f64>) {
    let g = q.len() / s.dim;
    let raw = scores(s, q);
    let n = raw.len() / g;
    let sel = &sp.select;
    let ex = |t: u64| sel.exclude.is_some_and(|(a, b)| t >= a && t < b);
    let forced = |t: u64| t < sel.sinks || sel.window.is_some_and(|(a, b)| t >= a && t < b);
    let mut union = Vec::new();
    let mut mass_of = Vec::new();
    let x = |j: usize, t: usize| f64::from(scale) * f64::from(raw[t * g + j]);
    for j in 0..g {
        let cand: Vec<usize> = (0..n).filter(|&t| !ex(t as u64)).collect();
        let max = cand
            .iter()
            .map(|&t| x(j, t))
            .fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = cand.iter().map(|&t| (x(j, t) - max).exp()).sum();
        let w = |t: usize| (x(j, t) - max).exp() / z;
        let mut list: Vec<usize> = cand.iter().copied().filter(|&t| forced(t as u64)).collect();
        let mut others: Vec<Hit> = cand
            .iter()
            .filter(|&&t| !forced(t as u64))
            .map(|&t| Hit {
                index: t as u32,
                score: raw[t * g + j],
            })
            .collect();
        others.sort_by(|a, b| a.rank_cmp(b));
        let mut taken: f64 = list.iter().map(|&t| w(t)).sum();
        for h in others {
            if list.len() >= sp.k || sel.top_p.is_some_and(|p| taken >= f64::from(p)) {
                break;
            }
            taken += w(h.index as usize);
            list.push(h.index as usize);
        }
        union.extend(list.iter().map(|&t| t as u32));
        mass_of.push((max, z));
    }
    union.sort_unstable();
    union.dedup();
    let vals = s.value_rows(1);
    let parts = (0..g)
        .map(|j| {
            let sc: Vec<f32> = union.iter().map(|&t| raw[t as usize * g + j]).collect();
            let rows: Vec<u8> = union
                .iter()
                .flat_map(|&t| vals.row_vec(t as usize))
                .collect();
            let v = cxlkv_kernels::KeyRows::new(&rows, s.dtype, s.dim).unwrap();
            Partial::over(&v, |i| scale * sc[i])
        })
        .collect();
    let left = mass_of
        .iter()
        .enumerate()
        .map(|(j, &(max, z))| {
            let held: f64 = union
                .iter()
                .filter(|&&t| !ex(u64::from(t)))
                .map(|&t| (x(j, t as usize) - max).exp() / z)
                .sum();
            1.0 - held
        })
        .collect();
    (union, parts, left)
}

fn selections(tokens: u64) -> Vec<(Select, usize)> {
    vec![
        (Select::default(), 8),
        (
            Select {
                sinks: 4,
                window: Some((tokens - 16, tokens)),
                ..Default::default()
            },
            40,
        ),
        (
            Select {
                sinks: 2,
                exclude: Some((tokens - 32, tokens + 100)),
                ..Default::default()
            },
            24,
        ),
        (
            Select {
                top_p: Some(0.8),
                ..Default::default()
            },
            256,
        ),
        (
            Select {
                sinks: 1,
                window: Some((100, 110)),
                exclude: Some((105, 400)),
                top_p: Some(0.5),
            },
            64,
        ),
    ]
}

#[test]
fn device_sparse_attend_equals_the_host_and_the_reference_rust_engine() {
    sparse_attend_equals_the_host_and_the_reference(Engine::Rust);
}

#[test]
fn device_sparse_attend_equals_the_host_and_the_reference_hls_engine() {
    sparse_attend_equals_the_host_and_the_reference(Engine::Hls);
}

fn sparse_attend_equals_the_host_and_the_reference(engine: Engine) {
    let (_c, pool) = setup(&format!("sparse-dev-{engine}"));
    let p = Arc::new(pool.attach().unwrap());
    let _dev = start(&pool, engine);
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    let mut rng = SplitMix64::new(23);
    let mut cases = 0;
    for (dtype, dim, tokens, per_block, g) in [
        (DType::F16, 64, 600, 100, 3),
        (DType::F32, 32, 333, 64, 8),
        (DType::Bf16, 128, 250, 48, 1),
    ] {
        let (k, v) = random_kv(tokens as u64, 2, tokens, dim, dtype);
        let s = store(
            &p,
            &k,
            &v,
            2,
            tokens,
            dim,
            dtype,
            per_block,
            500 + dim as u64,
            3,
        );
        let scale = default_scale(dim);
        for (select, k) in selections(tokens as u64) {
            // Scores spread enough that a selection leaves mass out.
            let q: Vec<f32> = rng.normal_vec(g * dim).iter().map(|x| 4.0 * x).collect();
            let sp = Sparse {
                select,
                k,
                candidates: None,
            };
            let req = request(&s, &q, scale, Some(sp));
            let got = ndp.attend(&req).unwrap();
            assert_eq!(got.stats.path, Some(NdpPath::Device));
            let host = host_attend(&pool, &req).unwrap();
            assert_eq!(got.partials, host.partials, "device and host bit for bit");
            assert_eq!(got.selection, host.selection);
            let (u, want, left) = reference(&s, &q, scale, &sp);
            assert_eq!(got.selection.len(), g);
            for (j, &(count, m)) in got.selection.iter().enumerate() {
                assert_eq!(count as usize, u.len(), "{select:?} k {k}");
                assert!(
                    (f64::from(m) - left[j].max(0.0)).abs() < 1e-4,
                    "{m} vs {}",
                    left[j]
                );
            }
            for (a, b) in got.partials.iter().zip(&want) {
                assert_eq!(a.max, b.max);
                assert!(relative_error(&a.finish(), &b.finish()) < 1e-5);
            }
            let row = dtype.bytes(dim) as u64;
            let bytes = tokens as u64 * row + 2 * u.len() as u64 * row;
            assert_eq!(got.stats.bytes_scanned, bytes);
            assert_eq!(host.stats.bytes_scanned, bytes);
            assert!(u.len() < tokens, "a selection, not everything");
            cases += 1;
        }
    }
    assert_eq!(cases, 15);
}

#[test]
fn a_budget_holding_every_token_gives_attends_answer() {
    let (_c, pool) = setup("sparse-all");
    let p = Arc::new(pool.attach().unwrap());
    let _dev = cxlkv_ndp::Device::start(pool.clone(), Default::default()).unwrap();
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    let mut rng = SplitMix64::new(5);
    for (per_block, exact) in [(200, true), (64, false)] {
        let (dim, tokens, g) = (32, 200, 4);
        let (k, v) = random_kv(7, 2, tokens, dim, DType::F16);
        let s = store(
            &p,
            &k,
            &v,
            2,
            tokens,
            dim,
            DType::F16,
            per_block,
            900 + per_block as u64,
            1,
        );
        let q = rng.normal_vec(g * dim);
        let scale = default_scale(dim);
        let all = Sparse {
            select: Select::default(),
            k: tokens,
            candidates: None,
        };
        let sparse = ndp.attend(&request(&s, &q, scale, Some(all))).unwrap();
        let dense = ndp.attend(&request(&s, &q, scale, None)).unwrap();
        assert!(sparse
            .selection
            .iter()
            .all(|&(c, m)| c as usize == tokens && m < 1e-5));
        if exact {
            // One block: the same rows in the same order through the same fused pass.
            assert_eq!(sparse.partials, dense.partials);
        } else {
            for (a, b) in sparse.partials.iter().zip(&dense.partials) {
                assert!(relative_error(&a.finish(), &b.finish()) < 1e-5);
            }
        }
        // top-p 1.0 keeps every token too.
        let p1 = Sparse {
            select: Select {
                top_p: Some(1.0),
                ..Default::default()
            },
            k: tokens,
            candidates: None,
        };
        let r = ndp.attend(&request(&s, &q, scale, Some(p1))).unwrap();
        assert_eq!(r.partials, sparse.partials);
    }
}

#[test]
fn malformed_sparse_commands_get_error_completions() {
    let (_c, pool) = setup("sparse-bad");
    let p = Arc::new(pool.attach().unwrap());
    let _dev = start(&pool, Engine::Rust);
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    let (dim, tokens) = (32, 300);
    let (k, v) = random_kv(4, 1, tokens, dim, DType::F16);
    let s = store(&p, &k, &v, 1, tokens, dim, DType::F16, 100, 3, 0);
    let staging = ndp.staging_offsets()[0];
    let q = SplitMix64::new(1).normal_vec(2 * dim);
    let base = cxlkv_ndp_cmd {
        opcode: CXLKV_NDP_OP_ATTEND as u16,
        flags: CXLKV_NDP_FLAG_SELECT as u16,
        k: 16,
        sequence: 3,
        dtype: DType::F16 as u8,
        group: 2,
        dim: dim as u32,
        nblocks: s.blocks.len() as u32,
        args_off: staging,
        result_off: staging + 8192,
        result_len: 16384,
        ..Default::default()
    };
    let mut run = |cmd: cxlkv_ndp_cmd, attend_scale: f32, sel_scale: f32| {
        let mut args = Vec::new();
        for x in &q {
            args.extend_from_slice(&x.to_le_bytes());
        }
        for b in &s.blocks {
            args.extend_from_slice(format::as_bytes(&cxlkv_ndp_block {
                key_lo: b.key.lo(),
                key_hi: b.key.hi(),
                token_offset: b.token_offset,
            }));
        }
        args.extend_from_slice(format::as_bytes(&cxlkv_ndp_attend {
            scale: attend_scale,
            ..Default::default()
        }));
        let sel = Select {
            sinks: 2,
            ..Default::default()
        };
        args.extend_from_slice(format::as_bytes(&sel.to_abi(sel_scale)));
        pool.memory().write(staging, &args).unwrap();
        let cmd = cxlkv_ndp_cmd {
            args_len: args.len() as u32,
            ..cmd
        };
        let tag = ndp.submit_raw(cmd).unwrap().unwrap();
        let c = ndp.wait_raw(tag).unwrap().unwrap();
        (c.status, c.detail)
    };
    let args = CXLKV_NDP_ERR_ARGS;
    assert_eq!(run(base, 0.25, 0.25), (CXLKV_NDP_OK, 0));
    assert_eq!(run(base, 0.25, 0.5), (args, CXLKV_NDP_DETAIL_BAD_SCALE));
    assert_eq!(run(cxlkv_ndp_cmd { k: 0, ..base }, 0.25, 0.25).0, args);
    assert_eq!(
        run(
            cxlkv_ndp_cmd {
                k: CXLKV_NDP_MAX_K + 1,
                ..base
            },
            0.25,
            0.25
        )
        .0,
        args
    );
    let flags = (CXLKV_NDP_FLAG_SELECT | CXLKV_NDP_FLAG_PRUNE) as u16;
    assert_eq!(run(cxlkv_ndp_cmd { flags, ..base }, 0.25, 0.25).0, args);
    // A dtype other than the blocks' (int8 on f16 blocks): the first block does not match.
    let int8 = cxlkv_ndp_cmd {
        dtype: DType::I8 as u8,
        ..base
    };
    assert_eq!(run(int8, 0.25, 0.25), (CXLKV_NDP_ERR_LAYOUT, 0));
    let small = cxlkv_ndp_cmd {
        result_len: 64,
        ..base
    };
    assert_eq!(run(small, 0.25, 0.25).0, CXLKV_NDP_ERR_RESULT_SIZE);
    // The device keeps serving.
    assert_eq!(run(base, 0.25, 0.25), (CXLKV_NDP_OK, 0));
}

fn start(pool: &Pool, engine: Engine) -> cxlkv_ndp::DeviceHandle {
    cxlkv_ndp::Device::start(
        pool.clone(),
        cxlkv_ndp::DeviceConfig {
            engine,
            ..Default::default()
        },
    )
    .unwrap()
}
