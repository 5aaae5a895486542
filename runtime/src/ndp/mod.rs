//! The near-data-processing (NDP) device as the runtime sees it: its ABI, the checks both sides
//! apply to what they read, the scan both sides run, and the host client.
//!
//! The device lives next to the pool's memory and serves one queue pair per participant slot in
//! the pool's device area ([`abi`], generated from `ndp-emulator/include/cxlkv_ndp.h`; prose in
//! docs/ABI.md). A command names typed KV blocks by key and carries the offsets of an argument
//! buffer and a result buffer, both inside blocks of the submitter's own partition; the device
//! answers with the top-k `(token, score)` hits and, if asked, the selected value rows, so only
//! those bytes cross the link instead of every key.
//!
//! - [`DeviceLayout`]: where the registers and queue pairs are, from the superblock alone.
//! - [`resolve_block`]: the block validation both the device and the host fallback apply (header
//!   CRC and index sequence via [`Pool::block_ref`], then the typed layout against the command).
//! - [`TopKScan`]: the scan both sides run with the `cxlkv-kernels` kernels, so the device and the
//!   host fallback return bit-identical results; pruning on the stored per-head key bounds is exact.
//! - [`encode_topk_result`] / [`decode_topk_result`]: the result buffer format.
//! - [`client::NdpDevice`]: submit, poll, wait with a timeout, and the host fallback.
//!
//! Invariants: offsets, never addresses, cross the ABI; the device copies its arguments out of
//! shared memory before checking them; every shared ring index is an atomic with a named ordering.

#[allow(
    missing_docs,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
// Generated code: bindgen's `Default` for the register block zeroes it with `write_bytes`
// (sound: every field is an integer or an array of integers).
    clippy::undocumented_unsafe_blocks
)]
#[rustfmt::skip] // bindgen's output verbatim: the drift test compares it byte for byte.
pub mod abi;
pub mod client;

pub use cxlkv_shm::futex::{wait as futex_wait, wake as futex_wake};

pub use client::{
    host_gather, host_score_topk, BlockSpec, FallbackReason, NdpDevice, NdpError, NdpOptions,
    NdpPath, NdpStats, ScoreRequest, Ticket, TopK,
};

use crate::coherence::{self, Site};
use crate::format::{self, Codec, KvLayout, Plain};
use crate::key::Key;
use crate::kv::LAYOUT_SIZE;
use crate::pool::{BlockRef, Pool};
use abi::*;
use cxlkv_kernels::{
    upper_bound, DType, GroupMode, Hit, KeyRows, QueryGroup, ScoreKernel, TopKSelector,
};
use cxlkv_shm::mem::SharedMemory;

