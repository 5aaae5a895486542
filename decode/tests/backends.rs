//! The pool backends against the dense reference on synthetic keys, values and queries (no model
//! needed): a prefill, then decode steps, with blocks stored in the pool and a non-empty open
//! block; outputs, positions, statistics and errors.

use cxlkv_decode::{DeviceChoice, Env, EnvOptions, ModeSpec};
use cxlkv_kernels::attention::relative_error;
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::DType;
use cxlkv_model::{Attention, AttentionShape, AttentionStats, Dense};

fn shape() -> AttentionShape {
    AttentionShape {
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        scale: cxlkv_kernels::attention::default_scale(16),
    }
}

fn opts(device: DeviceChoice) -> EnvOptions {
    EnvOptions {
        device,
        block_tokens: 4,
        ..EnvOptions::default()
    }
}

/// One step of a sequence: K and V (`[kv_heads][t][d]`) and queries (`[t][heads][d]`).
struct Step {
    k: Vec<f32>,
    v: Vec<f32>,
    q: Vec<f32>,
}

/// A prefill of `prefill` positions then `decode` single positions.
fn steps(s: &AttentionShape, prefill: usize, decode: usize, seed: u64) -> Vec<Step> {
    chunks(s, &[prefill], decode, seed)
}

/// Blocks of positions (`sizes`), then `decode` single positions.
fn chunks(s: &AttentionShape, sizes: &[usize], decode: usize, seed: u64) -> Vec<Step> {
    let mut rng = SplitMix64::new(seed);
    sizes
        .iter()
        .copied()
        .chain(std::iter::repeat_n(1, decode))
        .map(|t| Step {
            k: rng.normal_vec(s.kv_heads * t * s.head_dim),
            v: rng.normal_vec(s.kv_heads * t * s.head_dim),
            q: rng
                .normal_vec(t * s.heads * s.head_dim)
                .into_iter()
                .map(|x| 2.0 * x)
                .collect(),
        })
        .collect()
}

/// Outputs of every step of every layer.
fn run(a: &mut dyn Attention, s: &AttentionShape, steps: &[Step]) -> Vec<Vec<f32>> {
    let mut outs = Vec::new();
    for st in steps {
        for layer in 0..s.layers {
            a.append(layer, &st.k, &st.v).unwrap();
            let mut out = vec![0.0; st.q.len()];
            a.attend(layer, &st.q, &mut out).unwrap();
            outs.push(out);
        }
    }
    outs
}

#[test]
fn pool_is_the_dense_reference_bit_for_bit() {
    let s = shape();
    let seq = steps(&s, 6, 9, 1);
    let dense = run(&mut Dense::new(s, DType::F32).unwrap(), &s, &seq);
    let env = Env::open(&opts(DeviceChoice::Host), s, 64).unwrap();
    assert!(env.describe().contains("private"), "{}", env.describe());
    let mut pool = env.backend(&ModeSpec::parse("pool").unwrap(), 7).unwrap();
    let got = run(pool.as_mut(), &s, &seq);
    assert_eq!(got, dense, "pool attention differs from dense");
    assert_eq!((pool.len(0), pool.len(1)), (15, 15));
    let st = pool.stats();
    // 15 positions in blocks of 4: 3 blocks per layer stored, K and V of 2 heads x 4 x 16 f32.
    let kv_bytes = 3 * 2 * (2 * 2 * 4 * 16 * 4);
    assert!(st.link_write_bytes >= kv_bytes as u64, "{st:?}");
    assert!(st.link_read_bytes > 0 && st.device_commands == 0, "{st:?}");
    // A clear forgets everything and frees the pool.
    pool.clear();
    assert_eq!(pool.len(1), 0);
    let again = run(pool.as_mut(), &s, &seq);
    assert_eq!(again, dense);
}

#[test]
fn dense_layers_stay_private() {
    let s = shape();
    let seq = steps(&s, 5, 4, 2);
    let dense = run(&mut Dense::new(s, DType::F32).unwrap(), &s, &seq);
    let env = Env::open(&opts(DeviceChoice::Host), s, 64).unwrap();
    let spec = ModeSpec::parse("pool+dense0").unwrap();
    let mut b = env.backend(&spec, 1).unwrap();
    assert_eq!(b.name(), "pool+dense0");
    assert_eq!(run(b.as_mut(), &s, &seq), dense);
    // Only layer 1 went to the pool: 9 positions = 2 blocks of 4.
    let st = b.stats();
    let one_block = 2 * 2 * 4 * 16 * 4;
    assert!(
        st.link_write_bytes >= 2 * one_block && st.link_write_bytes < 3 * one_block,
        "{st:?}"
    );
    let bad = ModeSpec::parse("pool+dense5").unwrap();
    let e = env.backend(&bad, 3).err().unwrap().to_string();
    assert!(e.contains("layer 5"), "{e}");
}

