//! The sparse ATTEND in the device (ABI 1.2, [`cxlkv_runtime::ndp::sparse`]): every key of the
//! command's blocks scored in place (pinned) in block-list order into the per-query
//! [`Selection`], the union of the group's lists, its key and value rows gathered in token order
//! out of the pinned blocks, and one fused pass over them ([`cxlkv_kernels::attend_block`]),
//! exactly as the host fallback does.

use crate::device::attend::Selector;
use crate::device::commands::{err, Done, Outcome};
use crate::device::model::Device;
use cxlkv_kernels::{attend_block, Partial, QueryGroup};
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::select::Selection;
use cxlkv_runtime::ndp::sparse::{
    encode_sparse_result, left_out, parse_tail, sparse_result_size, union, TAIL_BYTES,
};
use cxlkv_runtime::ndp::{locate_token, DeviceStatus, ScanStats};

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
        let selection = Selection::new(sel, k, scale, g, &ranges)?;
        // 1. Every key scored, each query's list selected (the selection scan of SCORE_TOPK).
        let (picked, mut stats) =
            self.select_scan(Selector::Rust(selection), &queries, &blocks, dtype, false)?;
        // 2. The union, 3. its rows gathered in token order out of the pinned blocks.
        let u = union(&picked.lists);
        let row = dtype.size() * dim;
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
            self.touch(b);
            i = j;
        }
        let gathered = 2 * (u.len() * row) as u64;
        stats.bytes_scanned += gathered;
        // 4. One fused pass over the union's rows.
        let parts: Vec<Partial> = if u.is_empty() {
            (0..g).map(|_| Partial::empty(dim)).collect()
        } else {
            let keys = cxlkv_kernels::KeyRows::new(&ku, dtype, dim)
                .map_err(|_| err(CXLKV_NDP_ERR_LAYOUT))?;
            let vals = cxlkv_kernels::KeyRows::new(&vu, dtype, dim)
                .map_err(|_| err(CXLKV_NDP_ERR_LAYOUT))?;
            attend_block(self.cfg.kernel, &queries, &keys, &vals, scale)
        };
        self.still_valid(&blocks)?;
        let left = left_out(&parts, &picked.log_sum_exp);
        let stats = ScanStats {
            bytes_scanned: stats.bytes_scanned,
            blocks_scanned: stats.blocks_scanned,
            blocks_pruned: 0,
        };
        let out = encode_sparse_result(&parts, u.len(), &left, &stats);
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats,
        })
    }
}
