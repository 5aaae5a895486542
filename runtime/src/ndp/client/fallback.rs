//! The host path: SCORE_TOPK and GATHER computed on the host with the same block checks and the
//! same kernels' scan as the device, so a caller gets the same answer whichever path ran.

use crate::coherence::{self, Site};
use crate::format;
use crate::ndp::abi::*;
use crate::ndp::block::{
    locate_token, read_scales, read_value_row, resolve_block, sorted_ranges, BlockExpect,
    ResolvedBlock,
};
use crate::ndp::client::error::{NdpError, Result};
use crate::ndp::client::host_rows::PulledRows;
use crate::ndp::client::request::{
    AttendRequest, Attended, BlockSpec, NdpStats, ScoreRequest, TopK,
};
use crate::ndp::layout::DeviceStatus;
use crate::ndp::quant;
use crate::ndp::result::{block_mass, ScanStats};
use crate::ndp::select::Selection;
use crate::ndp::sketch::sparse_rows;
use crate::ndp::sparse::{left_out, union, Sparse};
use crate::pool::Pool;
use cxlkv_kernels::attention::default_scale;
use cxlkv_kernels::{
    attend_block, GroupMode, Hit, KernelScorer, KeyRows, Partial, PrunedScan, QueryGroup,
    ScoreKernel, VisitOrder,
};
use std::time::Instant;

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

/// The value rows of `hits` (in order), pulled across the link (dequantized to f32 for a
/// quantized block, as the device returns them); returns the bytes pulled.
fn pull_values<'h>(
    pool: &Pool,
    blocks: &[ResolvedBlock],
    order: &[usize],
    want: &BlockExpect,
    hits: impl Iterator<Item = &'h Hit>,
    values: &mut Vec<u8>,
) -> Result<u64> {
    let mem = pool.memory();
    let mut pulled = 0;
    for h in hits {
        let (bi, i) = locate_token(blocks, order, h.index)
            .ok_or(DeviceStatus::at(CXLKV_NDP_ERR_TOKEN, h.index as usize))?;
        let (r, n) = read_value_row(&**mem, &blocks[bi], i, want.dim as usize, want.dtype)?;
        values.extend_from_slice(&r);
        pulled += n;
    }
    Ok(pulled)
}

/// Reads `len` bytes at `off` into `buf` (resized), across the link.
fn pull(pool: &Pool, off: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
    let mem = pool.memory();
    buf.resize(len as usize, 0);
    coherence::acquire(&**mem, Site::PayloadRead, off, len);
    mem.read(off, buf)?;
    Ok(())
}

/// The list of hits as token indices and scores.
fn split_lists(lists: &[Vec<Hit>]) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    (
        lists
            .iter()
            .map(|l| l.iter().map(|h| h.index).collect())
            .collect(),
        lists
            .iter()
            .map(|l| l.iter().map(|h| h.score).collect())
            .collect(),
    )
}

/// SCORE_TOPK with an active selection on the host: every key of every block is scored (in block
/// list order, like the device) and fed to the shared [`Selection`].
fn host_select(
    pool: &Pool,
    tenant: u64,
    req: &ScoreRequest<'_>,
    kernel: ScoreKernel,
) -> Result<TopK> {
    let start = Instant::now();
    let want = req.expect(tenant);
    let queries =
        QueryGroup::new(req.queries, req.dim).map_err(|e| NdpError::BadRequest(e.to_string()))?;
    let g = queries.count();
    let group_max = req.mode == GroupMode::GroupMax;
    for _attempt in 0..crate::pool::READ_RETRIES {
        let (blocks, order) = resolve_all(pool, req.blocks, &want)?;
        let ranges: Vec<(u64, u64)> = blocks
            .iter()
            .map(|b| (u64::from(b.base), u64::from(b.base) + u64::from(b.tokens)))
            .collect();
        let lists = if group_max { 1 } else { g };
        let mut sel = Selection::new(req.select, req.k, req.scale(), lists, &ranges)?;
        let (mut pulled, mut scanned) = (0u64, 0u64);
        let (mut buf, mut scores) = (Vec::new(), Vec::new());
        for b in &blocks {
            pull(pool, b.k_off, b.head_bytes, &mut buf)?;
            let k_scales = read_k_scales(pool, b, req.dim)?;
            let read = b.head_bytes + 4 * k_scales.len() as u64;
            pulled += read + HOST_META_BYTES_PER_BLOCK;
            scanned += read;
            let keys = KeyRows::new(&buf, req.dtype, req.dim)
                .map_err(|e| NdpError::BadRequest(e.to_string()))?;
            if b.quantized() {
                quant::score(kernel, &queries, &keys, &k_scales, &mut scores);
            } else {
                scores.resize(keys.len() * g, 0.0);
                kernel.score(&queries, &keys, &mut scores);
            }
            sel.feed(b.base, &scores, g, group_max);
        }
        let got = sel.finish();
        let mut values = Vec::new();
        if req.gather_values {
            pulled += pull_values(
                pool,
                &blocks,
                &order,
                &want,
                got.lists.iter().flatten(),
                &mut values,
            )?;
        }
        if !blocks
            .iter()
            .all(|b| pool.still_valid(&b.block).unwrap_or(false))
        {
            continue;
        }
        let mass = block_mass(&got.lists[0], &blocks, &order, req.scale());
        let (indices, scores) = split_lists(&got.lists);
        return Ok(TopK {
            indices,
            scores,
            values,
            left_out_mass: got.left_out,
            stats: NdpStats {
                block_mass: mass,
                ..NdpStats::on_host(pulled, scanned, blocks.len(), start)
            },
        });
    }
    Err(NdpError::Stale(0))
}

