//! Asynchronous device commands: `cxlkv_device_submit_score_topk` and `cxlkv_device_submit_attend`
//! file a command and return a ticket at once; `cxlkv_device_poll` (non-blocking) and
//! `cxlkv_device_wait` collect it. Several tickets may be in flight on one device handle.
//!
//! Ownership of the results (docs/C-ABI.md, "Asynchronous commands"): the caller names its result
//! arrays at submit time and owns them throughout; the library writes them only inside the
//! `cxlkv_device_poll` or `cxlkv_device_wait` call that reports the ticket done, and never after
//! that call, after a failed collection, or after `cxlkv_device_close`. A collected ticket is
//! forgotten: polling it again is `CXLKV_ERR_INVALID_ARG`.
//!
//! Metrics: the runtime counts a ticket's command in this process's metrics (`Op::ScoreTopk`,
//! `Op::Attend`) once, when it is collected (its outcome, bytes and elapsed time from submit), or
//! when the submit itself fails (a request refused by its checks is not counted); a ticket dropped
//! uncollected by `cxlkv_device_close` is not counted. A `CXLKV_SCORE_HOST` ticket is computed, and
//! counted, in its submit.

use crate::args::{need, put_out};
use crate::device::{
    check_stats, cxlkv_attend_request, cxlkv_device, cxlkv_ndp_stats, cxlkv_score_request,
    stats_out, write_attend, write_topk, AttendArgs, ScoreArgs, CXLKV_SCORE_GATHER_V,
    CXLKV_SCORE_HOST,
};
use crate::errors::cxlkv_result::{self, CXLKV_ERR_BUFFER_TOO_SMALL, CXLKV_ERR_INVALID_ARG};
use crate::errors::{fail, guard, map_ndp};
use crate::handles::{borrow, Kind};
use crate::inflight::{Inflight, TopKOut};
use crate::sized::read_in;
use cxlkv_runtime::ndp::NdpStats;
use std::time::{Duration, Instant};

/// `cxlkv_device_wait`'s `timeout_ms` that waits until the ticket is answered (by the device
/// within the handle's timeout, else by the host).
pub const CXLKV_WAIT_FOREVER: u32 = u32::MAX;

/// Submits a SCORE_TOPK (`req` as for `cxlkv_device_score_topk`) and stores its ticket in
/// `*ticket` without waiting. The answer goes, when the ticket is collected by
/// `cxlkv_device_poll` or `cxlkv_device_wait`, to the caller's arrays named here, which must stay
/// valid until then (or until `cxlkv_device_close`): `indices` and `scores` (`cap` entries each,
/// at least lists × k), `values` (`values_cap` bytes, at least lists × k × dim × element size,
/// with `CXLKV_SCORE_GATHER_V`), and `*per_list` (hits per list). Too-small capacities are refused
/// here with `CXLKV_ERR_BUFFER_TOO_SMALL`. With `CXLKV_SCORE_HOST` the host computes the answer in
/// this call and the ticket is ready at once. Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cxlkv_device_submit_score_topk(
    d: *const cxlkv_device,
    req: *const cxlkv_score_request,
    indices: *mut u32,
    scores: *mut f32,
    cap: usize,
    values: *mut u8,
    values_cap: usize,
    per_list: *mut usize,
    ticket: *mut u64,
) -> cxlkv_result {
    guard(|| {
        let dev = borrow(d, Kind::Device)?;
        let r = read_in(req, cxlkv_score_request::default(), "req")?;
        need(indices, "indices")?;
        need(scores, "scores")?;
        need(per_list, "per_list")?;
        need(ticket, "ticket")?;
        let args = ScoreArgs::parse(&r)?;
        let request = args.request();
        let entries = args
            .lists()
            .checked_mul(request.k)
            .ok_or(CXLKV_ERR_INVALID_ARG)?;
        if entries > cap {
            return Err(fail(
                CXLKV_ERR_BUFFER_TOO_SMALL,
                format!("lists × k = {entries} hits need room, capacity {cap}"),
            ));
        }
        let gather = r.flags & CXLKV_SCORE_GATHER_V != 0;
        if gather {
            let bytes = entries
                .checked_mul(request.dtype.bytes(request.dim))
                .ok_or(CXLKV_ERR_INVALID_ARG)?;
            if bytes > values_cap || values.is_null() {
                return Err(fail(
                    CXLKV_ERR_BUFFER_TOO_SMALL,
                    format!(
                        "lists × k rows = {bytes} value bytes need room, capacity {values_cap}"
                    ),
                ));
            }
        }
        let out = TopKOut {
            indices,
            scores,
            cap,
            values,
            values_cap,
            gather,
        };
        let mut st = dev.lock();
        let (t, host) = if r.flags & CXLKV_SCORE_HOST != 0 {
            let top = st.client.score_topk_on_host(&request).map_err(map_ndp)?;
            (None, Some(Box::new(top)))
        } else {
            (
                Some(st.client.submit_score(&request).map_err(map_ndp)?),
                None,
            )
        };
        let id = st.tickets.file(Inflight::TopK {
            ticket: t,
            host,
            out,
            per_list,
        });
        put_out(ticket, id);
        Ok(())
    })
}

