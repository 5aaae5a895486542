//! SCORE_TOPK in the device: the kernels' block-wise scan ([`cxlkv_kernels::PrunedScan`]: visiting
//! order, skip rule) over the command's blocks, each block pinned while its keys are scored in
//! place by the configured engine; then the gathered value rows and the result.

use crate::device::attend::Selector;
use crate::device::commands::{err, Done, Outcome};
use crate::device::model::Device;
use crate::engine_hls::{self, Engine, HlsScorer, HlsSelect};
use cxlkv_kernels::{
    BlockScorer, DType, GroupMode, Hit, KernelScorer, KeyRows, PruneStats, PrunedScan, QueryGroup,
    TopK, VisitOrder,
};
use cxlkv_runtime::coherence::{self, Site};
use cxlkv_runtime::format;
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::block::read_value_row;
use cxlkv_runtime::ndp::select::{Select, Selection};
use cxlkv_runtime::ndp::{
    block_mass, encode_list_info, encode_topk_result, gathered_dtype, locate_token, quant,
    read_bounds, read_scales, topk_result_size, DeviceStatus, ResolvedBlock, ScanStats,
};
use cxlkv_runtime::PinnedBlock;
use std::time::{Duration, Instant};

impl Device {
    pub(super) fn score_topk(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> Outcome {
        let (dtype, want) = self.common(qp, cmd)?;
        let flags = u32::from(cmd.flags);
        let (k, g, dim, n) = (
            cmd.k as usize,
            usize::from(cmd.group),
            cmd.dim as usize,
            cmd.nblocks as usize,
        );
        if flags & !CXLKV_NDP_FLAGS_ALL != 0
            || k == 0
            || k > CXLKV_NDP_MAX_K as usize
            || g == 0
            || g > CXLKV_NDP_MAX_GROUP as usize
        {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        let mode = if flags & CXLKV_NDP_FLAG_GROUP_MAX != 0 {
            GroupMode::GroupMax
        } else {
            GroupMode::PerQuery
        };
        let gather = flags & CXLKV_NDP_FLAG_GATHER_V != 0;
        let select = flags & CXLKV_NDP_FLAG_SELECT != 0;
        if select && flags & CXLKV_NDP_FLAG_PRUNE != 0 {
            return Err(DeviceStatus::at(
                CXLKV_NDP_ERR_ARGS,
                CXLKV_NDP_DETAIL_BAD_OPTIONS as usize,
            ));
        }
        if dtype.is_quantized() && flags & CXLKV_NDP_FLAG_PRUNE != 0 {
            // Quantized blocks are scanned whole (ABI.md, Quantized blocks).
            return Err(DeviceStatus::at(
                CXLKV_NDP_ERR_ARGS,
                CXLKV_NDP_DETAIL_BAD_OPTIONS as usize,
            ));
        }
        // Gathered rows of a quantized block come back dequantized to f32.
        let rows = gathered_dtype(dtype);
        let lists = if mode == GroupMode::PerQuery { g } else { 1 };
        let sel_bytes = if select { 64 } else { 0 };
        let need = (g * dim * 4 + n * 24 + sel_bytes) as u64;
        // The smallest result possible (one hit per list); the exact size is checked once the
        // token count is known.
        let min_result = topk_result_size(lists, 1, dim, rows.bytes(1), gather, n)
            .ok_or(err(CXLKV_NDP_ERR_ARGS))?;
        let raw = self.args(qp, cmd, need, min_result)?;
        let qv: Vec<f32> = raw[..g * dim * 4]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let queries = QueryGroup::new(&qv, dim).map_err(|_| err(CXLKV_NDP_ERR_ARGS))?;
        let sel = if select {
            let w: cxlkv_ndp_select = format::from_bytes(&raw[g * dim * 4 + n * 24..]);
            Some(Select::from_abi(&w)?)
        } else {
            None
        };
        let (blocks, order) = self.resolve(&raw[g * dim * 4..g * dim * 4 + n * 24], n, &want)?;
        let total_tokens: u64 = blocks.iter().map(|b| u64::from(b.tokens)).sum();
        let per_list = (k as u64).min(total_tokens) as usize;
        let size = topk_result_size(lists, per_list, dim, rows.bytes(1), gather, n)
            .ok_or(err(CXLKV_NDP_ERR_ARGS))?
            + if select { 8 + 8 * lists as u64 } else { 0 };
        if size > u64::from(cmd.result_len) {
            return Err(err(CXLKV_NDP_ERR_RESULT_SIZE));
        }
        if let Some((sel, scale)) = sel {
            let ranges: Vec<(u64, u64)> = blocks
                .iter()
                .map(|b| (u64::from(b.base), u64::from(b.base) + u64::from(b.tokens)))
                .collect();
            let group_max = mode == GroupMode::GroupMax;
            let selection = match self.cfg.engine {
                Engine::Rust => Selector::Rust(Selection::new(sel, k, scale, lists, &ranges)?),
                Engine::Hls => Selector::Hls(HlsSelect::new(
                    &queries, k, group_max, &sel, scale, &ranges,
                )?),
            };
            let (got, stats) = self.select_scan(selection, &queries, &blocks, dtype, group_max)?;
            // Lists padded only to the longest one, not to `k`: a top-p list is usually far
            // shorter than its cap, and every padding row would cross the link.
            let per_list = got.lists.iter().map(Vec::len).max().unwrap_or(0).max(1);
            let values = if gather {
                // Each list's rows padded to `per_list` (zero rows), as the result lays them out.
                let row = rows.bytes(dim);
                let mut v = Vec::with_capacity(lists * per_list * row);
                for l in &got.lists {
                    v.extend(self.gather_rows(
                        &blocks,
                        &order,
                        l.iter().map(|h| h.index),
                        dtype,
                        dim,
                    )?);
                    v.resize(v.len() + (per_list - l.len()) * row, 0);
                }
                Some(v)
            } else {
                None
            };
            self.still_valid(&blocks)?;
            let mass = block_mass(&got.lists[0], &blocks, &order, scale);
            let mut out = encode_topk_result(
                &got.lists,
                per_list,
                dim,
                rows,
                values.as_deref(),
                &mass,
                &stats,
            );
            encode_list_info(&mut out, &got.lists, &got.left_out);
            return Ok(Done {
                result_bytes: self.write_result(cmd, &out)?,
                stats,
            });
        }
        let topk = TopK { k, mode };
        let prune = flags & CXLKV_NDP_FLAG_PRUNE != 0;
        let (hits, counts) = match self.cfg.engine {
            Engine::Rust if dtype.is_quantized() => {
                self.folded_scan(&queries, topk, &blocks, dtype)?
            }
            Engine::Rust => {
                let scorer = KernelScorer::new(self.cfg.kernel, &queries, topk);
                self.scan_blocks(scorer, &queries, &blocks, prune, dtype)?
            }
            Engine::Hls => {
                let scorer = HlsScorer::new(&queries, topk).ok_or(err(CXLKV_NDP_ERR_INTERNAL))?;
                if dtype.is_quantized() {
                    self.hls_folded_scan(scorer, &queries, &blocks, dtype)?
                } else {
                    self.scan_blocks(scorer, &queries, &blocks, prune, dtype)?
                }
            }
        };
        let stats = ScanStats::from(&counts);
        let values = if gather {
            Some(self.gather_rows(
                &blocks,
                &order,
                hits.iter().flatten().map(|h| h.index),
                dtype,
                dim,
            )?)
        } else {
            None
        };
        self.still_valid(&blocks)?;
        let mass = block_mass(
            &hits[0],
            &blocks,
            &order,
            cxlkv_kernels::attention::default_scale(dim),
        );
        let out = encode_topk_result(&hits, per_list, dim, rows, values.as_deref(), &mass, &stats);
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats,
        })
    }