/// SCORE_TOPK computed on the host: every key of every block is read across the link (a full
/// scan, no pruning) into private memory and scored with the same kernels as the device, so the
/// answer is identical. The stats count every byte pulled. It reads as no tenant: blocks of
/// tenant 0 only ([`host_score_topk_as`] reads as a tenant).
pub fn host_score_topk(pool: &Pool, req: &ScoreRequest<'_>, kernel: ScoreKernel) -> Result<TopK> {
    host_score_topk_as(pool, 0, req, kernel)
}

/// [`host_score_topk`] for a reader attached as `tenant`: a block of another tenant is refused
/// with `CXLKV_NDP_ERR_ACCESS`, as the device refuses it ([`Pool::reads_tenant`]).
pub fn host_score_topk_as(
    pool: &Pool,
    tenant: u64,
    req: &ScoreRequest<'_>,
    kernel: ScoreKernel,
) -> Result<TopK> {
    req.check()?;
    if req.select.is_active() {
        return host_select(pool, tenant, req, kernel);
    }
    let start = Instant::now();
    let want = req.expect(tenant);
    let mem = pool.memory();
    let queries =
        QueryGroup::new(req.queries, req.dim).map_err(|e| NdpError::BadRequest(e.to_string()))?;
    if req.dtype.is_quantized() {
        return host_folded_topk(pool, tenant, req, kernel, &queries);
    }
    for _attempt in 0..crate::pool::READ_RETRIES {
        let (blocks, order) = resolve_all(pool, req.blocks, &want)?;
        let scorer = KernelScorer::new(
            kernel,
            &queries,
            cxlkv_kernels::TopK {
                k: req.k,
                mode: req.mode,
            },
        );
        let visits = VisitOrder::in_order(blocks.iter().map(|b| b.head_bytes).collect());
        let mut scan = PrunedScan::new(scorer, visits);
        let mut pulled = 0u64;
        let mut buf = Vec::new();
        while let Some(i) = scan.next_block() {
            let b = &blocks[i];
            buf.resize(b.head_bytes as usize, 0);
            coherence::acquire(&**mem, Site::PayloadRead, b.k_off, b.head_bytes);
            mem.read(b.k_off, &mut buf)?;
            pulled += b.head_bytes + HOST_META_BYTES_PER_BLOCK;
            let keys = KeyRows::new(&buf, req.dtype, req.dim)
                .map_err(|e| NdpError::BadRequest(e.to_string()))?;
            scan.scan(&keys, b.base);
        }
        let (lists, counts) = scan.finish();
        let st = ScanStats::from(&counts);
        let mut values = Vec::new();
        if req.gather_values {
            pulled += pull_values(
                pool,
                &blocks,
                &order,
                &want,
                lists.iter().flatten(),
                &mut values,
            )?;
        }
        if !blocks
            .iter()
            .all(|b| pool.still_valid(&b.block).unwrap_or(false))
        {
            continue;
        }
        // Plain SCORE_TOPK carries no scale on the wire (ABI 1.0): its block mass uses the default.
        let mass = block_mass(&lists[0], &blocks, &order, default_scale(req.dim));
        let (indices, scores) = split_lists(&lists);
        return Ok(TopK {
            indices,
            scores,
            values,
            left_out_mass: Vec::new(),
            stats: NdpStats {
                block_mass: mass,
                ..NdpStats::on_host(pulled, st.bytes_scanned, st.blocks_scanned as usize, start)
            },
        });
    }
    Err(NdpError::Stale(0))
}

