//! The near-data device handle: `cxlkv_device` (`cxlkv_device_open` / `cxlkv_device_close`), the
//! request and statistics structs, the `CXLKV_SCORE_*` flags, and the two commands,
//! `cxlkv_device_score_topk` and `cxlkv_device_gather`, which write into caller arrays. A device
//! handle keeps its participant alive; docs/ABI.md is the device ABI behind these calls.

use crate::args::{need, put_out, slice_in};
use crate::errors::cxlkv_result::{
    self, CXLKV_ERR_BUFFER_TOO_SMALL, CXLKV_ERR_INVALID_ARG, CXLKV_ERR_UNAVAILABLE,
};
use crate::errors::{fail, guard, map_ndp};
use crate::handles::{borrow, register, unregister, Kind};
use crate::inflight::{AttendOut, Tickets, TopKOut};
use crate::keys::cxlkv_key;
use crate::kv::dtype_arg;
use crate::participant::cxlkv_participant;
use crate::sized::{check_out, read_in, sized, write_out};
use cxlkv_runtime::ndp::{
    AttendRequest, Attended, BlockSpec, NdpDevice, NdpOptions, NdpPath, NdpStats, ScoreRequest,
    Select, TopK,
};
use std::sync::Mutex;
use std::time::Duration;

/// `cxlkv_score_request::flags`: one list for the group's maximum score instead of one per query.
pub const CXLKV_SCORE_GROUP_MAX: u32 = 1;
/// `cxlkv_score_request::flags`: skip blocks whose key bounds cannot reach the k-th score (exact).
pub const CXLKV_SCORE_PRUNE: u32 = 2;
/// `cxlkv_score_request::flags`: also return the value rows of the hits.
pub const CXLKV_SCORE_GATHER_V: u32 = 4;
/// `cxlkv_score_request::flags`: compute on the host (the reference path), not on the device.
pub const CXLKV_SCORE_HOST: u32 = 8;

/// A typed block named in a device request: its key and the position of its first token.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_block_ref {
    /// The block's key.
    pub key: cxlkv_key,
    /// Token offset its layout must carry.
    pub token_offset: u64,
}

/// A SCORE_TOPK request (`cxlkv_device_score_topk`, `cxlkv_device_submit_score_topk`). First
/// layout: all of it (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_score_request {
    /// `sizeof(cxlkv_score_request)` as the caller's header declares it.
    pub struct_size: u32,
    /// Queries in the group.
    pub group: u32,
    /// `group × dim` f32 query vectors of one GQA group.
    pub queries: *const f32,
    /// Head dimension.
    pub dim: u32,
    /// Layer the blocks must carry.
    pub layer: u32,
    /// Blocks of one sequence, in any order.
    pub blocks: *const cxlkv_block_ref,
    /// Number of blocks.
    pub nblocks: usize,
    /// Sequence id the blocks must carry.
    pub sequence: u64,
    /// KV head to score.
    pub kv_head: u32,
    /// `CXLKV_DTYPE_*` of the blocks.
    pub dtype: u32,
    /// Hits per list.
    pub k: u32,
    /// `CXLKV_SCORE_*` flags.
    pub flags: u32,
}
sized!(cxlkv_score_request, 64);

impl Default for cxlkv_score_request {
    fn default() -> Self {
        cxlkv_score_request {
            struct_size: 0,
            group: 0,
            queries: std::ptr::null(),
            dim: 0,
            layer: 0,
            blocks: std::ptr::null(),
            nblocks: 0,
            sequence: 0,
            kv_head: 0,
            dtype: 0,
            k: 0,
            flags: 0,
        }
    }
}

