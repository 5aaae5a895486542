//! The committed header `ffi/include/cxlkv.h` must equal what cbindgen generates from the sources.
//! `CXLKV_BLESS=1 cargo test -p cxlkv-ffi --test header` rewrites it.

#[test]
fn header_matches_sources() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config =
        cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let path = format!("{dir}/include/cxlkv.h");
    if std::env::var("CXLKV_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "ffi/include/cxlkv.h is out of date with ffi/src: run CXLKV_BLESS=1 cargo test -p cxlkv-ffi --test header and commit it"
    );
}