/// The key scales of a quantized block's head (`dim` f32, pulled across the link), or none.
fn read_k_scales(pool: &Pool, b: &ResolvedBlock, dim: usize) -> Result<Vec<f32>> {
    if !b.quantized() {
        return Ok(Vec::new());
    }
    Ok(read_scales(&**pool.memory(), b, dim)?.0)
}

/// Plain SCORE_TOPK over quantized blocks on the host: every block's key codes and scales pulled
/// and scored in list order with the folded queries ([`quant::FoldedTopK`], as the device does;
/// pruning does not apply to quantized blocks).
fn host_folded_topk(
    pool: &Pool,
    tenant: u64,
    req: &ScoreRequest<'_>,
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
) -> Result<TopK> {
    let start = Instant::now();
    let want = req.expect(tenant);
    for _attempt in 0..crate::pool::READ_RETRIES {
        let (blocks, order) = resolve_all(pool, req.blocks, &want)?;
        let topk = cxlkv_kernels::TopK {
            k: req.k,
            mode: req.mode,
        };
        let mut scan = quant::FoldedTopK::new(kernel, queries, topk);
        let (mut pulled, mut scanned) = (0u64, 0u64);
        let mut buf = Vec::new();
        for b in &blocks {
            pull(pool, b.k_off, b.head_bytes, &mut buf)?;
            let k_scales = read_k_scales(pool, b, req.dim)?;
            let read = b.head_bytes + 4 * k_scales.len() as u64;
            pulled += read + HOST_META_BYTES_PER_BLOCK;
            scanned += read;
            let keys = KeyRows::new(&buf, req.dtype, req.dim)
                .map_err(|e| NdpError::BadRequest(e.to_string()))?;
            scan.block(&keys, b.base, &k_scales);
        }
        let lists = scan.finish();
        let mut values = Vec::new();
        if req.gather_values {
            pulled += pull_values(
                pool,
                &blocks,
                &order,
                &want,
                lists.iter().flatten(),
                &mut values,
            )?;
        }
        if !blocks
            .iter()
            .all(|b| pool.still_valid(&b.block).unwrap_or(false))
        {
            continue;
        }
        let mass = block_mass(&lists[0], &blocks, &order, default_scale(req.dim));
        let (indices, scores) = split_lists(&lists);
        return Ok(TopK {
            indices,
            scores,
            values,
            left_out_mass: Vec::new(),
            stats: NdpStats {
                block_mass: mass,
                ..NdpStats::on_host(pulled, scanned, blocks.len(), start)
            },
        });
    }
    Err(NdpError::Stale(0))
}

/// ATTEND computed on the host: every key and value row of every block is read across the link
/// into private memory and attended with the same fused kernel as the device
/// ([`cxlkv_kernels::attend_block`]), the blocks' partials merged in block-list order, so the
/// answer is identical to the device's. It reads as no tenant: blocks of tenant 0 only
/// ([`host_attend_as`] reads as a tenant).
pub fn host_attend(pool: &Pool, req: &AttendRequest<'_>) -> Result<Attended> {
    host_attend_with(pool, req, ScoreKernel::detect())
}

/// [`host_attend`] with a chosen score kernel.
pub fn host_attend_with(
    pool: &Pool,
    req: &AttendRequest<'_>,
    kernel: ScoreKernel,
) -> Result<Attended> {
    host_attend_as(pool, 0, req, kernel)
}