// SAFETY (for the five impls below): bindgen emits them `#[repr(C)]`; the compile-time layout
// assertions in `abi.rs` pin every offset and the size, which leave no padding; all fields are
// integers, f32 or arrays of them, so every bit pattern is valid.
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_cmd {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_cpl {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_block {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_result {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_hot_entry {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_hit {}

/// Byte offsets of register words (from the device area), for atomic access.
pub mod reg {
    use super::abi::cxlkv_ndp_regs as R;
    use std::mem::offset_of;
    /// `magic`.
    pub const MAGIC: u64 = offset_of!(R, magic) as u64;
    /// `abi_major` and `abi_minor` (one u64 word).
    pub const ABI: u64 = offset_of!(R, abi_major) as u64;
    /// `capabilities`.
    pub const CAPABILITIES: u64 = offset_of!(R, capabilities) as u64;
    /// `generation`.
    pub const GENERATION: u64 = offset_of!(R, generation) as u64;
    /// `pid`.
    pub const PID: u64 = offset_of!(R, pid) as u64;
    /// `heartbeat_ns`.
    pub const HEARTBEAT: u64 = offset_of!(R, heartbeat_ns) as u64;
    /// `sleeping`.
    pub const SLEEPING: u64 = offset_of!(R, sleeping) as u64;
    /// `doorbell`.
    pub const DOORBELL: u64 = offset_of!(R, doorbell) as u64;
    /// `counters[0]`.
    pub const COUNTERS: u64 = offset_of!(R, counters) as u64;
    /// `link_bw_mbps`.
    pub const LINK_BW: u64 = offset_of!(R, link_bw_mbps) as u64;
    /// `link_latency_ns`.
    pub const LINK_LATENCY: u64 = offset_of!(R, link_latency_ns) as u64;
    /// `internal_bw_mbps`.
    pub const INTERNAL_BW: u64 = offset_of!(R, internal_bw_mbps) as u64;
    /// `hot_epoch` (then `hot_count`, `hot_epoch_ns`, then the window).
    pub const HOT_EPOCH: u64 = offset_of!(R, hot_epoch) as u64;
    /// `hot_count`.
    pub const HOT_COUNT: u64 = offset_of!(R, hot_count) as u64;
    /// `hot[0]`.
    pub const HOT: u64 = offset_of!(R, hot) as u64;
}

/// Byte offsets of ring indices within a queue pair.
pub mod qpi {
    use super::abi::cxlkv_ndp_qp_indices as I;
    use std::mem::offset_of;
    /// `sq_tail` (client-written).
    pub const SQ_TAIL: u64 = offset_of!(I, sq_tail) as u64;
    /// `sq_head` (device-written).
    pub const SQ_HEAD: u64 = offset_of!(I, sq_head) as u64;
    /// `cq_tail` (device-written; the completion futex word).
    pub const CQ_TAIL: u64 = offset_of!(I, cq_tail) as u64;
    /// `cq_head` (client-written).
    pub const CQ_HEAD: u64 = offset_of!(I, cq_head) as u64;
    /// `cq_waiters` (client-written).
    pub const CQ_WAITERS: u64 = offset_of!(I, cq_waiters) as u64;
}

/// Queue depth (entries per ring).
pub const DEPTH: u64 = CXLKV_NDP_QUEUE_DEPTH as u64;

/// Where the device's structures are in a pool, derived from the superblock alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLayout {
    /// Pool offset of the register block.
    pub regs: u64,
    /// Pool offset of queue pair 0.
    pub qp0: u64,
    /// Bytes between queue pairs.
    pub qp_stride: u64,
    /// Queue pairs: one per participant slot, as many as fit in the device area.
    pub queue_pairs: u32,
}

impl DeviceLayout {
    /// The layout of `pool`'s device area.
    pub fn of(pool: &Pool) -> DeviceLayout {
        let sb = pool.superblock();
        let regs = sb.device_area_off;
        let stride = u64::from(CXLKV_NDP_QP_STRIDE);
        let room = sb
            .device_area_size
            .saturating_sub(u64::from(CXLKV_NDP_REGS_SIZE))
            / stride;
        DeviceLayout {
            regs,
            qp0: regs + u64::from(CXLKV_NDP_REGS_SIZE),
            qp_stride: stride,
            queue_pairs: room.min(u64::from(sb.participants)) as u32,
        }
    }

    /// Pool offset of queue pair `qp`'s indices.
    pub fn qp(&self, qp: u32) -> u64 {
        self.qp0 + u64::from(qp) * self.qp_stride
    }

    /// Pool offset of submission slot `index % DEPTH` of queue pair `qp`.
    pub fn sq_slot(&self, qp: u32, index: u64) -> u64 {
        self.qp(qp)
            + u64::from(CXLKV_NDP_QP_INDICES_SIZE)
            + (index % DEPTH) * u64::from(CXLKV_NDP_CMD_SIZE)
    }

    /// Pool offset of completion slot `index % DEPTH` of queue pair `qp`.
    pub fn cq_slot(&self, qp: u32, index: u64) -> u64 {
        self.qp(qp)
            + u64::from(CXLKV_NDP_QP_INDICES_SIZE)
            + DEPTH * u64::from(CXLKV_NDP_CMD_SIZE)
            + (index % DEPTH) * u64::from(CXLKV_NDP_CPL_SIZE)
    }
}

/// A completion status other than OK, as a typed error (the ABI's `CXLKV_NDP_ERR_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("device status {code} ({}), detail {detail}", status_name(*.code))]
pub struct DeviceStatus {
    /// `CXLKV_NDP_ERR_*`.
    pub code: u32,
    /// Index of the offending block or token, when there is one.
    pub detail: u32,
}

impl DeviceStatus {
    /// A status with no detail.
    pub fn new(code: u32) -> Self {
        DeviceStatus { code, detail: 0 }
    }
    /// A status naming entry `detail`.
    pub fn at(code: u32, detail: usize) -> Self {
        DeviceStatus {
            code,
            detail: detail.min(u32::MAX as usize) as u32,
        }
    }
}

/// Short name of a completion status.
pub fn status_name(code: u32) -> &'static str {
    match code {
        CXLKV_NDP_OK => "ok",
        CXLKV_NDP_ERR_OPCODE => "unknown opcode",
        CXLKV_NDP_ERR_RANGE => "buffer range not in the submitter's partition",
        CXLKV_NDP_ERR_ARGS => "arguments out of range",
        CXLKV_NDP_ERR_BLOCK => "block missing or invalid",
        CXLKV_NDP_ERR_LAYOUT => "block layout mismatch",
        CXLKV_NDP_ERR_STALE => "block changed during the scan",
        CXLKV_NDP_ERR_RESULT_SIZE => "result buffer too small",
        CXLKV_NDP_ERR_TOKEN => "token in no block",
        CXLKV_NDP_ERR_RING => "ring indices inconsistent",
        CXLKV_NDP_ERR_RESTARTED => "device restarted",
        CXLKV_NDP_ERR_INTERNAL => "internal device error",
        CXLKV_NDP_ERR_CHECKSUM => "payload checksum mismatch",
        _ => "unknown status",
    }
}

/// What every block of a command must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockExpect {
    /// Sequence id.
    pub sequence: u64,
    /// Layer.
    pub layer: u32,
    /// KV head to read (must be below the block's head count).
    pub kv_head: u32,
    /// Element type.
    pub dtype: DType,
    /// Head dimension.
    pub dim: u32,
}

/// A validated typed block: where the selected head's K, V and bounds are.
#[derive(Clone, Copy, Debug)]
pub struct ResolvedBlock {
    /// The header snapshot and slot version ([`Pool::still_valid`] re-checks it).
    pub block: BlockRef,
    /// Tokens in the block.
    pub tokens: u32,
    /// Token index of row 0 (checked to fit with every row in `u32`).
    pub base: u32,
    /// Pool offset of the head's keys (`tokens × dim` elements).
    pub k_off: u64,
    /// Pool offset of the head's values.
    pub v_off: u64,
    /// Pool offset of the head's bounds (`2 × dim` f32: min then max).
    pub bounds_off: u64,
    /// Bytes of the head's keys (and of its values).
    pub head_bytes: u64,
}

/// Finds and validates block `entry` for a command expecting `want`; `index` is its position in
/// the block list (reported in errors). Both the device and the host fallback call this.
pub fn resolve_block(
    pool: &Pool,
    entry: &cxlkv_ndp_block,
    want: &BlockExpect,
    index: usize,
) -> Result<ResolvedBlock, DeviceStatus> {
    let block_err = DeviceStatus::at(CXLKV_NDP_ERR_BLOCK, index);
    let layout_err = DeviceStatus::at(CXLKV_NDP_ERR_LAYOUT, index);
    let key = Key::from_parts(entry.key_lo, entry.key_hi);
    let r = match pool.block_ref(key) {
        Ok(Some(r)) => r,
        _ => return Err(block_err),
    };
    if Codec::from_code(r.header.codec) != Some(Codec::KvV1) || r.header.len < LAYOUT_SIZE as u64 {
        return Err(layout_err);
    }
    let mem = pool.memory();
    coherence::acquire(&**mem, Site::PayloadRead, r.payload_off, LAYOUT_SIZE as u64);
    let l: KvLayout = format::read_plain(&**mem, r.payload_off).map_err(|_| block_err)?;
    let esize = want.dtype.size() as u64;
    let t = u64::from(l.kv_heads) * u64::from(l.tokens) * u64::from(l.head_dim) * esize;
    let total = LAYOUT_SIZE as u64 + 2 * t + u64::from(l.kv_heads) * u64::from(l.head_dim) * 8;
    let ok = l.dtype == want.dtype as u32
        && l.sequence == want.sequence
        && l.layer == want.layer
        && l.head_dim == want.dim
        && want.kv_head < l.kv_heads
        && l.tokens > 0
        && l.token_offset == entry.token_offset
        && l.token_offset
            .checked_add(u64::from(l.tokens))
            .is_some_and(|e| e <= u64::from(u32::MAX))
        && u64::from(l.k_off) == LAYOUT_SIZE as u64
        && u64::from(l.v_off) == LAYOUT_SIZE as u64 + t
        && u64::from(l.bounds_off) == LAYOUT_SIZE as u64 + 2 * t
        && total == r.header.len
        && total <= pool.block_size();
    if !ok {
        return Err(layout_err);
    }
    let head_bytes = u64::from(l.tokens) * u64::from(l.head_dim) * esize;
    let h = u64::from(want.kv_head);
    Ok(ResolvedBlock {
        block: r,
        tokens: l.tokens,
        base: l.token_offset as u32,
        k_off: r.payload_off + u64::from(l.k_off) + h * head_bytes,
        v_off: r.payload_off + u64::from(l.v_off) + h * head_bytes,
        bounds_off: r.payload_off + u64::from(l.bounds_off) + h * u64::from(l.head_dim) * 8,
        head_bytes,
    })
}

/// Reads the `2 × dim` f32 bounds of a resolved block (min, max).
pub fn read_bounds(
    mem: &dyn SharedMemory,
    b: &ResolvedBlock,
    dim: usize,
) -> cxlkv_shm::mem::Result<(Vec<f32>, Vec<f32>)> {
    let mut raw = vec![0u8; dim * 8];
    coherence::acquire(mem, Site::PayloadRead, b.bounds_off, raw.len() as u64);
    mem.read(b.bounds_off, &mut raw)?;
    let f: Vec<f32> = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((f[..dim].to_vec(), f[dim..].to_vec()))
}

/// Checks that a block list's token ranges do not overlap; returns block indices sorted by base.
pub fn sorted_ranges(blocks: &[ResolvedBlock]) -> Result<Vec<usize>, DeviceStatus> {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&i| blocks[i].base);
    for w in order.windows(2) {
        let (a, b) = (&blocks[w[0]], &blocks[w[1]]);
        if u64::from(a.base) + u64::from(a.tokens) > u64::from(b.base) {
            return Err(DeviceStatus::at(CXLKV_NDP_ERR_LAYOUT, w[1]));
        }
    }
    Ok(order)
}

/// The block (index into `blocks`) and row holding `token`, given `order` from [`sorted_ranges`].
pub fn locate_token(
    blocks: &[ResolvedBlock],
    order: &[usize],
    token: u32,
) -> Option<(usize, usize)> {
    let pos = order.partition_point(|&i| blocks[i].base <= token);
    let i = *order.get(pos.checked_sub(1)?)?;
    let row = (token - blocks[i].base) as usize;
    (row < blocks[i].tokens as usize).then_some((i, row))
}

/// Counts of a scan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Key bytes read.
    pub bytes_scanned: u64,
    /// Blocks whose keys were read.
    pub blocks_scanned: u32,
    /// Blocks skipped on their bounds.
    pub blocks_pruned: u32,
}