    /// Runs the kernels' block-wise scan over `blocks` into `scorer`'s lists: in list order, or,
    /// with `prune`, by the blocks' stored key bounds, skipping those that cannot matter. Each
    /// block read is pinned and its keys scored in place.
    fn scan_blocks<S: BlockScorer>(
        &self,
        scorer: S,
        queries: &QueryGroup<'_>,
        blocks: &[ResolvedBlock],
        prune: bool,
        dtype: DType,
    ) -> Result<(Vec<Vec<Hit>>, PruneStats), DeviceStatus> {
        let t0 = Instant::now();
        let dim = queries.dim();
        let bytes = blocks.iter().map(|b| b.head_bytes).collect();
        let visits = if prune {
            let mut bounds = Vec::with_capacity(blocks.len());
            for b in blocks {
                bounds.push(read_bounds(self.mem(), b, dim).map_err(|_| err(CXLKV_NDP_ERR_RANGE))?);
            }
            VisitOrder::by_bound(queries, bytes, |b| (&bounds[b].0[..], &bounds[b].1[..]))
        } else {
            VisitOrder::in_order(bytes)
        };
        let mut scan = PrunedScan::new(scorer, visits);
        while let Some(i) = scan.next_block() {
            let b = &blocks[i];
            self.with_rows(b, b.k_off, b.head_bytes, dtype, dim, |keys| {
                scan.scan(keys, b.base)
            })?;
            self.touch(b);
            self.pace(t0, scan.stats().bytes_scanned);
        }
        Ok(scan.finish())
    }