/// What a device call cost and who computed it. First layout: all of it (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_ndp_stats {
    /// `sizeof(cxlkv_ndp_stats)` as the caller's header declares it; on return, the bytes written.
    pub struct_size: u32,
    /// 1 when the device computed the result, 0 when the host did.
    pub on_device: u32,
    /// Blocks whose keys were read.
    pub blocks_scanned: u32,
    /// Blocks skipped on their bounds.
    pub blocks_pruned: u32,
    /// Bytes that crossed the link, either path (commands, results, or a host scan's reads).
    pub link_bytes: u64,
    /// Key bytes the scanner read.
    pub bytes_scanned: u64,
    /// Wall time from submit to result, nanoseconds.
    pub elapsed_ns: u64,
}

sized!(cxlkv_ndp_stats, 40);

/// An open NDP device client (opaque); its client owns a reference to its participant.
pub struct cxlkv_device {
    pub(crate) dev: Mutex<DeviceState>,
}

/// The client and the tickets of `cxlkv_device_submit_*` not yet collected.
pub(crate) struct DeviceState {
    pub(crate) client: NdpDevice,
    pub(crate) tickets: Tickets,
}

impl cxlkv_device {
    /// The client, locked (calls on one handle are serialized).
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, DeviceState> {
        self.dev.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Checks an optional stats out-pointer (NULL is fine) before any work.
pub(crate) fn check_stats(p: *mut cxlkv_ndp_stats) -> Result<(), cxlkv_result> {
    if p.is_null() {
        Ok(())
    } else {
        check_out(p, "stats")
    }
}

/// Writes a call's cost to `p` (checked with `check_stats`) unless it is NULL.
pub(crate) fn stats_out(p: *mut cxlkv_ndp_stats, s: &NdpStats) {
    if !p.is_null() {
        write_out(
            p,
            cxlkv_ndp_stats {
                struct_size: 0,
                on_device: u32::from(s.path == Some(NdpPath::Device)),
                blocks_scanned: s.blocks_scanned,
                blocks_pruned: s.blocks_pruned,
                link_bytes: s.link_bytes(),
                bytes_scanned: s.bytes_scanned,
                elapsed_ns: u64::try_from(s.elapsed.as_nanos()).unwrap_or(u64::MAX),
            },
        );
    }
}

/// A block list argument (the runtime's request check refuses an empty one).
pub(crate) fn block_specs(
    blocks: *const cxlkv_block_ref,
    n: usize,
) -> Result<Vec<BlockSpec>, cxlkv_result> {
    Ok(slice_in(blocks, n, "blocks")?
        .iter()
        .map(|b| BlockSpec {
            key: b.key.into(),
            token_offset: b.token_offset,
        })
        .collect())
}

/// Options of `cxlkv_device_open_with`; start from `CXLKV_STRUCT_INIT(cxlkv_device_config)` (every
/// 0 is a default). First layout: all of it (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_device_config {
    /// `sizeof(cxlkv_device_config)` as the caller's header declares it.
    pub struct_size: u32,
    /// How long a command may take before the client computes it on the host instead, in
    /// milliseconds (0: 2000).
    pub timeout_ms: u32,
    /// Commands that may be on the device at once, each with a staging block of the
    /// participant's partition held for the life of the handle (0: 2). Tickets beyond it are
    /// computed on the host when collected.
    pub staging: u32,
    /// Zero.
    pub reserved: u32,
}
sized!(cxlkv_device_config, 16);

/// Opens a client of the pool's NDP device for this participant (its queue pair); `timeout_ms` is
/// how long a command may take before the client computes it on the host instead (0: 2000 ms).
/// Works, falling back to the host, when no device runs. Release with `cxlkv_device_close`. A
/// device handle may be used from several threads (calls are serialized). Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_device_open(
    p: *const cxlkv_participant,
    timeout_ms: u32,
    out: *mut *mut cxlkv_device,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        need(out, "out")?;
        open(&me, timeout_ms, 0, out)
    })
}

