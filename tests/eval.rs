//! `cxlkv eval` end to end: bad input is a clear error with exit status 2 (most without a model),
//! and with the SmolLM2 GGUF (scripts/fetch-model.sh; `CXLKV_MODEL` overrides the path) a short
//! run whose dense perplexity equals the model's own teacher-forced perplexity computed here.

use cxlkv::model::{Dense, Model, WeightFormat};
use cxlkv_test_support::fails_with;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn cxlkv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cxlkv"))
        .args(args)
        .output()
        .unwrap()
}

fn model_path() -> Option<PathBuf> {
    cxlkv_test_support::smollm2("eval")
}

/// A neutral text written for this test (not the dev set of data/kv).
const TEXT: &str = "The old harbour town wakes slowly in winter. Before dawn the bakers light \
their ovens, and the smell of bread drifts down the narrow streets towards the water. Fishing \
boats that went out at midnight return one by one, their decks stacked with crates of ice and \
silver fish. At the market, traders argue about prices while gulls circle overhead, waiting for \
scraps. By eight o'clock the school bell rings, and children run past the church with their \
bags bouncing on their backs. The library opens at nine. Its reading room faces the sea, and on \
clear days you can see the lighthouse on the far island, white against the grey horizon. In the \
afternoon the wind often rises, and the ferry to the island may be cancelled; then the cafés \
fill with travellers who must wait until morning. Evening brings a quiet that visitors find \
strange: the shops close early, the streets empty, and only the sound of the waves remains.";

/// A file in a folder of this test's own (tests run in parallel).
fn temp(test: &str, name: &str, contents: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cxlkv-eval-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, contents).unwrap();
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn bad_input_without_a_model() {
    let text = temp("nomodel", "text.txt", TEXT.as_bytes());
    let base = |extra: &[&str]| {
        let mut a = vec!["eval", "--model", "/nonexistent.gguf", "--text", s(&text)];
        a.extend_from_slice(extra);
        cxlkv(&a)
    };
    fails_with(
        &base(&["--modes", "dense,flash"]),
        &["\"flash\"", "unknown mode", "ndp-exact"],
    );
    fails_with(&base(&["--modes", "topp:1.5"]), &["outside (0, 1]"]);
    fails_with(
        &base(&["--dense-layers", "3-1"]),
        &["--dense-layers", "empty"],
    );
    fails_with(
        &base(&["--context", "8", "--scored", "8"]),
        &["--context 8", "--scored 8"],
    );
    fails_with(&base(&["--scored", "0"]), &["--scored"]);
    fails_with(&base(&["--passkey", "0"]), &["--passkey"]);
    fails_with(&base(&["--link-gbps", "0"]), &["--link-gbps 0"]);
    fails_with(&base(&["--link-gbps", "inf"]), &["--link-gbps inf"]);
    fails_with(&base(&["--link-latency-us=-1"]), &["--link-latency-us -1"]);
    fails_with(&base(&[]), &["/nonexistent.gguf"]);
    let corrupt = temp(
        "nomodel",
        "corrupt.gguf",
        b"GGUF\x03\x00\x00\x00 this is not a model",
    );
    fails_with(
        &cxlkv(&["eval", "--model", s(&corrupt), "--text", s(&text)]),
        &["corrupt.gguf"],
    );
    fails_with(
        &cxlkv(&["eval", "--model", s(&corrupt), "--text", "/nonexistent.txt"]),
        &["/nonexistent.txt"],
    );
    let _ = std::fs::remove_dir_all(text.parent().unwrap());
}

#[test]
fn bad_input_with_the_model() {
    let Some(model) = model_path() else { return };
    let text = temp("badmodel", "short.txt", TEXT.as_bytes());
    let run = |extra: &[&str]| {
        let mut a = vec!["eval", "--model", s(&model), "--text", s(&text)];
        a.extend_from_slice(extra);
        cxlkv(&a)
    };
    fails_with(
        &run(&["--context", "9000", "--scored", "8"]),
        &["--context 9000", "8192"],
    );
    fails_with(
        &run(&["--context", "4096", "--scored", "8"]),
        &["tokens; --context 4096"],
    );
    fails_with(
        &run(&["--context", "96", "--scored", "8", "--dense-layers", "30"]),
        &["dense layer 30", "0-29"],
    );
    let _ = std::fs::remove_dir_all(text.parent().unwrap());
}

/// Tokens of the window and scored positions of the short run.
const CONTEXT: usize = 96;
const SCORED: usize = 8;

