//! The host side of the NDP device: [`NdpDevice`] submits commands on the queue pair of its
//! participant slot, polls for completions (spinning briefly, then sleeping on a futex that the
//! device wakes), and falls back to scanning on the host with the same kernels when the device is
//! absent, dead, slow or busy — so a caller always gets the same answer, and the stats say which
//! path produced it and how many bytes crossed the link.
//!
//! Argument and result buffers are blocks that the client reserves in its own partition
//! ([`Participant::reserve`]; never committed, so never indexed nor evicted): one per command in
//! flight. A command that timed out keeps its block quarantined until its completion arrives or a
//! new device generation starts (which fails every command it found pending without running it),
//! so a late device can never write into a buffer that was handed to another command.

use super::abi::*;
use super::{
    block_mass, decode_topk_result, encode_topk_result, locate_token, qpi, reg, resolve_block,
    sorted_ranges, topk_result_size, BlockExpect, DeviceLayout, DeviceStatus, ResolvedBlock,
    ScanStats, TopKScan, DEPTH,
};
use crate::coherence::{self, Site};
use crate::format::{self, Codec};
use crate::hotness::Hotness;
use crate::key::Key;
use crate::participant::{Participant, Reservation};
use crate::pool::Pool;
use cxlkv_kernels::{DType, GroupMode, Hit, KeyRows, QueryGroup, ScoreKernel};
use std::collections::HashMap;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Errors of the NDP client.
#[derive(Debug, Error)]
pub enum NdpError {
    /// A pool access failed.
    #[error(transparent)]
    Pool(#[from] crate::pool::PoolError),
    /// A memory access failed.
    #[error(transparent)]
    Mem(#[from] cxlkv_shm::mem::MemError),
    /// The device rejected the command (the request itself is wrong: the host path would fail too).
    #[error(transparent)]
    Device(#[from] DeviceStatus),
    /// The request is malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// This participant has no queue pair (its slot number is beyond the device area's room).
    #[error("participant {participant} has no queue pair (the device serves {queue_pairs})")]
    NoQueuePair {
        /// The participant.
        participant: u32,
        /// Queue pairs in the device area.
        queue_pairs: u32,
    },
    /// The device did not answer a command that has no host fallback (NOP, HOTLIST, ...).
    #[error("device unavailable: {0:?}")]
    Unavailable(FallbackReason),
    /// A block kept changing while the host scanned it.
    #[error("block {0} kept changing during the host scan")]
    Stale(usize),
    /// The device's result did not decode.
    #[error("malformed result from the device ({0} bytes)")]
    BadResult(u64),
    /// Unknown ticket.
    #[error("unknown ticket {0}")]
    UnknownTicket(u64),
}

/// Result alias of the client.
pub type Result<T> = std::result::Result<T, NdpError>;

/// Why a command ran on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackReason {
    /// No device registers (magic or ABI version missing).
    Absent,
    /// The device's heartbeat is stale.
    Dead,
    /// The command did not complete within the timeout.
    Timeout,
    /// The submission ring or every staging buffer is busy.
    Busy,
    /// Arguments and result do not fit one staging block.
    TooLarge,
    /// The device reported that a block changed under its scan, or that it restarted.
    DeviceRetry,
    /// The caller asked for the host path.
    Forced,
}

/// Which path produced a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NdpPath {
    /// The device.
    Device,
    /// The host, for this reason.
    Host(FallbackReason),
}

/// What a command cost, per path.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NdpStats {
    /// Who computed the result (`None` only in a default value).
    pub path: Option<NdpPath>,
    /// Bytes the host wrote across the link: command descriptor, arguments, ring index and
    /// doorbell stores.
    pub bytes_to_device: u64,
    /// Bytes the host read across the link from the device path: completion, result, ring index.
    pub bytes_from_device: u64,
    /// Bytes a host-side scan pulled across the link (headers, layouts, every key, selected values).
    pub host_scan_bytes: u64,
    /// Key bytes the scanner read (device-local on the device path).
    pub bytes_scanned: u64,
    /// Blocks whose keys were read.
    pub blocks_scanned: u32,
    /// Blocks skipped on their bounds.
    pub blocks_pruned: u32,
    /// Execution time reported by the device.
    pub device_ns: u64,
    /// Softmax mass of list 0's hits per block, in block-list order.
    pub block_mass: Vec<f32>,
    /// Wall time from submit to result.
    pub elapsed: Duration,
}

impl NdpStats {
    /// All bytes that crossed the link for this command, either path.
    pub fn link_bytes(&self) -> u64 {
        self.bytes_to_device + self.bytes_from_device + self.host_scan_bytes
    }
}

/// A SCORE_TOPK answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopK {
    /// Token indices per list (one list per query, or one for the group), best first.
    pub indices: Vec<Vec<u32>>,
    /// Scores `q·k` (unscaled), same shape.
    pub scores: Vec<Vec<f32>>,
    /// Value rows of the hits, `[lists][hits][dim]` raw elements, when asked for.
    pub values: Vec<u8>,
    /// Costs and path.
    pub stats: NdpStats,
}

impl TopK {
    /// The hits of list `l`.
    pub fn hits(&self, l: usize) -> Vec<Hit> {
        self.indices[l]
            .iter()
            .zip(&self.scores[l])
            .map(|(&index, &score)| Hit { index, score })
            .collect()
    }

    /// The attention mass of list 0 per block of `blocks` (the request's block list): `(key,
    /// mass)` pairs for [`Hotness::record_attention_mass`], so the blocks attention actually uses
    /// count as hot.
    pub fn attention_mass(&self, blocks: &[BlockSpec]) -> Vec<(Key, f32)> {
        blocks
            .iter()
            .zip(&self.stats.block_mass)
            .map(|(b, &m)| (b.key, m))
            .collect()
    }
}

/// A typed KV block named in a command: its key and the position of its first token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSpec {
    /// Key of the block.
    pub key: Key,
    /// Token offset its layout must carry.
    pub token_offset: u64,
}

