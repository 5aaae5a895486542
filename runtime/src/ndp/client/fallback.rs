//! The host path: SCORE_TOPK and GATHER computed on the host with the same block checks and the
//! same kernels' scan as the device, so a caller gets the same answer whichever path ran.

use crate::coherence::{self, Site};
use crate::format;
use crate::ndp::abi::*;
use crate::ndp::block::{locate_token, resolve_block, sorted_ranges, BlockExpect, ResolvedBlock};
use crate::ndp::client::error::{FallbackReason, NdpError, Result};
use crate::ndp::client::request::{BlockSpec, NdpPath, NdpStats, ScoreRequest, TopK};
use crate::ndp::layout::DeviceStatus;
use crate::ndp::result::{block_mass, ScanStats};
use crate::pool::Pool;
use cxlkv_kernels::{KernelScorer, KeyRows, PrunedScan, QueryGroup, ScoreKernel, VisitOrder};
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
