//! The forward against tensors from an independent implementation of the same model
//! (data/kv/smollm2_devil_2048: a numpy forward validated against llama.cpp): keys, values and
//! queries of layers 4 and 17, the last logits, the perplexity. Skipped without the GGUF.

mod common;

use common::{array, max_abs_diff, prefix, Recorder};
use cxlkv_kernels::DType;
use cxlkv_model::{argmax, Attention, Dense, Model, WeightFormat};
use std::time::Instant;

const LAYERS: [usize; 2] = [4, 17];

fn load(test: &str, format: WeightFormat) -> Option<Model> {
    let path = common::model_path(test)?;
    let t = Instant::now();
    let model = Model::load(path, format).expect("load the model");
    eprintln!("{test}: loaded ({format:?}) in {:.2?}", t.elapsed());
    Some(model)
}

fn recorder(model: &Model, dtype: DType) -> Recorder<Dense> {
    let s = model.attention_shape();
    let dense = Dense::new(s, dtype).unwrap();
    Recorder::new(dense, &LAYERS, s.heads, s.kv_heads, s.head_dim)
}

/// How far the model's K, V and Q of layers 4 and 17 (first `n` positions) are from the
/// reference, over K, V and Q: the largest absolute error, and the largest excess of the error
/// over f16 precision (`|got − want| − 2⁻¹⁰·|want|`; the reference is stored as f16, whose
/// relative precision is 2⁻¹¹ to 2⁻¹⁰).
fn compare_kvq(rec: &Recorder<Dense>, n: usize) -> (f32, f32) {
    let (heads, kv, d) = (rec.heads, rec.kv_heads, rec.head_dim);
    let (mut abs, mut excess) = (0f32, f32::NEG_INFINITY);
    for (i, layer) in LAYERS.iter().enumerate() {
        let seen = &rec.seen[i];
        for (name, got, want_heads) in [
            ("k", &seen.k, kv),
            ("v", &seen.v, kv),
            ("q", &seen.q, heads),
        ] {
            let (reference, shape) = array(&format!("layer{layer:02}_{name}.npy"));
            assert_eq!(shape, [want_heads, 2048, d]);
            let want = prefix(&reference, want_heads, shape[1], d, n);
            let got: Vec<f32> = got.iter().flatten().copied().collect();
            let err = max_abs_diff(&got, &want);
            let over = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (g - w).abs() - w.abs() / 1024.0)
                .fold(f32::NEG_INFINITY, f32::max);
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            eprintln!(
                "layer {layer} {name}: max |error| {err:.5} (max |value| {scale:.2}), \
                 beyond f16 precision {over:.1e}"
            );
            abs = abs.max(err);
            excess = excess.max(over);
        }
    }
    (abs, excess)
}

/// The first 256 tokens in one prefill: K, V and Q of layers 4 and 17 equal the reference's to
/// f16 precision.
#[test]
fn prefill_matches_reference_kv() {
    let Some(model) = load("prefill_matches_reference_kv", WeightFormat::F32) else {
        return;
    };
    let tokens = common::tokens();
    let n = 256;
    let mut rec = recorder(&model, DType::F32);
    let t = Instant::now();
    model.forward(&tokens[..n], &mut rec).unwrap();
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "prefill of {n} tokens: {secs:.2} s ({:.1} tokens/s)",
        n as f64 / secs
    );
    // Within f16 precision of the reference, up to 1e-4 (two f32 computations' difference).
    let (abs, excess) = compare_kvq(&rec, n);
    assert!(
        excess <= 1e-4,
        "error beyond f16 precision {excess} (max |error| {abs})"
    );
}

