//! ATTEND and SCORE_TOPK selection (sinks, window, exclusion, top-p) against brute-force
//! references: the host path, then the device (both engines where they implement the command),
//! which must return the same partials and identical indices.

mod common;
use common::*;
use cxlkv_kernels::attention::{default_scale, relative_error};
use cxlkv_kernels::{rng::SplitMix64, DType, GroupMode, Hit, Partial, QueryGroup, ScoreKernel};
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
    let pool = create_pool(b.backend(), 64 << 20, 64 << 10);
    (b, pool)
}

/// Every stored token's score (unscaled) for list `l` of head `h`: per query, or the group max.
fn all_scores(s: &Stored, h: usize, q: &[f32], mode: GroupMode, l: usize) -> Vec<Hit> {
    let qg = QueryGroup::new(q, s.dim).unwrap();
    let g = qg.count();
    let keys = s.key_rows(h);
    let mut raw = vec![0f32; keys.len() * g];
    ScoreKernel::scalar().score(&qg, &keys, &mut raw);
    raw.chunks_exact(g)
        .enumerate()
        .map(|(i, row)| Hit {
            index: i as u32,
            score: match mode {
                GroupMode::PerQuery => row[l],
                GroupMode::GroupMax => row.iter().copied().fold(f32::NEG_INFINITY, f32::max),
            },
        })
        .collect()
}

/// Brute force selection: forced tokens, then the others best first until k (or mass p).
fn brute_select(sel: &Select, k: usize, scale: f32, all: &[Hit]) -> (Vec<Hit>, f32) {
    let ex = |t: u64| sel.exclude.is_some_and(|(a, b)| t >= a && t < b);
    let forced =
        |t: u64| !ex(t) && (t < sel.sinks || sel.window.is_some_and(|(a, b)| t >= a && t < b));
    let cand: Vec<Hit> = all
        .iter()
        .copied()
        .filter(|h| !ex(u64::from(h.index)))
        .collect();
    let x = |h: &Hit| f64::from(scale) * f64::from(h.score);
    let max = cand.iter().map(x).fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = cand.iter().map(|h| (x(h) - max).exp()).sum();
    let w = |h: &Hit| (x(h) - max).exp() / z;
    let mut out: Vec<Hit> = cand
        .iter()
        .copied()
        .filter(|h| forced(u64::from(h.index)))
        .collect();
    let mut rest: Vec<Hit> = cand
        .iter()
        .copied()
        .filter(|h| !forced(u64::from(h.index)))
        .collect();
    rest.sort_by(|a, b| a.rank_cmp(b));
    let mut taken: f64 = out.iter().map(w).sum();
    for h in rest {
        if out.len() >= k || sel.top_p.is_some_and(|p| taken >= f64::from(p)) {
            break;
        }
        taken += w(&h);
        out.push(h);
    }
    out.sort_by(|a, b| a.rank_cmp(b));
    (out, (1.0 - taken).max(0.0) as f32)
}

fn selections(tokens: u64) -> Vec<Select> {
    vec![
        Select {
            sinks: 4,
            ..Default::default()
        },
        Select {
            sinks: 4,
            window: Some((tokens - 16, tokens)),
            ..Default::default()
        },
        Select {
            sinks: 2,
            exclude: Some((tokens - 32, tokens + 100)),
            ..Default::default()
        },
        Select {
            top_p: Some(0.8),
            ..Default::default()
        },
        Select {
            sinks: 1,
            window: Some((100, 110)),
            exclude: Some((105, 400)),
            top_p: Some(0.5),
        },
    ]
}

