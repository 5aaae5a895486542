//! The device's commands as the client issues them: SCORE_TOPK submitted, polled and waited for
//! (computed on the host when the device cannot answer), and NOP, GATHER, BUILD_BOUNDS, HOTLIST
//! and raw commands run to completion.

use crate::coherence::{self, Site};
use crate::format;
use crate::hotness::Hotness;
use crate::key::Key;
use crate::metrics::{count_device, count_failure, global, Op};
use crate::ndp::abi::*;
use crate::ndp::block::{gathered_dtype, BlockExpect};
use crate::ndp::client::error::{FallbackReason, NdpError, Result};
use crate::ndp::client::fallback::{host_attend_as, host_gather, host_score_topk_as};
use crate::ndp::client::request::{
    AttendRequest, Attended, BlockSpec, NdpPath, NdpStats, OwnedRequest, ScoreRequest, TopK,
};
use crate::ndp::client::ring::{NdpDevice, Pending, Ticket};
use crate::ndp::layout::reg;
use crate::ndp::layout::DeviceStatus;
use crate::ndp::result::{
    attend_result_size, decode_attend_result, decode_list_info, decode_topk_result,
    topk_result_size,
};
use crate::ndp::sparse::{select_to_abi, sparse_result_size, Sparse};
use cxlkv_kernels::{DType, GroupMode};
use std::time::{Duration, Instant};

/// The capability a command on blocks of `dtype` needs beside its own: CAP_QUANT for int8 and
/// int4 blocks (a device without it, such as the HLS engine, leaves them to the host).
fn quant_cap(dtype: DType) -> u32 {
    if dtype.is_quantized() {
        CXLKV_NDP_CAP_QUANT
    } else {
        0
    }
}

/// What a settled command answers.
enum Answer {
    TopK(TopK),
    Attend(Attended),
}

impl Answer {
    /// Its figures in the metrics: its op, path and costs, the bytes handed back (each hit's index
    /// and score and the value rows; each query's partial `out`, `max` and `sum`).
    fn counts(&self) -> (Op, &NdpStats, u64) {
        match self {
            Answer::TopK(t) => (Op::ScoreTopk, &t.stats, topk_bytes_out(t)),
            Answer::Attend(a) => (Op::Attend, &a.stats, attend_bytes_out(a)),
        }
    }

    fn topk(self) -> Result<TopK> {
        match self {
            Answer::TopK(t) => Ok(t),
            Answer::Attend(_) => Err(NdpError::BadRequest(
                "the ticket is an ATTEND: wait for it with wait_attend".into(),
            )),
        }
    }

    fn attended(self) -> Result<Attended> {
        match self {
            Answer::Attend(a) => Ok(a),
            Answer::TopK(_) => Err(NdpError::BadRequest(
                "the ticket is a SCORE_TOPK: wait for it with wait".into(),
            )),
        }
    }
}

/// Bytes a SCORE_TOPK answer hands back: 8 per hit (index and score), and the value rows.
fn topk_bytes_out(t: &TopK) -> u64 {
    let hits: usize = t.indices.iter().map(Vec::len).sum();
    (hits * 8 + t.values.len()) as u64
}

/// Bytes an ATTEND answer hands back: per query its `out` row, `max` and `sum` (f32).
fn attend_bytes_out(a: &Attended) -> u64 {
    let parts: u64 = a
        .partials
        .iter()
        .map(|p| 4 * (p.out.len() as u64 + 2))
        .sum();
    parts + 8 * a.selection.len() as u64
}

/// Bytes of a request's query vectors (f32), what the caller hands in.
fn query_bytes(queries: &[f32]) -> u64 {
    4 * queries.len() as u64
}

/// Appends the queries (f32) and the block list entries, the arguments' common head.
fn push_queries_and_blocks(args: &mut Vec<u8>, queries: &[f32], blocks: &[BlockSpec]) {
    for q in queries {
        args.extend_from_slice(&q.to_le_bytes());
    }
    for b in blocks {
        let e = cxlkv_ndp_block {
            key_lo: b.key.lo(),
            key_hi: b.key.hi(),
            token_offset: b.token_offset,
        };
        args.extend_from_slice(format::as_bytes(&e));
    }
}

