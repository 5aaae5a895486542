//! The sparse ATTEND in the device (ABI 1.2, [`cxlkv_runtime::ndp::sparse`]): every key of the
//! command's blocks scored in place (pinned) in block-list order into the per-query
//! [`Selection`], the union of the group's lists, its key and value rows gathered in token order
//! out of the pinned blocks, and one fused pass over them ([`cxlkv_kernels::attend_block`]),
//! exactly as the host fallback does.

use crate::device::attend::Selector;
use crate::device::commands::{err, Done, Outcome};
use crate::device::model::Device;
use crate::engine_hls::{Engine, HlsSparse};
use cxlkv_kernels::{attend_block, KeyRows, Partial, QueryGroup};
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::select::Selection;
use cxlkv_runtime::ndp::sparse::{
    encode_sparse_result, left_out, parse_tail, sparse_result_size, union, TAIL_BYTES,
};
use cxlkv_runtime::ndp::{locate_token, DeviceStatus, ScanStats};
use std::time::Instant;

impl Device {
    pub(super) fn sparse_attend(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> Outcome {
        let (dtype, want) = Self::common(cmd)?;
        let (g, dim, n, k) = (
            usize::from(cmd.group),
            cmd.dim as usize,
            cmd.nblocks as usize,
            cmd.k as usize,
        );
        if cmd.flags != CXLKV_NDP_FLAG_SELECT as u16
            || g == 0
            || g > CXLKV_NDP_MAX_GROUP as usize
            || k == 0
            || k > CXLKV_NDP_MAX_K as usize
        {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        if dtype.is_quantized() {
            // Each quantized block scores with its own folded queries, which one pass over the
            // union's gathered rows would mix: refused, as the HLS unit does.
            return Err(DeviceStatus::at(
                CXLKV_NDP_ERR_ARGS,
                CXLKV_NDP_DETAIL_BAD_OPTIONS as usize,
            ));
        }
        let size = sparse_result_size(g, dim).ok_or(err(CXLKV_NDP_ERR_ARGS))?;
        let qbytes = g * dim * 4;
        let raw = self.args(qp, cmd, (qbytes + n * 24 + TAIL_BYTES) as u64, size)?;
        let (sel, scale) = parse_tail(&raw[qbytes + n * 24..])?;
        let qv: Vec<f32> = raw[..qbytes]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let queries = QueryGroup::new(&qv, dim).map_err(|_| err(CXLKV_NDP_ERR_ARGS))?;
        let (blocks, order) = self.resolve(&raw[qbytes..qbytes + n * 24], n, &want)?;
        let ranges: Vec<(u64, u64)> = blocks
            .iter()
            .map(|b| (u64::from(b.base), u64::from(b.base) + u64::from(b.tokens)))
            .collect();
        let row = dtype.bytes(dim);
        let gather = |u: &[u32]| -> Result<(Vec<u8>, Vec<u8>), DeviceStatus> {
            let (mut ku, mut vu) = (vec![0u8; u.len() * row], vec![0u8; u.len() * row]);
            let mut i = 0;
            while i < u.len() {
                let (bi, _) = locate_token(&blocks, &order, u[i])
                    .ok_or(DeviceStatus::at(CXLKV_NDP_ERR_TOKEN, u[i] as usize))?;
                let b = &blocks[bi];
                let end = u64::from(b.base) + u64::from(b.tokens);
                let j = i + u[i..].partition_point(|&t| u64::from(t) < end);
                for (buf, off) in [(&mut ku, b.k_off), (&mut vu, b.v_off)] {
                    self.with_rows(b, off, b.head_bytes, dtype, dim, |rows| {
                        for (x, &t) in u[i..j].iter().enumerate() {
                            let at = (i + x) * row;
                            rows.copy_row((t - b.base) as usize, &mut buf[at..at + row]);
                        }
                    })?;
                }
                i = j;
            }
            Ok((ku, vu))
        };
        let view = |bytes| view(bytes, dtype, dim);
        let (parts, selection, mut stats) = match self.cfg.engine {
            Engine::Rust => {
                // 1. Every key scored, each query's list selected (SCORE_TOPK's selection scan).
                let selection = Selection::new(sel, k, scale, g, &ranges)?;
                let (picked, stats) =
                    self.select_scan(Selector::Rust(selection), &queries, &blocks, dtype, false)?;
                // 2. The union, 3. its rows gathered in token order, 4. one fused pass.
                let u = union(&picked.lists);
                let (ku, vu) = gather(&u)?;
                let parts: Vec<Partial> = if u.is_empty() {
                    (0..g).map(|_| Partial::empty(dim)).collect()
                } else {
                    attend_block(self.cfg.kernel, &queries, &view(&ku)?, &view(&vu)?, scale)
                };
                let left = left_out(&parts, &picked.log_sum_exp);
                let sel: Vec<(u32, f32)> = left.iter().map(|&m| (u.len() as u32, m)).collect();
                (parts, sel, stats)
            }
            Engine::Hls => {
                // The HLS sparse unit: the same steps on its own datapath.
                let mut h = HlsSparse::new(&queries, k, &sel, scale, &ranges)?;
                let t0 = Instant::now();
                let mut scanned = 0u64;
                for b in &blocks {
                    self.with_rows(b, b.k_off, b.head_bytes, dtype, dim, |keys| {
                        h.block(keys, b.base)
                    })?;
                    self.touch(b);
                    scanned += b.head_bytes;
                    self.pace(t0, scanned);
                }
                let u = h.union()?;
                if !u.is_empty() {
                    let (ku, vu) = gather(&u)?;
                    h.rows(&view(&ku)?, &view(&vu)?);
                }
                let (parts, sel) = h.finish();
                let stats = ScanStats {
                    bytes_scanned: scanned,
                    blocks_scanned: blocks.len() as u32,
                    blocks_pruned: 0,
                };
                (parts, sel, stats)
            }
        };
        let union_len = selection.first().map_or(0, |s| s.0 as usize);
        stats.bytes_scanned += 2 * (union_len * row) as u64;
        self.still_valid(&blocks)?;
        let left: Vec<f32> = selection.iter().map(|s| s.1).collect();
        let out = encode_sparse_result(&parts, union_len, &left, &stats);
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats,
        })
    }
}

/// Gathered rows as a view (`ERR_LAYOUT` if they are not whole rows).
fn view(
    bytes: &[u8],
    dtype: cxlkv_kernels::DType,
    dim: usize,
) -> Result<KeyRows<'_>, DeviceStatus> {
    KeyRows::new(bytes, dtype, dim).map_err(|_| err(CXLKV_NDP_ERR_LAYOUT))
}