/// The top-k scan over a list of blocks that the device and the host fallback both run: blocks are
/// fed one at a time (their keys as [`KeyRows`], token `base + i` at row `i`); with pruning the
/// caller visits them in [`TopKScan::visit_order`] and asks [`TopKScan::can_skip`] first. Because
/// the ranking is a total order and the bounds bound every computed score, the result equals the
/// dense top-k over all keys whatever the visiting order or pruning.
pub struct TopKScan {
    kernel: ScoreKernel,
    mode: GroupMode,
    g: usize,
    selectors: Vec<TopKSelector>,
    scores: Vec<f32>,
    /// Counts so far.
    pub stats: ScanStats,
}

impl TopKScan {
    /// A scan of `g` queries for the `k` best per list.
    pub fn new(kernel: ScoreKernel, g: usize, k: usize, mode: GroupMode) -> TopKScan {
        let lists = if mode == GroupMode::PerQuery { g } else { 1 };
        TopKScan {
            kernel,
            mode,
            g,
            selectors: (0..lists).map(|_| TopKSelector::new(k)).collect(),
            scores: Vec::new(),
            stats: ScanStats::default(),
        }
    }

    /// Per-query upper bounds of each block and the visiting order (highest group bound first, ties
    /// by list position). `bounds[b]` is block `b`'s (min, max).
    pub fn visit_order(
        queries: &QueryGroup<'_>,
        bounds: &[(Vec<f32>, Vec<f32>)],
    ) -> (Vec<f32>, Vec<usize>) {
        let g = queries.count();
        let mut ub = vec![0f32; bounds.len() * g];
        let mut order: Vec<(f32, usize)> = Vec::with_capacity(bounds.len());
        for (b, (lo, hi)) in bounds.iter().enumerate() {
            let row = &mut ub[b * g..(b + 1) * g];
            for (q, slot) in row.iter_mut().enumerate() {
                *slot = upper_bound(queries.query(q), lo, hi);
            }
            order.push((row.iter().copied().fold(f32::NEG_INFINITY, f32::max), b));
        }
        order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        (ub, order.into_iter().map(|(_, b)| b).collect())
    }

