//! The real model (SmolLM2-135M, `CXLKV_MODEL` or scripts/fetch-model.sh's cache) decodes with
//! its K/V in the pool: greedy tokens are identical to the dense reference's for `pool`,
//! `ndp-exact` (device in a thread and as a `cxlkv-ndpd` process), `topk` with a budget over
//! every position and `topp:1.0`; and the statistics say what crossed the link. A short version
//! (a few tokens, small blocks so that several are stored and the open block is not empty); the
//! full run: `CXLKV_GREEDY_TOKENS=128 cargo test --release -p cxlkv-decode --test greedy`
//! (`CXLKV_GREEDY_BLOCK` sets the block size, default 16).
//!
//! Every prompt runs exactly `CXLKV_GREEDY_TOKENS` tokens: the comparison greedy-decodes past an
//! end-of-sequence token instead of stopping there (the printed line says where one came).
//! An identity test compares the backends' attention over a fixed, known number of positions;
//! after EOS the model's argmax is still a deterministic function of the same growing K/V, so the
//! tokens past it test the backends exactly as the ones before it do, while a stop would make the
//! length (and so what is compared) depend on the prompt and the model.

use cxlkv_decode::{DeviceChoice, Env, EnvOptions, ModeSpec};
use cxlkv_kernels::DType;
use cxlkv_model::{argmax, Attention, AttentionStats, Model, WeightFormat};
use std::path::PathBuf;

const PROMPTS: [&str; 3] = [
    "The history of the Roman Empire spans many centuries. It began when Augustus became \
     the first emperor, and over time",
    "To bake a simple loaf of bread you need flour, water, salt and yeast. First, mix",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n",
];
/// Tokens generated per prompt and mode (`CXLKV_GREEDY_TOKENS`, default 8).
fn new_tokens() -> usize {
    env_or("CXLKV_GREEDY_TOKENS", 8)
}

/// Positions per stored block (`CXLKV_GREEDY_BLOCK`, default 16).
fn block() -> usize {
    env_or("CXLKV_GREEDY_BLOCK", 16)
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn model_path() -> Option<PathBuf> {
    cxlkv_test_support::smollm2("greedy")
}

/// Exactly `new_tokens()` greedy tokens of `prompt` (through end-of-sequence tokens: see the
/// module docs) and the backend's statistics of the prefill and decode steps.
fn tokens(model: &Model, attn: &mut dyn Attention, prompt: &[u32]) -> (Vec<u32>, AttentionStats) {
    let n = new_tokens();
    let before = attn.stats();
    let mut out = Vec::with_capacity(n);
    let mut next = argmax(&model.forward(prompt, attn).unwrap()) as u32;
    while out.len() < n {
        out.push(next);
        if out.len() < n {
            next = argmax(&model.forward(&[next], attn).unwrap()) as u32;
        }
    }
    (out, attn.stats().since(&before))
}

/// Where the first end-of-sequence token of `got` is, for the printed lines.
fn eos_note(model: &Model, got: &[u32]) -> String {
    match model.tokenizer().eos() {
        Some(eos) => match got.iter().position(|&t| t == eos) {
            Some(i) => format!(", EOS at token {} (decoded on past it)", i + 1),
            None => ", no EOS".into(),
        },
        None => String::new(),
    }
}

#[test]
fn greedy_tokens_are_identical_across_modes_and_devices() {
    let Some(path) = model_path() else { return };
    let (new, block) = (new_tokens(), block());
    let model = Model::load(&path, WeightFormat::F32).unwrap();
    let shape = model.attention_shape();
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| model.tokenizer().encode(p))
        .collect();
    let longest = prompts.iter().map(Vec::len).max().unwrap();
    assert!(
        prompts.iter().all(|p| p.len() > block),
        "prompts fill a block"
    );
    let dense: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut d = cxlkv_model::Dense::new(shape, cxlkv_kernels::DType::F32).unwrap();
            tokens(&model, &mut d, p).0
        })
        .collect();
    let ndpd = cxlkv_test_support::ndpd();
    for device in [DeviceChoice::Thread, DeviceChoice::Ndpd(ndpd)] {
        let opts = EnvOptions {
            device: device.clone(),
            block_tokens: block,
            ..EnvOptions::default()
        };
        let env = Env::open(&opts, shape, longest + new).unwrap();
        eprintln!("{}", env.describe());
        // The device's own modes on both devices; `pool` and the selections once.
        let modes: &[&str] = match device {
            DeviceChoice::Thread => &[
                "pool",
                "ndp-exact",
                "topk:4096",
                "topp:1.0",
                "ndp-topk:4096",
                "ndp-topp:1.0",
                "pull-topk:4096",
            ],
            _ => &["pool", "ndp-exact"],
        };
        let mut link = std::collections::HashMap::new();
        for (i, prompt) in prompts.iter().enumerate() {
            for (m, mode) in modes.iter().enumerate() {
                let spec = ModeSpec::parse(mode).unwrap();
                let mut b = env.backend(&spec, (i * modes.len() + m) as u64).unwrap();
                let (got, st) = tokens(&model, b.as_mut(), prompt);
                assert_eq!(got.len(), new, "{mode} on {device:?}, prompt {i}");
                assert_eq!(
                    got, dense[i],
                    "{mode} on {device:?}, prompt {i}: greedy tokens differ from dense"
                );
                eprintln!(
                    "{mode} on {device:?}, prompt {i} ({} tokens): {} tokens identical to dense{}",
                    prompt.len(),
                    got.len(),
                    eos_note(&model, &got)
                );
                *link.entry(*mode).or_insert(0) += st.link_read_bytes;
                if *mode != "pool" && !mode.starts_with("pull") {
                    assert!(st.device_commands > 0, "{mode} on {device:?}: {st:?}");
                }
            }
        }
        // The device reads K and V in place: far fewer bytes come back than `pool` pulls.
        assert!(
            link["ndp-exact"] * 4 < link["pool"],
            "ndp-exact read {} bytes over the link, pool {}",
            link["ndp-exact"],
            link["pool"]
        );
    }
}