/// `cxlkv_device_open` with options (`config` NULL: the defaults), e.g. more commands on the
/// device at once for asynchronous tickets. `CXLKV_ERR_INVALID_ARG` for more than 16 staging blocks
/// or nonzero `reserved`; `CXLKV_ERR_FULL` when the partition cannot spare the staging blocks.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_device_open_with(
    p: *const cxlkv_participant,
    config: *const cxlkv_device_config,
    out: *mut *mut cxlkv_device,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        let c = if config.is_null() {
            cxlkv_device_config::default()
        } else {
            read_in(config, cxlkv_device_config::default(), "config")?
        };
        need(out, "out")?;
        if c.staging > 16 || c.reserved != 0 {
            return Err(fail(
                CXLKV_ERR_INVALID_ARG,
                format!(
                    "staging {} (at most 16, the ring's depth) and reserved {} (must be 0)",
                    c.staging, c.reserved
                ),
            ));
        }
        open(&me, c.timeout_ms, c.staging, out)
    })
}

fn open(
    me: &cxlkv_participant,
    timeout_ms: u32,
    staging: u32,
    out: *mut *mut cxlkv_device,
) -> Result<(), cxlkv_result> {
    let participant = me.inner.clone();
    let mut opts = NdpOptions::default();
    if timeout_ms > 0 {
        opts.timeout = Duration::from_millis(u64::from(timeout_ms));
    }
    if staging > 0 {
        opts.staging = staging as usize;
    }
    let dev = NdpDevice::open(participant, opts).map_err(map_ndp)?;
    put_out(
        out,
        register(
            Box::new(cxlkv_device {
                dev: Mutex::new(DeviceState {
                    client: dev,
                    tickets: Default::default(),
                }),
            }),
            Kind::Device,
        ),
    );
    Ok(())
}

/// Closes a device client. NULL is accepted and ignored. Tickets not yet collected are dropped:
/// their result buffers are never written after this returns, and a command still on the device
/// keeps its staging block out of use until the device is done. A call on the handle already
/// running on another thread finishes first (a poll or wait writes the answer of the ticket it
/// collects), and the client is closed when it returns; calls after this return
/// `CXLKV_ERR_INVALID_HANDLE`. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_device_close(d: *mut cxlkv_device) -> cxlkv_result {
    guard(|| {
        if d.is_null() {
            return Ok(());
        }
        unregister(d, Kind::Device).map(drop)
    })
}

/// Top-k attention scores over typed blocks, computed by the near-data device (or by the host
/// when the device is absent, late, or `CXLKV_SCORE_HOST` is set: same answer). Lists: one per
/// query, or one with `CXLKV_SCORE_GROUP_MAX`; `n = min(k, tokens)` hits per list, best first, are
/// written to `indices[list * n + i]` and `scores[...]` (capacity `cap` entries each); with
/// `CXLKV_SCORE_GATHER_V`, their value rows (`dim` elements of `dtype`) to `values` (capacity
/// `values_cap` bytes). `*per_list` receives `n`; `stats` may be NULL. Too-small arrays return
/// `CXLKV_ERR_BUFFER_TOO_SMALL` (nothing written). Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cxlkv_device_score_topk(
    d: *const cxlkv_device,
    req: *const cxlkv_score_request,
    indices: *mut u32,
    scores: *mut f32,
    cap: usize,
    values: *mut u8,
    values_cap: usize,
    per_list: *mut usize,
    stats: *mut cxlkv_ndp_stats,
) -> cxlkv_result {
    guard(|| {
        let dev = borrow(d, Kind::Device)?;
        let r = read_in(req, cxlkv_score_request::default(), "req")?;
        need(indices, "indices")?;
        need(scores, "scores")?;
        need(per_list, "per_list")?;
        check_stats(stats)?;
        let args = ScoreArgs::parse(&r)?;
        let request = args.request();
        let top = if r.flags & CXLKV_SCORE_HOST != 0 {
            dev.lock().client.score_topk_on_host(&request)
        } else {
            dev.lock().client.score_topk(&request)
        };
        let top = top.map_err(map_ndp)?;
        let n = write_topk(
            &top,
            &TopKOut {
                indices,
                scores,
                cap,
                values,
                values_cap,
                gather: request.gather_values,
            },
        )?;
        put_out(per_list, n);
        stats_out(stats, &top.stats);
        Ok(())
    })
}

