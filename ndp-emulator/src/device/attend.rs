//! ATTEND in the device (ABI 1.1): every key and value row of the command's blocks, read in place
//! under a pin, through the kernels' fused attention ([`cxlkv_kernels::attend_block`]); the
//! blocks' partials merged in block-list order, exactly as the host fallback
//! ([`cxlkv_runtime::ndp::host_attend`]) does; a quantized block through the same
//! [`cxlkv_runtime::ndp::quant`] helpers as the host (queries folded with its key scales, values
//! weighted by its token scales). And the selection scan of SCORE_TOPK
//! (`FLAG_SELECT`): every stored token scored and fed to the shared
//! [`cxlkv_runtime::ndp::select::Selection`].

use crate::device::commands::{err, Done, Outcome};
use crate::device::model::Device;
use crate::engine_hls::{Engine, HlsAttend, HlsSelect};
use cxlkv_kernels::{attend_block, DType, KeyRows, Partial, QueryGroup};
use cxlkv_runtime::coherence::{self, Site};
use cxlkv_runtime::format;
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::select::{Selected, Selection};
use cxlkv_runtime::ndp::{
    attend_result_size, encode_attend_result, quant, read_scales, DeviceStatus, ResolvedBlock,
    ScanStats,
};
use std::time::Instant;

/// The selection of a SCORE_TOPK with `FLAG_SELECT`, by engine: the shared [`Selection`] fed with
/// the Rust kernels' scores, or the HLS kernel's selection datapath.
pub(super) enum Selector {
    Rust(Selection),
    Hls(HlsSelect),
}

impl Device {
    pub(super) fn attend(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> Outcome {
        if cmd.flags == CXLKV_NDP_FLAG_SELECT as u16 {
            return self.sparse_attend(qp, cmd);
        }
        let (dtype, want) = self.common(qp, cmd)?;
        let (g, dim, n) = (
            usize::from(cmd.group),
            cmd.dim as usize,
            cmd.nblocks as usize,
        );
        if cmd.flags != 0 || cmd.k != 0 || g == 0 || g > CXLKV_NDP_MAX_GROUP as usize {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        let size = attend_result_size(g, dim).ok_or(err(CXLKV_NDP_ERR_ARGS))?;
        let qbytes = g * dim * 4;
        let raw = self.args(qp, cmd, (qbytes + n * 24 + 16) as u64, size)?;
        let tail: cxlkv_ndp_attend = format::from_bytes(&raw[qbytes + n * 24..]);
        if tail.reserved0 != 0 || tail.reserved1 != 0 {
            return Err(DeviceStatus::at(
                CXLKV_NDP_ERR_ARGS,
                CXLKV_NDP_DETAIL_BAD_OPTIONS as usize,
            ));
        }
        if !tail.scale.is_finite() {
            return Err(DeviceStatus::at(
                CXLKV_NDP_ERR_ARGS,
                CXLKV_NDP_DETAIL_BAD_SCALE as usize,
            ));
        }
        let qv: Vec<f32> = raw[..qbytes]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let queries = QueryGroup::new(&qv, dim).map_err(|_| err(CXLKV_NDP_ERR_ARGS))?;
        let (blocks, _) = self.resolve(&raw[qbytes..qbytes + n * 24], n, &want)?;
        let t0 = Instant::now();
        let mut parts: Vec<Partial> = (0..g).map(|_| Partial::empty(dim)).collect();
        // The HLS engine's ATTEND unit folds the blocks itself (the same fused computation).
        let mut hls = match self.cfg.engine {
            Engine::Rust => None,
            Engine::Hls => {
                Some(HlsAttend::new(&queries, tail.scale).ok_or(err(CXLKV_NDP_ERR_INTERNAL))?)
            }
        };
        let mut scanned = 0u64;
        for b in &blocks {
            // A quantized block's scales (copied: `dim + tokens` f32) fold into the queries
            // and weight the value rows.
            let (ks, vs) = read_scales(self.mem(), b, dim).map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
            if let Some(h) = hls.as_mut() {
                self.with_kv(b, dtype, dim, |keys, vals| {
                    if b.quantized() {
                        h.block_q(keys, vals, &ks, &vs)
                    } else {
                        h.block(keys, vals)
                    }
                })?;
            } else {
                let x = self.with_kv(b, dtype, dim, |keys, vals| {
                    if b.quantized() {
                        let k = self.cfg.kernel;
                        quant::attend(k, &queries, keys, vals, (&ks, &vs), tail.scale)
                    } else {
                        attend_block(self.cfg.kernel, &queries, keys, vals, tail.scale)
                    }
                })?;
                for (p, x) in parts.iter_mut().zip(&x) {
                    p.merge(x);
                }
            }
            self.touch(b);
            scanned += 2 * b.head_bytes + b.scale_bytes(dim);
            self.pace(t0, scanned);
        }
        if let Some(h) = hls {
            parts = h.finish();
        }
        self.still_valid(&blocks)?;
        let stats = ScanStats {
            bytes_scanned: scanned,
            blocks_scanned: blocks.len() as u32,
            blocks_pruned: 0,
        };
        let out = encode_attend_result(&parts, &stats);
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats,
        })
    }

