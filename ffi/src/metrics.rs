//! This process's metrics (`cxlkv_runtime::metrics::global`, the registry of the runtime this
//! library links): the runtime's operations record every put, get, pin, delete and device command
//! (SCORE_TOPK, GATHER, ATTEND; synchronous or through a ticket) there (outcome, bytes, latency,
//! fallbacks; the rules in `cxlkv_runtime::metrics`), and two calls read them back:
//! `cxlkv_metrics_read` as numbers in a struct whose first field says its size,
//! `cxlkv_metrics_text` as the Prometheus text exposition. README ("Observability") names the
//! metrics.
//!
//! The per-participant counters every participant publishes in its pool slot (any process that
//! maps the pool reads them, as `cxlkv pool stat` does): `cxlkv_pool_participant_counters` as
//! numbers, `cxlkv_pool_metrics_text` as this process's metrics plus the pool's in one exposition.

use crate::args::{need, put_out};
use crate::errors::cxlkv_result::{self, CXLKV_ERR_BUFFER_TOO_SMALL};
use crate::errors::{fail, guard, map_err};
use crate::handles::{borrow, Kind};
use crate::pool::cxlkv_pool;
use crate::sized::{check_out, sized, write_out};
use cxlkv_runtime::metrics::{global, Op, OpSnapshot};
use std::ffi::c_char;

/// One operation's figures in `cxlkv_metrics`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct cxlkv_op_metrics {
    /// Calls that succeeded.
    pub ok: u64,
    /// Calls that found no block under their key (gets, pins, deletes).
    pub miss: u64,
    /// Calls that failed.
    pub error: u64,
    /// Bytes the caller handed in (put payloads, device query vectors).
    pub bytes_in: u64,
    /// Bytes handed back (get payloads, device hits and value rows).
    pub bytes_out: u64,
    /// Sum of the calls' latencies, nanoseconds (divide by ok + miss + error for the mean).
    pub latency_ns: u64,
}

/// This process's metrics (`cxlkv_metrics_read`). Set `struct_size` to `sizeof(cxlkv_metrics)`
/// before the call: a library built with more fields writes only the first `struct_size` bytes,
/// and one with fewer writes what it has and stores that size back. First layout: the 8 bytes of
/// `struct_size` and `reserved` (any caller that sets its size gets what fits).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct cxlkv_metrics {
    /// Bytes of this struct the caller provides; on return, the bytes written.
    pub struct_size: u32,
    /// Zero.
    pub reserved: u32,
    /// `cxlkv_participant_put`.
    pub put: cxlkv_op_metrics,
    /// `cxlkv_participant_get`.
    pub get: cxlkv_op_metrics,
    /// `cxlkv_participant_pin`.
    pub pin: cxlkv_op_metrics,
    /// `cxlkv_participant_delete`.
    pub del: cxlkv_op_metrics,
    /// `cxlkv_device_score_topk`.
    pub score_topk: cxlkv_op_metrics,
    /// `cxlkv_device_gather`.
    pub gather: cxlkv_op_metrics,
    /// Device commands computed on the host (device absent, dead, late, busy, or asked for).
    pub device_fallbacks: u64,
    /// Bytes that crossed the link for device commands that the device computed.
    pub device_link_bytes: u64,
    /// Bytes that crossed the link for device commands computed on the host.
    pub host_link_bytes: u64,
    /// `cxlkv_device_submit_attend`, counted when its ticket is collected (or when the submit
    /// fails): `bytes_in` the query vectors, `bytes_out` the partials (`out`, `max`, `sum`).
    /// Appended after the first ABI 2 layout (320 bytes): a caller whose `struct_size` ends before
    /// it does not get it.
    pub attend: cxlkv_op_metrics,
}

sized!(cxlkv_metrics, 8);

/// The counters one participant publishes in its pool slot (`cxlkv_pool_participant_counters`),
/// each its running total since it attached. Set `struct_size` to
/// `sizeof(cxlkv_participant_counters)` before the call (the sized-struct rule of `cxlkv_metrics`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct cxlkv_participant_counters {
    /// Bytes of this struct the caller provides; on return, the bytes written.
    pub struct_size: u32,
    /// Zero.
    pub reserved: u32,
    /// Successful puts.
    pub puts: u64,
    /// Gets that found their key.
    pub hits: u64,
    /// Gets that did not.
    pub misses: u64,
    /// Optimistic reads retried.
    pub retries: u64,
    /// Blocks evicted to make room.
    pub evictions: u64,
    /// Blocks deleted.
    pub deletes: u64,
    /// Pins taken.
    pub pins: u64,
    /// Payload bytes its puts wrote.
    pub bytes_in: u64,
    /// Payload bytes its gets copied out.
    pub bytes_out: u64,
    /// Device requests the host answered because the device was unavailable or unsupported.
    pub fallbacks: u64,
    /// Pins refused because its pin table was full.
    pub pin_full: u64,
}

sized!(cxlkv_participant_counters, 8);

