//! Exports only `cxlkv_*` symbols from libcxlkv.so (ffi/cxlkv.map).
fn main() {
    let map = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cxlkv.map");
    println!("cargo:rerun-if-changed={}", map.display());
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}