#[test]
fn short_run_matches_the_models_own_perplexity() {
    let Some(model_file) = model_path() else {
        return;
    };
    let text = temp("short", "text.txt", TEXT.as_bytes());
    let plot = temp("short", "plot.svg", b"");
    std::fs::remove_file(&plot).unwrap();
    let (ctx, scored) = (CONTEXT.to_string(), SCORED.to_string());
    let out = cxlkv(&[
        "eval",
        "--model",
        s(&model_file),
        "--text",
        s(&text),
        "--context",
        &ctx,
        "--scored",
        &scored,
        "--modes",
        "dense,dense-f16,pool,ndp-exact,topk:16,topp:0.9",
        "--block-tokens",
        "16",
        "--sinks",
        "4",
        "--window",
        "16",
        "--passkey",
        "1",
        "--json",
        "--plot",
        s(&plot),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("scoring 8/8 tokens"), "progress: {err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["context"], CONTEXT);
    assert_eq!(v["scored"], SCORED);
    let modes = v["modes"].as_array().unwrap();
    let names: Vec<&str> = modes.iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "dense",
            "dense-f16",
            "pool",
            "ndp-exact",
            "topk:16",
            "topp:0.9"
        ]
    );
    for m in modes {
        for key in [
            "mode",
            "perplexity",
            "top1_agreement",
            "kl",
            "value_rows_per_head",
            "link_bytes_per_token",
            "ms_per_token",
        ] {
            assert!(!m[key].is_null(), "{key} missing in {m}");
        }
        assert!(m["ms_per_token"].as_f64().unwrap() > 0.0);
        let pk = &m["passkey"];
        assert_eq!(pk["prompts"].as_array().unwrap().len(), 1, "{m}");
    }
    let [dense, f16, pool, exact, topk, topp] = &modes[..] else {
        unreachable!()
    };
    let num = |m: &serde_json::Value, key: &str| m[key].as_f64().unwrap();
    assert_eq!(dense["top1_agreement"], 1.0);
    assert_eq!(dense["kl"], 0.0);
    assert!(num(f16, "kl") > 0.0, "{f16}");
    // Each scored step attends over every position up to its own: the mean is the prefix plus
    // the midpoint of the scored steps. Only the selection modes read fewer.
    let all_rows = (CONTEXT - SCORED - 1) as f64 + (SCORED as f64 + 1.0) / 2.0;
    for m in [dense, f16, pool, exact] {
        assert!(
            (num(m, "value_rows_per_head") - all_rows).abs() < 1e-9,
            "{m}"
        );
    }
    for m in [topk, topp] {
        assert!(num(m, "value_rows_per_head") < all_rows, "{m}");
        assert!(num(m, "device_commands_per_token") > 0.0, "{m}");
    }
    for m in [dense, f16] {
        assert_eq!(num(m, "link_bytes_per_token"), 0.0, "private memory: {m}");
    }
    // pool and ndp-exact are exact: dense's tokens, perplexity within 1e-4.
    for m in [pool, exact] {
        assert_eq!(m["top1_agreement"], 1.0, "{m}");
        let r = num(m, "perplexity") / num(dense, "perplexity");
        assert!((r - 1.0).abs() < 1e-4, "{m}");
    }
    // The host pulls every stored key and value in pool mode; the device reads them in place
    // for ndp-exact, and only partials cross the link.
    assert!(num(exact, "device_commands_per_token") > 0.0, "{exact}");
    assert!(num(exact, "device_scan_bytes_per_token") > 0.0, "{exact}");
    assert_eq!(num(pool, "device_scan_bytes_per_token"), 0.0, "{pool}");
    assert!(
        num(exact, "link_bytes_per_token") * 5.0 < num(pool, "link_bytes_per_token"),
        "ndp-exact {exact} against pool {pool}"
    );
    assert_eq!(
        dense["passkey"]["accuracy"], 1.0,
        "dense finds the key in a short prompt: {}",
        dense["passkey"]
    );

    // The model's own teacher-forced perplexity of the same positions, one forward over the
    // window: logits after token i predict token i + 1.
    let model = Model::load(&model_file, WeightFormat::F32).unwrap();
    let tokens = model.tokenizer().encode(TEXT);
    assert!(tokens.len() >= CONTEXT, "{} tokens", tokens.len());
    let mut attn = Dense::new(model.attention_shape(), cxlkv::kernels::DType::F32).unwrap();
    let logits = model
        .forward_all(&tokens[..CONTEXT - 1], &mut attn)
        .unwrap();
    let vocab = model.config().vocab;
    let mut nll = 0f64;
    for pos in CONTEXT - SCORED - 1..CONTEXT - 1 {
        let row = &logits[pos * vocab..(pos + 1) * vocab];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max
            + row
                .iter()
                .map(|&x| (x as f64 - max).exp())
                .sum::<f64>()
                .ln();
        nll += lse - row[tokens[pos + 1] as usize] as f64;
    }
    let ppl = (nll / SCORED as f64).exp();
    let got = dense["perplexity"].as_f64().unwrap();
    assert!(
        ((got - ppl) / ppl).abs() < 1e-4,
        "eval says {got}, the model's forward over the window {ppl}"
    );

    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains(">dense-f16</text>"),
        "{svg}"
    );
    let _ = std::fs::remove_dir_all(plot.parent().unwrap());
}