#[test]
fn host_selection_matches_brute_force() {
    let (_c, pool) = setup("host-select");
    let p = Arc::new(pool.attach().unwrap());
    let (dim, heads, tokens) = (32, 2, 700);
    let (k, v) = random_kv(3, heads, tokens, dim, DType::F16);
    let s = store(&p, &k, &v, heads, tokens, dim, DType::F16, 128, 5, 1);
    let mut rng = SplitMix64::new(4);
    let mut stopped_early = 0;
    for sel in selections(tokens as u64) {
        for (mode, g) in [(GroupMode::PerQuery, 3), (GroupMode::GroupMax, 4)] {
            let q: Vec<f32> = rng.normal_vec(g * dim).iter().map(|x| 3.0 * x).collect();
            let mut req = request(&s, 1, &q, 64, mode, false, true);
            req.select = sel;
            req.scale = Some(0.5);
            let got = host_score_topk(&pool, &req, Default::default()).unwrap();
            let lists = if mode == GroupMode::PerQuery { g } else { 1 };
            assert_eq!(got.indices.len(), lists);
            assert_eq!(got.left_out_mass.len(), lists);
            let mut want_all = Vec::new();
            for l in 0..lists {
                let (want, left) = brute_select(&sel, 64, 0.5, &all_scores(&s, 1, &q, mode, l));
                assert_eq!(got.hits(l), want, "{sel:?} {mode:?} list {l}");
                assert!((got.left_out_mass[l] - left).abs() < 1e-5, "{sel:?}");
                if sel.top_p.is_some() && want.len() < 64 {
                    stopped_early += 1;
                }
                want_all.push(want);
            }
            assert_eq!(got.values, reference_values(&s, 1, &want_all));
        }
    }
    assert!(stopped_early > 0, "top-p reached its mass before the cap");
    // Bad selections are refused before any work.
    let q = rng.normal_vec(dim);
    for sel in [
        Select {
            top_p: Some(0.0),
            ..Default::default()
        },
        Select {
            top_p: Some(1.01),
            ..Default::default()
        },
        Select {
            window: Some((10, 5)),
            ..Default::default()
        },
    ] {
        let mut req = request(&s, 0, &q, 8, GroupMode::PerQuery, false, false);
        req.select = sel;
        assert!(host_score_topk(&pool, &req, Default::default()).is_err());
    }
    // A window past the stored tokens, or more forced tokens than k.
    for (sel, k) in [
        (
            Select {
                window: Some((600, 701)),
                ..Default::default()
            },
            200,
        ),
        (
            Select {
                sinks: 9,
                ..Default::default()
            },
            8,
        ),
    ] {
        let mut req = request(&s, 0, &q, k, GroupMode::PerQuery, false, false);
        req.select = sel;
        assert!(host_score_topk(&pool, &req, Default::default()).is_err());
    }
}

/// The dense reference of ATTEND: every token's scores, one `Partial::over_group`.
fn dense_partials(s: &Stored, h: usize, q: &[f32], scale: f32) -> Vec<Partial> {
    let qg = QueryGroup::new(q, s.dim).unwrap();
    let keys = s.key_rows(h);
    let mut raw = vec![0f32; keys.len() * qg.count()];
    ScoreKernel::scalar().score(&qg, &keys, &mut raw);
    Partial::over_group(&s.value_rows(h), &raw, qg.count(), scale)
}

/// Partials equal within `tol` relative, maxima identical.
fn assert_partials_close(got: &[Partial], want: &[Partial], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(want) {
        assert_eq!(a.max, b.max);
        assert!(
            ((a.sum - b.sum) / b.sum).abs() < tol as f32,
            "{} {}",
            a.sum,
            b.sum
        );
        assert!(relative_error(&a.out, &b.out) < tol);
        assert!(relative_error(&a.finish(), &b.finish()) < tol);
    }
}

/// An ATTEND over all of `s`'s blocks.
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

#[test]
fn host_attend_matches_dense() {
    let (_c, pool) = setup("host-attend");
    let p = Arc::new(pool.attach().unwrap());
    let mut rng = SplitMix64::new(21);
    for (dtype, dim, tokens, per_block) in [
        (DType::F16, 64, 500, 100),
        (DType::F32, 32, 333, 64),
        (DType::Bf16, 16, 50, 50),
    ] {
        let (k, v) = random_kv(dim as u64, 2, tokens, dim, dtype);
        let s = store(&p, &k, &v, 2, tokens, dim, dtype, per_block, dim as u64, 2);
        for g in [1, 3, 4] {
            let q = rng.normal_vec(g * dim);
            let scale = default_scale(dim);
            let got = host_attend(&pool, &attend_request(&s, 1, &q, scale)).unwrap();
            assert_partials_close(&got.partials, &dense_partials(&s, 1, &q, scale), 1e-5);
            let row = dtype.bytes(dim) as u64;
            assert_eq!(got.stats.bytes_scanned, 2 * tokens as u64 * row);
        }
    }
    // Bad requests are refused.
    let (k, v) = random_kv(1, 1, 10, 16, DType::F32);
    let s = store(&p, &k, &v, 1, 10, 16, DType::F32, 10, 77, 0);
    let q = rng.normal_vec(17 * 16);
    assert!(host_attend(&pool, &attend_request(&s, 0, &q, 1.0)).is_err());
    assert!(host_attend(&pool, &attend_request(&s, 0, &q[..15], 1.0)).is_err());
    assert!(host_attend(&pool, &attend_request(&s, 0, &q[..16], f32::NAN)).is_err());
    assert!(host_attend(&pool, &attend_request(&s, 1, &q[..16], 1.0)).is_err());
}