/// `topk:K` attends to about K + sinks + window + the open rows per query head.
#[test]
fn topk_value_rows_follow_the_budget() {
    let Some(path) = model_path() else { return };
    let (new, block) = (new_tokens(), block());
    let model = Model::load(&path, WeightFormat::F32).unwrap();
    let shape = model.attention_shape();
    let prompt = model.tokenizer().encode(&PROMPTS.join(" "));
    let opts = EnvOptions {
        block_tokens: block,
        sinks: 2,
        window: 8,
        ..EnvOptions::default()
    };
    let env = Env::open(&opts, shape, prompt.len() + new).unwrap();
    let mut b = env.backend(&ModeSpec::parse("topk:8").unwrap(), 1).unwrap();
    let (got, st) = tokens(&model, b.as_mut(), &prompt);
    assert_eq!(got.len(), new);
    // The decode steps only (the prefill is exact): per query head, the 8 best + the 2 sinks +
    // the stored part of the 8-position window (all capped at the stored positions), + the open
    // rows.
    let mut prefill = cxlkv_model::Dense::new(shape, cxlkv_kernels::DType::F32).unwrap();
    model.forward(&prompt, &mut prefill).unwrap();
    let decode_rows = st.value_rows - prefill.stats().value_rows;
    let decode_heads = st.query_heads - prefill.stats().query_heads;
    let expected: usize = (1..new)
        .map(|s| {
            let held = prompt.len() + s;
            let stored = held / block * block;
            let window_start = held.saturating_sub(8).min(stored);
            let forced = 2 + stored - window_start.max(2);
            (8 + forced).min(stored) + held - stored
        })
        .sum();
    assert_eq!(
        decode_heads,
        ((new - 1) * shape.heads * shape.layers) as u64
    );
    assert_eq!(
        decode_rows,
        (expected * shape.heads * shape.layers) as u64,
        "value rows of {} decode steps over {} positions",
        new - 1,
        prompt.len()
    );
}

/// `ndp-exact` over quantized blocks (int8, and int4): the device attends the codes (queries
/// folded with the key scales, values weighted by the token scales) and its partials equal its
/// host reference, the client's host fallback over the very same blocks (`DeviceChoice::Host`),
/// bit for bit, so greedy tokens are identical. `pool` (blocks pulled and dequantized) and
/// `topk:4096` (rows gathered as f32) run on the same blocks; the device reads about a quarter of
/// the f32 run's bytes with int8.
#[test]
fn ndp_exact_on_quantized_blocks_equals_its_host_reference() {
    let Some(path) = model_path() else { return };
    let (new, block) = (new_tokens(), block());
    let model = Model::load(&path, WeightFormat::F32).unwrap();
    let shape = model.attention_shape();
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| model.tokenizer().encode(p))
        .collect();
    let longest = prompts.iter().map(Vec::len).max().unwrap();
    let run = |dtype: DType, device: DeviceChoice, mode: &str, i: usize| {
        let opts = EnvOptions {
            device,
            block_tokens: block,
            dtype,
            ..EnvOptions::default()
        };
        let env = Env::open(&opts, shape, longest + new).unwrap();
        let mut b = env
            .backend(&ModeSpec::parse(mode).unwrap(), i as u64)
            .unwrap();
        tokens(&model, b.as_mut(), &prompts[i])
    };
    let (_, f32_stats) = run(DType::F32, DeviceChoice::Thread, "ndp-exact", 0);
    for dtype in [DType::I8, DType::I4] {
        for i in 0..prompts.len() {
            let (dev, st) = run(dtype, DeviceChoice::Thread, "ndp-exact", i);
            let (host, host_st) = run(dtype, DeviceChoice::Host, "ndp-exact", i);
            assert_eq!(dev.len(), new);
            assert_eq!(
                dev, host,
                "{dtype:?} prompt {i}: ndp-exact on the device and on the host differ"
            );
            assert!(st.device_commands > 0 && host_st.device_commands == 0);
            eprintln!(
                "ndp-exact {dtype:?}, prompt {i}: {new} tokens identical on the device and the host"
            );
            if i == 0 {
                let ratio = st.device_scan_bytes as f64 / f32_stats.device_scan_bytes as f64;
                eprintln!("{dtype:?}: device bytes {ratio:.3} of f32's");
                assert!(
                    ratio < if dtype == DType::I8 { 0.35 } else { 0.25 },
                    "{ratio}"
                );
                for mode in ["pool", "topk:4096"] {
                    let (got, st) = run(dtype, DeviceChoice::Thread, mode, 0);
                    assert_eq!(got.len(), new, "{mode} {dtype:?}");
                    assert_eq!(st.device_commands > 0, mode != "pool", "{mode} {dtype:?}");
                }
            }
        }
    }
}