/// A SCORE_TOPK request.
#[derive(Clone, Debug)]
pub struct ScoreRequest<'a> {
    /// `G × dim` f32 query vectors of one GQA group.
    pub queries: &'a [f32],
    /// Head dimension.
    pub dim: usize,
    /// Blocks of one sequence.
    pub blocks: &'a [BlockSpec],
    /// Sequence id the blocks must carry.
    pub sequence: u64,
    /// Layer.
    pub layer: u32,
    /// KV head.
    pub kv_head: u32,
    /// Element type of K and V.
    pub dtype: DType,
    /// Hits per list.
    pub k: usize,
    /// Per query or group maximum.
    pub mode: GroupMode,
    /// Skip blocks on their bounds (exact).
    pub prune: bool,
    /// Return the value rows of the hits.
    pub gather_values: bool,
}

impl ScoreRequest<'_> {
    fn group(&self) -> usize {
        self.queries.len().checked_div(self.dim).unwrap_or(0)
    }

    fn expect(&self) -> BlockExpect {
        BlockExpect {
            sequence: self.sequence,
            layer: self.layer,
            kv_head: self.kv_head,
            dtype: self.dtype,
            dim: self.dim as u32,
        }
    }

    fn check(&self) -> Result<()> {
        let g = self.group();
        let bad = |m: String| Err(NdpError::BadRequest(m));
        if self.dim == 0 || self.dim & 15 != 0 || self.dim > CXLKV_NDP_MAX_DIM as usize {
            return bad(format!(
                "head dimension {} is not a multiple of 16 in 16..=256",
                self.dim
            ));
        }
        if g == 0 || g > CXLKV_NDP_MAX_GROUP as usize || g * self.dim != self.queries.len() {
            return bad(format!(
                "{} query floats are not 1..=16 queries of {}",
                self.queries.len(),
                self.dim
            ));
        }
        if self.k == 0 || self.k > CXLKV_NDP_MAX_K as usize {
            return bad(format!("k = {} is outside 1..={CXLKV_NDP_MAX_K}", self.k));
        }
        if self.blocks.is_empty()
            || self.blocks.len() > CXLKV_NDP_MAX_BLOCKS as usize
            || self.kv_head > u32::from(u16::MAX)
        {
            return bad(format!(
                "{} blocks (1..={CXLKV_NDP_MAX_BLOCKS}) or KV head {}",
                self.blocks.len(),
                self.kv_head
            ));
        }
        Ok(())
    }

    fn owned(&self) -> OwnedRequest {
        OwnedRequest {
            queries: self.queries.to_vec(),
            dim: self.dim,
            blocks: self.blocks.to_vec(),
            sequence: self.sequence,
            layer: self.layer,
            kv_head: self.kv_head,
            dtype: self.dtype,
            k: self.k,
            mode: self.mode,
            prune: self.prune,
            gather_values: self.gather_values,
        }
    }
}

#[derive(Clone, Debug)]
struct OwnedRequest {
    queries: Vec<f32>,
    dim: usize,
    blocks: Vec<BlockSpec>,
    sequence: u64,
    layer: u32,
    kv_head: u32,
    dtype: DType,
    k: usize,
    mode: GroupMode,
    prune: bool,
    gather_values: bool,
}

impl OwnedRequest {
    fn borrow(&self) -> ScoreRequest<'_> {
        ScoreRequest {
            queries: &self.queries,
            dim: self.dim,
            blocks: &self.blocks,
            sequence: self.sequence,
            layer: self.layer,
            kv_head: self.kv_head,
            dtype: self.dtype,
            k: self.k,
            mode: self.mode,
            prune: self.prune,
            gather_values: self.gather_values,
        }
    }
}

/// Options of [`NdpDevice::open`].
#[derive(Clone, Debug)]
pub struct NdpOptions {
    /// How long to wait for a completion before computing on the host.
    pub timeout: Duration,
    /// A device heartbeat older than this means the device is dead.
    pub stale_after: Duration,
    /// How long to spin on the completion index before sleeping on the futex.
    pub spin: Duration,
    /// Staging blocks (commands with buffers in flight at once).
    pub staging: usize,
    /// Kernel of the host fallback.
    pub kernel: ScoreKernel,
}

impl Default for NdpOptions {
    fn default() -> Self {
        NdpOptions {
            timeout: Duration::from_secs(2),
            stale_after: Duration::from_millis(500),
            spin: Duration::from_micros(50),
            staging: 2,
            kernel: ScoreKernel::detect(),
        }
    }
}

/// A command in flight, or one already settled on the host.
#[derive(Debug)]
pub struct Ticket(u64);

struct Staging<'p> {
    /// Held for the life of the client: dropping it returns the block to the partition.
    _reservation: Reservation<'p>,
    off: u64,
    /// Tag of the command using it; a timed-out command keeps it until it completes.
    owner: Option<u64>,
    generation: u64,
}

struct Pending {
    tag: u64,
    staging: Option<usize>,
    req: OwnedRequest,
    result_off: u64,
    result_len: u64,
    stats: NdpStats,
    start: Instant,
    forced: Option<FallbackReason>,
}

/// The client of the NDP device, on the queue pair of `participant`'s slot.
pub struct NdpDevice<'p> {
    participant: &'p Participant,
    pool: Pool,
    layout: DeviceLayout,
    qp: u32,
    opts: NdpOptions,
    staging: Vec<Staging<'p>>,
    sq_tail: u64,
    cq_head: u64,
    next_tag: u64,
    done: HashMap<u64, cxlkv_ndp_cpl>,
    pending: HashMap<u64, Pending>,
    next_ticket: u64,
}