    /// True if no key of a block whose per-query bounds are `ub` can enter any list (strictly
    /// below every list's k-th score: a tie could still win on a lower index).
    pub fn can_skip(&mut self, ub: &[f32]) -> bool {
        match self.mode {
            GroupMode::GroupMax => {
                let best = ub.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                self.selectors[0].kth().is_some_and(|kth| best < kth.score)
            }
            GroupMode::PerQuery => self
                .selectors
                .iter_mut()
                .zip(ub)
                .all(|(s, &b)| s.kth().is_some_and(|kth| b < kth.score)),
        }
    }

    /// Records a skipped block.
    pub fn skipped(&mut self) {
        self.stats.blocks_pruned += 1;
    }

    /// Scores every row of `keys` (token `base + i`) and offers them to the lists.
    pub fn scan(&mut self, queries: &QueryGroup<'_>, keys: &KeyRows<'_>, base: u32) {
        const CHUNK: usize = cxlkv_kernels::scan::SCAN_CHUNK_KEYS;
        self.scores.resize(CHUNK * self.g, 0.0);
        let mut start = 0;
        while start < keys.len() {
            let end = (start + CHUNK).min(keys.len());
            let chunk = &mut self.scores[..(end - start) * self.g];
            self.kernel.score(queries, &keys.slice(start, end), chunk);
            cxlkv_kernels::scan::offer(
                chunk,
                self.g,
                base + start as u32,
                self.mode,
                &mut self.selectors,
            );
            start = end;
        }
        self.stats.blocks_scanned += 1;
        self.stats.bytes_scanned += keys.bytes().len() as u64;
    }