    /// A plain top-k over quantized blocks, in list order (no pruning): each block's key codes
    /// scored in place with the queries folded by its key scales ([`quant::FoldedTopK`], as the
    /// host fallback does). Bytes scanned count the codes and the key scales read.
    fn folded_scan(
        &self,
        queries: &QueryGroup<'_>,
        topk: TopK,
        blocks: &[ResolvedBlock],
        dtype: DType,
    ) -> Result<(Vec<Vec<Hit>>, PruneStats), DeviceStatus> {
        let mut scan = quant::FoldedTopK::new(self.cfg.kernel, queries, topk);
        let counts = self.folded_blocks(blocks, queries.dim(), dtype, |keys, base, ks| {
            scan.block(keys, base, ks)
        })?;
        Ok((scan.finish(), counts))
    }

    /// Every quantized block's key codes in list order, pinned, handed to `score` with the
    /// block's first token and its key scales; bytes scanned count the codes and the scales.
    fn folded_blocks(
        &self,
        blocks: &[ResolvedBlock],
        dim: usize,
        dtype: DType,
        mut score: impl FnMut(&KeyRows<'_>, u32, &[f32]),
    ) -> Result<PruneStats, DeviceStatus> {
        let t0 = Instant::now();
        let mut counts = PruneStats {
            blocks_total: blocks.len(),
            ..Default::default()
        };
        for b in blocks {
            let (k_scales, _) =
                read_scales(self.mem(), b, dim).map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
            self.with_rows(b, b.k_off, b.head_bytes, dtype, dim, |keys| {
                score(keys, b.base, &k_scales)
            })?;
            self.touch(b);
            counts.blocks_scanned += 1;
            counts.bytes_scanned += b.head_bytes + 4 * dim as u64;
            self.pace(t0, counts.bytes_scanned);
        }
        Ok(counts)
    }

    /// [`Device::folded_scan`] on the HLS kernel: its dot unit scores each block's codes with the
    /// queries folded by the block's key scales, its top-k network keeps the lists.
    fn hls_folded_scan(
        &self,
        mut scorer: HlsScorer,
        queries: &QueryGroup<'_>,
        blocks: &[ResolvedBlock],
        dtype: DType,
    ) -> Result<(Vec<Vec<Hit>>, PruneStats), DeviceStatus> {
        let counts = self.folded_blocks(blocks, queries.dim(), dtype, |keys, base, ks| {
            scorer.score_block_q(keys, base, ks)
        })?;
        Ok((scorer.into_lists(), counts))
    }

    /// Pins block `b` for reads of `ranges` (`(offset, length)`), which must lie inside its
    /// payload (`ERR_RANGE`); `ERR_STALE` if the block changed since it was resolved.
    pub(super) fn pin_ranges(
        &self,
        b: &ResolvedBlock,
        ranges: &[(u64, u64)],
    ) -> Result<PinnedBlock<'_>, DeviceStatus> {
        let payload = b.block.payload_off..b.block.payload_off + b.block.header.len;
        for &(off, len) in ranges {
            if off < payload.start || off.checked_add(len).is_none_or(|e| e > payload.end) {
                return Err(err(CXLKV_NDP_ERR_RANGE));
            }
        }
        match self.reader.pin_block(&b.block) {
            Ok(Some(pin)) => Ok(pin),
            Ok(None) => Err(err(CXLKV_NDP_ERR_STALE)),
            Err(_) => Err(err(CXLKV_NDP_ERR_INTERNAL)),
        }
    }

    /// Copies `[off, off + len)` of block `b`'s payload out, with the block pinned (a key
    /// sketch's sign bits: rows of any byte length).
    pub(super) fn read_pinned(
        &self,
        b: &ResolvedBlock,
        off: u64,
        len: u64,
    ) -> Result<Vec<u8>, DeviceStatus> {
        let pin = self.pin_ranges(b, &[(off, len)])?;
        let mem = self.mem();
        coherence::acquire(mem, Site::PayloadRead, off, len);
        let mut buf = vec![0u8; len as usize];
        let r = mem
            .read(off, &mut buf)
            .map_err(|_| err(CXLKV_NDP_ERR_RANGE));
        drop(pin);
        r.map(|()| buf)
    }

