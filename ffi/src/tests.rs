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
