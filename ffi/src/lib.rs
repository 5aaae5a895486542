//! # cxlkv-ffi
//!
//! The C ABI of cxlkv (`libcxlkv.so`, `libcxlkv.a`, `include/cxlkv.h`). Filled by the C ABI issue;
//! until then it exports only the version query.

/// The library version as a NUL-terminated string with static lifetime, e.g. `"0.1.0"`.
#[no_mangle]
pub extern "C" fn cxlkv_version() -> *const std::ffi::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
