//! `cxlkv generate` end to end: argument errors without a model, and a short greedy run with the
//! SmolLM2 GGUF when it is present (scripts/fetch-model.sh; `CXLKV_MODEL` overrides the path).

use std::process::Command;

fn cxlkv(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cxlkv"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn unknown_attention_lists_the_known_ones() {
    let out = cxlkv(&[
        "generate",
        "--model",
        "/nonexistent.gguf",
        "--prompt",
        "x",
        "--attention",
        "sparse",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"sparse\"") && err.contains("dense") && err.contains("dense-f16"),
        "{err}"
    );
}

#[test]
fn missing_model_is_a_clear_error() {
    let out = cxlkv(&["generate", "--model", "/nonexistent.gguf", "--prompt", "x"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent.gguf"), "{err}");
}

#[test]
fn generates_with_the_real_model() {
    let Some(path) = cxlkv_test_support::smollm2("generate") else {
        return;
    };
    let model = path.to_str().unwrap();
    let out = cxlkv(&[
        "generate",
        "--model",
        model,
        "--prompt",
        "The capital of France is",
        "-n",
        "6",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Paris"), "generated {text:?}");
    assert!(
        err.contains("prefill: 5 tokens") && err.contains("decode: 6 tokens"),
        "{err}"
    );
}

#[test]
fn bad_device_is_a_clear_error() {
    let out = cxlkv(&[
        "generate",
        "--model",
        "/nonexistent.gguf",
        "--prompt",
        "x",
        "--attention",
        "ndp-exact",
        "--device",
        "gpu",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("thread, ndpd or host"), "{err}");
}

/// `ndp-exact` on the real model: the same text as `dense`, the device's commands in the
/// statistics; a pool that does not exist is a clear error.
#[test]
fn ndp_exact_generates_the_dense_text() {
    let Some(path) = cxlkv_test_support::smollm2("generate") else {
        return;
    };
    let model = path.to_str().unwrap();
    let run = |mode: &str, extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--prompt",
            "The capital of France is",
            "-n",
            "5",
            "--block-tokens",
            "4",
            "--attention",
            mode,
        ];
        args.extend_from_slice(extra);
        cxlkv(&args)
    };
    let dense = run("dense", &[]);
    assert!(dense.status.success());
    let ndp = run("ndp-exact", &[]);
    let err = String::from_utf8_lossy(&ndp.stderr);
    assert!(ndp.status.success(), "{err}");
    assert_eq!(ndp.stdout, dense.stdout, "{err}");
    assert!(
        err.contains("near-data device in a thread") && err.contains("device commands"),
        "{err}"
    );
    let missing = run("pool", &["--pool", "file:/nonexistent/cxlkv-pool"]);
    assert_eq!(missing.status.code(), Some(2));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("cxlkv pool create"), "{err}");
}