fn start_device(pool: &Pool, engine: Engine) -> cxlkv_ndp::DeviceHandle {
    Device::start(
        pool.clone(),
        DeviceConfig {
            engine,
            ..DeviceConfig::default()
        },
    )
    .unwrap()
}

#[test]
fn device_attend_equals_the_host() {
    let (_c, pool) = setup("dev-attend");
    let p = Arc::new(pool.attach().unwrap());
    let _dev = start_device(&pool, Engine::Rust);
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    let mut rng = SplitMix64::new(8);
    for (dtype, dim, tokens, per_block, g) in [
        (DType::F16, 64, 900, 100, 3),
        (DType::F32, 64, 300, 50, 4),
        (DType::Bf16, 128, 200, 48, 1),
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
            100 + dim as u64,
            4,
        );
        assert!(s.blocks.len() > 1, "a multi-block sequence");
        let q = rng.normal_vec(g * dim);
        let scale = default_scale(dim);
        let req = attend_request(&s, 1, &q, scale);
        let got = ndp.attend(&req).unwrap();
        assert_eq!(got.stats.path, Some(NdpPath::Device), "{dtype:?}");
        let host = host_attend(&pool, &req).unwrap();
        assert_eq!(got.partials, host.partials, "device and host bit for bit");
        assert_partials_close(&got.partials, &dense_partials(&s, 1, &q, scale), 1e-5);
        let kv_bytes = 2 * dtype.bytes(tokens * dim) as u64;
        assert_eq!(got.stats.bytes_scanned, kv_bytes);
        assert_eq!(host.stats.bytes_scanned, kv_bytes);
        assert!(got.stats.link_bytes() < host.stats.link_bytes() / 10);
    }
}

#[test]
fn device_attend_on_real_tensors() {
    let Some((qt, kt, vt)) = smollm2(17) else {
        eprintln!("skipped: no SmolLM2 tensors in data/kv");
        return;
    };
    let (_c, pool) = setup("dev-attend-real");
    let p = Arc::new(pool.attach().unwrap());
    let _dev = start_device(&pool, Engine::Rust);
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    let (dim, tokens) = (64, 2048);
    let s = store(&p, &kt, &vt, 3, tokens, dim, DType::F16, 64, 7, 17);
    for (head, t) in [(0usize, 2047usize), (2, 1000)] {
        // Query heads 3*head .. 3*head+3 share KV head `head`; attend over tokens 0..=t.
        let q = queries_at(&qt, tokens, dim, 3 * head, 3, t);
        let blocks: Vec<_> = s
            .blocks
            .iter()
            .copied()
            .filter(|b| b.token_offset <= t as u64)
            .collect();
        let req = AttendRequest {
            blocks: &blocks,
            ..attend_request(&s, head as u32, &q, 0.125)
        };
        let got = ndp.attend(&req).unwrap();
        assert_eq!(got.stats.path, Some(NdpPath::Device));
        assert_eq!(got.partials, host_attend(&pool, &req).unwrap().partials);
        let n = blocks.len() * 64;
        let keys = s.key_rows(head).slice(0, n);
        let vals = s.value_rows(head).slice(0, n);
        let qg = QueryGroup::new(&q, dim).unwrap();
        let mut raw = vec![0f32; n * 3];
        ScoreKernel::scalar().score(&qg, &keys, &mut raw);
        let dense = Partial::over_group(&vals, &raw, 3, 0.125);
        assert_partials_close(&got.partials, &dense, 1e-5);
    }
}