    /// The selection scan of a SCORE_TOPK with `FLAG_SELECT`: every block's keys scored in place
    /// (pinned) in block-list order and fed to `sel`.
    pub(super) fn select_scan(
        &self,
        sel: Selector,
        queries: &QueryGroup<'_>,
        blocks: &[ResolvedBlock],
        dtype: DType,
        group_max: bool,
    ) -> Result<(Selected, ScanStats), DeviceStatus> {
        let t0 = Instant::now();
        let (g, dim) = (queries.count(), queries.dim());
        // The HLS engine scores and selects with its own datapath (the same computation).
        let (mut sel, mut hls) = match sel {
            Selector::Rust(s) => (Some(s), None),
            Selector::Hls(h) => (None, Some(h)),
        };
        let mut scores = Vec::new();
        let mut scanned = 0u64;
        for b in blocks {
            let (k_scales, _) =
                read_scales(self.mem(), b, dim).map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
            self.with_rows(b, b.k_off, b.head_bytes, dtype, dim, |keys| {
                if let Some(h) = hls.as_mut() {
                    if b.quantized() {
                        h.block_q(keys, b.base, &k_scales);
                    } else {
                        h.block(keys, b.base);
                    }
                } else if b.quantized() {
                    quant::score(self.cfg.kernel, queries, keys, &k_scales, &mut scores);
                } else {
                    scores.resize(keys.len() * g, 0.0);
                    self.cfg.kernel.score(queries, keys, &mut scores);
                }
            })?;
            if let Some(s) = sel.as_mut() {
                s.feed(b.base, &scores, g, group_max);
            }
            self.touch(b);
            scanned += b.head_bytes + 4 * k_scales.len() as u64;
            self.pace(t0, scanned);
        }
        let stats = ScanStats {
            bytes_scanned: scanned,
            blocks_scanned: blocks.len() as u32,
            blocks_pruned: 0,
        };
        match (sel, hls) {
            (Some(s), _) => Ok((s.finish(), stats)),
            (None, Some(h)) => Ok((h.finish()?, stats)),
            (None, None) => Err(err(CXLKV_NDP_ERR_INTERNAL)),
        }
    }

    /// Calls `f` with block `b`'s keys and values of the command's head as rows of `dim` elements
    /// of `dtype`: in place when the memory has a stable address (views that hold no reference
    /// into it), else private copies. The block is pinned for the duration, so its owner neither
    /// reuses nor rewrites it while `f` reads.
    fn with_kv<R>(
        &self,
        b: &ResolvedBlock,
        dtype: DType,
        dim: usize,
        f: impl FnOnce(&KeyRows<'_>, &KeyRows<'_>) -> R,
    ) -> Result<R, DeviceStatus> {
        let len = b.head_bytes;
        let pin = self.pin_ranges(b, &[(b.k_off, len), (b.v_off, len)])?;
        let mem = self.mem();
        coherence::acquire(mem, Site::PayloadRead, b.k_off, len);
        coherence::acquire(mem, Site::PayloadRead, b.v_off, len);
        let layout_err = |_| err(CXLKV_NDP_ERR_LAYOUT);
        let r = match (mem.raw_range(b.k_off, len), mem.raw_range(b.v_off, len)) {
            (Ok(Some(kp)), Ok(Some(vp))) => {
                // SAFETY: `raw_range` checked that both ranges lie inside the mapping, which
                // outlives this call (the pool holds it), and both lie inside block `b`'s payload
                // (checked above); every thread may read the mapping. `pin` is held until after
                // `f` returns: while a live pin names the block, its owner neither reuses nor
                // rewrites it (the pin protocol, docs/FORMAT.md), so nobody writes these bytes
                // while the views are used. The views hold no reference to them, and `f` cannot
                // keep them (they are lent for the call only).
                let (keys, vals) = unsafe {
                    (
                        KeyRows::from_raw(kp as *const u8, len as usize, dtype, dim),
                        KeyRows::from_raw(vp as *const u8, len as usize, dtype, dim),
                    )
                };
                Ok(f(&keys.map_err(layout_err)?, &vals.map_err(layout_err)?))
            }
            (Ok(_), Ok(_)) => {
                let (mut kb, mut vb) = (vec![0u8; len as usize], vec![0u8; len as usize]);
                mem.read(b.k_off, &mut kb)
                    .and_then(|()| mem.read(b.v_off, &mut vb))
                    .map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
                let keys = KeyRows::new(&kb, dtype, dim).map_err(layout_err)?;
                let vals = KeyRows::new(&vb, dtype, dim).map_err(layout_err)?;
                Ok(f(&keys, &vals))
            }
            _ => Err(err(CXLKV_NDP_ERR_RANGE)),
        };
        drop(pin);
        r
    }
}