impl<'p> NdpDevice<'p> {
    /// Opens the device for `participant` (which must own a partition: staging buffers live there).
    /// Works without a device: every command then runs on the host.
    pub fn open(participant: &'p Participant, opts: NdpOptions) -> Result<NdpDevice<'p>> {
        let pool = participant.pool().clone();
        let layout = DeviceLayout::of(&pool);
        let qp = participant.id();
        if qp >= layout.queue_pairs {
            return Err(NdpError::NoQueuePair {
                participant: qp,
                queue_pairs: layout.queue_pairs,
            });
        }
        let mut staging = Vec::new();
        for i in 0..opts.staging.max(1) {
            let key = Key::from_bytes(
                format!("cxlkv-ndp-staging/{qp}/{}/{i}", participant.generation()).as_bytes(),
            );
            let reservation = participant.reserve(key, pool.block_size(), Codec::Raw)?;
            let off = reservation.payload_offset();
            staging.push(Staging {
                _reservation: reservation,
                off,
                owner: None,
                generation: 0,
            });
        }
        let mem = pool.memory();
        let base = layout.qp(qp);
        coherence::acquire(
            &**mem,
            Site::NdpCompleteRead,
            base,
            u64::from(CXLKV_NDP_QP_INDICES_SIZE),
        );
        // Our slot's previous holder may have left commands behind: continue after them and
        // ignore their completions (their tags are not ours).
        let sq_tail = mem.load_u64(base + qpi::SQ_TAIL, Ordering::Relaxed)?;
        // Acquire pairs with the device's Release store of cq_tail.
        let cq_tail = mem.load_u64(base + qpi::CQ_TAIL, Ordering::Acquire)?;
        mem.store_u64(base + qpi::CQ_HEAD, cq_tail, Ordering::Release)?;
        mem.store_u64(base + qpi::CQ_WAITERS, 0, Ordering::Relaxed)?;
        coherence::publish(
            &**mem,
            Site::NdpHeadWrite,
            base,
            u64::from(CXLKV_NDP_QP_INDICES_SIZE),
        );
        Ok(NdpDevice {
            participant,
            pool,
            layout,
            qp,
            next_tag: (participant.generation() << 32) | 1,
            opts,
            staging,
            sq_tail,
            cq_head: cq_tail,
            done: HashMap::new(),
            pending: HashMap::new(),
            next_ticket: 1,
        })
    }

    /// The queue pair this client submits on.
    pub fn queue_pair(&self) -> u32 {
        self.qp
    }

    /// The participant this client submits for.
    pub fn participant(&self) -> &'p Participant {
        self.participant
    }

    /// Pool offsets of the staging blocks (for tools and tests).
    pub fn staging_offsets(&self) -> Vec<u64> {
        self.staging.iter().map(|s| s.off).collect()
    }

    fn reg(&self, off: u64) -> Result<u64> {
        let mem = self.pool.memory();
        coherence::acquire(&**mem, Site::NdpRegsRead, self.layout.regs + off, 8);
        Ok(mem.load_u64(self.layout.regs + off, Ordering::Acquire)?)
    }

    /// Whether a live device of this ABI is attached, and if not, why.
    pub fn device_state(&self) -> Result<std::result::Result<u64, FallbackReason>> {
        // Acquire pairs with the device's Release store of the magic, written last at start.
        if self.reg(reg::MAGIC)? != CXLKV_NDP_MAGIC
            || self.reg(reg::ABI)? & 0xffff_ffff != u64::from(CXLKV_NDP_ABI_MAJOR)
        {
            return Ok(Err(FallbackReason::Absent));
        }
        let hb = self.reg(reg::HEARTBEAT)?;
        if super::now_ns().saturating_sub(hb) > self.opts.stale_after.as_nanos() as u64 {
            return Ok(Err(FallbackReason::Dead));
        }
        Ok(Ok(self.reg(reg::GENERATION)?))
    }

    /// A device counter (`CXLKV_NDP_CTR_*`).
    pub fn counter(&self, index: u32) -> Result<u64> {
        self.reg(reg::COUNTERS + 8 * u64::from(index.min(CXLKV_NDP_COUNTERS - 1)))
    }

    /// Moves every new completion into `done`, releasing quarantined staging blocks.
    fn drain(&mut self) -> Result<()> {
        let mem = self.pool.memory().clone();
        let base = self.layout.qp(self.qp);
        coherence::acquire(&*mem, Site::NdpCompleteRead, base + qpi::CQ_TAIL, 8);
        // Acquire pairs with the device's Release store of cq_tail after writing the entry.
        let tail = mem.load_u64(base + qpi::CQ_TAIL, Ordering::Acquire)?;
        if tail.wrapping_sub(self.cq_head) > DEPTH {
            // Not a state the device produces; resynchronise rather than read garbage.
            self.cq_head = tail;
        }
        while self.cq_head != tail {
            let off = self.layout.cq_slot(self.qp, self.cq_head);
            coherence::acquire(
                &*mem,
                Site::NdpCompleteRead,
                off,
                u64::from(CXLKV_NDP_CPL_SIZE),
            );
            let c: cxlkv_ndp_cpl = format::read_plain(&*mem, off)?;
            self.cq_head = self.cq_head.wrapping_add(1);
            if self.pending.values().any(|p| p.tag == c.tag) {
                // Its result is still to be read from the staging block: the block stays ours
                // until then (`finish_device`, `run_simple`). Releasing it here let a submission
                // in between overwrite an unread result (found by tests/ring_sim.rs).
                self.done.insert(c.tag, c);
            } else {
                // A command given up on (timed out): its quarantined staging block is free now.
                for s in &mut self.staging {
                    if s.owner == Some(c.tag) {
                        s.owner = None;
                    }
                }
            }
        }
        // Release: our reads of the entries happen before the device may overwrite them. Pairs
        // with the device's Acquire load of cq_head when it checks for space.
        mem.store_u64(base + qpi::CQ_HEAD, self.cq_head, Ordering::Release)?;
        coherence::publish(&*mem, Site::NdpHeadWrite, base + qpi::CQ_HEAD, 8);
        Ok(())
    }

    /// Releases staging blocks held for commands of an older device generation (a new device fails
    /// such commands without running them, so nothing will write there any more).
    fn release_old(&mut self, generation: u64) {
        for s in &mut self.staging {
            if s.owner.is_some() && s.generation != generation {
                s.owner = None;
            }
        }
    }