impl NdpDevice {
    /// Submits an ATTEND: the partial attention of the request's queries over every token of its
    /// blocks. The answer comes from [`NdpDevice::wait_attend`]; when the device cannot take the
    /// command (absent, dead, busy, lacking `CXLKV_NDP_CAP_ATTEND`) it is computed on the host.
    ///
    /// Metrics (the module [`crate::metrics`]): the command counts once, as `attend`, when its
    /// answer is collected or when it fails; a request its check refuses is not counted.
    pub fn submit_attend(&mut self, req: &AttendRequest<'_>) -> Result<Ticket> {
        req.check()?;
        let t0 = Instant::now();
        let owned = req.owned();
        let r = self.enqueue(owned, |dev, tag| dev.try_submit_attend(req, tag));
        if r.is_err() {
            count_failure(Op::Attend, t0);
        }
        r
    }

    /// Waits for the answer of an ATTEND ticket: from the device within the timeout, else from
    /// the host.
    pub fn wait_attend(&mut self, ticket: Ticket) -> Result<Attended> {
        self.settle(&ticket, true)?
            .expect("a blocking settle always answers")
            .attended()
    }

    /// The answer of an ATTEND ticket if it is ready (computed on the host if the device gave up
    /// on it or its deadline passed), else `None`: [`NdpDevice::poll`] for ATTEND.
    pub fn poll_attend(&mut self, ticket: &Ticket) -> Result<Option<Attended>> {
        self.settle(ticket, false)?
            .map(Answer::attended)
            .transpose()
    }

    /// Submits and waits: [`NdpDevice::submit_attend`] then [`NdpDevice::wait_attend`].
    pub fn attend(&mut self, req: &AttendRequest<'_>) -> Result<Attended> {
        let t = self.submit_attend(req)?;
        self.wait_attend(t)
    }

    /// Submits a SCORE_TOPK. The answer comes from [`NdpDevice::poll`] or [`NdpDevice::wait`];
    /// when the device cannot take the command it will be computed on the host.
    /// Counted as `score_topk` as [`NdpDevice::submit_attend`] is as `attend`.
    pub fn submit_score(&mut self, req: &ScoreRequest<'_>) -> Result<Ticket> {
        req.check()?;
        let t0 = Instant::now();
        let owned = req.owned();
        let r = self.enqueue(owned, |dev, tag| dev.try_submit_score(req, tag));
        if r.is_err() {
            count_failure(Op::ScoreTopk, t0);
        }
        r
    }

    /// SCORE_TOPK computed on the host by this client (the reference path: [`host_score_topk_as`]
    /// with the client's kernel and tenant; the answer the device gives too). Counted as `score_topk`, a
    /// fallback of reason `forced`.
    pub fn score_topk_on_host(&self, req: &ScoreRequest<'_>) -> Result<TopK> {
        req.check()?;
        let t0 = Instant::now();
        let r = self
            .tenant()
            .and_then(|t| host_score_topk_as(&self.pool, t, req, self.opts.kernel));
        count_device(Op::ScoreTopk, t0, &r, |t| {
            (&t.stats, query_bytes(req.queries), topk_bytes_out(t))
        });
        r
    }

    /// ATTEND computed on the host by this client (the reference path, [`host_attend_as`] with
    /// the client's kernel and tenant). Counted as `attend`, a fallback of reason `forced`.
    pub fn attend_on_host(&self, req: &AttendRequest<'_>) -> Result<Attended> {
        req.check()?;
        let t0 = Instant::now();
        let r = self
            .tenant()
            .and_then(|t| host_attend_as(&self.pool, t, req, self.opts.kernel));
        count_device(Op::Attend, t0, &r, |a| {
            (&a.stats, query_bytes(req.queries), attend_bytes_out(a))
        });
        r
    }

    /// Whether the attached device advertises capability `cap` (`CXLKV_NDP_CAP_*`).
    /// True if the device has every capability bit of `cap`.
    fn capable(&self, cap: u32) -> Result<bool> {
        Ok(self.reg(reg::CAPABILITIES)? & u64::from(cap) == u64::from(cap))
    }