/// [`host_attend_with`] for a reader attached as `tenant`: a block of another tenant is refused
/// with `CXLKV_NDP_ERR_ACCESS`, as the device refuses it ([`Pool::reads_tenant`]).
pub fn host_attend_as(
    pool: &Pool,
    tenant: u64,
    req: &AttendRequest<'_>,
    kernel: ScoreKernel,
) -> Result<Attended> {
    req.check()?;
    if let Some(sp) = &req.sparse {
        return host_sparse_attend(pool, tenant, req, kernel, sp);
    }
    let start = Instant::now();
    let want = req.as_score().expect(tenant);
    let mem = pool.memory();
    let queries =
        QueryGroup::new(req.queries, req.dim).map_err(|e| NdpError::BadRequest(e.to_string()))?;
    let g = queries.count();
    for _attempt in 0..crate::pool::READ_RETRIES {
        let (blocks, _) = resolve_all(pool, req.blocks, &want)?;
        let mut parts: Vec<Partial> = (0..g).map(|_| Partial::empty(req.dim)).collect();
        let (mut kbuf, mut vbuf) = (Vec::new(), Vec::new());
        let (mut pulled, mut scanned) = (0u64, 0u64);
        for b in &blocks {
            pull(pool, b.k_off, b.head_bytes, &mut kbuf)?;
            pull(pool, b.v_off, b.head_bytes, &mut vbuf)?;
            let scales = read_scales(&**mem, b, req.dim)?;
            let read = 2 * b.head_bytes + b.scale_bytes(req.dim);
            pulled += read + HOST_META_BYTES_PER_BLOCK;
            scanned += read;
            let shape = |e: cxlkv_kernels::ShapeError| NdpError::BadRequest(e.to_string());
            let keys = KeyRows::new(&kbuf, req.dtype, req.dim).map_err(shape)?;
            let vals = KeyRows::new(&vbuf, req.dtype, req.dim).map_err(shape)?;
            let x = if b.quantized() {
                let s = (&scales.0[..], &scales.1[..]);
                quant::attend(kernel, &queries, &keys, &vals, s, req.scale())
            } else {
                attend_block(kernel, &queries, &keys, &vals, req.scale())
            };
            for (p, x) in parts.iter_mut().zip(&x) {
                p.merge(x);
            }
        }
        if !blocks
            .iter()
            .all(|b| pool.still_valid(&b.block).unwrap_or(false))
        {
            continue;
        }
        return Ok(Attended {
            partials: parts,
            selection: Vec::new(),
            rescored: None,
            stats: NdpStats::on_host(pulled, scanned, blocks.len(), start),
        });
    }
    Err(NdpError::Stale(0))
}

/// The sparse ATTEND on the host ([`crate::ndp::sparse`]): every block's keys pulled and scored in
/// block-list order into the per-query [`Selection`], then the union's key and value rows pulled
/// in token order and attended in one fused pass, as the device does, so the answer is identical.
/// On key sketches or quantized blocks, [`crate::ndp::sketch::sparse_rows`] over pulled rows.
fn host_sparse_attend(
    pool: &Pool,
    tenant: u64,
    req: &AttendRequest<'_>,
    kernel: ScoreKernel,
    sp: &Sparse,
) -> Result<Attended> {
    if sp.candidates.is_some() || req.dtype.is_quantized() {
        return host_sparse_rows(pool, tenant, req, kernel, sp);
    }
    let start = Instant::now();
    let want = req.as_score().expect(tenant);
    let mem = pool.memory();
    let shape = |e: cxlkv_kernels::ShapeError| NdpError::BadRequest(e.to_string());
    let queries = QueryGroup::new(req.queries, req.dim).map_err(shape)?;
    let (g, dim, scale) = (queries.count(), req.dim, req.scale());
    let row = req.dtype.bytes(dim);
    for _attempt in 0..crate::pool::READ_RETRIES {
        let (blocks, order) = resolve_all(pool, req.blocks, &want)?;
        let ranges: Vec<(u64, u64)> = blocks
            .iter()
            .map(|b| (u64::from(b.base), u64::from(b.base) + u64::from(b.tokens)))
            .collect();
        let mut sel = Selection::new(sp.select, sp.k, scale, g, &ranges)?;
        // Every block's keys, pulled once: scored now, and the union's key rows come from here.
        let mut kbufs = Vec::with_capacity(blocks.len());
        let mut scores = Vec::new();
        let (mut pulled, mut scanned) = (0u64, 0u64);
        for b in &blocks {
            let mut kbuf = vec![0u8; b.head_bytes as usize];
            coherence::acquire(&**mem, Site::PayloadRead, b.k_off, b.head_bytes);
            mem.read(b.k_off, &mut kbuf)?;
            pulled += b.head_bytes + HOST_META_BYTES_PER_BLOCK;
            scanned += b.head_bytes;
            let keys = KeyRows::new(&kbuf, req.dtype, dim).map_err(shape)?;
            scores.resize(keys.len() * g, 0.0);
            kernel.score(&queries, &keys, &mut scores);
            sel.feed(b.base, &scores, g, false);
            kbufs.push(kbuf);
        }
        let picked = sel.finish();
        let u = union(&picked.lists);
        let (mut ku, mut vu) = (vec![0u8; u.len() * row], vec![0u8; u.len() * row]);
        for (i, &t) in u.iter().enumerate() {
            let (bi, r) = locate_token(&blocks, &order, t)
                .ok_or(DeviceStatus::at(CXLKV_NDP_ERR_TOKEN, t as usize))?;
            let dst = i * row..(i + 1) * row;
            ku[dst.clone()].copy_from_slice(&kbufs[bi][r * row..(r + 1) * row]);
            let off = blocks[bi].v_off + (r * row) as u64;
            coherence::acquire(&**mem, Site::PayloadRead, off, row as u64);
            mem.read(off, &mut vu[dst])?;
        }
        pulled += (u.len() * row) as u64;
        // What the device reads for the same answer: the union's key and value rows again.
        scanned += 2 * (u.len() * row) as u64;
        let parts = if u.is_empty() {
            (0..g).map(|_| Partial::empty(dim)).collect()
        } else {
            let keys = KeyRows::new(&ku, req.dtype, dim).map_err(shape)?;
            let vals = KeyRows::new(&vu, req.dtype, dim).map_err(shape)?;
            attend_block(kernel, &queries, &keys, &vals, scale)
        };
        if !blocks
            .iter()
            .all(|b| pool.still_valid(&b.block).unwrap_or(false))
        {
            continue;
        }
        let left = left_out(&parts, &picked.log_sum_exp);
        return Ok(Attended {
            partials: parts,
            selection: left.iter().map(|&m| (u.len() as u32, m)).collect(),
            rescored: None,
            stats: NdpStats::on_host(pulled, scanned, blocks.len(), start),
        });
    }
    Err(NdpError::Stale(0))
}

