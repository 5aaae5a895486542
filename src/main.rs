//! The `cxlkv` command line.
fn main() {
    println!("cxlkv {}", env!("CARGO_PKG_VERSION"));
}