/// `ndp-topk` / `ndp-topp` on key sketches (`--sketch int4:C`, `sign:C`): with enough candidates (every
/// position) the selection is the exact one, so `ndp-topk:4096` and `ndp-topp:1.0` keep dense's
/// greedy tokens on f32 blocks; with few candidates the device's answers equal its host reference
/// (the client's fallback over the same blocks) bit for bit, on f32 and int8 blocks, and it reads
/// fewer bytes than without the sketch.
#[test]
fn sketched_selections_equal_their_host_reference() {
    let Some(path) = model_path() else { return };
    let (new, block) = (new_tokens(), block());
    let model = Model::load(&path, WeightFormat::F32).unwrap();
    let shape = model.attention_shape();
    let prompt = model.tokenizer().encode(PROMPTS[0]);
    let mut d = cxlkv_model::Dense::new(shape, DType::F32).unwrap();
    let dense = tokens(&model, &mut d, &prompt).0;
    let run = |dtype: DType, device: DeviceChoice, sketch: &str, mode: &str| {
        let opts = EnvOptions {
            device,
            block_tokens: block,
            dtype,
            sketch: sketch.parse().unwrap(),
            ..EnvOptions::default()
        };
        let env = Env::open(&opts, shape, prompt.len() + new).unwrap();
        let mut b = env.backend(&ModeSpec::parse(mode).unwrap(), 1).unwrap();
        tokens(&model, b.as_mut(), &prompt)
    };
    for mode in ["ndp-topk:4096", "ndp-topp:1.0"] {
        let (got, st) = run(DType::F32, DeviceChoice::Thread, "int4:65536", mode);
        assert_eq!(got, dense, "{mode} with every position a candidate");
        assert!(st.rescored_rows > 0 && st.device_commands > 0, "{st:?}");
    }
    for dtype in [DType::F32, DType::I8] {
        let mode = "ndp-topk:4";
        let (_, exact) = run(dtype, DeviceChoice::Thread, "none", mode);
        for sketch in ["int4:6", "sign:6"] {
            let (dev, st) = run(dtype, DeviceChoice::Thread, sketch, mode);
            let (host, _) = run(dtype, DeviceChoice::Host, sketch, mode);
            assert_eq!(
                dev, host,
                "{dtype:?} {sketch}: the device and its host reference differ"
            );
            eprintln!(
                "{dtype:?} {mode} {sketch}: device bytes {} with the sketch, {} without; {} \
                 rows re-scored",
                st.device_scan_bytes, exact.device_scan_bytes, st.rescored_rows
            );
            assert!(st.device_scan_bytes < exact.device_scan_bytes);
        }
    }
}

/// A mode's own element type (`ndp-exact+int8`) in an f32 environment stores and computes exactly
/// what the same mode does in an int8 environment: identical tokens and device bytes.
#[test]
fn a_modes_dtype_equals_the_environments() {
    let Some(path) = model_path() else { return };
    let (new, block) = (new_tokens(), block());
    let model = Model::load(&path, WeightFormat::F32).unwrap();
    let shape = model.attention_shape();
    let prompt = model.tokenizer().encode(PROMPTS[1]);
    let run = |dtype: DType, mode: &str| {
        let opts = EnvOptions {
            block_tokens: block,
            dtype,
            ..EnvOptions::default()
        };
        let specs = [ModeSpec::parse(mode).unwrap()];
        let env = Env::open_for(&specs, &opts, shape, prompt.len() + new)
            .unwrap()
            .unwrap();
        let mut b = env.backend(&specs[0], 1).unwrap();
        tokens(&model, b.as_mut(), &prompt)
    };
    let (a, sa) = run(DType::F32, "ndp-exact+int8");
    let (b, sb) = run(DType::I8, "ndp-exact");
    assert_eq!(a, b);
    assert_eq!(sa.device_scan_bytes, sb.device_scan_bytes);
    // And the other way round: an f32 mode in an int8 environment (blocks sized for f32).
    let (c, sc) = run(DType::I8, "ndp-exact+f32");
    let (d, sd) = run(DType::F32, "ndp-exact");
    assert_eq!(c, d);
    assert_eq!(sc.device_scan_bytes, sd.device_scan_bytes);
    assert!(sa.device_scan_bytes * 3 < sc.device_scan_bytes);
}
