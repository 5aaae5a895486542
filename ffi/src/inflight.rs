//! The tickets of a device handle not yet collected (`cxlkv_device_submit_*`, collected by
//! `cxlkv_device_poll` / `_wait` in `tickets`): each with the caller's result arrays named at
//! submit time, which the library writes only when the ticket is collected.

use cxlkv_runtime::ndp::{Ticket, TopK};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a SCORE_TOPK answer goes: the caller's arrays.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TopKOut {
    pub(crate) indices: *mut u32,
    pub(crate) scores: *mut f32,
    pub(crate) cap: usize,
    pub(crate) values: *mut u8,
    pub(crate) values_cap: usize,
    pub(crate) gather: bool,
}

/// Where an ATTEND answer goes: `out[group][dim]`, `max[group]`, `sum[group]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttendOut {
    pub(crate) out: *mut f32,
    pub(crate) max: *mut f32,
    pub(crate) sum: *mut f32,
    pub(crate) group: usize,
    pub(crate) dim: usize,
}

/// A ticket not yet collected: the client's ticket (or an answer computed at submit time) and the
/// caller's result arrays.
pub(crate) enum Inflight {
    TopK {
        ticket: Option<Ticket>,
        host: Option<Box<TopK>>,
        out: TopKOut,
        per_list: *mut usize,
    },
    Attend {
        ticket: Ticket,
        out: AttendOut,
    },
}

/// The tickets of one device handle, by the number the caller holds. Numbers are unique in the
/// process (never 0), so a ticket of one handle passed to another is unknown there, not another
/// command's.
#[derive(Default)]
pub(crate) struct Tickets {
    pub(crate) live: HashMap<u64, Inflight>,
}

impl Tickets {
    pub(crate) fn file(&mut self, t: Inflight) -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        self.live.insert(id, t);
        id
    }
}

// SAFETY: the raw pointers are the caller's result arrays, named at submit and written only by the
// poll or wait that collects the ticket, under the device handle's lock. The header makes the
// caller keep them valid and untouched until then (or until `cxlkv_device_close`), from whichever
// thread collects: a device handle is thread-safe, so its registered object (`handles`) must be
// `Send + Sync`, and moving these addresses to another thread moves no data.
unsafe impl Send for Inflight {}