    /// Writes a command and rings the doorbell. Returns the bytes written across the link.
    fn push(&mut self, cmd: &cxlkv_ndp_cmd) -> Result<std::result::Result<u64, FallbackReason>> {
        let mem = self.pool.memory().clone();
        let base = self.layout.qp(self.qp);
        coherence::acquire(&*mem, Site::NdpHeadRead, base + qpi::SQ_HEAD, 8);
        let head = mem.load_u64(base + qpi::SQ_HEAD, Ordering::Acquire)?;
        if self.sq_tail.wrapping_sub(head) >= DEPTH {
            return Ok(Err(FallbackReason::Busy));
        }
        let slot = self.layout.sq_slot(self.qp, self.sq_tail);
        format::write_plain(&*mem, slot, cmd)?;
        coherence::publish(
            &*mem,
            Site::NdpSubmitWrite,
            slot,
            u64::from(CXLKV_NDP_CMD_SIZE),
        );
        self.sq_tail = self.sq_tail.wrapping_add(1);
        // Release: the slot before the index. Pairs with the device's Acquire load of sq_tail.
        mem.store_u64(base + qpi::SQ_TAIL, self.sq_tail, Ordering::Release)?;
        coherence::publish(&*mem, Site::NdpSubmitWrite, base + qpi::SQ_TAIL, 8);
        let mut sent = u64::from(CXLKV_NDP_CMD_SIZE) + 8;
        // Dekker pair with the device going to sleep: it stores `sleeping` then re-reads every
        // sq_tail (SeqCst); we store sq_tail then read `sleeping` (SeqCst). One of us sees the other.
        fence(Ordering::SeqCst);
        if self.reg(reg::SLEEPING)? != 0 {
            let bell = self.layout.regs + reg::DOORBELL;
            let mut cur = mem.load_u64(bell, Ordering::Relaxed)?;
            while let Err(actual) = mem.compare_exchange_u64(bell, cur, cur.wrapping_add(1))? {
                cur = actual;
            }
            coherence::publish(&*mem, Site::NdpSubmitWrite, bell, 8);
            cxlkv_shm::futex::wake(&*mem, bell);
            sent += 8;
        }
        Ok(Ok(sent))
    }

    fn new_tag(&mut self) -> u64 {
        let t = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        t
    }