/// `cxlkv_select::flags`: `window_start..window_end` is always in each list.
pub const CXLKV_SELECT_WINDOW: u32 = 1;
/// `cxlkv_select::flags`: `exclude_start..exclude_end` is never returned nor counted in the mass.
pub const CXLKV_SELECT_EXCLUDE: u32 = 2;

/// The selection of `cxlkv_device_score_select` (docs/ABI.md, "Commands"): over the
/// stored tokens of the blocks, each list holds the forced tokens (`0..sinks` and the window, less
/// the exclusion) and then the best-scored others, up to `k` in all, or with `top_p` the fewest
/// whose softmax mass reaches `p` (at most `k`). Start from `CXLKV_STRUCT_INIT(cxlkv_select)`
/// (every 0 is "none"). First layout: all of it (56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_select {
    /// `sizeof(cxlkv_select)` as the caller's header declares it.
    pub struct_size: u32,
    /// `p` in (0, 1], or 0 for plain top-k.
    pub top_p: f32,
    /// Tokens `0..sinks` are always in each list (0: none).
    pub sinks: u64,
    /// Start of the window (with `CXLKV_SELECT_WINDOW`).
    pub window_start: u64,
    /// End of the window, exclusive.
    pub window_end: u64,
    /// Start of the excluded range (with `CXLKV_SELECT_EXCLUDE`).
    pub exclude_start: u64,
    /// End of the excluded range, exclusive.
    pub exclude_end: u64,
    /// Applied to `q·k` before `exp` in every softmax mass; 0 means `1/sqrt(dim)`.
    pub scale: f32,
    /// `CXLKV_SELECT_*` flags.
    pub flags: u32,
}
sized!(cxlkv_select, 56);

impl cxlkv_select {
    /// The runtime's selection and scale (its checks are the runtime's, `Select::check`).
    fn select(&self) -> Result<(Select, Option<f32>), cxlkv_result> {
        if self.flags & !(CXLKV_SELECT_WINDOW | CXLKV_SELECT_EXCLUDE) != 0 {
            return Err(fail(
                CXLKV_ERR_INVALID_ARG,
                format!("unknown selection flags {:#x}", self.flags),
            ));
        }
        let on = |f: u32| self.flags & f != 0;
        let sel = Select {
            sinks: self.sinks,
            window: on(CXLKV_SELECT_WINDOW).then_some((self.window_start, self.window_end)),
            exclude: on(CXLKV_SELECT_EXCLUDE).then_some((self.exclude_start, self.exclude_end)),
            top_p: (self.top_p != 0.0).then_some(self.top_p),
        };
        Ok((sel, (self.scale != 0.0).then_some(self.scale)))
    }
}

