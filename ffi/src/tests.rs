//! Tests of the error rule through the exported functions: a failing call leaves its own message,
//! the next call that returns a `cxlkv_result` clears it, and reading messages changes nothing.
//! Each test runs on its own thread, so each sees its own last error.

use crate::errors::cxlkv_result::*;
use crate::errors::{cxlkv_last_error_message, cxlkv_result_message};
use crate::keys::{cxlkv_key, cxlkv_key_from_bytes};
use crate::pool::{cxlkv_pool, cxlkv_pool_close, cxlkv_pool_create, cxlkv_pool_describe};
use std::ffi::{c_char, CStr};
use std::ptr::{null, null_mut};

fn last_error() -> String {
    let need = cxlkv_last_error_message(null_mut(), 0);
    let mut buf = vec![0u8; need];
    let written = cxlkv_last_error_message(buf.as_mut_ptr().cast::<c_char>(), need);
    assert_eq!(written, need);
    let text = CStr::from_bytes_until_nul(&buf).expect("NUL-terminated");
    text.to_str().unwrap().to_string()
}

#[test]
fn a_success_clears_the_message_of_the_failure_before_it() {
    let mut key = cxlkv_key::default();
    assert_eq!(cxlkv_key_from_bytes(null(), 1, &mut key), CXLKV_ERR_NULL);
    assert_eq!(last_error(), "bytes is NULL with count 1");
    assert_eq!(cxlkv_key_from_bytes(b"k".as_ptr(), 1, &mut key), CXLKV_OK);
    assert_eq!(last_error(), "");
    assert_eq!(
        cxlkv_last_error_message(null_mut(), 0),
        1,
        "size of the empty string"
    );
}

#[test]
fn releasing_null_is_a_success_and_clears_the_message() {
    let mut key = cxlkv_key::default();
    assert_eq!(cxlkv_key_from_bytes(null(), 1, &mut key), CXLKV_ERR_NULL);
    assert_ne!(last_error(), "");
    assert_eq!(cxlkv_pool_close(null_mut()), CXLKV_OK);
    assert_eq!(last_error(), "");
}

#[test]
fn a_failure_without_detail_reports_its_own_code_not_an_older_message() {
    let mut pool: *mut cxlkv_pool = null_mut();
    let spec = c"bogus-spec";
    let r = cxlkv_pool_create(spec.as_ptr(), 1 << 20, null(), &mut pool);
    assert_eq!(r, CXLKV_ERR_INVALID_ARG);
    assert!(last_error().contains("bogus-spec"), "{}", last_error());
    // An unknown handle fails before any detail is written: the code's text fills in.
    let r = cxlkv_pool_describe(null(), &mut Default::default());
    assert_eq!(r, CXLKV_ERR_INVALID_HANDLE);
    assert_eq!(
        last_error(),
        "handle is NULL, released, or of the wrong type"
    );
    assert!(pool.is_null(), "out-parameter written on failure");
}

#[test]
fn reading_messages_leaves_the_last_error_alone() {
    let mut key = cxlkv_key::default();
    assert_eq!(cxlkv_key_from_bytes(null(), 1, &mut key), CXLKV_ERR_NULL);
    let before = last_error();
    assert_ne!(cxlkv_result_message(CXLKV_ERR_IO as u32, null_mut(), 0), 0);
    assert!(!crate::version::cxlkv_version().is_null());
    assert_eq!(last_error(), before);
    assert_eq!(
        last_error(),
        before,
        "reading the message twice gives it twice"
    );
}

