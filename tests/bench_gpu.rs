//! `cxlkv bench gpu` from the outside: bad input is a clear error with exit status 2 before any
//! GPU work, and without a GPU the bench exits 2 saying what is missing (the driver, a device or
//! NVRTC).
//! On a machine with a GPU the bench itself is run by scripts/gpu-check.sh, not here (it takes
//! minutes).

use cxlkv_test_support::fails_with;
use std::process::{Command, Output};

fn cxlkv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cxlkv"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn bad_input_is_refused_before_the_gpu() {
    fails_with(&cxlkv(&["bench", "gpu", "--tokens", "100"]), &["--tokens"]);
    fails_with(&cxlkv(&["bench", "gpu", "--repeats", "0"]), &["--repeats"]);
    fails_with(
        &cxlkv(&["bench", "gpu", "--kv", "/nonexistent-kv"]),
        &["/nonexistent-kv/layer04_k.npy"],
    );
}

#[test]
fn without_a_gpu_the_bench_says_what_is_missing() {
    let out = cxlkv(&["bench", "gpu", "--tokens", "1024"]);
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("bench gpu: NVIDIA") || out.status.success() {
        println!("a GPU is present: the bench ran (scripts/gpu-check.sh records it)");
        return;
    }
    // No driver or no device here; a GPU machine without NVRTC says that instead.
    let missing = if err.contains("no NVRTC") {
        "bench gpu: no NVRTC"
    } else {
        "bench gpu: no CUDA"
    };
    fails_with(&out, &[missing]);
}