/// SCORE_TOPK with a selection (`sel`; `req` as for `cxlkv_device_score_topk`, its
/// `CXLKV_SCORE_PRUNE` ignored: a selection scores every stored token), on the device or the
/// host, same answer. Lists may differ in length, so each has `k = req->k` slots: list `l`'s hits
/// are `indices[l * k + i]` and `scores[...]` for `i < counts[l]` (`cap` entries each, at least
/// lists × k), best first; `left_out_mass[l]` is the softmax mass of the candidates it leaves out;
/// `counts` and `left_out_mass` hold `lists` entries (at least the number of lists); with
/// `CXLKV_SCORE_GATHER_V`, hit `(l, i)`'s value row is at row `l * k + i` of `values`
/// (`values_cap` bytes, at least lists × k rows). Slots past `counts[l]` are left as they were.
/// `stats` may be NULL. Too-small arrays: `CXLKV_ERR_BUFFER_TOO_SMALL`, nothing written.
/// Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cxlkv_device_score_select(
    d: *const cxlkv_device,
    req: *const cxlkv_score_request,
    sel: *const cxlkv_select,
    indices: *mut u32,
    scores: *mut f32,
    cap: usize,
    counts: *mut u32,
    left_out_mass: *mut f32,
    lists: usize,
    values: *mut u8,
    values_cap: usize,
    stats: *mut cxlkv_ndp_stats,
) -> cxlkv_result {
    guard(|| {
        let dev = borrow(d, Kind::Device)?;
        let r = read_in(req, cxlkv_score_request::default(), "req")?;
        let s = read_in(sel, cxlkv_select::default(), "sel")?;
        need(indices, "indices")?;
        need(scores, "scores")?;
        need(counts, "counts")?;
        need(left_out_mass, "left_out_mass")?;
        check_stats(stats)?;
        let args = ScoreArgs::parse(&r)?;
        let (select, scale) = s.select()?;
        let mut request = args.request();
        request.select = select;
        request.scale = scale;
        let (n, k) = (args.lists(), request.k);
        let row = request.dtype.bytes(request.dim);
        let room = n.checked_mul(k).ok_or(CXLKV_ERR_INVALID_ARG)?;
        let rows_room = room.checked_mul(row).ok_or(CXLKV_ERR_INVALID_ARG)?;
        if room > cap
            || n > lists
            || (request.gather_values && (rows_room > values_cap || values.is_null()))
        {
            return Err(fail(
                CXLKV_ERR_BUFFER_TOO_SMALL,
                format!(
                    "{n} lists of {k} slots ({rows_room} value bytes with GATHER_V) need room; \
                     capacities {cap} slots, {lists} lists, {values_cap} value bytes"
                ),
            ));
        }
        let top = if r.flags & CXLKV_SCORE_HOST != 0 {
            dev.lock().client.score_topk_on_host(&request)
        } else {
            dev.lock().client.score_topk(&request)
        }
        .map_err(map_ndp)?;
        if top.indices.len() != n || top.indices.iter().any(|l| l.len() > k) {
            return Err(fail(
                CXLKV_ERR_UNAVAILABLE,
                format!("the answer has {} lists, expected {n}", top.indices.len()),
            ));
        }
        let mut at_row = 0;
        for (l, (idx, sc)) in top.indices.iter().zip(&top.scores).enumerate() {
            let mass = top.left_out_mass.get(l).copied().unwrap_or(0.0);
            // SAFETY: l < n ≤ lists, and l * k + i < n * k ≤ cap (checked above), within the
            // arrays the caller promises.
            unsafe {
                counts.add(l).write_unaligned(idx.len() as u32);
                left_out_mass.add(l).write_unaligned(mass);
                for (i, (&ix, &sv)) in idx.iter().zip(sc).enumerate() {
                    indices.add(l * k + i).write_unaligned(ix);
                    scores.add(l * k + i).write_unaligned(sv);
                }
            }
            if request.gather_values {
                let len = idx.len() * row;
                let got = top.values.get(at_row..at_row + len).ok_or_else(|| {
                    fail(
                        CXLKV_ERR_UNAVAILABLE,
                        "the value rows of the answer are short",
                    )
                })?;
                // SAFETY: values is non-null with values_cap ≥ n * k * row bytes (checked), and
                // list l's rows end at (l * k + idx.len()) * row ≤ n * k * row.
                unsafe {
                    std::ptr::copy_nonoverlapping(got.as_ptr(), values.add(l * k * row), len)
                };
                at_row += len;
            }
        }
        stats_out(stats, &top.stats);
        Ok(())
    })
}

/// A checked SCORE_TOPK request, owning its block list.
pub(crate) struct ScoreArgs<'a> {
    pub(crate) queries: &'a [f32],
    blocks: Vec<BlockSpec>,
    r: cxlkv_score_request,
    dtype: cxlkv_kernels::DType,
}