/// Stores the counters participant slot `participant` of `pool` publishes in `*out` (read from
/// the pool's memory: any process's participants, as `cxlkv pool stat` shows them). The caller
/// sets `out->struct_size` to `sizeof(cxlkv_participant_counters)` (at least 8); at most that many
/// bytes are written and their number stored in `struct_size`. `CXLKV_ERR_NOT_FOUND` when the slot
/// is free or not a slot of the pool. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_participant_counters(
    pool: *const cxlkv_pool,
    participant: u32,
    out: *mut cxlkv_participant_counters,
) -> cxlkv_result {
    guard(|| {
        let pool = borrow(pool, Kind::Pool)?;
        check_out(out, "out")?;
        let Some(c) =
            cxlkv_runtime::participant_counters(&pool.pool, participant).map_err(map_err)?
        else {
            return Err(fail(
                cxlkv_result::CXLKV_ERR_NOT_FOUND,
                format!(
                    "participant slot {participant} is free or not one of the pool's {}",
                    pool.pool.superblock().participants
                ),
            ));
        };
        write_out(
            out,
            cxlkv_participant_counters {
                struct_size: 0,
                reserved: 0,
                puts: c.puts,
                hits: c.hits,
                misses: c.misses,
                retries: c.retries,
                evictions: c.evictions,
                deletes: c.deletes,
                pins: c.pins,
                bytes_in: c.bytes_in,
                bytes_out: c.bytes_out,
                fallbacks: c.fallbacks,
                pin_full: c.pin_full,
            },
        );
        Ok(())
    })
}

fn op_out(s: OpSnapshot) -> cxlkv_op_metrics {
    cxlkv_op_metrics {
        ok: s.ok,
        miss: s.miss,
        error: s.error,
        bytes_in: s.bytes_in,
        bytes_out: s.bytes_out,
        latency_ns: (s.latency.sum_s * 1e9).round() as u64,
    }
}

/// Stores this process's metrics in `*out`, whose `struct_size` field the caller sets to
/// `sizeof(cxlkv_metrics)` (at least 8: `CXLKV_ERR_INVALID_ARG` otherwise); writes at most that
/// many bytes and stores the number written in `struct_size`. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_metrics_read(out: *mut cxlkv_metrics) -> cxlkv_result {
    guard(|| {
        check_out(out, "out")?;
        let s = global().snapshot();
        write_out(
            out,
            cxlkv_metrics {
                struct_size: 0,
                reserved: 0,
                put: op_out(s.op(Op::Put)),
                get: op_out(s.op(Op::Get)),
                pin: op_out(s.op(Op::Pin)),
                del: op_out(s.op(Op::Delete)),
                score_topk: op_out(s.op(Op::ScoreTopk)),
                gather: op_out(s.op(Op::Gather)),
                device_fallbacks: s.device_fallbacks(),
                device_link_bytes: s.device_link_bytes,
                host_link_bytes: s.host_link_bytes,
                attend: op_out(s.op(Op::Attend)),
            },
        );
        Ok(())
    })
}

/// Writes this process's metrics as Prometheus text (NUL-terminated) into `buf` (capacity `cap`)
/// and stores the text's length without the NUL in `*len`. `CXLKV_ERR_BUFFER_TOO_SMALL` when `cap`
/// is not above that length (the length is stored: retry with `*len + 1`); `buf` may be NULL when
/// `cap` is 0. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_metrics_text(
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> cxlkv_result {
    guard(|| text_out(global().encode(), buf, cap, len))
}

/// `cxlkv_metrics_text` with the pool-wide metrics of `pool` added to the same exposition: every
/// held participant slot's counters (`cxlkv_pool_participant_*`, labelled by participant and pid,
/// read from the pool's memory) and each partition's occupancy, as `cxlkv pool stat --prometheus`
/// prints them. Same buffer rules. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_metrics_text(
    pool: *const cxlkv_pool,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> cxlkv_result {
    guard(|| {
        let pool = borrow(pool, Kind::Pool)?;
        let st = cxlkv_runtime::pool_stats(&pool.pool).map_err(map_err)?;
        text_out(global().encode_with_pool(&st), buf, cap, len)
    })
}

/// Copies `text` and a NUL into `buf` (capacity `cap`) and its length into `*len`.
fn text_out(
    text: String,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> Result<(), cxlkv_result> {
    need(len, "len")?;
    if buf.is_null() && cap > 0 {
        return Err(fail(
            crate::errors::cxlkv_result::CXLKV_ERR_NULL,
            format!("buf is NULL with capacity {cap}"),
        ));
    }
    if text.len() >= cap {
        put_out(len, text.len());
        return Err(fail(
            CXLKV_ERR_BUFFER_TOO_SMALL,
            format!("{} bytes of text and a NUL, capacity {cap}", text.len()),
        ));
    }
    // SAFETY: buf is non-null (cap > text.len() ≥ 0) with `cap` writable bytes, which the
    // caller promises; text.len() + 1 ≤ cap.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        buf.add(text.len()).write(0);
    }
    put_out(len, text.len());
    Ok(())
}