    /// Files a checked command under a new ticket: `stage` writes it to the ring (or says why
    /// it cannot go to the device, and the host will compute it when the ticket is settled).
    fn enqueue(
        &mut self,
        req: OwnedRequest,
        stage: impl FnOnce(
            &mut Self,
            u64,
        )
            -> Result<std::result::Result<(usize, u64, u64, u64), FallbackReason>>,
    ) -> Result<Ticket> {
        let start = Instant::now();
        let id = self.next_ticket;
        self.next_ticket += 1;
        let tag = self.new_tag();
        let mut pending = Pending {
            tag,
            staging: None,
            req,
            result_off: 0,
            result_len: 0,
            stats: NdpStats::default(),
            start,
            forced: None,
        };
        match stage(self, tag)? {
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
        let g = req.group();
        let lists = if req.mode == GroupMode::PerQuery {
            g
        } else {
            1
        };
        let select = req.select.is_active();
        let mut args = Vec::with_capacity(req.queries.len() * 4 + req.blocks.len() * 24 + 64);
        push_queries_and_blocks(&mut args, req.queries, req.blocks);
        if select {
            args.extend_from_slice(format::as_bytes(&req.select.to_abi(req.scale())));
        }
        let result_len = topk_result_size(
            lists,
            req.k,
            req.dim,
            gathered_dtype(req.dtype).bytes(1),
            req.gather_values,
            req.blocks.len(),
        )
        .map(|n| n + if select { 8 + 8 * lists as u64 } else { 0 })
        .unwrap_or(u64::MAX);
        let mut flags = 0u16;
        // Pruning is a hint (the answer is the same without it); quantized blocks are scanned
        // whole, and a device refuses FLAG_PRUNE on them.
        if req.prune && !select && !req.dtype.is_quantized() {
            flags |= CXLKV_NDP_FLAG_PRUNE as u16;
        }
        if req.mode == GroupMode::GroupMax {
            flags |= CXLKV_NDP_FLAG_GROUP_MAX as u16;
        }
        if req.gather_values {
            flags |= CXLKV_NDP_FLAG_GATHER_V as u16;
        }
        if select {
            flags |= CXLKV_NDP_FLAG_SELECT as u16;
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
            ..Default::default()
        };
        let cap = if select { CXLKV_NDP_CAP_SELECT } else { 0 } | quant_cap(req.dtype);
        self.try_stage(cmd, &args, result_len, cap)
    }

    fn try_submit_attend(
        &mut self,
        req: &AttendRequest<'_>,
        tag: u64,
    ) -> Result<std::result::Result<(usize, u64, u64, u64), FallbackReason>> {
        let mut args = Vec::with_capacity(req.queries.len() * 4 + req.blocks.len() * 24 + 80);
        push_queries_and_blocks(&mut args, req.queries, req.blocks);
        args.extend_from_slice(format::as_bytes(&cxlkv_ndp_attend {
            scale: req.scale(),
            ..Default::default()
        }));
        let g = req.queries.len() / req.dim;
        if let Some(sp) = &req.sparse {
            args.extend_from_slice(format::as_bytes(&select_to_abi(sp, req.scale())));
            let cmd = cxlkv_ndp_cmd {
                tag,
                opcode: CXLKV_NDP_OP_ATTEND as u16,
                flags: CXLKV_NDP_FLAG_SELECT as u16,
                k: sp.k as u32,
                sequence: req.sequence,
                layer: req.layer,
                kv_head: req.kv_head as u16,
                dtype: req.dtype as u8,
                group: g as u8,
                dim: req.dim as u32,
                nblocks: req.blocks.len() as u32,
                ..Default::default()
            };
            let result_len = sparse_result_size(g, req.dim).unwrap_or(u64::MAX);
            // Rows picked one by one (a sketch's candidates, a quantized block's runs).
            let sketch = if sp.candidates.is_some() || req.dtype.is_quantized() {
                CXLKV_NDP_CAP_SKETCH
            } else {
                0
            };
            let caps = CXLKV_NDP_CAP_SPARSE_ATTEND | quant_cap(req.dtype) | sketch;
            return self.try_stage(cmd, &args, result_len, caps);
        }
        let cmd = cxlkv_ndp_cmd {
            tag,
            opcode: CXLKV_NDP_OP_ATTEND as u16,
            sequence: req.sequence,
            layer: req.layer,
            kv_head: req.kv_head as u16,
            dtype: req.dtype as u8,
            group: g as u8,
            dim: req.dim as u32,
            nblocks: req.blocks.len() as u32,
            ..Default::default()
        };
        let result_len = attend_result_size(g, req.dim).unwrap_or(u64::MAX);
        self.try_stage(
            cmd,
            &args,
            result_len,
            CXLKV_NDP_CAP_ATTEND | quant_cap(req.dtype),
        )
    }

    /// Puts `args` in a free staging block and submits `cmd` with its buffers there, if a live
    /// device that has capability `cap` (0: none needed) can take it; returns the staging block,
    /// the result's offset and length and the bytes sent, or why the host must compute it.
    fn try_stage(
        &mut self,
        mut cmd: cxlkv_ndp_cmd,
        args: &[u8],
        result_len: u64,
        cap: u32,
    ) -> Result<std::result::Result<(usize, u64, u64, u64), FallbackReason>> {
        let generation = match self.device_state()? {
            Ok(g) => g,
            Err(why) => return Ok(Err(why)),
        };
        if cap != 0 && !self.capable(cap)? {
            return Ok(Err(FallbackReason::Unsupported));
        }
        self.release_old(generation);
        self.drain()?;
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
        mem.write(off, args)?;
        coherence::publish(&*mem, Site::NdpSubmitWrite, off, args.len() as u64);
        cmd.args_off = off;
        cmd.result_off = off + result_at;
        cmd.args_len = args.len() as u32;
        cmd.result_len = result_len as u32;
        match self.push(&cmd)? {
            Ok(sent) => {
                self.staging[si].owner = Some(cmd.tag);
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
        self.settle(ticket, false)?.map(Answer::topk).transpose()
    }

    /// Waits for the answer of `ticket`: from the device within the timeout, else from the host.
    pub fn wait(&mut self, ticket: Ticket) -> Result<TopK> {
        self.settle(&ticket, true)?
            .expect("a blocking settle always answers")
            .topk()
    }

    /// Submits and waits: [`NdpDevice::submit_score`] then [`NdpDevice::wait`].
    pub fn score_topk(&mut self, req: &ScoreRequest<'_>) -> Result<TopK> {
        let t = self.submit_score(req)?;
        self.wait(t)
    }

    /// Settles `ticket` (see [`NdpDevice::poll`] and [`NdpDevice::wait`]) and counts the command
    /// in the metrics once it answers or fails.
    fn settle(&mut self, ticket: &Ticket, block: bool) -> Result<Option<Answer>> {
        let p = self
            .pending
            .get(&ticket.0)
            .ok_or(NdpError::UnknownTicket(ticket.0))?;
        let op = if p.req.attend {
            Op::Attend
        } else {
            Op::ScoreTopk
        };
        let (start, bytes_in) = (p.start, query_bytes(p.req.borrow().queries));
        let r = self.settle_pending(ticket, block);
        match &r {
            Ok(Some(a)) => {
                let (answered, stats, bytes_out) = a.counts();
                global().record_device(answered, stats, bytes_in, bytes_out);
            }
            Ok(None) => {}
            Err(_) => count_failure(op, start),
        }
        r
    }

    fn settle_pending(&mut self, ticket: &Ticket, block: bool) -> Result<Option<Answer>> {
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
                self.on_host(p, why).map(Some)
            }
        }
    }

    /// Computes `p`'s request on the host because of `why`: the answer's stats are `p`'s (what
    /// the device path already cost) with the host scan's costs and counts.
    fn on_host(&self, p: Pending, why: FallbackReason) -> Result<Answer> {
        // Published in the participant's slot (`fallbacks`), so `cxlkv pool stat` sees it.
        self.participant.count_fallbacks(1);
        // The host reads as this client's tenant: it never returns what the device refuses.
        let tenant = self.tenant()?;
        if p.req.attend {
            let req = p.req.borrow_attend();
            let mut a = host_attend_as(&self.pool, tenant, &req, self.opts.kernel)?;
            let mut stats = p.stats;
            stats.path = Some(NdpPath::Host(why));
            stats.host_scan_bytes = a.stats.host_scan_bytes;
            stats.bytes_scanned = a.stats.bytes_scanned;
            stats.blocks_scanned = a.stats.blocks_scanned;
            stats.elapsed = p.start.elapsed();
            a.stats = stats;
            return Ok(Answer::Attend(a));
        }
        let mut r = host_score_topk_as(&self.pool, tenant, &p.req.borrow(), self.opts.kernel)?;
        let mut stats = p.stats;
        stats.path = Some(NdpPath::Host(why));
        stats.host_scan_bytes = r.stats.host_scan_bytes;
        stats.bytes_scanned = r.stats.bytes_scanned;
        stats.blocks_scanned = r.stats.blocks_scanned;
        stats.blocks_pruned = r.stats.blocks_pruned;
        stats.block_mass = std::mem::take(&mut r.stats.block_mass);
        stats.elapsed = p.start.elapsed();
        r.stats = stats;
        Ok(Answer::TopK(r))
    }

    fn finish_device(&mut self, mut p: Pending, c: cxlkv_ndp_cpl) -> Result<Answer> {
        p.stats.bytes_from_device += u64::from(CXLKV_NDP_CPL_SIZE) + 8;
        if c.status == CXLKV_NDP_ERR_STALE
            || c.status == CXLKV_NDP_ERR_RESTARTED
            || c.status == CXLKV_NDP_ERR_INTERNAL
        {
            self.release_staging(p.staging);
            return self.on_host(p, FallbackReason::DeviceRetry);
        }
        let mut stats = std::mem::take(&mut p.stats);
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
        stats.path = Some(NdpPath::Device);
        stats.bytes_scanned = c.bytes_scanned;
        stats.blocks_scanned = c.blocks_scanned;
        stats.blocks_pruned = c.blocks_pruned;
        stats.device_ns = c.device_ns;
        stats.elapsed = p.start.elapsed();
        let req = &p.req;
        if req.attend {
            let a = req.borrow_attend();
            let g = a.queries.len() / a.dim;
            let (partials, _) =
                decode_attend_result(&buf, g, a.dim).ok_or(NdpError::BadResult(n))?;
            let selection = match a.sparse {
                Some(_) => decode_list_info(&buf)
                    .filter(|i| i.len() == g)
                    .ok_or(NdpError::BadResult(n))?,
                None => Vec::new(),
            };
            let rescored = match a.sparse {
                Some(Sparse {
                    candidates: Some(_),
                    ..
                }) => {
                    let h: cxlkv_ndp_result = format::from_bytes(&buf);
                    Some(h.bounds_match as usize)
                }
                _ => None,
            };
            return Ok(Answer::Attend(Attended {
                partials,
                selection,
                rescored,
                stats,
            }));
        }
        let r = req.borrow();
        let mut d = decode_topk_result(&buf, gathered_dtype(r.dtype).bytes(1))
            .ok_or(NdpError::BadResult(n))?;
        let mut left_out_mass = Vec::new();
        if r.select.is_active() {
            let info = decode_list_info(&buf).ok_or(NdpError::BadResult(n))?;
            if info.len() != d.lists.len()
                || info
                    .iter()
                    .zip(&d.lists)
                    .any(|(i, l)| i.0 as usize != l.len())
            {
                return Err(NdpError::BadResult(n));
            }
            left_out_mass = info.iter().map(|i| i.1).collect();
            if r.gather_values {
                // The device pads each list's rows to `per_list`; keep the hits' rows only.
                let row = gathered_dtype(r.dtype).bytes(r.dim);
                let per = d.values.len() / row / d.lists.len().max(1);
                let mut v = Vec::new();
                for (l, list) in d.lists.iter().enumerate() {
                    let at = l * per * row;
                    v.extend_from_slice(
                        d.values
                            .get(at..at + list.len() * row)
                            .ok_or(NdpError::BadResult(n))?,
                    );
                }
                d.values = v;
            }
        }
        stats.block_mass = d.mass;
        Ok(Answer::TopK(TopK {
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
            left_out_mass,
            stats,
        }))
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
        self.pending
            .insert(u64::MAX - tag, Pending::bare(tag, start));
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
    ///
    /// Counted as `gather` in the process's metrics: the token list in (4 bytes a token), the
    /// rows out. No blocks, no tokens or a zero `dim` is a bad request (not counted).
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
        if blocks.is_empty() || tokens.is_empty() || dim == 0 {
            return Err(NdpError::BadRequest(format!(
                "{} blocks, {} tokens and dim {dim}: each must be positive",
                blocks.len(),
                tokens.len()
            )));
        }
        let t0 = Instant::now();
        let r = self.gather_rows(blocks, sequence, layer, kv_head, dtype, dim, tokens);
        count_device(Op::Gather, t0, &r, |(rows, stats)| {
            (stats, 4 * tokens.len() as u64, rows.len() as u64)
        });
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn gather_rows(
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
            tenant: self.tenant()?,
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
        let esize = gathered_dtype(dtype).bytes(1);
        let rlen = topk_result_size(1, tokens.len(), dim, esize, true, 0).unwrap_or(u64::MAX);
        if dtype.is_quantized()
            && self.device_state()?.is_ok()
            && !self.capable(CXLKV_NDP_CAP_QUANT)?
        {
            self.participant.count_fallbacks(1);
            let (v, mut stats) = host_gather(&self.pool, blocks, &want, tokens)?;
            stats.path = Some(NdpPath::Host(FallbackReason::Unsupported));
            return Ok((v, stats));
        }
        match self.run_simple(cmd, &args, rlen) {
            Ok((_, buf, stats)) => {
                let d =
                    decode_topk_result(&buf, esize).ok_or(NdpError::BadResult(buf.len() as u64))?;
                Ok((d.values, stats))
            }
            Err(NdpError::Unavailable(why)) => {
                self.participant.count_fallbacks(1);
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
        self.pending
            .insert(u64::MAX - tag, Pending::bare(tag, start));
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
}