    /// The lists, best first.
    pub fn finish(self) -> (Vec<Vec<Hit>>, ScanStats) {
        (
            self.selectors
                .into_iter()
                .map(TopKSelector::into_sorted)
                .collect(),
            self.stats,
        )
    }
}

/// Softmax mass (`scale · score`, normalised over `hits`) that each block holds.
pub fn block_mass(hits: &[Hit], blocks: &[ResolvedBlock], order: &[usize], scale: f32) -> Vec<f32> {
    let mut mass = vec![0f64; blocks.len()];
    let max = hits
        .iter()
        .map(|h| f64::from(scale) * f64::from(h.score))
        .fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0f64;
    for h in hits {
        let w = (f64::from(scale) * f64::from(h.score) - max).exp();
        total += w;
        if let Some((b, _)) = locate_token(blocks, order, h.index) {
            mass[b] += w;
        }
    }
    mass.iter()
        .map(|m| if total > 0.0 { (m / total) as f32 } else { 0.0 })
        .collect()
}

/// Bytes of a SCORE_TOPK result: header, hits, values (if gathered), per-block mass.
pub fn topk_result_size(
    lists: usize,
    per_list: usize,
    dim: usize,
    esize: usize,
    gather: bool,
    nblocks: usize,
) -> Option<u64> {
    let hits = lists.checked_mul(per_list)?.checked_mul(8)?;
    let values = if gather {
        lists
            .checked_mul(per_list)?
            .checked_mul(dim)?
            .checked_mul(esize)?
    } else {
        0
    };
    let mass = nblocks.checked_mul(4)?;
    let total = 64usize
        .checked_add(hits)?
        .checked_add(values.next_multiple_of(8))?
        .checked_add(mass)?;
    Some(total as u64)
}

/// Encodes a SCORE_TOPK (or GATHER, with scores 0) result: lists padded to `per_list` hits.
pub fn encode_topk_result(
    lists: &[Vec<Hit>],
    per_list: usize,
    dim: usize,
    dtype: DType,
    values: Option<&[u8]>,
    mass: &[f32],
    stats: &ScanStats,
) -> Vec<u8> {
    let hits_off = 64usize;
    let values_off = hits_off + lists.len() * per_list * 8;
    let vlen = values.map_or(0, |v| v.len().next_multiple_of(8));
    let mass_off = values_off + vlen;
    let total = mass_off + mass.len() * 4;
    let header = cxlkv_ndp_result {
        lists: lists.len() as u32,
        per_list: per_list as u32,
        dim: dim as u32,
        dtype: dtype as u32,
        hits_off: hits_off as u32,
        values_off: if values.is_some() {
            values_off as u32
        } else {
            0
        },
        mass_off: mass_off as u32,
        nblocks: mass.len() as u32,
        bytes_scanned: stats.bytes_scanned,
        blocks_scanned: stats.blocks_scanned,
        blocks_pruned: stats.blocks_pruned,
        bounds_off: 0,
        bounds_match: 0,
        total_bytes: total as u64,
    };
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(format::as_bytes(&header));
    for list in lists {
        for i in 0..per_list {
            let h = list.get(i).map_or(
                cxlkv_ndp_hit {
                    token: u32::MAX,
                    score: f32::NEG_INFINITY,
                },
                |h| cxlkv_ndp_hit {
                    token: h.index,
                    score: h.score,
                },
            );
            out.extend_from_slice(format::as_bytes(&h));
        }
    }
    if let Some(v) = values {
        out.extend_from_slice(v);
        out.resize(mass_off, 0);
    }
    for m in mass {
        out.extend_from_slice(&m.to_le_bytes());
    }
    debug_assert_eq!(out.len(), total);
    out
}