/// [`host_sparse_attend`] on key sketches or quantized blocks: the device's computation
/// ([`sparse_rows`]) over rows pulled across the link, which then carries what the device reads.
fn host_sparse_rows(
    pool: &Pool,
    tenant: u64,
    req: &AttendRequest<'_>,
    kernel: ScoreKernel,
    sp: &Sparse,
) -> Result<Attended> {
    let start = Instant::now();
    let want = req.as_score().expect(tenant);
    let mem = pool.memory();
    let queries =
        QueryGroup::new(req.queries, req.dim).map_err(|e| NdpError::BadRequest(e.to_string()))?;
    for _attempt in 0..crate::pool::READ_RETRIES {
        let (blocks, order) = resolve_all(pool, req.blocks, &want)?;
        let mut rows = PulledRows::new(&**mem, &blocks, req.dtype, req.dim);
        let a = sparse_rows(
            &mut rows,
            &blocks,
            &order,
            &queries,
            sp,
            req.scale(),
            kernel,
            req.dtype,
        )?;
        if !blocks
            .iter()
            .all(|b| pool.still_valid(&b.block).unwrap_or(false))
        {
            continue;
        }
        let scanned = a.stats.bytes_scanned;
        let pulled = scanned + HOST_META_BYTES_PER_BLOCK * blocks.len() as u64;
        return Ok(Attended {
            selection: a
                .left_out
                .iter()
                .map(|&m| (a.union_len as u32, m))
                .collect(),
            partials: a.parts,
            rescored: a.rescored,
            stats: NdpStats::on_host(pulled, scanned, blocks.len(), start),
        });
    }
    Err(NdpError::Stale(0))
}

/// GATHER computed on the host: the value rows of `tokens`, `[tokens][dim]` raw (dequantized f32
/// rows for quantized blocks, as the device returns them). It reads as `want.tenant`.
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
        let mut out = Vec::new();
        let mut read = 0;
        for (j, &t) in tokens.iter().enumerate() {
            let (bi, i) =
                locate_token(&rb, &order, t).ok_or(DeviceStatus::at(CXLKV_NDP_ERR_TOKEN, j))?;
            let (r, n) = read_value_row(&**mem, &rb[bi], i, want.dim as usize, want.dtype)?;
            out.extend_from_slice(&r);
            read += n;
        }
        if rb
            .iter()
            .all(|b| pool.still_valid(&b.block).unwrap_or(false))
        {
            let pulled = read + HOST_META_BYTES_PER_BLOCK * rb.len() as u64;
            let stats = NdpStats::on_host(pulled, 0, 0, start);
            return Ok((out, stats));
        }
    }
    Err(NdpError::Stale(0))
}
