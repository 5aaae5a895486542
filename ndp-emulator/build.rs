//! Compiles the HLS kernel of `fpga/src` as a static library for the device's `hls` engine, with
//! the system C++ compiler and our HLS compatibility headers (no vendor tools needed).

use std::path::PathBuf;

fn main() {
    let dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets the manifest dir"));
    let fpga = dir.join("../fpga");
    for f in [
        "src/cxlkv_ndp_engine.cpp",
        "src/cxlkv_ndp_engine.h",
        "src/cxlkv_ndp_kernel.h",
        "src/cxlkv_ndp_attend.h",
        "src/cxlkv_ndp_select.h",
        "src/cxlkv_ndp_sparse.h",
        "src/cxlkv_hls_types.h",
        "include/hls_compat/hls_stream.h",
    ] {
        println!("cargo:rerun-if-changed={}", fpga.join(f).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        dir.join("include/cxlkv_ndp.h").display()
    );
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file(fpga.join("src/cxlkv_ndp_engine.cpp"))
        .define("CXLKV_HLS_COMPAT", None)
        // Bit-exactness: never fuse products and sums that the reference rounds separately.
        .flag("-ffp-contract=off")
        .warnings(true)
        .extra_warnings(true)
        // HLS pragmas and loop labels are for Vitis HLS only.
        .flag_if_supported("-Wno-unknown-pragmas")
        .flag_if_supported("-Wno-unused-label")
        // The engine streams every key element through the kernel's FIFOs: optimize even in
        // debug builds so the device tests stay fast.
        .opt_level(2)
        .compile("cxlkv_hls_engine");
}