/// Token by token (decode steps) gives what one prefill gives, and the f16 cache stays close.
#[test]
fn decode_steps_match_prefill() {
    let Some(model) = load("decode_steps_match_prefill", WeightFormat::F32) else {
        return;
    };
    let tokens = &common::tokens()[..48];
    let s = model.attention_shape();
    let mut whole = Dense::new(s, DType::F32).unwrap();
    let prefill = model.forward(tokens, &mut whole).unwrap();
    let mut steps = Dense::new(s, DType::F32).unwrap();
    let mut half = Dense::new(s, DType::F16).unwrap();
    let t = Instant::now();
    let mut last = Vec::new();
    for &tok in tokens {
        last = model.forward(&[tok], &mut steps).unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "{} decode steps: {:.1} tokens/s",
        tokens.len(),
        tokens.len() as f64 / secs
    );
    let mut last16 = Vec::new();
    for &tok in tokens {
        last16 = model.forward(&[tok], &mut half).unwrap();
    }
    let e = max_abs_diff(&last, &prefill);
    let e16 = max_abs_diff(&last16, &prefill);
    eprintln!("logits: steps vs prefill {e:.2e}, f16 cache vs f32 {e16:.2e}");
    assert!(e < 1e-3, "{e}");
    assert!(e16 < 0.1, "{e16}");
    assert_eq!(argmax(&last), argmax(&prefill));
    assert_eq!(argmax(&last16), argmax(&prefill));
    assert_eq!(steps.len(s.layers - 1), tokens.len());
}

/// Quantized matrices (8-bit activations, llama.cpp's arithmetic) stay near the f32 reading.
#[test]
fn quantized_weights_stay_close() {
    let Some(model) = load("quantized_weights_stay_close", WeightFormat::Quantized) else {
        return;
    };
    let tokens = common::tokens();
    let n = 64;
    let mut rec = recorder(&model, DType::F32);
    let t = Instant::now();
    model.forward(&tokens[..n], &mut rec).unwrap();
    eprintln!("quantized prefill of {n} tokens: {:.2?}", t.elapsed());
    // 8-bit activations: a few tenths at values up to about 20.
    let (abs, _) = compare_kvq(&rec, n);
    assert!(abs < 0.5, "max |error| {abs}");
}

/// log-softmax of `logits` at `target`.
fn log_prob(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    logits[target] as f64 - max - sum.ln()
}

/// All 2,048 tokens (prefill in blocks of 256): the last logits and the perplexity agree with
/// the reference, and so do K and V of layers 4 and 17 at every position.
#[test]
#[ignore = "about a minute in release; cargo test --release -p cxlkv-model -- --ignored"]
fn full_text_matches_reference_logits_and_perplexity() {
    let Some(model) = load(
        "full_text_matches_reference_logits_and_perplexity",
        WeightFormat::F32,
    ) else {
        return;
    };
    let tokens = common::tokens();
    let vocab = model.config().vocab;
    let mut rec = recorder(&model, DType::F32);
    let mut nll = 0f64;
    let mut last = Vec::new();
    let t = Instant::now();
    for (c, chunk) in tokens.chunks(256).enumerate() {
        let logits = model.forward_all(chunk, &mut rec).unwrap();
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            let pos = c * 256 + i;
            if pos + 1 < tokens.len() {
                nll -= log_prob(row, tokens[pos + 1] as usize);
            }
        }
        last = logits[logits.len() - vocab..].to_vec();
    }
    let secs = t.elapsed().as_secs_f64();
    let ppl = (nll / (tokens.len() - 1) as f64).exp();
    let meta = common::meta();
    let want_ppl = meta["perplexity"].as_f64().unwrap();
    let (want_last, _) = array("last_logits.npy");
    let err = max_abs_diff(&last, &want_last);
    eprintln!(
        "2048 tokens in {secs:.1} s ({:.1} tokens/s); perplexity {ppl:.6} (reference {want_ppl:.6}); \
         last logits max |error| {err:.2e}, argmax {} (reference {})",
        tokens.len() as f64 / secs,
        argmax(&last),
        argmax(&want_last)
    );
    assert_eq!(argmax(&last), argmax(&want_last));
    assert!(err < 0.05, "{err}");
    assert!(
        (ppl - want_ppl).abs() / want_ppl < 1e-3,
        "{ppl} vs {want_ppl}"
    );
    let (abs, excess) = compare_kvq(&rec, tokens.len());
    assert!(
        excess <= 1e-4,
        "error beyond f16 precision {excess} (max |error| {abs})"
    );
}