    /// Waits for the completion of `tag` until `deadline`, spinning first, then sleeping on the
    /// completion futex in short slices while the device's heartbeat stays fresh.
    fn await_tag(
        &mut self,
        tag: u64,
        deadline: Instant,
    ) -> Result<std::result::Result<cxlkv_ndp_cpl, FallbackReason>> {
        let mem = self.pool.memory().clone();
        let base = self.layout.qp(self.qp);
        let spin_until = Instant::now() + self.opts.spin;
        let mut slice = Duration::from_micros(20);
        loop {
            self.drain()?;
            if let Some(c) = self.done.remove(&tag) {
                return Ok(Ok(c));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Err(FallbackReason::Timeout));
            }
            if now < spin_until {
                std::hint::spin_loop();
                continue;
            }
            if let Err(why) = self.device_state()? {
                return Ok(Err(why));
            }
            // Announce the wait, then re-check: the device stores cq_tail then reads cq_waiters
            // (SeqCst), we store cq_waiters then read cq_tail (SeqCst).
            mem.store_u64(base + qpi::CQ_WAITERS, 1, Ordering::SeqCst)?;
            let tail = mem.load_u64(base + qpi::CQ_TAIL, Ordering::SeqCst)?;
            if tail == self.cq_head {
                cxlkv_shm::futex::wait(
                    &*mem,
                    base + qpi::CQ_TAIL,
                    tail as u32,
                    slice.min(deadline - now),
                );
                slice = (slice * 2).min(Duration::from_millis(5));
            }
            mem.store_u64(base + qpi::CQ_WAITERS, 0, Ordering::Relaxed)?;
        }
    }

    /// Submits a SCORE_TOPK. The answer comes from [`NdpDevice::poll`] or [`NdpDevice::wait`];
    /// when the device cannot take the command it will be computed on the host.
    pub fn submit_score(&mut self, req: &ScoreRequest<'_>) -> Result<Ticket> {
        req.check()?;
        let start = Instant::now();
        let id = self.next_ticket;
        self.next_ticket += 1;
        let tag = self.new_tag();
        let mut pending = Pending {
            tag,
            staging: None,
            req: req.owned(),
            result_off: 0,
            result_len: 0,
            stats: NdpStats::default(),
            start,
            forced: None,
        };
        match self.try_submit_score(req, tag)? {
            Ok((staging, result_off, result_len, sent)) => {
                pending.staging = Some(staging);
                pending.result_off = result_off;
                pending.result_len = result_len;
                pending.stats.bytes_to_device = sent;
            }
            Err(why) => pending.forced = Some(why),
        }
        self.pending.insert(id, pending);
        Ok(Ticket(id))
    }

    fn try_submit_score(
        &mut self,
        req: &ScoreRequest<'_>,
        tag: u64,
    ) -> Result<std::result::Result<(usize, u64, u64, u64), FallbackReason>> {
        let generation = match self.device_state()? {
            Ok(g) => g,
            Err(why) => return Ok(Err(why)),
        };
        self.release_old(generation);
        self.drain()?;
        let g = req.group();
        let lists = if req.mode == GroupMode::PerQuery {
            g
        } else {
            1
        };
        let mut args = Vec::with_capacity(req.queries.len() * 4 + req.blocks.len() * 24);
        for q in req.queries {
            args.extend_from_slice(&q.to_le_bytes());
        }
        for b in req.blocks {
            let e = cxlkv_ndp_block {
                key_lo: b.key.lo(),
                key_hi: b.key.hi(),
                token_offset: b.token_offset,
            };
            args.extend_from_slice(format::as_bytes(&e));
        }
        let result_len = topk_result_size(
            lists,
            req.k,
            req.dim,
            req.dtype.size(),
            req.gather_values,
            req.blocks.len(),
        )
        .unwrap_or(u64::MAX);
        let result_at = (args.len() as u64).next_multiple_of(64);
        if result_at.saturating_add(result_len) > self.pool.block_size()
            || result_len > u64::from(u32::MAX)
        {
            return Ok(Err(FallbackReason::TooLarge));
        }
        let Some(si) = self.staging.iter().position(|s| s.owner.is_none()) else {
            return Ok(Err(FallbackReason::Busy));
        };
        let off = self.staging[si].off;
        let mem = self.pool.memory().clone();
        mem.write(off, &args)?;
        coherence::publish(&*mem, Site::NdpSubmitWrite, off, args.len() as u64);
        let mut flags = 0u16;
        if req.prune {
            flags |= CXLKV_NDP_FLAG_PRUNE as u16;
        }
        if req.mode == GroupMode::GroupMax {
            flags |= CXLKV_NDP_FLAG_GROUP_MAX as u16;
        }
        if req.gather_values {
            flags |= CXLKV_NDP_FLAG_GATHER_V as u16;
        }
        let cmd = cxlkv_ndp_cmd {
            tag,
            opcode: CXLKV_NDP_OP_SCORE_TOPK as u16,
            flags,
            k: req.k as u32,
            sequence: req.sequence,
            layer: req.layer,
            kv_head: req.kv_head as u16,
            dtype: req.dtype as u8,
            group: g as u8,
            dim: req.dim as u32,
            nblocks: req.blocks.len() as u32,
            args_off: off,
            result_off: off + result_at,
            args_len: args.len() as u32,
            result_len: result_len as u32,
        };
        match self.push(&cmd)? {
            Ok(sent) => {
                self.staging[si].owner = Some(tag);
                self.staging[si].generation = generation;
                Ok(Ok((
                    si,
                    off + result_at,
                    result_len,
                    sent + args.len() as u64,
                )))
            }
            Err(why) => Ok(Err(why)),
        }
    }

    /// The answer of `ticket` if it is ready (computed on the host if the device gave up on it or
    /// its deadline passed), else `None`.
    pub fn poll(&mut self, ticket: &Ticket) -> Result<Option<TopK>> {
        self.settle(ticket, false)
    }

    /// Waits for the answer of `ticket`: from the device within the timeout, else from the host.
    pub fn wait(&mut self, ticket: Ticket) -> Result<TopK> {
        Ok(self
            .settle(&ticket, true)?
            .expect("a blocking settle always answers"))
    }

    /// Submits and waits: [`NdpDevice::submit_score`] then [`NdpDevice::wait`].
    pub fn score_topk(&mut self, req: &ScoreRequest<'_>) -> Result<TopK> {
        let t = self.submit_score(req)?;
        self.wait(t)
    }

    fn settle(&mut self, ticket: &Ticket, block: bool) -> Result<Option<TopK>> {
        let p = self
            .pending
            .get(&ticket.0)
            .ok_or(NdpError::UnknownTicket(ticket.0))?;
        let (tag, forced, start) = (p.tag, p.forced, p.start);
        let outcome = if let Some(why) = forced {
            Err(why)
        } else if block {
            self.await_tag(tag, start + self.opts.timeout)?
        } else {
            self.drain()?;
            match self.done.remove(&tag) {
                Some(c) => Ok(c),
                None if start.elapsed() >= self.opts.timeout => Err(FallbackReason::Timeout),
                None => match self.device_state()? {
                    Err(why) => Err(why),
                    Ok(_) => return Ok(None),
                },
            }
        };
        let p = self.pending.remove(&ticket.0).expect("checked above");
        match outcome {
            Ok(c) => self.finish_device(p, c).map(Some),
            Err(why) => {
                // A staging block of a command the device may still run stays quarantined (until
                // `drain` sees its completion); if the completion already came, it is free now.
                if self.done.remove(&tag).is_some() {
                    self.release_staging(p.staging);
                }
                let mut stats = p.stats.clone();
                let mut r = host_score_topk(&self.pool, &p.req.borrow(), self.opts.kernel)?;
                stats.path = Some(NdpPath::Host(why));
                stats.host_scan_bytes = r.stats.host_scan_bytes;
                stats.bytes_scanned = r.stats.bytes_scanned;
                stats.blocks_scanned = r.stats.blocks_scanned;
                stats.block_mass = std::mem::take(&mut r.stats.block_mass);
                stats.elapsed = p.start.elapsed();
                r.stats = stats;
                Ok(Some(r))
            }
        }
    }

    /// Frees a staging block once its command's result has been copied out (or will not be).
    fn release_staging(&mut self, si: Option<usize>) {
        if let Some(si) = si {
            self.staging[si].owner = None;
        }
    }

    fn finish_device(&mut self, p: Pending, c: cxlkv_ndp_cpl) -> Result<TopK> {
        let mut stats = p.stats;
        stats.bytes_from_device += u64::from(CXLKV_NDP_CPL_SIZE) + 8;
        if c.status == CXLKV_NDP_ERR_STALE
            || c.status == CXLKV_NDP_ERR_RESTARTED
            || c.status == CXLKV_NDP_ERR_INTERNAL
        {
            self.release_staging(p.staging);
            let mut r = host_score_topk(&self.pool, &p.req.borrow(), self.opts.kernel)?;
            stats.path = Some(NdpPath::Host(FallbackReason::DeviceRetry));
            stats.host_scan_bytes = r.stats.host_scan_bytes;
            stats.block_mass = std::mem::take(&mut r.stats.block_mass);
            stats.elapsed = p.start.elapsed();
            r.stats = stats;
            return Ok(r);
        }
        if c.status != CXLKV_NDP_OK {
            self.release_staging(p.staging);
            return Err(DeviceStatus {
                code: c.status,
                detail: c.detail,
            }
            .into());
        }
        let n = c.result_bytes.min(p.result_len);
        let mut buf = vec![0u8; n as usize];
        let mem = self.pool.memory().clone();
        coherence::acquire(&*mem, Site::NdpCompleteRead, p.result_off, n);
        let read = mem.read(p.result_off, &mut buf);
        // The result is copied out: the device is done with the block, and so are we.
        self.release_staging(p.staging);
        read?;
        stats.bytes_from_device += n;
        let d = decode_topk_result(&buf, p.req.dtype.size()).ok_or(NdpError::BadResult(n))?;
        stats.path = Some(NdpPath::Device);
        stats.bytes_scanned = c.bytes_scanned;
        stats.blocks_scanned = c.blocks_scanned;
        stats.blocks_pruned = c.blocks_pruned;
        stats.device_ns = c.device_ns;
        stats.block_mass = d.mass;
        stats.elapsed = p.start.elapsed();
        Ok(TopK {
            indices: d
                .lists
                .iter()
                .map(|l| l.iter().map(|h| h.index).collect())
                .collect(),
            scores: d
                .lists
                .iter()
                .map(|l| l.iter().map(|h| h.score).collect())
                .collect(),
            values: d.values,
            stats,
        })
    }

    /// Runs a command without host fallback and returns its completion and result bytes.
    fn run_simple(
        &mut self,
        mut cmd: cxlkv_ndp_cmd,
        args: &[u8],
        result_len: u64,
    ) -> Result<(cxlkv_ndp_cpl, Vec<u8>, NdpStats)> {
        let start = Instant::now();
        let generation = match self.device_state()? {
            Ok(g) => g,
            Err(why) => return Err(NdpError::Unavailable(why)),
        };
        self.release_old(generation);
        self.drain()?;
        let tag = self.new_tag();
        cmd.tag = tag;
        let mut stats = NdpStats::default();
        let mut si = None;
        if !args.is_empty() || result_len > 0 {
            let result_at = (args.len() as u64).next_multiple_of(64);
            if result_at + result_len > self.pool.block_size() {
                return Err(NdpError::Unavailable(FallbackReason::TooLarge));
            }
            let i = self
                .staging
                .iter()
                .position(|s| s.owner.is_none())
                .ok_or(NdpError::Unavailable(FallbackReason::Busy))?;
            let off = self.staging[i].off;
            self.pool.memory().write(off, args)?;
            coherence::publish(
                &**self.pool.memory(),
                Site::NdpSubmitWrite,
                off,
                args.len() as u64,
            );
            cmd.args_off = off;
            cmd.args_len = args.len() as u32;
            cmd.result_off = off + result_at;
            cmd.result_len = result_len as u32;
            si = Some(i);
            stats.bytes_to_device += args.len() as u64;
        }
        stats.bytes_to_device += match self.push(&cmd)? {
            Ok(n) => n,
            Err(why) => return Err(NdpError::Unavailable(why)),
        };
        if let Some(i) = si {
            self.staging[i].owner = Some(tag);
            self.staging[i].generation = generation;
        }
        // A pending entry makes `drain` keep this tag's completion.
        self.pending.insert(
            u64::MAX - tag,
            Pending {
                tag,
                staging: None,
                req: empty_request(),
                result_off: 0,
                result_len: 0,
                stats: NdpStats::default(),
                start,
                forced: None,
            },
        );
        let got = self.await_tag(tag, start + self.opts.timeout);
        self.pending.remove(&(u64::MAX - tag));
        let c = match got? {
            Ok(c) => c,
            Err(why) => return Err(NdpError::Unavailable(why)),
        };
        if let Some(i) = si {
            self.staging[i].owner = None;
        }
        stats.bytes_from_device += u64::from(CXLKV_NDP_CPL_SIZE) + 8;
        if c.status != CXLKV_NDP_OK {
            return Err(DeviceStatus {
                code: c.status,
                detail: c.detail,
            }
            .into());
        }
        let mut buf = vec![0u8; c.result_bytes.min(result_len) as usize];
        if !buf.is_empty() {
            coherence::acquire(
                &**self.pool.memory(),
                Site::NdpCompleteRead,
                cmd.result_off,
                buf.len() as u64,
            );
            self.pool.memory().read(cmd.result_off, &mut buf)?;
        }
        stats.bytes_from_device += buf.len() as u64;
        stats.path = Some(NdpPath::Device);
        stats.device_ns = c.device_ns;
        stats.bytes_scanned = c.bytes_scanned;
        stats.elapsed = start.elapsed();
        Ok((c, buf, stats))
    }

    /// A NOP round trip; returns its wall time.
    pub fn nop(&mut self) -> Result<Duration> {
        let cmd = cxlkv_ndp_cmd {
            opcode: CXLKV_NDP_OP_NOP as u16,
            ..Default::default()
        };
        Ok(self.run_simple(cmd, &[], 0)?.2.elapsed)
    }

    /// Gathers the value rows of `tokens` (raw `[tokens][dim]`), on the device or, when it is
    /// unavailable, on the host.
    #[allow(clippy::too_many_arguments)]
    pub fn gather(
        &mut self,
        blocks: &[BlockSpec],
        sequence: u64,
        layer: u32,
        kv_head: u32,
        dtype: DType,
        dim: usize,
        tokens: &[u32],
    ) -> Result<(Vec<u8>, NdpStats)> {
        let want = BlockExpect {
            sequence,
            layer,
            kv_head,
            dtype,
            dim: dim as u32,
        };
        let mut args = Vec::new();
        for b in blocks {
            args.extend_from_slice(format::as_bytes(&cxlkv_ndp_block {
                key_lo: b.key.lo(),
                key_hi: b.key.hi(),
                token_offset: b.token_offset,
            }));
        }
        for t in tokens {
            args.extend_from_slice(&t.to_le_bytes());
        }
        let cmd = cxlkv_ndp_cmd {
            opcode: CXLKV_NDP_OP_GATHER as u16,
            k: tokens.len() as u32,
            sequence,
            layer,
            kv_head: kv_head as u16,
            dtype: dtype as u8,
            group: 1,
            dim: dim as u32,
            nblocks: blocks.len() as u32,
            ..Default::default()
        };
        let rlen =
            topk_result_size(1, tokens.len(), dim, dtype.size(), true, 0).unwrap_or(u64::MAX);
        match self.run_simple(cmd, &args, rlen) {
            Ok((_, buf, stats)) => {
                let d = decode_topk_result(&buf, dtype.size())
                    .ok_or(NdpError::BadResult(buf.len() as u64))?;
                Ok((d.values, stats))
            }
            Err(NdpError::Unavailable(why)) => {
                let (v, mut stats) = host_gather(&self.pool, blocks, &want, tokens)?;
                stats.path = Some(NdpPath::Host(why));
                Ok((v, stats))
            }
            Err(e) => Err(e),
        }
    }

    /// Has the device recompute the key bounds of one block's head near memory (after checking the
    /// payload CRC); returns (min, max, whether the stored bounds equal them).
    pub fn build_bounds(
        &mut self,
        block: BlockSpec,
        want: &BlockExpect,
    ) -> Result<(Vec<f32>, Vec<f32>, bool)> {
        let args = format::as_bytes(&cxlkv_ndp_block {
            key_lo: block.key.lo(),
            key_hi: block.key.hi(),
            token_offset: block.token_offset,
        })
        .to_vec();
        let cmd = cxlkv_ndp_cmd {
            opcode: CXLKV_NDP_OP_BUILD_BOUNDS as u16,
            sequence: want.sequence,
            layer: want.layer,
            kv_head: want.kv_head as u16,
            dtype: want.dtype as u8,
            group: 1,
            dim: want.dim,
            nblocks: 1,
            ..Default::default()
        };
        let (_, buf, _) = self.run_simple(cmd, &args, 64 + u64::from(want.dim) * 8)?;
        if buf.len() < 64 {
            return Err(NdpError::BadResult(buf.len() as u64));
        }
        let h: cxlkv_ndp_result = format::from_bytes(&buf);
        let d = want.dim as usize;
        let raw = buf
            .get(h.bounds_off as usize..h.bounds_off as usize + 8 * d)
            .ok_or(NdpError::BadResult(buf.len() as u64))?;
        let f: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok((f[..d].to_vec(), f[d..].to_vec(), h.bounds_match == 1))
    }

    /// The device's hottest blocks this epoch (at most `max`).
    pub fn hotlist(&mut self, max: usize) -> Result<Vec<cxlkv_ndp_hot_entry>> {
        let cmd = cxlkv_ndp_cmd {
            opcode: CXLKV_NDP_OP_HOTLIST as u16,
            k: max as u32,
            ..Default::default()
        };
        let (_, buf, _) = self.run_simple(cmd, &[], 64 + 32 * max as u64)?;
        if buf.len() < 64 {
            return Err(NdpError::BadResult(buf.len() as u64));
        }
        let h: cxlkv_ndp_result = format::from_bytes(&buf);
        let n = (h.per_list as usize).min(max);
        (0..n)
            .map(|i| {
                let at = h.bounds_off as usize + 32 * i;
                buf.get(at..at + 32)
                    .map(format::from_bytes::<cxlkv_ndp_hot_entry>)
                    .ok_or(NdpError::BadResult(buf.len() as u64))
            })
            .collect()
    }

    /// Feeds the device's HOTLIST (at most `max` blocks, its own decayed scan heat) into `hot` as
    /// the device signal (a snapshot that replaces the previous one). Returns the entries fed.
    pub fn feed_hotness(&mut self, hot: &Hotness, max: usize) -> Result<usize> {
        let pairs: Vec<(Key, u64)> = self
            .hotlist(max)?
            .iter()
            .map(|e| (Key::from_parts(e.key_lo, e.key_hi), e.heat))
            .collect();
        hot.record_device(&pairs);
        Ok(pairs.len())
    }

    /// Writes a raw command on this queue pair (tests of the device's validation). Returns the
    /// tag to pass to [`NdpDevice::wait_raw`], or why the ring did not take it.
    pub fn submit_raw(
        &mut self,
        mut cmd: cxlkv_ndp_cmd,
    ) -> Result<std::result::Result<u64, FallbackReason>> {
        let tag = self.new_tag();
        cmd.tag = tag;
        let start = Instant::now();
        self.pending.insert(
            u64::MAX - tag,
            Pending {
                tag,
                staging: None,
                req: empty_request(),
                result_off: 0,
                result_len: 0,
                stats: NdpStats::default(),
                start,
                forced: None,
            },
        );
        Ok(self.push(&cmd)?.map(|_| tag))
    }

    /// Waits for the completion of a raw command.
    pub fn wait_raw(
        &mut self,
        tag: u64,
    ) -> Result<std::result::Result<cxlkv_ndp_cpl, FallbackReason>> {
        let r = self.await_tag(tag, Instant::now() + self.opts.timeout);
        self.pending.remove(&(u64::MAX - tag));
        r
    }

    /// Stores an arbitrary value as this queue pair's `sq_tail` (tests of ring validation) and
    /// returns the value the client will continue from.
    pub fn corrupt_sq_tail(&mut self, value: u64) -> Result<()> {
        let mem = self.pool.memory();
        let base = self.layout.qp(self.qp);
        mem.store_u64(base + qpi::SQ_TAIL, value, Ordering::Release)?;
        self.sq_tail = value;
        Ok(())
    }

    /// Re-reads the device's `sq_head` and continues submitting from it (after a ring error).
    pub fn resync(&mut self) -> Result<()> {
        let mem = self.pool.memory();
        let base = self.layout.qp(self.qp);
        let head = mem.load_u64(base + qpi::SQ_HEAD, Ordering::Acquire)?;
        self.sq_tail = head;
        mem.store_u64(base + qpi::SQ_TAIL, head, Ordering::Release)?;
        Ok(())
    }
}

