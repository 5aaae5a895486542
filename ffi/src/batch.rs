//! Batched block calls: `cxlkv_participant_put_batch`, `cxlkv_participant_get_batch` and
//! `cxlkv_pool_contains_batch`. One call per batch across the boundary, one result per key.
//!
//! The rule of every batch: `n = 0` is a success that touches nothing; with `n > 0` a NULL array
//! is `CXLKV_ERR_NULL` and nothing is done. Otherwise every key is tried, in order, and
//! `results[i]` receives key `i`'s code (as the single-key call would return it); the call returns
//! the first key's failure (and its message, prefixed with the key's index), or `CXLKV_OK` when
//! every key succeeded. So the per-key results are written even when the call returns an error.

use crate::args::{bytes_in, bytes_out, need, slice_in};
use crate::errors::cxlkv_result::{self, CXLKV_OK};
use crate::errors::{fail, guard, last_message, map_err};
use crate::handles::{borrow, Kind};
use crate::keys::cxlkv_key;
use crate::participant::{cxlkv_participant, get_one, put_one};
use crate::pool::cxlkv_pool;

/// Runs `one` for keys `0..n`, storing each code in `results`; returns the first failure.
fn each(
    n: usize,
    results: *mut cxlkv_result,
    mut one: impl FnMut(usize) -> Result<(), cxlkv_result>,
) -> Result<(), cxlkv_result> {
    let mut first: Option<(cxlkv_result, String)> = None;
    for i in 0..n {
        let code = match one(i) {
            Ok(()) => CXLKV_OK,
            Err(code) => {
                if first.is_none() {
                    first = Some((code, format!("key {i}: {}", last_message())));
                }
                code
            }
        };
        // SAFETY: i < n and the caller promises `n` writable results (checked non-null).
        unsafe { results.add(i).write_unaligned(code) };
    }
    match first {
        None => Ok(()),
        Some((code, msg)) => Err(fail(code, msg)),
    }
}

/// Stores `n` blocks: `bufs[i][0..lens[i]]` under `keys[i]` (as `cxlkv_participant_put`; a
/// `bufs[i]` may be NULL when `lens[i]` is 0). `results[i]` receives each key's code; the call
/// returns the first failure or `CXLKV_OK` (docs/C-ABI.md, "Batches"). Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_put_batch(
    p: *const cxlkv_participant,
    n: usize,
    keys: *const cxlkv_key,
    bufs: *const *const u8,
    lens: *const usize,
    results: *mut cxlkv_result,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        let keys = slice_in(keys, n, "keys")?;
        let bufs = slice_in(bufs, n, "bufs")?;
        let lens = slice_in(lens, n, "lens")?;
        if n > 0 {
            need(results, "results")?;
        }
        each(n, results, |i| {
            let bytes = bytes_in(bufs[i], lens[i], "bufs[i]")?;
            put_one(&me, keys[i].into(), bytes)
        })
    })
}

/// Reads `n` blocks: the block under `keys[i]` into `bufs[i]` (capacity `caps[i]`; NULL when 0),
/// its length into `lens[i]` (as `cxlkv_participant_get`: the needed size with
/// `CXLKV_ERR_BUFFER_TOO_SMALL`, untouched on a miss). `results[i]` receives each key's code
/// (`CXLKV_ERR_NOT_FOUND` for a miss); the call returns the first failure or `CXLKV_OK`.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_get_batch(
    p: *const cxlkv_participant,
    n: usize,
    keys: *const cxlkv_key,
    bufs: *const *mut u8,
    caps: *const usize,
    lens: *mut usize,
    results: *mut cxlkv_result,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        let keys = slice_in(keys, n, "keys")?;
        let bufs = slice_in(bufs, n, "bufs")?;
        let caps = slice_in(caps, n, "caps")?;
        if n > 0 {
            need(lens, "lens")?;
            need(results, "results")?;
        }
        each(n, results, |i| {
            let dst = bytes_out(bufs[i], caps[i], "bufs[i]")?;
            // SAFETY: i < n and the caller promises `n` writable lengths (checked non-null).
            get_one(&me, keys[i].into(), dst, unsafe { lens.add(i) })
        })
    })
}

/// Whether each of `keys[0..n]` is in the pool (index only, no payload read): `present[i]` = 1 or
/// 0. `n = 0` is a success; NULL arrays with `n > 0` are `CXLKV_ERR_NULL`. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_contains_batch(
    pool: *const cxlkv_pool,
    n: usize,
    keys: *const cxlkv_key,
    present: *mut u8,
) -> cxlkv_result {
    guard(|| {
        let p = borrow(pool, Kind::Pool)?;
        let keys = slice_in(keys, n, "keys")?;
        if n > 0 {
            need(present, "present")?;
        }
        let mut found = Vec::with_capacity(n);
        for (i, k) in keys.iter().enumerate() {
            let hit = p
                .pool
                .contains((*k).into())
                .map_err(|e| fail(map_err(e), format!("key {i}: {}", last_message())))?;
            found.push(u8::from(hit));
        }
        if n > 0 {
            // SAFETY: present is non-null (checked, n > 0) with `n` writable bytes, which the
            // caller promises.
            unsafe { std::ptr::copy_nonoverlapping(found.as_ptr(), present, n) };
        }
        Ok(())
    })
}
