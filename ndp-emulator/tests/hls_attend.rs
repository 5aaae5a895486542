//! The HLS engine serves ATTEND and SCORE_TOPK selection (ABI 1.1) with the HLS kernel's own
//! datapaths: the same commands on a device with either engine return identical partials (bit
//! for bit), identical indices, scores, left-out masses, gathered values and block masses, equal
//! to the host fallback's, and the same error completions for bad commands.

mod common;
use common::*;
use cxlkv_kernels::attention::default_scale;
use cxlkv_kernels::{rng::SplitMix64, DType, GroupMode, Partial};
use cxlkv_ndp::{Device, DeviceConfig, Engine};
use cxlkv_runtime::format;
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::{
    host_attend, host_score_topk, AttendRequest, NdpDevice, NdpOptions, NdpPath, Select,
};
use cxlkv_runtime::Pool;
use std::sync::Arc;

fn setup(tag: &str) -> (TempBackend, Pool) {
    let b = shm_backend(tag);
    let pool = create_pool(b.backend(), 64 << 20, 256 << 10);
    (b, pool)
}

fn start(pool: &Pool, engine: Engine) -> (cxlkv_ndp::DeviceHandle, NdpDevice) {
    let dev = Device::start(
        pool.clone(),
        DeviceConfig {
            engine,
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    let ndp = NdpDevice::open(Arc::new(pool.attach().unwrap()), NdpOptions::default()).unwrap();
    (dev, ndp)
}

fn attend_request<'a>(s: &'a Stored, h: u32, q: &'a [f32], scale: f32) -> AttendRequest<'a> {
    AttendRequest {
        queries: q,
        dim: s.dim,
        blocks: &s.blocks,
        sequence: s.sequence,
        layer: s.layer,
        kv_head: h,
        dtype: s.dtype,
        scale: Some(scale),
        sparse: None,
    }
}

/// Every ATTEND of `cases` on a device with `engine`: the partials and scanned bytes.
fn attends(engine: Engine, pool: &Pool, cases: &[(&Stored, Vec<f32>)]) -> Vec<(Vec<Partial>, u64)> {
    let (dev, mut ndp) = start(pool, engine);
    let out = cases
        .iter()
        .map(|(s, q)| {
            let got = ndp
                .attend(&attend_request(s, 1, q, default_scale(s.dim)))
                .unwrap();
            assert_eq!(got.stats.path, Some(NdpPath::Device), "{engine}");
            (got.partials, got.stats.bytes_scanned)
        })
        .collect();
    dev.stop();
    out
}

#[test]
fn both_engines_attend_identically() {
    let (_c, pool) = setup("hls-attend");
    let p = Arc::new(pool.attach().unwrap());
    let mut stored = Vec::new();
    // Blocks shorter and longer than the kernels' 64-row chunk, d up to 256, G up to 16.
    for (seq, dtype, dim, tokens, per_block) in [
        (1u64, DType::F16, 64usize, 900usize, 100usize),
        (2, DType::F32, 128, 300, 50),
        (3, DType::Bf16, 256, 200, 120),
    ] {
        let (k, v) = random_kv(seq, 2, tokens, dim, dtype);
        stored.push(store(&p, &k, &v, 2, tokens, dim, dtype, per_block, seq, 4));
    }
    let mut rng = SplitMix64::new(0x4a7);
    let mut cases = Vec::new();
    for s in &stored {
        for g in [1usize, 3, 16] {
            let q: Vec<f32> = rng.normal_vec(g * s.dim).iter().map(|x| 2.0 * x).collect();
            cases.push((s, q));
        }
    }
    let rust = attends(Engine::Rust, &pool, &cases);
    let hls = attends(Engine::Hls, &pool, &cases);
    for (i, ((r, h), (s, q))) in rust.iter().zip(&hls).zip(&cases).enumerate() {
        assert_eq!(r, h, "case {i}: the engines' partials differ");
        let host = host_attend(&pool, &attend_request(s, 1, q, default_scale(s.dim)));
        assert_eq!(h.0, host.unwrap().partials, "case {i}: HLS engine and host");
        assert_eq!(h.1, 2 * s.dtype.bytes(s.tokens * s.dim) as u64);
    }
}

#[test]
fn both_engines_attend_identically_on_real_tensors() {
    let Some((qt, kt, vt)) = smollm2(17) else {
        eprintln!("skipped: no SmolLM2 tensors in data/kv");
        return;
    };
    let (_c, pool) = setup("hls-attend-real");
    let p = Arc::new(pool.attach().unwrap());
    let (dim, tokens) = (64, 2048);
    let s = store(&p, &kt, &vt, 3, tokens, dim, DType::F16, 128, 7, 17);
    let cases: Vec<(&Stored, Vec<f32>)> = [(1usize, 2047usize), (1, 900)]
        .iter()
        .map(|&(head, t)| (&s, queries_at(&qt, tokens, dim, 3 * head, 3, t)))
        .collect();
    let rust = attends(Engine::Rust, &pool, &cases);
    let hls = attends(Engine::Hls, &pool, &cases);
    assert_eq!(rust, hls);
}

#[test]
fn both_engines_select_identically() {
    let (_c, pool) = setup("hls-select");
    let p = Arc::new(pool.attach().unwrap());
    let (dim, tokens) = (64, 700);
    let mut stored = Vec::new();
    for dtype in [DType::F16, DType::Bf16] {
        let (k, v) = random_kv(30 + dtype as u64, 2, tokens, dim, dtype);
        stored.push(store(
            &p,
            &k,
            &v,
            2,
            tokens,
            dim,
            dtype,
            100,
            40 + dtype as u64,
            1,
        ));
    }
    let t = tokens as u64;
    let sels = [
        Select {
            exclude: Some((0, 0)),
            ..Default::default()
        },
        Select {
            sinks: 4,
            window: Some((t - 32, t)),
            ..Default::default()
        },
        Select {
            sinks: 2,
            exclude: Some((t - 64, t + 10)),
            top_p: Some(0.9),
            ..Default::default()
        },
        Select {
            window: Some((100, 140)),
            exclude: Some((110, 120)),
            top_p: Some(0.5),
            ..Default::default()
        },
        Select {
            top_p: Some(1.0),
            ..Default::default()
        },
    ];
    let mut rng = SplitMix64::new(0x5e1);
    let mut cases = Vec::new();
    for s in &stored {
        for sel in sels {
            for (mode, g) in [(GroupMode::PerQuery, 3usize), (GroupMode::GroupMax, 4)] {
                let q: Vec<f32> = rng.normal_vec(g * dim).iter().map(|x| 3.0 * x).collect();
                cases.push((s, sel, mode, q));
            }
        }
    }
    let run = |engine: Engine| {
        let (dev, mut ndp) = start(&pool, engine);
        let out: Vec<_> = cases
            .iter()
            .map(|(s, sel, mode, q)| {
                let mut req = request(s, 1, q, 64, *mode, false, true);
                req.select = *sel;
                req.scale = Some(0.5);
                let got = ndp.score_topk(&req).unwrap();
                assert_eq!(got.stats.path, Some(NdpPath::Device), "{engine} {sel:?}");
                let host = host_score_topk(&pool, &req, Default::default()).unwrap();
                assert_eq!(got.indices, host.indices, "{engine} {sel:?} {mode:?}");
                assert_eq!(got.left_out_mass, host.left_out_mass, "{engine} {sel:?}");
                (
                    got.indices,
                    got.scores,
                    got.left_out_mass,
                    got.values,
                    got.stats.block_mass,
                    got.stats.bytes_scanned,
                )
            })
            .collect();
        dev.stop();
        out
    };
    let (rust, hls) = (run(Engine::Rust), run(Engine::Hls));
    for (i, (r, h)) in rust.iter().zip(&hls).enumerate() {
        assert_eq!(r, h, "case {i}");
    }
    // Top-p made some lists shorter than k.
    assert!(hls.iter().any(|a| a.0.iter().any(|l| l.len() < 64)));
}

/// Bad ATTEND and selected SCORE_TOPK commands complete with the same status and detail on both
/// engines.
#[test]
fn both_engines_refuse_bad_commands_alike() {
    let (_c, pool) = setup("hls-bad");
    let p = Arc::new(pool.attach().unwrap());
    let (dim, tokens) = (32, 300);
    let (k, v) = random_kv(4, 1, tokens, dim, DType::F16);
    let s = store(&p, &k, &v, 1, tokens, dim, DType::F16, 100, 3, 0);
    let q = SplitMix64::new(1).normal_vec(2 * dim);
    let mut head = Vec::new();
    for x in &q {
        head.extend_from_slice(&x.to_le_bytes());
    }
    for b in &s.blocks {
        head.extend_from_slice(format::as_bytes(&cxlkv_ndp_block {
            key_lo: b.key.lo(),
            key_hi: b.key.hi(),
            token_offset: b.token_offset,
        }));
    }
    let good = Select {
        sinks: 2,
        window: Some((290, 300)),
        top_p: Some(0.9),
        ..Default::default()
    }
    .to_abi(0.25);
    let sel = |f: &dyn Fn(&mut cxlkv_ndp_select)| {
        let mut w = good;
        f(&mut w);
        format::as_bytes(&w).to_vec()
    };
    let att = |scale: f32, reserved: u64| {
        format::as_bytes(&cxlkv_ndp_attend {
            scale,
            reserved0: 0,
            reserved1: reserved,
        })
        .to_vec()
    };
    let topk = |flags: u32| cxlkv_ndp_cmd {
        opcode: CXLKV_NDP_OP_SCORE_TOPK as u16,
        flags: (CXLKV_NDP_FLAG_SELECT | flags) as u16,
        k: 16,
        sequence: 3,
        dtype: DType::F16 as u8,
        group: 2,
        dim: dim as u32,
        nblocks: s.blocks.len() as u32,
        result_len: 16384,
        ..Default::default()
    };
    let attend = |k: u32| cxlkv_ndp_cmd {
        opcode: CXLKV_NDP_OP_ATTEND as u16,
        flags: 0,
        k,
        ..topk(0)
    };
    let cases: Vec<(cxlkv_ndp_cmd, Vec<u8>)> = vec![
        (topk(0), sel(&|_| {})),
        (topk(0), sel(&|w| w.top_p = 0.0)),
        (topk(0), sel(&|w| w.window_end = 301)),
        (topk(0), sel(&|w| w.sinks = 20)),
        (topk(0), sel(&|w| w.options |= 1 << 7)),
        (topk(CXLKV_NDP_FLAG_PRUNE), sel(&|_| {})),
        (attend(0), att(0.25, 0)),
        (attend(0), att(f32::INFINITY, 0)),
        (attend(0), att(0.25, 1)),
        (attend(3), att(0.25, 0)),
    ];
    let run = |engine: Engine| {
        let (dev, mut ndp) = start(&pool, engine);
        let staging = ndp.staging_offsets()[0];
        let out: Vec<(u32, u32)> = cases
            .iter()
            .map(|(cmd, tail)| {
                let mut args = head.clone();
                args.extend_from_slice(tail);
                pool.memory().write(staging, &args).unwrap();
                let cmd = cxlkv_ndp_cmd {
                    args_off: staging,
                    args_len: args.len() as u32,
                    result_off: staging + 8192,
                    ..*cmd
                };
                let tag = ndp.submit_raw(cmd).unwrap().unwrap();
                let c = ndp.wait_raw(tag).unwrap().unwrap();
                (c.status, c.detail)
            })
            .collect();
        dev.stop();
        out
    };
    let (rust, hls) = (run(Engine::Rust), run(Engine::Hls));
    assert_eq!(rust, hls);
    let args = CXLKV_NDP_ERR_ARGS;
    assert_eq!(
        hls,
        vec![
            (CXLKV_NDP_OK, 0),
            (args, CXLKV_NDP_DETAIL_BAD_P),
            (args, CXLKV_NDP_DETAIL_BAD_WINDOW),
            (args, CXLKV_NDP_DETAIL_TOO_MANY_FORCED),
            (args, CXLKV_NDP_DETAIL_BAD_OPTIONS),
            (args, CXLKV_NDP_DETAIL_BAD_OPTIONS),
            (CXLKV_NDP_OK, 0),
            (args, CXLKV_NDP_DETAIL_BAD_SCALE),
            (args, CXLKV_NDP_DETAIL_BAD_OPTIONS),
            (args, 0),
        ]
    );
}
