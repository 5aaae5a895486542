//! This process's metrics (`cxlkv_runtime::metrics::global`): the library's entry points record
//! every put, get, pin, delete and device command here (outcome, bytes, latency, fallbacks), and
//! two calls read them back: `cxlkv_metrics_read` as numbers in a struct whose first field says
//! its size, `cxlkv_metrics_text` as the Prometheus text exposition. README ("Observability")
//! names the metrics.

use crate::args::{need, put_out};
use crate::errors::cxlkv_result::{self, CXLKV_ERR_BUFFER_TOO_SMALL};
use crate::errors::{fail, guard};
use crate::sized::{check_out, sized, write_out};
use cxlkv_runtime::metrics::{global, Op, OpSnapshot, Outcome};
use std::ffi::c_char;
use std::time::Instant;

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
}

sized!(cxlkv_metrics, 8);

/// Records one call of `op` that started at `t0`.
pub(crate) fn record(op: Op, outcome: Outcome, bytes_in: u64, bytes_out: u64, t0: Instant) {
    global().record(op, outcome, bytes_in, bytes_out, t0.elapsed());
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
    guard(|| {
        need(len, "len")?;
        if buf.is_null() && cap > 0 {
            return Err(fail(
                crate::errors::cxlkv_result::CXLKV_ERR_NULL,
                format!("buf is NULL with capacity {cap}"),
            ));
        }
        let text = global().encode();
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
    })
}