fn empty_request() -> OwnedRequest {
    OwnedRequest {
        queries: Vec::new(),
        dim: 0,
        blocks: Vec::new(),
        sequence: 0,
        layer: 0,
        kv_head: 0,
        dtype: DType::F16,
        k: 0,
        mode: GroupMode::PerQuery,
        prune: false,
        gather_values: false,
    }
}

/// Per-block metadata bytes a host-side reader pulls: block header, layout descriptor, index slot.
pub const HOST_META_BYTES_PER_BLOCK: u64 = format::BLOCK_HEADER_SIZE + 64 + format::INDEX_SLOT_SIZE;

fn resolve_all(
    pool: &Pool,
    blocks: &[BlockSpec],
    want: &BlockExpect,
) -> Result<(Vec<ResolvedBlock>, Vec<usize>)> {
    let mut out = Vec::with_capacity(blocks.len());
    for (i, b) in blocks.iter().enumerate() {
        let e = cxlkv_ndp_block {
            key_lo: b.key.lo(),
            key_hi: b.key.hi(),
            token_offset: b.token_offset,
        };
        out.push(resolve_block(pool, &e, want, i)?);
    }
    let order = sorted_ranges(&out)?;
    Ok((out, order))
}

/// SCORE_TOPK computed on the host: every key of every block is read across the link (a full
/// scan, no pruning) into private memory and scored with the same kernels as the device, so the
/// answer is identical. The stats count every byte pulled.
pub fn host_score_topk(pool: &Pool, req: &ScoreRequest<'_>, kernel: ScoreKernel) -> Result<TopK> {
    req.check()?;
    let start = Instant::now();
    let want = req.expect();
    let mem = pool.memory();
    let queries =
        QueryGroup::new(req.queries, req.dim).map_err(|e| NdpError::BadRequest(e.to_string()))?;
    for _attempt in 0..crate::pool::READ_RETRIES {
        let (blocks, order) = resolve_all(pool, req.blocks, &want)?;
        let mut scan = TopKScan::new(kernel, req.group(), req.k, req.mode);
        let mut pulled = 0u64;
        let mut buf = Vec::new();
        for b in &blocks {
            buf.resize(b.head_bytes as usize, 0);
            coherence::acquire(&**mem, Site::PayloadRead, b.k_off, b.head_bytes);
            mem.read(b.k_off, &mut buf)?;
            pulled += b.head_bytes + HOST_META_BYTES_PER_BLOCK;
            let keys = KeyRows::new(&buf, req.dtype, req.dim)
                .map_err(|e| NdpError::BadRequest(e.to_string()))?;
            scan.scan(&queries, &keys, b.base);
        }
        let (lists, st) = scan.finish();
        let mut values = Vec::new();
        if req.gather_values {
            let row = req.dim * req.dtype.size();
            let mut r = vec![0u8; row];
            for h in lists.iter().flatten() {
                let (bi, i) = locate_token(&blocks, &order, h.index)
                    .ok_or(DeviceStatus::at(CXLKV_NDP_ERR_TOKEN, h.index as usize))?;
                let off = blocks[bi].v_off + (i * row) as u64;
                coherence::acquire(&**mem, Site::PayloadRead, off, row as u64);
                mem.read(off, &mut r)?;
                values.extend_from_slice(&r);
                pulled += row as u64;
            }
        }
        if !blocks
            .iter()
            .all(|b| pool.still_valid(&b.block).unwrap_or(false))
        {
            continue;
        }
        let scale = 1.0 / (req.dim as f32).sqrt();
        let mass = block_mass(&lists[0], &blocks, &order, scale);
        return Ok(TopK {
            indices: lists
                .iter()
                .map(|l| l.iter().map(|h| h.index).collect())
                .collect(),
            scores: lists
                .iter()
                .map(|l| l.iter().map(|h| h.score).collect())
                .collect(),
            values,
            stats: NdpStats {
                path: Some(NdpPath::Host(FallbackReason::Forced)),
                host_scan_bytes: pulled,
                bytes_scanned: st.bytes_scanned,
                blocks_scanned: st.blocks_scanned,
                block_mass: mass,
                elapsed: start.elapsed(),
                ..Default::default()
            },
        });
    }
    Err(NdpError::Stale(0))
}