#[test]
fn a_pool_too_small_is_refused_clearly() {
    let s = shape();
    let dir = std::env::temp_dir().join(format!("cxlkv-decode-small-{}", std::process::id()));
    let spec = format!("file:{}", dir.display());
    let backend: cxlkv_runtime::Backend = spec.parse().unwrap();
    let cfg = cxlkv_runtime::PoolConfig {
        block_size: 4096,
        participants: 4,
        partitions: Some(1),
        ..Default::default()
    };
    let pool = cxlkv_runtime::Pool::create_on(
        &backend,
        8 << 20,
        &cfg,
        &cxlkv_runtime::RegionOptions::default(),
    )
    .unwrap();
    drop(pool);
    let o = EnvOptions {
        pool: Some(spec.clone()),
        ..opts(DeviceChoice::Host)
    };
    // 4 KiB blocks hold 4 positions of 2 heads x 16 f32 K and V, but not 64.
    let big = EnvOptions {
        block_tokens: 64,
        ..o.clone()
    };
    let e = Env::open(&big, s, 128).err().unwrap().to_string();
    assert!(e.contains("--block-tokens"), "{e}");
    // The pool's blocks are fine, but a million positions do not fit.
    let e = Env::open(&o, s, 1 << 20).err().unwrap().to_string();
    assert!(e.contains("too small"), "{e}");
    let env = Env::open(&o, s, 64).unwrap();
    assert!(env.describe().contains("given"), "{}", env.describe());
    drop(env);
    let _ = std::fs::remove_file(&dir);
    let missing = EnvOptions {
        pool: Some("file:/nonexistent/cxlkv-pool".into()),
        ..o
    };
    let e = Env::open(&missing, s, 64).err().unwrap().to_string();
    assert!(e.contains("cxlkv pool create"), "{e}");
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let s = shape();
    let env = Env::open(&opts(DeviceChoice::Host), s, 64).unwrap();
    let mut b = env.backend(&ModeSpec::parse("pool").unwrap(), 1).unwrap();
    assert!(b.append(0, &[0.0; 31], &[0.0; 31]).is_err());
    assert!(b.append(2, &[0.0; 32], &[0.0; 32]).is_err());
    let mut out = vec![0.0; 64];
    assert!(b.attend(0, &[0.0; 64], &mut out).is_err(), "nothing held");
    assert!(b.attend(9, &[0.0; 64], &mut out).is_err());
    let odd = AttentionShape { head_dim: 24, ..s };
    assert!(Env::open(&opts(DeviceChoice::Host), odd, 64).is_err());
    let zero = EnvOptions {
        block_tokens: 0,
        ..opts(DeviceChoice::Host)
    };
    assert!(Env::open(&zero, s, 64).is_err());
}

/// Near-data modes: `ndp-exact` matches dense to float rounding (a different summation order:
/// device partial + host partial, merged); top-k with a budget over every position and top-p at
/// mass 1 select every position and match as well. A chunk of 5 positions after the prefill has
/// its queries' share of the stored blocks computed by the device too (ndp-exact).
#[test]
fn near_data_modes_match_dense() {
    let s = shape();
    let seq = chunks(&s, &[6, 5], 12, 3);
    let dense = run(&mut Dense::new(s, DType::F32).unwrap(), &s, &seq);
    for device in [DeviceChoice::Thread, DeviceChoice::Host] {
        let env = Env::open(&opts(device.clone()), s, 64).unwrap();
        let modes = [
            "ndp-exact",
            "topk:64",
            "topp:1.0",
            "ndp-topk:64",
            "ndp-topp:1.0",
        ];
        for (i, mode) in modes.iter().enumerate() {
            let mut b = env
                .backend(&ModeSpec::parse(mode).unwrap(), i as u64 + 1)
                .unwrap();
            let got = run(b.as_mut(), &s, &seq);
            for (g, d) in got.iter().zip(&dense) {
                let e = relative_error(g, d);
                assert!(e < 1e-5, "{mode} on {device:?}: relative error {e}");
            }
            let st = b.stats();
            if mode.starts_with("pull") {
                assert_eq!(st.device_commands, 0, "{mode}: the host selects and pulls");
            } else if device == DeviceChoice::Thread {
                // 12 decode steps x 2 layers x 2 KV heads, each one command (the gather modes
                // two: SCORE_TOPK, then GATHER of the group's union); ndp-exact also sends the
                // chunk of 5 (one command per layer and KV head: 10 queries <= 16).
                let want = match *mode {
                    "ndp-exact" => 48 + 4,
                    "topk:64" | "topp:1.0" => 96,
                    _ => 48,
                };
                assert_eq!(st.device_commands, want, "{mode}: {st:?}");
                assert!(st.device_scan_bytes > 0);
            } else {
                assert_eq!(st.device_commands, 0, "{mode}: {st:?}");
            }
        }
    }
}

