//! The sparse ATTEND in the device (ABI 1.2, [`cxlkv_runtime::ndp::sparse`]): every key of the
//! command's blocks scored in place (pinned) in block-list order into the per-query
//! [`Selection`], the union of the group's lists, its key and value rows gathered in token order
//! out of the pinned blocks, and one fused pass over them ([`cxlkv_kernels::attend_block`]),
//! exactly as the host fallback does. On key sketches and quantized blocks (ABI 1.3), the shared
//! [`cxlkv_runtime::ndp::sketch::sparse_rows`] over the pinned blocks ([`PinnedRows`]); the HLS
//! engine refuses a sketch.

use crate::device::attend::Selector;
use crate::device::commands::{err, Done, Outcome};
use crate::device::model::Device;
use crate::engine_hls::{Engine, HlsSparse};
use cxlkv_kernels::{attend_block, DType, KeyRows, Partial, QueryGroup};
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::select::Selection;
use cxlkv_runtime::ndp::sketch::{sparse_rows, BlockRows, Section};
use cxlkv_runtime::ndp::sparse::{
    encode_sparse_result, left_out, parse_tail, sparse_result_size, union, Sparse, TAIL_BYTES,
};
use cxlkv_runtime::ndp::{
    locate_token, read_scales, read_sketch_scales, DeviceStatus, ResolvedBlock, ScanStats,
};
use std::time::Instant;

impl Device {
    pub(super) fn sparse_attend(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> Outcome {
        let (dtype, want) = self.common(qp, cmd)?;
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
        let (sel, scale, candidates) = parse_tail(&raw[qbytes + n * 24..])?;
        if (candidates.is_some() || dtype.is_quantized()) && self.cfg.engine == Engine::Hls {
            // The HLS sparse unit has no datapath for rows picked one by one (a sketch's
            // candidates, a quantized block's runs; the device does not advertise CAP_SKETCH with
            // this engine): a clear refusal, not a wrong answer.
            return Err(DeviceStatus::at(
                CXLKV_NDP_ERR_ARGS,
                CXLKV_NDP_DETAIL_BAD_OPTIONS as usize,
            ));
        }
        let qv: Vec<f32> = raw[..qbytes]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let queries = QueryGroup::new(&qv, dim).map_err(|_| err(CXLKV_NDP_ERR_ARGS))?;
        let (blocks, order) = self.resolve(&raw[qbytes..qbytes + n * 24], n, &want)?;
        if candidates.is_some() || dtype.is_quantized() {
            // Rows picked one by one (a sketch's candidates, a quantized block's runs): the
            // computation the host fallback runs too.
            let sp = Sparse {
                select: sel,
                k,
                candidates,
            };
            let mut rows = PinnedRows {
                dev: self,
                blocks: &blocks,
                dtype,
                dim,
                t0: Instant::now(),
                paced: 0,
            };
            let kernel = self.cfg.kernel;
            let a = sparse_rows(
                &mut rows, &blocks, &order, &queries, &sp, scale, kernel, dtype,
            )?;
            self.still_valid(&blocks)?;
            let out =
                encode_sparse_result(&a.parts, a.union_len, &a.left_out, a.rescored, &a.stats);
            return Ok(Done {
                result_bytes: self.write_result(cmd, &out)?,
                stats: a.stats,
            });
        }
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
        let out = encode_sparse_result(&parts, union_len, &left, None, &stats);
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats,
        })
    }
}

/// How the device reads a command's blocks for [`sparse_rows`]: in place, each block pinned while
/// it is read ([`Device::with_rows`]), paced to the configured internal bandwidth.
struct PinnedRows<'a> {
    dev: &'a Device,
    blocks: &'a [ResolvedBlock],
    dtype: DType,
    dim: usize,
    t0: Instant,
    paced: u64,
}

impl BlockRows for PinnedRows<'_> {
    fn keys(&mut self, b: usize, f: &mut dyn FnMut(&KeyRows<'_>)) -> Result<(), DeviceStatus> {
        let r = &self.blocks[b];
        self.dev
            .with_rows(r, r.k_off, r.head_bytes, self.dtype, self.dim, |k| f(k))
    }

    fn sketch(&mut self, b: usize, f: &mut dyn FnMut(&KeyRows<'_>)) -> Result<(), DeviceStatus> {
        let r = &self.blocks[b];
        let t = r
            .sketch
            .dtype()
            .ok_or(DeviceStatus::at(CXLKV_NDP_ERR_LAYOUT, b))?;
        let len = r.sketch_code_bytes(self.dim);
        self.dev
            .with_rows(r, r.sketch_off, len, t, self.dim, |c| f(c))
    }

    fn sketch_copy(&mut self, b: usize) -> Result<Vec<u8>, DeviceStatus> {
        let r = &self.blocks[b];
        let len = r.sketch_code_bytes(self.dim);
        self.dev.read_pinned(r, r.sketch_off, len)
    }

    fn copy_rows(
        &mut self,
        b: usize,
        section: Section,
        rows: &[usize],
        out: &mut [u8],
    ) -> Result<(), DeviceStatus> {
        let r = &self.blocks[b];
        let off = section.offset(r);
        let row = self.dtype.bytes(self.dim);
        self.dev
            .with_rows(r, off, r.head_bytes, self.dtype, self.dim, |src| {
                for (x, &i) in rows.iter().enumerate() {
                    src.copy_row(i, &mut out[x * row..(x + 1) * row]);
                }
            })?;
        self.paced += (rows.len() * row) as u64;
        self.dev.pace(self.t0, self.paced);
        Ok(())
    }

    fn scales(&mut self, b: usize) -> Result<(Vec<f32>, Vec<f32>), DeviceStatus> {
        read_scales(self.dev.mem(), &self.blocks[b], self.dim).map_err(|_| err(CXLKV_NDP_ERR_RANGE))
    }

    fn sketch_scales(&mut self, b: usize) -> Result<Vec<f32>, DeviceStatus> {
        read_sketch_scales(self.dev.mem(), &self.blocks[b], self.dim)
            .map_err(|_| err(CXLKV_NDP_ERR_RANGE))
    }

    fn scanned(&mut self, b: usize, bytes: u64) {
        self.dev.touch(&self.blocks[b]);
        self.paced += bytes;
        self.dev.pace(self.t0, self.paced);
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