impl<'a> ScoreArgs<'a> {
    /// Reads `r`'s flags and arrays; the runtime's request check judges the rest (group, dim,
    /// k, blocks, scale).
    pub(crate) fn parse(r: &cxlkv_score_request) -> Result<ScoreArgs<'a>, cxlkv_result> {
        if r.flags
            & !(CXLKV_SCORE_GROUP_MAX | CXLKV_SCORE_PRUNE | CXLKV_SCORE_GATHER_V | CXLKV_SCORE_HOST)
            != 0
        {
            return Err(fail(
                CXLKV_ERR_INVALID_ARG,
                format!("unknown flags {:#x}", r.flags),
            ));
        }
        let nq = (r.group as usize)
            .checked_mul(r.dim as usize)
            .ok_or(CXLKV_ERR_INVALID_ARG)?;
        Ok(ScoreArgs {
            queries: slice_in(r.queries, nq, "queries")?,
            blocks: block_specs(r.blocks, r.nblocks)?,
            r: *r,
            dtype: dtype_arg(r.dtype)?,
        })
    }

    /// Lists the answer will have.
    pub(crate) fn lists(&self) -> usize {
        if self.r.flags & CXLKV_SCORE_GROUP_MAX != 0 {
            1
        } else {
            self.r.group as usize
        }
    }

    /// The runtime's request.
    pub(crate) fn request(&self) -> ScoreRequest<'_> {
        let r = &self.r;
        ScoreRequest {
            queries: self.queries,
            dim: r.dim as usize,
            blocks: &self.blocks,
            sequence: r.sequence,
            layer: r.layer,
            kv_head: r.kv_head,
            dtype: self.dtype,
            k: r.k as usize,
            mode: if r.flags & CXLKV_SCORE_GROUP_MAX != 0 {
                cxlkv_kernels::GroupMode::GroupMax
            } else {
                cxlkv_kernels::GroupMode::PerQuery
            },
            prune: r.flags & CXLKV_SCORE_PRUNE != 0,
            gather_values: r.flags & CXLKV_SCORE_GATHER_V != 0,
            scale: None,
            select: Default::default(),
        }
    }
}

/// Writes `top` into the caller's arrays (checked non-null, with the capacities the caller
/// promises); returns the hits per list. Too-small arrays: `CXLKV_ERR_BUFFER_TOO_SMALL`, nothing
/// written.
pub(crate) fn write_topk(top: &TopK, o: &TopKOut) -> Result<usize, cxlkv_result> {
    let n = top.indices.first().map_or(0, Vec::len);
    let lists = top.indices.len();
    let need_entries = lists * n;
    if need_entries > o.cap {
        return Err(fail(
            CXLKV_ERR_BUFFER_TOO_SMALL,
            format!("{need_entries} hits need room, capacity {}", o.cap),
        ));
    }
    if o.gather
        && (top.values.len() > o.values_cap || (o.values.is_null() && !top.values.is_empty()))
    {
        return Err(fail(
            CXLKV_ERR_BUFFER_TOO_SMALL,
            format!(
                "{} value bytes, capacity {}",
                top.values.len(),
                o.values_cap
            ),
        ));
    }
    for (l, (idx, sc)) in top.indices.iter().zip(&top.scores).enumerate() {
        for (i, (&ix, &s)) in idx.iter().zip(sc).enumerate() {
            // SAFETY: l * n + i < lists * n ≤ cap, and the caller promises `cap` writable
            // entries in each array.
            unsafe {
                o.indices.add(l * n + i).write_unaligned(ix);
                o.scores.add(l * n + i).write_unaligned(s);
            }
        }
    }
    if o.gather && !top.values.is_empty() {
        // SAFETY: values is non-null with at least values_cap ≥ len writable bytes (checked).
        unsafe { std::ptr::copy_nonoverlapping(top.values.as_ptr(), o.values, top.values.len()) };
    }
    Ok(n)
}