/// A decoded SCORE_TOPK / GATHER result.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodedTopK {
    /// Hits per list, best first (padding removed).
    pub lists: Vec<Vec<Hit>>,
    /// Value rows `[lists][per_list][dim]` raw, when gathered (padding rows included).
    pub values: Vec<u8>,
    /// Per-block softmax mass of list 0.
    pub mass: Vec<f32>,
    /// Scan counts reported by the producer.
    pub stats: ScanStats,
}

/// Decodes a result buffer, checking every offset against its length (it came from a peer).
pub fn decode_topk_result(bytes: &[u8], esize: usize) -> Option<DecodedTopK> {
    if bytes.len() < 64 {
        return None;
    }
    let h: cxlkv_ndp_result = format::from_bytes(bytes);
    let lists = h.lists as usize;
    let per = h.per_list as usize;
    let hits_end = (h.hits_off as usize).checked_add(lists.checked_mul(per)?.checked_mul(8)?)?;
    let hits_raw = bytes.get(h.hits_off as usize..hits_end)?;
    let mut out = DecodedTopK {
        stats: ScanStats {
            bytes_scanned: h.bytes_scanned,
            blocks_scanned: h.blocks_scanned,
            blocks_pruned: h.blocks_pruned,
        },
        ..Default::default()
    };
    for l in 0..lists {
        let list = (0..per)
            .map(|i| format::from_bytes::<cxlkv_ndp_hit>(&hits_raw[(l * per + i) * 8..]))
            .filter(|x| x.token != u32::MAX)
            .map(|x| Hit {
                index: x.token,
                score: x.score,
            })
            .collect();
        out.lists.push(list);
    }
    if h.values_off != 0 {
        let n = lists
            .checked_mul(per)?
            .checked_mul(h.dim as usize)?
            .checked_mul(esize)?;
        out.values = bytes
            .get(h.values_off as usize..(h.values_off as usize).checked_add(n)?)?
            .to_vec();
    }
    let m = bytes
        .get(h.mass_off as usize..(h.mass_off as usize).checked_add(h.nblocks as usize * 4)?)?;
    out.mass = m
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Some(out)
}

/// True if `[off, off + len)` lies inside one payload block of a partition owned by participant
/// `qp` (the only places a command's buffers may be). Returns the error status otherwise.
pub fn check_owned_range(pool: &Pool, qp: u32, off: u64, len: u64) -> Result<(), DeviceStatus> {
    let bad = DeviceStatus::new(CXLKV_NDP_ERR_RANGE);
    let sb = pool.superblock();
    let rel = off.checked_sub(sb.partition_off).ok_or(bad)?;
    let p = rel / sb.partition_stride;
    if p >= u64::from(sb.partitions) {
        return Err(bad);
    }
    let in_part = rel % sb.partition_stride;
    let in_payloads = in_part.checked_sub(sb.payloads_off).ok_or(bad)?;
    let block = in_payloads / sb.block_size;
    if block >= u64::from(sb.blocks_per_partition) {
        return Err(bad);
    }
    let block_end = sb.payloads_off + (block + 1) * sb.block_size;
    if in_part.checked_add(len).is_none_or(|e| e > block_end) {
        return Err(bad);
    }
    let owner_off = pool.partition_offset(p as u32).ok_or(bad)? + format::partition::OWNER;
    let owner = pool
        .memory()
        .load_u64(owner_off, std::sync::atomic::Ordering::Acquire)
        .map_err(|_| bad)?;
    if owner & 0xffff_ffff != u64::from(qp) + 1 {
        return Err(bad);
    }
    Ok(())
}

/// Nanoseconds since the Unix epoch (the heartbeat clock).
pub fn now_ns() -> u64 {
    crate::clock::system_now_ns()
}