/// Every struct that carries its size is laid out without padding (the byte copies of
/// `sized` rely on it) and starts with its `struct_size`.
#[test]
fn sized_structs_have_no_padding() {
    use crate::device::cxlkv_attend_request;
    use crate::device::{cxlkv_ndp_stats, cxlkv_score_request};
    use crate::kv::cxlkv_kv_shape;
    use crate::metrics::{cxlkv_metrics, cxlkv_op_metrics};
    use crate::participant::cxlkv_stats;
    use crate::pool::{cxlkv_pool_config, cxlkv_pool_info};
    use std::mem::size_of;
    // Sum of the field sizes = the struct size: no padding anywhere.
    assert_eq!(size_of::<cxlkv_pool_config>(), 4 + 4 + 8 + 4 + 4 + 4 * 4);
    assert_eq!(
        size_of::<cxlkv_pool_info>(),
        4 + 4 + 8 + 8 + 4 + 4 + 2 + 2 + 4 + 8 + 8 + 4 + 4
    );
    assert_eq!(size_of::<cxlkv_stats>(), 8 + 7 * 8);
    assert_eq!(size_of::<cxlkv_kv_shape>(), 6 * 4 + 2 * 8);
    assert_eq!(
        size_of::<cxlkv_score_request>(),
        4 + 4 + 8 + 4 + 4 + 8 + 8 + 8 + 4 * 4
    );
    assert_eq!(
        size_of::<cxlkv_attend_request>(),
        4 + 4 + 8 + 4 + 4 + 8 + 8 + 8 + 4 * 4
    );
    assert_eq!(size_of::<cxlkv_ndp_stats>(), 4 * 4 + 3 * 8);
    assert_eq!(
        size_of::<crate::device::cxlkv_select>(),
        4 + 4 + 8 + 4 * 8 + 4 + 4
    );
    assert_eq!(size_of::<crate::device::cxlkv_device_config>(), 4 * 4);
    assert_eq!(
        size_of::<cxlkv_metrics>(),
        8 + 6 * size_of::<cxlkv_op_metrics>() + 3 * 8 + size_of::<cxlkv_op_metrics>()
    );
    // `attend` was appended after the first ABI 2 layout (320 bytes), which stays as it was.
    assert_eq!(std::mem::offset_of!(cxlkv_metrics, attend), 320);
    assert_eq!(
        size_of::<crate::metrics::cxlkv_participant_counters>(),
        8 + 11 * 8
    );
    assert_eq!(
        std::mem::offset_of!(cxlkv_pool_config, pins_per_participant),
        20
    );
    // mode, owner, group and access_flags were appended after `pins_per_participant`.
    assert_eq!(std::mem::offset_of!(cxlkv_pool_config, mode), 24);
    assert_eq!(std::mem::offset_of!(cxlkv_pool_config, access_flags), 36);
    assert_eq!(std::mem::offset_of!(cxlkv_pool_info, map_base), 40);
}