/// A top-k budget below the stored positions attends to the budget, the sinks, the window and
/// the open block only.
#[test]
fn topk_attends_to_what_it_selected() {
    let s = shape();
    let seq = steps(&s, 40, 3, 4);
    let o = EnvOptions {
        sinks: 2,
        window: 6,
        ..opts(DeviceChoice::Thread)
    };
    let env = Env::open(&o, s, 64).unwrap();
    let mut b = env.backend(&ModeSpec::parse("topk:5").unwrap(), 1).unwrap();
    let mut before = None;
    for (i, st) in seq.iter().enumerate() {
        if i == 1 {
            before = Some(b.stats());
        }
        for layer in 0..s.layers {
            b.append(layer, &st.k, &st.v).unwrap();
            let mut out = vec![0.0; st.q.len()];
            b.attend(layer, &st.q, &mut out).unwrap();
        }
    }
    let d = b.stats().since(&before.unwrap());
    // Per query head: 5 + 2 sinks + the window's stored part (the window of 6 covers the open
    // rows first), + the open rows; at most 5 + 2 + 6 rows, far fewer than the 41..43 held.
    let per_head = d.value_rows as f64 / d.query_heads as f64;
    assert!((7.0..=13.0).contains(&per_head), "{per_head} rows per head");
}

/// `ndp-topk`: the device attends the union of the group's selections. Below the stored
/// positions it attends to fewer rows than are held and reports the mass it left out; only
/// partials cross, so its link bytes per decode step are those of `ndp-exact`, not of a gather.
#[test]
fn ndp_topk_attends_the_union_and_reports_what_it_left_out() {
    let s = shape();
    let seq = steps(&s, 40, 3, 4);
    let o = EnvOptions {
        sinks: 2,
        window: 6,
        ..opts(DeviceChoice::Thread)
    };
    let env = Env::open(&o, s, 64).unwrap();
    let decode = |mode: &str, id: u64| {
        let mut b = env.backend(&ModeSpec::parse(mode).unwrap(), id).unwrap();
        let mut before = None;
        for (i, st) in seq.iter().enumerate() {
            if i == 1 {
                before = Some(b.stats());
            }
            for layer in 0..s.layers {
                b.append(layer, &st.k, &st.v).unwrap();
                let mut out = vec![0.0; st.q.len()];
                b.attend(layer, &st.q, &mut out).unwrap();
            }
        }
        b.stats().since(&before.unwrap())
    };
    let sparse = decode("ndp-topk:5", 1);
    let exact = decode("ndp-exact", 2);
    let gather = decode("topk:5", 3);
    let pull = decode("pull-topk:5", 4);
    let per_head = sparse.value_rows as f64 / sparse.query_heads as f64;
    // The union of the group's lists: at least one list (5 + 2 sinks + stored window), at most
    // all of them, plus the open rows; fewer than the 41..43 held.
    assert!((7.0..41.0).contains(&per_head), "{per_head} rows per head");
    let left = sparse.left_out_mass().expect("selections recorded");
    assert!(left > 0.0 && left < 1.0, "left-out mass {left}");
    assert_eq!(sparse.selected_heads, sparse.query_heads);
    assert!(exact.left_out_mass().is_none());
    assert!(sparse.device_scan_bytes < exact.device_scan_bytes);
    let link = |st: &AttentionStats| st.link_read_bytes + st.link_write_bytes;
    assert!(
        link(&sparse) < link(&gather),
        "{} vs {}",
        link(&sparse),
        link(&gather)
    );
    assert!(
        link(&sparse) < link(&pull),
        "{} vs {}",
        link(&sparse),
        link(&pull)
    );
    assert!(pull.left_out_mass().is_some_and(|m| m > 0.0));
    assert_eq!(pull.device_commands, 0);
}

/// On int8 and int4 blocks every pool mode runs (the pulled and gathered rows come back
/// dequantized) and stays close to dense: the quantization error, not a wrong row type.
#[test]
fn selection_modes_run_on_quantized_blocks() {
    let s = shape();
    let seq = chunks(&s, &[6, 5], 12, 3);
    let dense = run(&mut Dense::new(s, DType::F32).unwrap(), &s, &seq);
    for dtype in [DType::I8, DType::I4] {
        let o = EnvOptions {
            dtype,
            ..opts(DeviceChoice::Thread)
        };
        let env = Env::open(&o, s, 64).unwrap();
        for (i, mode) in ["pool", "ndp-exact", "topk:64", "topp:1.0", "pull-topk:64"]
            .iter()
            .enumerate()
        {
            let mut b = env
                .backend(&ModeSpec::parse(mode).unwrap(), i as u64 + 1)
                .unwrap();
            let got = run(b.as_mut(), &s, &seq);
            let worst = got
                .iter()
                .zip(&dense)
                .map(|(g, d)| relative_error(g, d))
                .fold(0.0, f64::max);
            let bound = if dtype == DType::I8 { 0.05 } else { 0.5 };
            assert!(worst < bound, "{mode} on {dtype:?}: relative error {worst}");
        }
    }
}