/// An ATTEND request (`cxlkv_device_submit_attend`): the partial attention of `group` queries over
/// every token of the blocks. First layout: all of it (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_attend_request {
    /// `sizeof(cxlkv_attend_request)` as the caller's header declares it.
    pub struct_size: u32,
    /// Queries in the group.
    pub group: u32,
    /// `group × dim` f32 query vectors of one GQA group.
    pub queries: *const f32,
    /// Head dimension.
    pub dim: u32,
    /// Layer the blocks must carry.
    pub layer: u32,
    /// Blocks of one sequence.
    pub blocks: *const cxlkv_block_ref,
    /// Number of blocks.
    pub nblocks: usize,
    /// Sequence id the blocks must carry.
    pub sequence: u64,
    /// KV head to read.
    pub kv_head: u32,
    /// `CXLKV_DTYPE_*` of the blocks.
    pub dtype: u32,
    /// Applied to `q·k` before `exp`; 0 means `1/sqrt(dim)`.
    pub scale: f32,
    /// Zero.
    pub reserved: u32,
}
sized!(cxlkv_attend_request, 64);

impl Default for cxlkv_attend_request {
    fn default() -> Self {
        cxlkv_attend_request {
            struct_size: 0,
            group: 0,
            queries: std::ptr::null(),
            dim: 0,
            layer: 0,
            blocks: std::ptr::null(),
            nblocks: 0,
            sequence: 0,
            kv_head: 0,
            dtype: 0,
            scale: 0.0,
            reserved: 0,
        }
    }
}

/// A checked ATTEND request, owning its block list.
pub(crate) struct AttendArgs<'a> {
    queries: &'a [f32],
    blocks: Vec<BlockSpec>,
    r: cxlkv_attend_request,
    dtype: cxlkv_kernels::DType,
}

impl<'a> AttendArgs<'a> {
    /// Reads `r`'s arrays and checks that `out_cap` floats hold `group × dim` outputs; the
    /// runtime's request check judges the rest (group, dim, blocks, scale).
    pub(crate) fn parse(
        r: &cxlkv_attend_request,
        out_cap: usize,
    ) -> Result<AttendArgs<'a>, cxlkv_result> {
        if r.reserved != 0 {
            return Err(fail(CXLKV_ERR_INVALID_ARG, "reserved must be 0"));
        }
        let nq = (r.group as usize)
            .checked_mul(r.dim as usize)
            .ok_or(CXLKV_ERR_INVALID_ARG)?;
        if nq > out_cap {
            return Err(fail(
                CXLKV_ERR_BUFFER_TOO_SMALL,
                format!("group × dim = {nq} outputs need room, capacity {out_cap}"),
            ));
        }
        Ok(AttendArgs {
            queries: slice_in(r.queries, nq, "queries")?,
            blocks: block_specs(r.blocks, r.nblocks)?,
            r: *r,
            dtype: dtype_arg(r.dtype)?,
        })
    }

    /// The runtime's request (a `scale` of 0 is the runtime's default).
    pub(crate) fn request(&self) -> AttendRequest<'_> {
        let r = &self.r;
        AttendRequest {
            queries: self.queries,
            dim: r.dim as usize,
            blocks: &self.blocks,
            sequence: r.sequence,
            layer: r.layer,
            kv_head: r.kv_head,
            dtype: self.dtype,
            scale: (r.scale != 0.0).then_some(r.scale),
            sparse: None,
        }
    }

    /// Where the answer goes.
    pub(crate) fn out(&self, out: *mut f32, max: *mut f32, sum: *mut f32) -> AttendOut {
        AttendOut {
            out,
            max,
            sum,
            group: self.r.group as usize,
            dim: self.r.dim as usize,
        }
    }
}

/// Writes an ATTEND answer to the caller's arrays.
pub(crate) fn write_attend(a: &Attended, o: &AttendOut) -> Result<(), cxlkv_result> {
    if a.partials.len() != o.group || a.partials.iter().any(|p| p.out.len() != o.dim) {
        return Err(fail(
            crate::errors::cxlkv_result::CXLKV_ERR_UNAVAILABLE,
            format!(
                "ATTEND answered {} partials, expected {}",
                a.partials.len(),
                o.group
            ),
        ));
    }
    for (g, p) in a.partials.iter().enumerate() {
        // SAFETY: g < group and the caller promised `group` floats at max and sum and
        // group × dim ≤ out_cap floats at out (checked by `AttendArgs::parse`), valid until the answer is written.
        unsafe {
            o.max.add(g).write_unaligned(p.max);
            o.sum.add(g).write_unaligned(p.sum);
            for (i, &x) in p.out.iter().enumerate() {
                o.out.add(g * o.dim + i).write_unaligned(x);
            }
        }
    }
    Ok(())
}