/// An older caller's smaller struct is read only as far as it reaches (the rest keeps the
/// library's defaults) and written only as far as it reaches; a newer caller's bigger one gets
/// what the library has, with `struct_size` saying how much; one below the first layout is refused.
#[test]
fn old_and_new_callers_get_what_fits() {
    use crate::pool::{
        cxlkv_pool_config, cxlkv_pool_config_default, cxlkv_pool_create, cxlkv_pool_describe,
        cxlkv_pool_info, cxlkv_pool_unlink,
    };
    use std::mem::size_of;
    let spec =
        std::ffi::CString::new(format!("shm:cxlkv-ffi-sized-{}", std::process::id())).unwrap();
    // An "old" config: 20 bytes, without pins_per_participant; bytes past it are garbage that the
    // library must not read (0xffffffff pins would be refused).
    let mut old = [0xffu8; 24];
    let c = cxlkv_pool_config {
        struct_size: 20,
        block_size: 4096,
        participants: 2,
        ..cxlkv_pool_config_default()
    };
    // SAFETY: `c` is a plain repr(C) struct of 24 bytes; `old` has 24.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&c as *const cxlkv_pool_config).cast::<u8>(),
            old.as_mut_ptr(),
            20,
        )
    };
    let mut pool = null_mut();
    let r = cxlkv_pool_create(spec.as_ptr(), 4 << 20, old.as_ptr().cast(), &mut pool);
    assert_eq!(r, CXLKV_OK, "{}", last_error());

    // An "old" info: the 40 bytes of the first layout; the 16 after it stay untouched.
    let mut small = [0xeeu8; 64];
    small[..4].copy_from_slice(&40u32.to_le_bytes());
    assert_eq!(
        cxlkv_pool_describe(pool, small.as_mut_ptr().cast()),
        CXLKV_OK
    );
    assert_eq!(u32::from_le_bytes(small[..4].try_into().unwrap()), 40);
    assert_eq!(
        u32::from_le_bytes(small[4..8].try_into().unwrap()),
        2,
        "participants"
    );
    assert_eq!(
        u64::from_le_bytes(small[16..24].try_into().unwrap()),
        4096,
        "block size"
    );
    assert!(
        small[40..].iter().all(|&b| b == 0xee),
        "written past struct_size"
    );

    // A "newer" info: 16 bytes more than this library knows; they stay untouched and
    // struct_size says how much was written.
    let n = size_of::<cxlkv_pool_info>();
    let mut big = vec![0xddu8; n + 16];
    big[..4].copy_from_slice(&((n + 16) as u32).to_le_bytes());
    assert_eq!(cxlkv_pool_describe(pool, big.as_mut_ptr().cast()), CXLKV_OK);
    assert_eq!(u32::from_le_bytes(big[..4].try_into().unwrap()) as usize, n);
    assert!(big[n..].iter().all(|&b| b == 0xdd));
    // SAFETY: the first n bytes are a cxlkv_pool_info the library wrote.
    let info: cxlkv_pool_info = unsafe { big.as_ptr().cast::<cxlkv_pool_info>().read_unaligned() };
    assert!(!info.map_base.is_null());
    assert_eq!(info.map_len, info.pool_size);
    assert_eq!(
        info.pins_per_participant, 64,
        "the old config's default pin table"
    );

    // Below the first layout: refused, nothing written.
    let mut tiny = [0xccu8; 64];
    tiny[..4].copy_from_slice(&39u32.to_le_bytes());
    assert_eq!(
        cxlkv_pool_describe(pool, tiny.as_mut_ptr().cast()),
        CXLKV_ERR_INVALID_ARG
    );
    assert!(
        last_error().contains("struct_size is 39"),
        "{}",
        last_error()
    );
    assert!(tiny[4..].iter().all(|&b| b == 0xcc));
    let mut cfg = cxlkv_pool_config_default();
    cfg.struct_size = 16;
    let mut other = null_mut();
    let spec2 =
        std::ffi::CString::new(format!("shm:cxlkv-ffi-sized2-{}", std::process::id())).unwrap();
    assert_eq!(
        cxlkv_pool_create(spec2.as_ptr(), 4 << 20, &cfg, &mut other),
        CXLKV_ERR_INVALID_ARG
    );
    assert!(other.is_null());

    assert_eq!(cxlkv_pool_close(pool), CXLKV_OK);
    assert_eq!(cxlkv_pool_unlink(spec.as_ptr()), CXLKV_OK);
}

/// The committed header's `cxlkv_result` is the runtime's table: every `CXLKV_<name> = <n>` line
/// of `include/cxlkv.h` names a code of `cxlkv_runtime::api::Code` with its number, and every code
/// is there.
#[test]
fn the_header_numbers_are_the_runtime_table() {
    use cxlkv_runtime::api::Code;
    let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/cxlkv.h"))
        .expect("read include/cxlkv.h");
    let start = header
        .find("enum cxlkv_result")
        .expect("the header declares enum cxlkv_result");
    let body = &header[start..start + header[start..].find('}').expect("the enum ends")];
    let rows: Vec<(String, u32)> = body
        .lines()
        .filter_map(|l| {
            let (name, n) = l.trim().trim_end_matches(',').split_once(" = ")?;
            Some((name.to_string(), n.parse().ok()?))
        })
        .collect();
    let want: Vec<(String, u32)> = Code::ALL
        .iter()
        .map(|c| (format!("CXLKV_{}", c.name()), *c as u32))
        .collect();
    assert_eq!(rows, want);
    for c in Code::ALL {
        assert_eq!(
            crate::errors::cxlkv_result::from(c) as u32,
            c as u32,
            "{c:?}"
        );
    }
}
