//! `cxlkv demo` end to end: its refusals without a model, the sweep only on request with its
//! error beside its ratio, and, with the SmolLM2 GGUF present (scripts/fetch-model.sh;
//! `CXLKV_MODEL` overrides the path), the real-model part at a shorter context: `--json` carries
//! a `decode` object whose ndp-exact tokens equal dense's and whose link figures come from the
//! run.

use std::path::PathBuf;
use std::process::Command;

fn cxlkv(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cxlkv"))
        .args(args)
        .output()
        .unwrap()
}

fn model() -> Option<PathBuf> {
    cxlkv_test_support::smollm2("demo")
}

#[test]
fn a_missing_model_is_refused_before_anything_runs() {
    let out = cxlkv(&["demo", "--model", "/nonexistent.gguf"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent.gguf") && err.contains("fetch-model.sh"),
        "{err}"
    );
    // Part 1 did not start.
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn sweep_options_need_the_sweep() {
    let out = cxlkv(&["demo", "--no-decode", "--tokens", "4096"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--sweep"), "{err}");
}

#[test]
fn without_sweep_no_synthetic_headline_and_with_it_the_error_is_beside_the_ratio() {
    let out = cxlkv(&["demo", "--no-decode"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("check: pool OK"), "{text}");
    assert!(
        !text.contains("synthetic") && !text.contains("fewer link bytes"),
        "{text}"
    );

    let out = cxlkv(&[
        "demo",
        "--no-decode",
        "--sweep",
        "--tokens",
        "4096",
        "--k",
        "32",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(j.get("decode").is_none(), "{j}");
    let runs = j["sweep"]["runs"].as_array().unwrap();
    assert!(runs
        .iter()
        .any(|r| r["name"].as_str().unwrap().starts_with("synthetic")));
    for r in runs {
        assert!(r["link_ratio"].as_f64().unwrap() > 1.0, "{r}");
        assert!(r["attn_rel_err"].as_f64().unwrap().is_finite(), "{r}");
    }
    // The table puts the error right after the ratio, and the headline states both.
    let header = err.lines().find(|l| l.starts_with("run ")).unwrap();
    let words: Vec<&str> = header.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "ratio").unwrap();
    assert_eq!(&words[at + 1..at + 3], ["attn", "err"], "{header}");
    let headline = err
        .lines()
        .find(|l| l.starts_with("largest ratio:"))
        .unwrap();
    assert!(headline.contains("attention error"), "{headline}");
}

#[test]
fn the_real_model_decodes_with_ndp_exact_identical_to_dense() {
    let Some(path) = model() else { return };
    let out = cxlkv(&[
        "demo",
        "--model",
        path.to_str().unwrap(),
        "--context",
        "512",
        "--generate",
        "4",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["ok"], true, "{j}");
    assert_eq!(j["sharing"]["check_ok"], true, "{j}");
    assert!(
        j.get("sweep").is_none(),
        "the sweep is not shown by default: {j}"
    );
    let d = &j["decode"];
    assert_eq!(d["mode"], "ndp-exact", "{d}");
    assert_eq!(d["context_tokens"], 512, "{d}");
    assert_eq!(d["generated_tokens"], 4, "{d}");
    assert_eq!(d["tokens_identical_to_dense"], true, "{d}");
    assert_eq!(d["tokens"]["ndp-exact"], d["tokens"]["dense"], "{d}");
    assert_eq!(d["tokens"]["dense"].as_array().unwrap().len(), 4, "{d}");
    let link = |m: &str| d["link_bytes_per_token"][m].as_f64().unwrap();
    let (pool, ndp) = (link("pool"), link("ndp-exact"));
    assert!(ndp > 0.0 && pool > ndp, "{d}");
    let ratio = d["link_ratio"].as_f64().unwrap();
    assert!(ratio > 1.0, "{d}");
    assert!((ratio - pool / ndp).abs() < 1e-9 * ratio, "{d}");
    // pool pulls every stored key and value (f32) of every layer and KV head, every step.
    assert!(pool >= (512 * 30 * 3 * 64 * 4 * 2) as f64, "{d}");
    let dev = &d["device"];
    for f in [
        "commands_per_token",
        "scan_bytes_per_token",
        "device_ms_per_token",
    ] {
        assert!(dev[f].as_f64().unwrap() > 0.0, "{f}: {d}");
    }
    // The lines for people went to stderr and say the same.
    assert!(
        err.contains("ndp-exact moves") && err.contains("identical to dense"),
        "{err}"
    );
}