#[test]
fn device_selection_equals_the_host() {
    let (_c, pool) = setup("dev-select");
    let p = Arc::new(pool.attach().unwrap());
    let _dev = start_device(&pool, Engine::Rust);
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    let mut rng = SplitMix64::new(12);
    for dtype in [DType::F16, DType::F32] {
        let (dim, tokens) = (32, 700);
        let (k, v) = random_kv(5, 2, tokens, dim, dtype);
        let s = store(&p, &k, &v, 2, tokens, dim, dtype, 100, 9 + dtype as u64, 1);
        for sel in selections(tokens as u64) {
            for (mode, g) in [(GroupMode::PerQuery, 3), (GroupMode::GroupMax, 4)] {
                let q: Vec<f32> = rng.normal_vec(g * dim).iter().map(|x| 3.0 * x).collect();
                let mut req = request(&s, 1, &q, 48, mode, true, true);
                req.select = sel;
                req.scale = Some(0.5);
                let got = ndp.score_topk(&req).unwrap();
                assert_eq!(got.stats.path, Some(NdpPath::Device), "{sel:?}");
                let host = host_score_topk(&pool, &req, Default::default()).unwrap();
                assert_eq!(got.indices, host.indices, "{sel:?} {mode:?}");
                assert_eq!(got.scores, host.scores);
                assert_eq!(got.left_out_mass, host.left_out_mass);
                assert_eq!(got.values, host.values);
                assert_eq!(got.stats.block_mass, host.stats.block_mass);
                let lists = if mode == GroupMode::PerQuery { g } else { 1 };
                for l in 0..lists {
                    let (want, _) = brute_select(&sel, 48, 0.5, &all_scores(&s, 1, &q, mode, l));
                    assert_eq!(got.hits(l), want);
                }
            }
        }
    }
    // Plain top-k is unchanged and carries no left-out mass.
    let (k, v) = random_kv(6, 1, 300, 32, DType::F16);
    let s = store(&p, &k, &v, 1, 300, 32, DType::F16, 100, 77, 1);
    let q = rng.normal_vec(32);
    let got = ndp
        .score_topk(&request(&s, 0, &q, 10, GroupMode::PerQuery, true, false))
        .unwrap();
    assert_eq!(got.stats.path, Some(NdpPath::Device));
    assert!(got.left_out_mass.is_empty());
    assert_eq!(hits_of(&got), reference(&s, 0, &q, 10, GroupMode::PerQuery));
}

// The HLS engine serves ATTEND and selection too: tests/hls_attend.rs runs the same commands on
// both engines and compares.

