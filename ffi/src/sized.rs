//! Structs that carry their size (docs/C-ABI.md, "How structs grow"). Every struct a caller passes
//! in or has filled starts with `uint32_t struct_size`, which the caller sets to `sizeof` of the
//! struct as its header declares it. The library
//! - refuses a size below the struct's first layout (`MIN_SIZE`) with `CXLKV_ERR_INVALID_ARG`;
//! - reads only the first `min(struct_size, sizeof)` bytes of an input struct (fields an older
//!   caller does not know keep the library's defaults);
//! - writes only the first `min(struct_size, sizeof)` bytes of an output struct and stores that
//!   number in its `struct_size` (a newer caller learns which of its fields an older library
//!   filled).
//!
//! A struct nested in another (`cxlkv_op_metrics`, `cxlkv_key`) or passed as an array element
//! (`cxlkv_block_ref`) is frozen: new fields go at the end of the outer struct.

use crate::errors::cxlkv_result::{self, CXLKV_ERR_INVALID_ARG, CXLKV_ERR_NULL};
use crate::errors::fail;
use std::mem::size_of;

/// A `repr(C)` struct whose first field is `struct_size: u32`, with no padding bytes and no field
/// for which some bit pattern is invalid (integers, floats, raw pointers).
///
/// # Safety
/// Implementors must satisfy the above: the byte copies below rely on it.
pub(crate) unsafe trait SizedStruct: Copy {
    /// Bytes of the struct's first layout (ABI 2.0): callers must provide at least these.
    const MIN_SIZE: usize;
    /// Its C name, for messages.
    const NAME: &'static str;
    /// Sets `struct_size`.
    fn set_size(&mut self, n: u32);
}

/// The `struct_size` of the caller's struct at `p` (non-null), checked against `T::MIN_SIZE`.
fn caller_size<T: SizedStruct>(p: *const T, what: &str) -> Result<usize, cxlkv_result> {
    // SAFETY: `p` is non-null (checked by the callers) and the caller promises a struct there that
    // starts with its u32 size field; read_unaligned tolerates any alignment.
    let n = unsafe { p.cast::<u32>().read_unaligned() } as usize;
    if n < T::MIN_SIZE {
        return Err(fail(
            CXLKV_ERR_INVALID_ARG,
            format!(
                "{what}->struct_size is {n}, below the {} bytes of the first {} layout: set it to sizeof({})",
                T::MIN_SIZE,
                T::NAME,
                T::NAME
            ),
        ));
    }
    Ok(n)
}

/// Reads an input struct: the fields that fit in the caller's `struct_size` over `base` (the
/// library's defaults for fields an older caller does not know).
pub(crate) fn read_in<T: SizedStruct>(p: *const T, base: T, what: &str) -> Result<T, cxlkv_result> {
    if p.is_null() {
        return Err(fail(CXLKV_ERR_NULL, format!("{what} is NULL")));
    }
    let n = caller_size(p, what)?.min(size_of::<T>());
    let mut v = base;
    // SAFETY: the caller promises `struct_size` ≥ n readable bytes at `p`; `v` is a local T of
    // size_of::<T>() ≥ n bytes; every bit pattern is a valid T (trait contract); no overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&mut v as *mut T).cast::<u8>(), n);
    }
    v.set_size(size_of::<T>() as u32);
    Ok(v)
}

/// Checks an output struct's pointer and `struct_size` before any work is done (out-parameters are
/// written only on success, so a bad size must fail first).
pub(crate) fn check_out<T: SizedStruct>(p: *mut T, what: &str) -> Result<(), cxlkv_result> {
    if p.is_null() {
        return Err(fail(CXLKV_ERR_NULL, format!("{what} is NULL")));
    }
    caller_size(p, what).map(drop)
}

/// Writes an output struct checked with [`check_out`]: at most the caller's `struct_size` bytes,
/// with `struct_size` set to the number written.
pub(crate) fn write_out<T: SizedStruct>(p: *mut T, mut v: T) {
    // SAFETY: `p` was checked non-null by `check_out`; the caller promises its size field.
    let n = (unsafe { p.cast::<u32>().read_unaligned() } as usize).min(size_of::<T>());
    v.set_size(n as u32);
    // SAFETY: `v` has size_of::<T>() ≥ n initialized bytes (no padding: trait contract) and the
    // caller promises `struct_size` ≥ n writable bytes at `p`; the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping((&v as *const T).cast::<u8>(), p.cast::<u8>(), n) }
}

/// Implements [`SizedStruct`] for structs whose first field is `struct_size: u32`.
macro_rules! sized {
    ($t:ident, $min:expr) => {
        // SAFETY: $t is repr(C), starts with `struct_size: u32`, and holds only integers, floats
        // and raw pointers laid out without padding (sizes checked in `tests`).
        unsafe impl crate::sized::SizedStruct for $t {
            const MIN_SIZE: usize = $min;
            const NAME: &'static str = stringify!($t);
            fn set_size(&mut self, n: u32) {
                self.struct_size = n;
            }
        }
    };
}
pub(crate) use sized;
