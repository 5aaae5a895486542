//! `cxlkv demo --kv-dir` on folders in the data/kv format that hold other layers than the
//! bundled one: the layers come from meta.json's `dumped_layers`, never from a fixed list (part 1
//! and the `--sweep`, which read the folder; the real-model part is left out).

use std::path::{Path, PathBuf};
use std::process::Command;

fn bundled() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/kv/smollm2_devil_2048")
}

/// A folder holding the bundled layer `from` under the number `to` (and tokens.npy), with a
/// meta.json that names `layers`.
fn folder(name: &str, pairs: &[(u32, u32)], layers: &[u32]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cxlkv-kvdir-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(bundled().join("tokens.npy"), dir.join("tokens.npy")).unwrap();
    for &(from, to) in pairs {
        for t in ["q", "k", "v"] {
            std::fs::copy(
                bundled().join(format!("layer{from:02}_{t}.npy")),
                dir.join(format!("layer{to:02}_{t}.npy")),
            )
            .unwrap();
        }
    }
    let meta = std::fs::read_to_string(bundled().join("meta.json")).unwrap();
    let mut meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
    meta["dumped_layers"] = serde_json::json!(layers);
    std::fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
    dir
}

fn demo(dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cxlkv"))
        .args([
            "demo",
            "--no-decode",
            "--sweep",
            "--tokens",
            "4096",
            "--k",
            "32",
            "--kv-dir",
        ])
        .arg(dir)
        .output()
        .unwrap()
}

#[test]
fn demo_reads_the_layers_the_folder_holds() {
    let dir = folder("39", &[(4, 3), (17, 9)], &[3, 9]);
    let out = demo(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("layers 3 and 9"), "{text}");
    assert!(text.contains("pins layer 9"), "{text}");
    assert!(text.contains("max |pool - model| = 0e0"), "{text}");
    assert!(text.contains("check: pool OK"), "{text}");
    assert!(text.contains("L3 kv0") && text.contains("L9 kv2"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_refuses_a_folder_without_the_layers_meta_names() {
    let dir = folder("missing", &[(17, 17)], &[5, 17]);
    let out = demo(&dir);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("layer05_k.npy"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