/// Raw ATTEND and selected SCORE_TOPK commands with bad arguments complete with `ERR_ARGS` (and
/// the detail that names the argument), and the device keeps serving.
#[test]
fn bad_attend_and_selection_commands_get_error_completions() {
    let (_c, pool) = setup("dev-bad");
    let p = Arc::new(pool.attach().unwrap());
    let _dev = start_device(&pool, Engine::Rust);
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    let (dim, tokens) = (32, 300);
    let (k, v) = random_kv(4, 1, tokens, dim, DType::F16);
    let s = store(&p, &k, &v, 1, tokens, dim, DType::F16, 100, 3, 0);
    let staging = ndp.staging_offsets()[0];
    let q = SplitMix64::new(1).normal_vec(2 * dim);
    let head = |args: &mut Vec<u8>| {
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
    };
    let base = cxlkv_ndp_cmd {
        opcode: CXLKV_NDP_OP_SCORE_TOPK as u16,
        flags: CXLKV_NDP_FLAG_SELECT as u16,
        k: 16,
        sequence: 3,
        layer: 0,
        kv_head: 0,
        dtype: DType::F16 as u8,
        group: 2,
        dim: dim as u32,
        nblocks: s.blocks.len() as u32,
        args_off: staging,
        result_off: staging + 8192,
        result_len: 16384,
        ..Default::default()
    };
    let good = Select {
        sinks: 2,
        window: Some((290, 300)),
        top_p: Some(0.9),
        ..Default::default()
    }
    .to_abi(0.25);
    let mut run = |cmd: cxlkv_ndp_cmd, tail: &[u8]| {
        let mut args = Vec::new();
        head(&mut args);
        args.extend_from_slice(tail);
        pool.memory().write(staging, &args).unwrap();
        let cmd = cxlkv_ndp_cmd {
            args_len: args.len() as u32,
            ..cmd
        };
        let tag = ndp.submit_raw(cmd).unwrap().unwrap();
        let c = ndp.wait_raw(tag).unwrap().unwrap();
        (c.status, c.detail)
    };
    let sel = |f: &dyn Fn(&mut cxlkv_ndp_select)| {
        let mut w = good;
        f(&mut w);
        format::as_bytes(&w).to_vec()
    };
    assert_eq!(run(base, &sel(&|_| {})), (CXLKV_NDP_OK, 0));
    let args = CXLKV_NDP_ERR_ARGS;
    for (what, cmd, tail, want) in [
        (
            "p = 0",
            base,
            sel(&|w| w.top_p = 0.0),
            (args, CXLKV_NDP_DETAIL_BAD_P),
        ),
        (
            "p > 1",
            base,
            sel(&|w| w.top_p = 1.5),
            (args, CXLKV_NDP_DETAIL_BAD_P),
        ),
        (
            "p NaN",
            base,
            sel(&|w| w.top_p = f32::NAN),
            (args, CXLKV_NDP_DETAIL_BAD_P),
        ),
        (
            "window past the sequence",
            base,
            sel(&|w| w.window_end = 301),
            (args, CXLKV_NDP_DETAIL_BAD_WINDOW),
        ),
        (
            "window reversed",
            base,
            sel(&|w| w.window_start = 299.max(w.window_end + 1)),
            (args, CXLKV_NDP_DETAIL_BAD_WINDOW),
        ),
        (
            "exclusion reversed",
            base,
            sel(&|w| {
                w.options |= CXLKV_NDP_SEL_EXCLUDE;
                w.exclude_start = 9;
                w.exclude_end = 8;
            }),
            (args, CXLKV_NDP_DETAIL_BAD_EXCLUDE),
        ),
        (
            "more forced than k",
            base,
            sel(&|w| w.sinks = 20),
            (args, CXLKV_NDP_DETAIL_TOO_MANY_FORCED),
        ),
        (
            "unknown option",
            base,
            sel(&|w| w.options |= 1 << 7),
            (args, CXLKV_NDP_DETAIL_BAD_OPTIONS),
        ),
        (
            "reserved field",
            base,
            sel(&|w| w.reserved1 = 1),
            (args, CXLKV_NDP_DETAIL_BAD_OPTIONS),
        ),
        (
            "scale NaN",
            base,
            sel(&|w| w.scale = f32::NAN),
            (args, CXLKV_NDP_DETAIL_BAD_SCALE),
        ),
        (
            "prune with select",
            cxlkv_ndp_cmd {
                flags: (CXLKV_NDP_FLAG_SELECT | CXLKV_NDP_FLAG_PRUNE) as u16,
                ..base
            },
            sel(&|_| {}),
            (args, CXLKV_NDP_DETAIL_BAD_OPTIONS),
        ),
        (
            "k_max 0",
            cxlkv_ndp_cmd { k: 0, ..base },
            sel(&|_| {}),
            (args, 0),
        ),
        ("no selection tail", base, Vec::new(), (args, 0)),
    ] {
        assert_eq!(run(cmd, &tail), want, "{what}");
    }
    // ATTEND.
    let attend = cxlkv_ndp_cmd {
        opcode: CXLKV_NDP_OP_ATTEND as u16,
        flags: 0,
        k: 0,
        ..base
    };
    let tail = |scale: f32, r: u64| {
        format::as_bytes(&cxlkv_ndp_attend {
            scale,
            reserved0: 0,
            reserved1: r,
        })
        .to_vec()
    };
    assert_eq!(run(attend, &tail(0.2, 0)), (CXLKV_NDP_OK, 0));
    for (what, cmd, tail, want) in [
        (
            "scale inf",
            attend,
            tail(f32::INFINITY, 0),
            (args, CXLKV_NDP_DETAIL_BAD_SCALE),
        ),
        (
            "reserved",
            attend,
            tail(0.2, 5),
            (args, CXLKV_NDP_DETAIL_BAD_OPTIONS),
        ),
        (
            "k != 0",
            cxlkv_ndp_cmd { k: 1, ..attend },
            tail(0.2, 0),
            (args, 0),
        ),
        (
            "flags",
            cxlkv_ndp_cmd { flags: 1, ..attend },
            tail(0.2, 0),
            (args, 0),
        ),
        (
            "G = 0",
            cxlkv_ndp_cmd { group: 0, ..attend },
            tail(0.2, 0),
            (args, 0),
        ),
        (
            "G = 17",
            cxlkv_ndp_cmd {
                group: 17,
                ..attend
            },
            tail(0.2, 0),
            (args, 0),
        ),
        (
            "dim 24",
            cxlkv_ndp_cmd { dim: 24, ..attend },
            tail(0.2, 0),
            (args, 0),
        ),
        (
            "dim 512",
            cxlkv_ndp_cmd { dim: 512, ..attend },
            tail(0.2, 0),
            (args, 0),
        ),
        ("short args", attend, Vec::new(), (args, 0)),
        (
            "small result",
            cxlkv_ndp_cmd {
                result_len: 64,
                ..attend
            },
            tail(0.2, 0),
            (CXLKV_NDP_ERR_RESULT_SIZE, 0),
        ),
        (
            "wrong layer",
            cxlkv_ndp_cmd { layer: 1, ..attend },
            tail(0.2, 0),
            (CXLKV_NDP_ERR_LAYOUT, 0),
        ),
    ] {
        assert_eq!(run(cmd, &tail), want, "{what}");
    }
    // Still serving.
    let got = ndp.attend(&attend_request(&s, 0, &q, 0.2)).unwrap();
    assert_eq!(got.stats.path, Some(NdpPath::Device));
}
