//! The near-data device handle: `cxlkv_device` (`cxlkv_device_open` / `cxlkv_device_close`), the
//! request and statistics structs, the `CXLKV_SCORE_*` flags, and the two commands,
//! `cxlkv_device_score_topk` and `cxlkv_device_gather`, which write into caller arrays. A device
//! handle keeps its participant alive; docs/ABI.md is the device ABI behind these calls.

use crate::args::{need, put_out, slice_in};
use crate::errors::cxlkv_result::{
    self, CXLKV_ERR_BUFFER_TOO_SMALL, CXLKV_ERR_INVALID_ARG, CXLKV_ERR_NULL, CXLKV_ERR_UNAVAILABLE,
};
use crate::errors::{fail, guard, map_ndp};
use crate::handles::{borrow, register, unregister, Kind};
use crate::keys::cxlkv_key;
use crate::kv::dtype_arg;
use crate::participant::cxlkv_participant;
use cxlkv_runtime::ndp::{BlockSpec, NdpDevice, NdpOptions, NdpPath, NdpStats, ScoreRequest};
use cxlkv_runtime::Participant;
use std::sync::{Arc, Mutex};
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

/// A SCORE_TOPK request (`cxlkv_device_score_topk`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_score_request {
    /// `group × dim` f32 query vectors of one GQA group.
    pub queries: *const f32,
    /// Queries in the group.
    pub group: u32,
    /// Head dimension.
    pub dim: u32,
    /// Blocks of one sequence, in any order.
    pub blocks: *const cxlkv_block_ref,
    /// Number of blocks.
    pub nblocks: usize,
    /// Sequence id the blocks must carry.
    pub sequence: u64,
    /// Layer the blocks must carry.
    pub layer: u32,
    /// KV head to score.
    pub kv_head: u32,
    /// `CXLKV_DTYPE_*` of the blocks.
    pub dtype: u32,
    /// Hits per list.
    pub k: u32,
    /// `CXLKV_SCORE_*` flags.
    pub flags: u32,
}

/// What a device call cost and who computed it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_ndp_stats {
    /// 1 when the device computed the result, 0 when the host did.
    pub on_device: u32,
    /// Blocks whose keys were read.
    pub blocks_scanned: u32,
    /// Blocks skipped on their bounds.
    pub blocks_pruned: u32,
    /// Zero.
    pub reserved: u32,
    /// Bytes that crossed the link, either path (commands, results, or a host scan's reads).
    pub link_bytes: u64,
    /// Key bytes the scanner read.
    pub bytes_scanned: u64,
    /// Wall time from submit to result, nanoseconds.
    pub elapsed_ns: u64,
}

/// An open NDP device client (opaque); owns a reference to its participant.
pub struct cxlkv_device {
    dev: Mutex<NdpDevice>,
    participant: Arc<Participant>,
}

/// Writes a call's cost to `p` unless it is NULL.
fn stats_out(p: *mut cxlkv_ndp_stats, s: &NdpStats) {
    if !p.is_null() {
        put_out(
            p,
            cxlkv_ndp_stats {
                on_device: u32::from(s.path == Some(NdpPath::Device)),
                blocks_scanned: s.blocks_scanned,
                blocks_pruned: s.blocks_pruned,
                reserved: 0,
                link_bytes: s.link_bytes(),
                bytes_scanned: s.bytes_scanned,
                elapsed_ns: u64::try_from(s.elapsed.as_nanos()).unwrap_or(u64::MAX),
            },
        );
    }
}

/// A non-empty block list argument.
fn block_specs(blocks: *const cxlkv_block_ref, n: usize) -> Result<Vec<BlockSpec>, cxlkv_result> {
    if n == 0 {
        return Err(fail(CXLKV_ERR_INVALID_ARG, "no blocks"));
    }
    Ok(slice_in(blocks, n, "blocks")?
        .iter()
        .map(|b| BlockSpec {
            key: b.key.into(),
            token_offset: b.token_offset,
        })
        .collect())
}

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
        let participant = me.inner.clone();
        let mut opts = NdpOptions::default();
        if timeout_ms > 0 {
            opts.timeout = Duration::from_millis(u64::from(timeout_ms));
        }
        let dev = NdpDevice::open(participant.clone(), opts).map_err(map_ndp)?;
        put_out(
            out,
            register(
                Box::new(cxlkv_device {
                    dev: Mutex::new(dev),
                    participant,
                }),
                Kind::Device,
            ),
        );
        Ok(())
    })
}