/// The attention of the request's queries over every token of its blocks, computed by the
/// near-data device (or by the host when the device is absent, late or lacks ATTEND: same answer),
/// written before the call returns: per query `g`, `max[g]` = the largest `scale·q·k`, `sum[g]` =
/// Σ exp(scale·q·k − max), and `out[g * dim ..]` = Σ exp(scale·q·k − max)·v (f32; `out / sum` is
/// the attention output). `out` holds `out_cap` floats, at least group × dim; `max` and `sum` hold
/// `group` floats each; `stats` may be NULL. The synchronous form of `cxlkv_device_submit_attend`
/// (same request, same answer). Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_device_attend(
    d: *const cxlkv_device,
    req: *const cxlkv_attend_request,
    out: *mut f32,
    out_cap: usize,
    max: *mut f32,
    sum: *mut f32,
    stats: *mut cxlkv_ndp_stats,
) -> cxlkv_result {
    guard(|| {
        let dev = borrow(d, Kind::Device)?;
        let r = read_in(req, cxlkv_attend_request::default(), "req")?;
        need(out, "out")?;
        need(max, "max")?;
        need(sum, "sum")?;
        check_stats(stats)?;
        let args = AttendArgs::parse(&r, out_cap)?;
        let a = dev.lock().client.attend(&args.request()).map_err(map_ndp)?;
        write_attend(&a, &args.out(out, max, sum))?;
        stats_out(stats, &a.stats);
        Ok(())
    })
}

/// Gathers the value rows of `tokens[0..ntokens]` (`dim` elements of `dtype` each, token order)
/// from typed blocks of one sequence into `values` (capacity `values_cap` bytes); on the device, or
/// on the host when it is unavailable. `stats` may be NULL. Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cxlkv_device_gather(
    d: *const cxlkv_device,
    blocks: *const cxlkv_block_ref,
    nblocks: usize,
    sequence: u64,
    layer: u32,
    kv_head: u32,
    dtype: u32,
    dim: u32,
    tokens: *const u32,
    ntokens: usize,
    values: *mut u8,
    values_cap: usize,
    stats: *mut cxlkv_ndp_stats,
) -> cxlkv_result {
    guard(|| {
        let dev = borrow(d, Kind::Device)?;
        check_stats(stats)?;
        let blocks = block_specs(blocks, nblocks)?;
        let dtype = dtype_arg(dtype)?;
        let toks = slice_in(tokens, ntokens, "tokens")?;
        need(values, "values")?;
        let need_bytes = ntokens
            .checked_mul(dtype.bytes(dim as usize))
            .ok_or(CXLKV_ERR_INVALID_ARG)?;
        if need_bytes > values_cap {
            return Err(fail(
                CXLKV_ERR_BUFFER_TOO_SMALL,
                format!("{need_bytes} value bytes, capacity {values_cap}"),
            ));
        }
        let (rows, st) = dev
            .lock()
            .client
            .gather(&blocks, sequence, layer, kv_head, dtype, dim as usize, toks)
            .map_err(map_ndp)?;
        if rows.len() != need_bytes {
            return Err(fail(
                CXLKV_ERR_UNAVAILABLE,
                format!(
                    "gather returned {} bytes, expected {need_bytes}",
                    rows.len()
                ),
            ));
        }
        // SAFETY: values is non-null with values_cap ≥ need_bytes writable bytes (checked).
        unsafe { std::ptr::copy_nonoverlapping(rows.as_ptr(), values, need_bytes) };
        stats_out(stats, &st);
        Ok(())
    })
}
