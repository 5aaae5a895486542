//! Versions: of the library (`cxlkv_version`) and of this C ABI (`CXLKV_ABI_VERSION`,
//! `cxlkv_abi_version`). Neither call can fail, so neither touches the last error.

use std::ffi::c_char;

/// Version of this C ABI; bumped on any incompatible change. 2: every struct a caller passes in or
/// has filled starts with `struct_size` (docs/C-ABI.md, "How structs grow").
pub const CXLKV_ABI_VERSION: u32 = 2;

/// The library version as a static NUL-terminated string (e.g. "0.1.0"). Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The C ABI version (`CXLKV_ABI_VERSION` of the library actually loaded). Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_abi_version() -> u32 {
    CXLKV_ABI_VERSION
}