    /// Calls `f` with `[off, off + len)` of block `b`'s payload as rows of `dim` elements of
    /// `dtype`: in place when the memory has a stable address (through a view that holds no
    /// reference into it), else a private copy. The block is pinned for the duration, so its
    /// owner neither reuses nor rewrites it while `f` reads.
    pub(super) fn with_rows<R>(
        &self,
        b: &ResolvedBlock,
        off: u64,
        len: u64,
        dtype: DType,
        dim: usize,
        f: impl FnOnce(&KeyRows<'_>) -> R,
    ) -> Result<R, DeviceStatus> {
        let pin = self.pin_ranges(b, &[(off, len)])?;
        let mem = self.mem();
        coherence::acquire(mem, Site::PayloadRead, off, len);
        let layout_err = |_| err(CXLKV_NDP_ERR_LAYOUT);
        let r = match mem.raw_range(off, len) {
            Ok(Some(ptr)) => {
                // SAFETY: `raw_range` checked that [off, off + len) lies inside the mapping, which
                // outlives this call (the pool holds it), and the range lies inside block `b`'s
                // payload (checked above); every thread may read the mapping. `pin` is held until
                // after `f` returns: while a live pin names the block, its owner neither reuses
                // nor rewrites it (the pin protocol, docs/FORMAT.md), so nobody writes these bytes
                // while the view is used. The view holds no reference to them, and `f` cannot
                // keep it (it is lent for the call only).
                let rows = unsafe { KeyRows::from_raw(ptr as *const u8, len as usize, dtype, dim) }
                    .map_err(layout_err)?;
                Ok(f(&rows))
            }
            Ok(None) => {
                let mut buf = vec![0u8; len as usize];
                mem.read(off, &mut buf)
                    .map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
                let rows = KeyRows::new(&buf, dtype, dim).map_err(layout_err)?;
                Ok(f(&rows))
            }
            Err(_) => Err(err(CXLKV_NDP_ERR_RANGE)),
        };
        drop(pin);
        r
    }

    pub(super) fn pace(&self, t0: Instant, bytes: u64) {
        if let Some(gbps) = self.cfg.internal_bw_gbps.filter(|g| *g > 0.0) {
            let target = Duration::from_secs_f64(bytes as f64 / (gbps * 1e9));
            while t0.elapsed() < target {
                let left = target - t0.elapsed();
                if left > Duration::from_micros(200) {
                    std::thread::sleep(left - Duration::from_micros(100));
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// The value rows of `tokens`, copied out of `blocks` (`order` from `sorted_ranges`): `dim`
    /// elements of `dtype`, or of f32 for a quantized block (dequantized).
    pub(super) fn gather_rows(
        &self,
        blocks: &[ResolvedBlock],
        order: &[usize],
        tokens: impl Iterator<Item = u32>,
        dtype: DType,
        dim: usize,
    ) -> Result<Vec<u8>, DeviceStatus> {
        let row = dtype.bytes(dim);
        let mut out = Vec::new();
        let mut r = vec![0u8; row];
        for (j, t) in tokens.enumerate() {
            let (b, i) =
                locate_token(blocks, order, t).ok_or(DeviceStatus::at(CXLKV_NDP_ERR_TOKEN, j))?;
            if self.cfg.engine == Engine::Rust {
                // The stored row, or a quantized row dequantized with its token's scale.
                let (got, _) = read_value_row(self.mem(), &blocks[b], i, dim, dtype)
                    .map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
                out.extend_from_slice(&got);
                continue;
            }
            // The HLS kernel's GATHER row mover reads the row in place (pinned); a quantized
            // row is dequantized with its token's scale.
            let off = blocks[b].v_off + (i * row) as u64;
            if blocks[b].quantized() {
                let (_, vs) = read_scales(self.mem(), &blocks[b], dim)
                    .map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
                let got = self.with_rows(&blocks[b], off, row as u64, dtype, dim, |src| {
                    engine_hls::dequant_row(src, vs[i])
                })?;
                out.extend_from_slice(&got);
                continue;
            }
            self.with_rows(&blocks[b], off, row as u64, dtype, dim, |src| {
                engine_hls::copy_rows(Engine::Hls, src, &mut r)
            })?;
            out.extend_from_slice(&r);
        }
        Ok(out)
    }
}
