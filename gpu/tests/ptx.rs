//! Every kernel compiled to PTX by NVRTC, on any machine: no GPU and no CUDA toolkit needed, only
//! the NVRTC library (the registry wheel `nvidia-cuda-nvrtc-cu12`; scripts/test.sh installs it
//! under the target directory and sets `CXLKV_NVRTC`).
//!
//! Without the library the test fails, saying how to install it, unless `CXLKV_SKIP_NVRTC=1`.

use cxlkv_gpu::nvrtc::{compile_ptx, ensure_nvrtc, version, KERNELS, NVRTC_ENV};

/// The wheel's library under this workspace's target directory, where scripts/test.sh puts it.
fn wheel_nvrtc() -> Option<std::path::PathBuf> {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/nvrtc/venv/lib");
    std::fs::read_dir(venv).ok()?.flatten().find_map(|py| {
        let p = py
            .path()
            .join("site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
        p.is_file().then_some(p)
    })
}

#[test]
fn every_kernel_compiles_to_ptx() {
    if std::env::var_os(NVRTC_ENV).is_none_or(|v| v.is_empty()) {
        if let Some(p) = wheel_nvrtc() {
            // SAFETY of the environment: set before any thread of this test reads it.
            std::env::set_var(NVRTC_ENV, p);
        }
    }
    if let Err(e) = ensure_nvrtc() {
        if std::env::var("CXLKV_SKIP_NVRTC").as_deref() == Ok("1") {
            println!("skipped (CXLKV_SKIP_NVRTC=1): {e}");
            return;
        }
        panic!(
            "{e}\nscripts/test.sh installs it: python3 -m venv target/nvrtc/venv && \
             target/nvrtc/venv/bin/pip install nvidia-cuda-nvrtc-cu12 (or set CXLKV_SKIP_NVRTC=1 \
             to skip this test)"
        );
    }
    let (major, minor) = version().expect("nvrtcVersion");
    // Volta (7.0) is the oldest architecture NVRTC 12 targets; 8.0 A100, 8.9 L4/L40, 9.0 H100.
    for arch in ["compute_70", "compute_80", "compute_89", "compute_90"] {
        let ptx = compile_ptx(arch).unwrap_or_else(|e| panic!("{e}"));
        let target = format!(".target sm_{}", &arch["compute_".len()..]);
        assert!(ptx.contains(&target), "{arch}: no `{target}` in the PTX");
        for k in KERNELS {
            assert!(
                ptx.contains(&format!(".entry {k}(")),
                "{arch}: kernel {k} missing from the PTX"
            );
        }
        println!(
            "NVRTC {major}.{minor}: {arch}: {} kernels, {} bytes of PTX",
            KERNELS.len(),
            ptx.len()
        );
    }
}