/// Submits an ATTEND and stores its ticket in `*ticket` without waiting. When the ticket is
/// collected, per query `g`: `max[g]` = the largest `scale·q·k`, `sum[g]` = Σ exp(scale·q·k −
/// max), and `out[g * dim ..]` = Σ exp(scale·q·k − max)·v (f32; `out / sum` is the attention
/// output), over every token of the blocks (docs/ABI.md, ATTEND). `out` holds `out_cap` floats, at
/// least group × dim; `max` and `sum` hold `group` floats each; all stay valid until the ticket is
/// collected or the device closed. Computed on the host when the device lacks ATTEND. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_device_submit_attend(
    d: *const cxlkv_device,
    req: *const cxlkv_attend_request,
    out: *mut f32,
    out_cap: usize,
    max: *mut f32,
    sum: *mut f32,
    ticket: *mut u64,
) -> cxlkv_result {
    guard(|| {
        let dev = borrow(d, Kind::Device)?;
        let r = read_in(req, cxlkv_attend_request::default(), "req")?;
        need(out, "out")?;
        need(max, "max")?;
        need(sum, "sum")?;
        need(ticket, "ticket")?;
        let args = AttendArgs::parse(&r, out_cap)?;
        let request = args.request();
        let mut st = dev.lock();
        let t = st.client.submit_attend(&request).map_err(map_ndp)?;
        let id = st.tickets.file(Inflight::Attend {
            ticket: t,
            out: args.out(out, max, sum),
        });
        put_out(ticket, id);
        Ok(())
    })
}

/// Collects ticket `id` if it is answered (`block`: waiting for it). Returns its cost when done,
/// `None` when not yet; the ticket is forgotten once done or failed.
fn collect(dev: &cxlkv_device, id: u64, block: bool) -> Result<Option<NdpStats>, cxlkv_result> {
    let mut st = dev.lock();
    let st = &mut *st;
    let Some(entry) = st.tickets.live.remove(&id) else {
        return Err(fail(
            CXLKV_ERR_INVALID_ARG,
            format!("ticket {id} is unknown or already collected"),
        ));
    };
    match entry {
        Inflight::TopK {
            ticket,
            host,
            out,
            per_list,
        } => {
            let top = match (host, ticket) {
                (Some(top), _) => Ok(*top),
                (None, Some(t)) if block => st.client.wait(t),
                (None, Some(t)) => match st.client.poll(&t) {
                    Ok(Some(top)) => Ok(top),
                    Ok(None) => {
                        let again = Inflight::TopK {
                            ticket: Some(t),
                            host: None,
                            out,
                            per_list,
                        };
                        st.tickets.live.insert(id, again);
                        return Ok(None);
                    }
                    Err(e) => Err(e),
                },
                (None, None) => unreachable!("a SCORE_TOPK ticket has a ticket or an answer"),
            };
            let top = top.map_err(map_ndp)?;
            let n = write_topk(&top, &out)?;
            put_out(per_list, n);
            Ok(Some(top.stats))
        }
        Inflight::Attend { ticket, out } => {
            let a = if block {
                st.client.wait_attend(ticket)
            } else {
                match st.client.poll_attend(&ticket) {
                    Ok(Some(a)) => Ok(a),
                    Ok(None) => {
                        let again = Inflight::Attend { ticket, out };
                        st.tickets.live.insert(id, again);
                        return Ok(None);
                    }
                    Err(e) => Err(e),
                }
            };
            let a = a.map_err(map_ndp)?;
            write_attend(&a, &out)?;
            Ok(Some(a.stats))
        }
    }
}

