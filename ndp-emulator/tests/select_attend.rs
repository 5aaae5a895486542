//! ATTEND and SCORE_TOPK selection (sinks, window, exclusion, top-p) against brute-force
//! references: the host path, then the device (both engines where they implement the command),
//! which must return the same partials and identical indices.

mod common;
use common::*;
use cxlkv_kernels::attention::relative_error;
use cxlkv_kernels::{rng::SplitMix64, DType, GroupMode, Hit, Partial, QueryGroup, ScoreKernel};
use cxlkv_runtime::ndp::{host_attend, host_score_topk, AttendRequest, Select};
use cxlkv_runtime::Pool;
use std::sync::Arc;

fn setup(tag: &str) -> (Cleanup, Pool) {
    let b = shm_backend(tag);
    let pool = create_pool(&b, 64 << 20, 64 << 10);
    (Cleanup(b), pool)
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
            req.scale = 0.5;
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
        scale,
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
            let scale = 1.0 / (dim as f32).sqrt();
            let got = host_attend(&pool, &attend_request(&s, 1, &q, scale)).unwrap();
            assert_partials_close(&got.partials, &dense_partials(&s, 1, &q, scale), 1e-5);
            let row = (dim * dtype.size()) as u64;
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