/// Closes a device client. NULL is accepted and ignored. Not thread-safe with other calls on the
/// same handle.
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
        if req.is_null() {
            return Err(fail(CXLKV_ERR_NULL, "req is NULL"));
        }
        // SAFETY: non-null; the caller promises a valid request for the call.
        let r = unsafe { req.read_unaligned() };
        need(indices, "indices")?;
        need(scores, "scores")?;
        need(per_list, "per_list")?;
        if r.group == 0 || r.dim == 0 || r.k == 0 {
            return Err(fail(
                CXLKV_ERR_INVALID_ARG,
                "group, dim and k must be positive",
            ));
        }
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
        let queries = slice_in(r.queries, nq, "queries")?;
        let blocks = block_specs(r.blocks, r.nblocks)?;
        let dtype = dtype_arg(r.dtype)?;
        let mode = if r.flags & CXLKV_SCORE_GROUP_MAX != 0 {
            cxlkv_kernels::GroupMode::GroupMax
        } else {
            cxlkv_kernels::GroupMode::PerQuery
        };
        let request = ScoreRequest {
            queries,
            dim: r.dim as usize,
            blocks: &blocks,
            sequence: r.sequence,
            layer: r.layer,
            kv_head: r.kv_head,
            dtype,
            k: r.k as usize,
            mode,
            prune: r.flags & CXLKV_SCORE_PRUNE != 0,
            gather_values: r.flags & CXLKV_SCORE_GATHER_V != 0,
            scale: 1.0 / (r.dim as f32).sqrt(),
            select: Default::default(),
        };
        let top = if r.flags & CXLKV_SCORE_HOST != 0 {
            cxlkv_runtime::ndp::host_score_topk(
                dev.participant.pool(),
                &request,
                NdpOptions::default().kernel,
            )
            .map_err(map_ndp)?
        } else {
            dev.dev
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .score_topk(&request)
                .map_err(map_ndp)?
        };
        let n = top.indices.first().map_or(0, Vec::len);
        let lists = top.indices.len();
        let need_entries = lists * n;
        if need_entries > cap {
            return Err(fail(
                CXLKV_ERR_BUFFER_TOO_SMALL,
                format!("{need_entries} hits need room, capacity {cap}"),
            ));
        }
        if request.gather_values
            && (top.values.len() > values_cap || (values.is_null() && !top.values.is_empty()))
        {
            return Err(fail(
                CXLKV_ERR_BUFFER_TOO_SMALL,
                format!("{} value bytes, capacity {values_cap}", top.values.len()),
            ));
        }
        for (l, (idx, sc)) in top.indices.iter().zip(&top.scores).enumerate() {
            for (i, (&ix, &s)) in idx.iter().zip(sc).enumerate() {
                // SAFETY: l * n + i < lists * n ≤ cap, and the caller promises `cap` writable
                // entries in each array.
                unsafe {
                    indices.add(l * n + i).write_unaligned(ix);
                    scores.add(l * n + i).write_unaligned(s);
                }
            }
        }
        if request.gather_values && !top.values.is_empty() {
            // SAFETY: values is non-null with at least values_cap ≥ len writable bytes (checked).
            unsafe { std::ptr::copy_nonoverlapping(top.values.as_ptr(), values, top.values.len()) };
        }
        put_out(per_list, n);
        stats_out(stats, &top.stats);
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
        let blocks = block_specs(blocks, nblocks)?;
        let dtype = dtype_arg(dtype)?;
        if ntokens == 0 || dim == 0 {
            return Err(fail(
                CXLKV_ERR_INVALID_ARG,
                "ntokens and dim must be positive",
            ));
        }
        let toks = slice_in(tokens, ntokens, "tokens")?;
        need(values, "values")?;
        let need_bytes = ntokens
            .checked_mul(dim as usize * dtype.size())
            .ok_or(CXLKV_ERR_INVALID_ARG)?;
        if need_bytes > values_cap {
            return Err(fail(
                CXLKV_ERR_BUFFER_TOO_SMALL,
                format!("{need_bytes} value bytes, capacity {values_cap}"),
            ));
        }
        let (rows, st) = dev
            .dev
            .lock()
            .unwrap_or_else(|e| e.into_inner())
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