/// Collects `ticket` if it is answered, without blocking: `*done = 1` and the answer written to the
/// arrays named at submit (and its cost to `*stats` unless NULL), or `*done = 0` and nothing
/// written. A ticket is collected once: after `*done = 1`, or after a call that failed on it (the
/// command's own error, e.g. a block missing), it is unknown (`CXLKV_ERR_INVALID_ARG`). A command
/// the device has not answered within the handle's timeout is computed on the host by the call
/// that notices. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_device_poll(
    d: *const cxlkv_device,
    ticket: u64,
    done: *mut i32,
    stats: *mut cxlkv_ndp_stats,
) -> cxlkv_result {
    guard(|| {
        let dev = borrow(d, Kind::Device)?;
        need(done, "done")?;
        check_stats(stats)?;
        deliver(collect(&dev, ticket, false)?, stats, done);
        Ok(())
    })
}

/// Reports a collection to the caller: `*done = 1` and the command's cost in `*stats` (if not
/// NULL) when the ticket was answered, else `*done = 0`.
fn deliver(answer: Option<NdpStats>, stats: *mut cxlkv_ndp_stats, done: *mut i32) {
    match answer {
        Some(s) => {
            stats_out(stats, &s);
            put_out(done, 1);
        }
        None => put_out(done, 0),
    }
}

/// Waits up to `timeout_ms` for `ticket` and collects it as `cxlkv_device_poll` does: `*done = 1`
/// with the answer written, or `*done = 0` when the time ran out (the ticket stays in flight).
/// `CXLKV_WAIT_FOREVER` waits until it is answered, which always happens: by the device within the
/// handle's timeout (`cxlkv_device_open`), else by the host. Other calls on the same handle wait
/// meanwhile. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_device_wait(
    d: *const cxlkv_device,
    ticket: u64,
    timeout_ms: u32,
    done: *mut i32,
    stats: *mut cxlkv_ndp_stats,
) -> cxlkv_result {
    guard(|| {
        let dev = borrow(d, Kind::Device)?;
        need(done, "done")?;
        check_stats(stats)?;
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        let answer = if timeout_ms == CXLKV_WAIT_FOREVER {
            collect(&dev, ticket, true)?
        } else {
            loop {
                if let Some(s) = collect(&dev, ticket, false)? {
                    break Some(s);
                }
                let now = Instant::now();
                if now >= deadline {
                    break None;
                }
                std::thread::sleep((deadline - now).min(Duration::from_micros(50)));
            }
        };
        deliver(answer, stats, done);
        Ok(())
    })
}

/// The tickets still in flight on `d` in `*count` (submitted, not yet collected). Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_device_in_flight(
    d: *const cxlkv_device,
    count: *mut usize,
) -> cxlkv_result {
    guard(|| {
        let dev = borrow(d, Kind::Device)?;
        need(count, "count")?;
        put_out(count, dev.lock().tickets.live.len());
        Ok(())
    })
}
