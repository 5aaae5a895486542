//! What `cargo build --workspace` ships (libcxlkv.so, `cxlkv`, `cxlkv-ndpd`) is built without the
//! runtime's test-only features: the simulator's teeth (`coherence-teeth`) and crash injection
//! (`crash-points`). This test reads cargo's feature resolution for a normal build;
//! `scripts/check-shipped.sh` (in the test command, right after the build) looks for their symbols
//! in the built artifacts.

use std::process::Command;

#[test]
fn normal_build_enables_no_test_only_feature() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--workspace",
            "--offline",
            "-e",
            "no-dev,features",
            "-i",
            "cxlkv-runtime",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.contains("cxlkv-runtime"), "{tree}");
    for f in ["\"coherence-teeth\"", "\"crash-points\""] {
        assert!(!tree.contains(f), "a normal build enables {f}:\n{tree}");
    }
}