/// GATHER computed on the host: the value rows of `tokens`, `[tokens][dim]` raw.
pub fn host_gather(
    pool: &Pool,
    blocks: &[BlockSpec],
    want: &BlockExpect,
    tokens: &[u32],
) -> Result<(Vec<u8>, NdpStats)> {
    let start = Instant::now();
    let mem = pool.memory();
    for _ in 0..crate::pool::READ_RETRIES {
        let (rb, order) = resolve_all(pool, blocks, want)?;
        let row = want.dim as usize * want.dtype.size();
        let mut out = vec![0u8; row * tokens.len()];
        for (j, &t) in tokens.iter().enumerate() {
            let (bi, i) =
                locate_token(&rb, &order, t).ok_or(DeviceStatus::at(CXLKV_NDP_ERR_TOKEN, j))?;
            let off = rb[bi].v_off + (i * row) as u64;
            coherence::acquire(&**mem, Site::PayloadRead, off, row as u64);
            mem.read(off, &mut out[j * row..(j + 1) * row])?;
        }
        if rb
            .iter()
            .all(|b| pool.still_valid(&b.block).unwrap_or(false))
        {
            let pulled = out.len() as u64 + HOST_META_BYTES_PER_BLOCK * rb.len() as u64;
            let stats = NdpStats {
                path: Some(NdpPath::Host(FallbackReason::Forced)),
                host_scan_bytes: pulled,
                elapsed: start.elapsed(),
                ..Default::default()
            };
            return Ok((out, stats));
        }
    }
    Err(NdpError::Stale(0))
}

/// Encodes host-computed lists the way the device does (for tests comparing result buffers).
pub fn encode_host_result(
    lists: &[Vec<Hit>],
    dim: usize,
    dtype: DType,
    values: Option<&[u8]>,
    mass: &[f32],
    stats: &ScanStats,
) -> Vec<u8> {
    let per = lists.first().map_or(0, Vec::len);
    encode_topk_result(lists, per, dim, dtype, values, mass, stats)
}
