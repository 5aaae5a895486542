//! Arguments from C: NUL-terminated strings, counted arrays, required pointers and
//! out-parameters. Each check records its message and returns the code the header documents
//! (`CXLKV_ERR_NULL` for a missing pointer, `CXLKV_ERR_INVALID_ARG` for bad text or a count no
//! array can have).

use crate::errors::cxlkv_result::{self, CXLKV_ERR_INVALID_ARG, CXLKV_ERR_NULL};
use crate::errors::fail;
use std::ffi::{c_char, CStr};

/// A NUL-terminated UTF-8 string argument named `what`.
pub(crate) fn cstr<'a>(p: *const c_char, what: &str) -> Result<&'a str, cxlkv_result> {
    if p.is_null() {
        return Err(fail(CXLKV_ERR_NULL, format!("{what} is NULL")));
    }
    // SAFETY: non-null; the caller promises a NUL-terminated string valid for the call.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| fail(CXLKV_ERR_INVALID_ARG, format!("{what} is not UTF-8")))
}

/// Refuses a NULL pointer argument named `what`.
pub(crate) fn need<T>(p: *mut T, what: &str) -> Result<(), cxlkv_result> {
    if p.is_null() {
        Err(fail(CXLKV_ERR_NULL, format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

/// Writes `v` to a checked, non-null out-pointer.
pub(crate) fn put_out<T>(p: *mut T, v: T) {
    // SAFETY: callers checked `p` with `need` first; the caller promises it is valid and aligned.
    unsafe { p.write(v) }
}

/// `len` bytes at `p` (NULL allowed when `len` is 0).
pub(crate) fn bytes_in<'a>(p: *const u8, len: usize, what: &str) -> Result<&'a [u8], cxlkv_result> {
    slice_in(p, len, what)
}

/// `n` elements at `p` (NULL allowed when `n` is 0).
pub(crate) fn slice_in<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T], cxlkv_result> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(fail(
            CXLKV_ERR_NULL,
            format!("{what} is NULL with count {n}"),
        ));
    }
    if n > isize::MAX as usize / std::mem::size_of::<T>().max(1) {
        return Err(fail(
            CXLKV_ERR_INVALID_ARG,
            format!("{what} count {n} too large"),
        ));
    }
    // SAFETY: non-null, bounded; the caller promises `n` readable, initialized elements.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A caller's writable buffer of `cap` bytes at `p` (NULL allowed when `cap` is 0).
pub(crate) fn bytes_out<'a>(
    p: *mut u8,
    cap: usize,
    what: &str,
) -> Result<&'a mut [u8], cxlkv_result> {
    if cap == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(fail(
            CXLKV_ERR_NULL,
            format!("{what} is NULL with capacity {cap}"),
        ));
    }
    if cap > isize::MAX as usize {
        return Err(fail(
            CXLKV_ERR_INVALID_ARG,
            format!("{what}: capacity too large"),
        ));
    }
    // SAFETY: non-null, bounded; the caller promises `cap` writable bytes at `p`, which no one
    // else accesses during the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, cap) })
}
