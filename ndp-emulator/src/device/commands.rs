//! Command decoding and validation (arguments copied out of shared memory, then checked; blocks
//! resolved, each against the submitting queue's tenant; results written only to the submitter's
//! buffer), and the commands other than
//! SCORE_TOPK: GATHER, BUILD_BOUNDS and HOTLIST.

use crate::device::model::Device;
use cxlkv_kernels::{block_bounds, DType, Hit};
use cxlkv_runtime::coherence::{self, Site};
use cxlkv_runtime::format;
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::{
    check_owned_range, encode_topk_result, gathered_dtype, read_bounds, resolve_block, slot_tenant,
    sorted_ranges, topk_result_size, BlockExpect, DeviceStatus, ResolvedBlock, ScanStats,
};

/// What a handler reports besides the status.
#[derive(Default)]
pub(super) struct Done {
    /// Bytes written to the result buffer.
    pub(super) result_bytes: u64,
    /// What the command scanned.
    pub(super) stats: ScanStats,
}

/// What a handler returns: its report, or the completion status of its failure.
pub(super) type Outcome = Result<Done, DeviceStatus>;

/// A status with no detail.
pub(super) fn err(code: u32) -> DeviceStatus {
    DeviceStatus::new(code)
}

impl Device {
    /// Copies a command's arguments (exactly `need` bytes) out of shared memory after checking
    /// that both buffers lie in blocks the submitter owns.
    pub(super) fn args(
        &self,
        qp: u32,
        cmd: &cxlkv_ndp_cmd,
        need: u64,
        result_need: u64,
    ) -> Result<Vec<u8>, DeviceStatus> {
        if u64::from(cmd.args_len) != need || u64::from(cmd.result_len) < result_need {
            return Err(if u64::from(cmd.args_len) != need {
                err(CXLKV_NDP_ERR_ARGS)
            } else {
                err(CXLKV_NDP_ERR_RESULT_SIZE)
            });
        }
        if need > 0 {
            check_owned_range(&self.pool, qp, cmd.args_off, need)?;
        }
        check_owned_range(&self.pool, qp, cmd.result_off, u64::from(cmd.result_len))?;
        let mut buf = vec![0u8; need as usize];
        coherence::acquire(self.mem(), Site::NdpSubmitRead, cmd.args_off, need);
        self.mem()
            .read(cmd.args_off, &mut buf)
            .map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
        Ok(buf)
    }

    /// The element type and what every block of `cmd` must be, its tenant included: queue pair
    /// `qp` is participant slot `qp`, whose `tenant` word is read now, when the command runs.
    pub(super) fn common(
        &self,
        qp: u32,
        cmd: &cxlkv_ndp_cmd,
    ) -> Result<(DType, BlockExpect), DeviceStatus> {
        let dtype = DType::from_code(cmd.dtype).ok_or(err(CXLKV_NDP_ERR_ARGS))?;
        let dim = cmd.dim;
        if dim == 0
            || dim & 15 != 0
            || dim > CXLKV_NDP_MAX_DIM
            || cmd.nblocks == 0
            || cmd.nblocks > CXLKV_NDP_MAX_BLOCKS
        {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        let tenant = slot_tenant(&self.pool, qp).map_err(|_| err(CXLKV_NDP_ERR_INTERNAL))?;
        Ok((
            dtype,
            BlockExpect {
                tenant,
                sequence: cmd.sequence,
                layer: cmd.layer,
                kv_head: u32::from(cmd.kv_head),
                dtype,
                dim,
            },
        ))
    }

    pub(super) fn resolve(
        &self,
        raw: &[u8],
        n: usize,
        want: &BlockExpect,
    ) -> Result<(Vec<ResolvedBlock>, Vec<usize>), DeviceStatus> {
        let mut blocks = Vec::with_capacity(n);
        for i in 0..n {
            let e: cxlkv_ndp_block = format::from_bytes(&raw[24 * i..24 * (i + 1)]);
            blocks.push(resolve_block(&self.pool, &e, want, i)?);
        }
        let order = sorted_ranges(&blocks)?;
        Ok((blocks, order))
    }

    pub(super) fn still_valid(&self, blocks: &[ResolvedBlock]) -> Result<(), DeviceStatus> {
        for (i, b) in blocks.iter().enumerate() {
            if !self.pool.still_valid(&b.block).unwrap_or(false) {
                return Err(DeviceStatus::at(CXLKV_NDP_ERR_STALE, i));
            }
        }
        Ok(())
    }

    pub(super) fn touch(&self, b: &ResolvedBlock) {
        self.hot.touch(b.block.key);
    }

    pub(super) fn write_result(
        &self,
        cmd: &cxlkv_ndp_cmd,
        bytes: &[u8],
    ) -> Result<u64, DeviceStatus> {
        if bytes.len() as u64 > u64::from(cmd.result_len) {
            return Err(err(CXLKV_NDP_ERR_RESULT_SIZE));
        }
        self.mem()
            .write(cmd.result_off, bytes)
            .map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
        coherence::publish(
            self.mem(),
            Site::NdpCompleteWrite,
            cmd.result_off,
            bytes.len() as u64,
        );
        Ok(bytes.len() as u64)
    }

    pub(super) fn gather(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> Outcome {
        let (dtype, want) = self.common(qp, cmd)?;
        let (k, dim, n) = (cmd.k as usize, cmd.dim as usize, cmd.nblocks as usize);
        if k == 0 || k > CXLKV_NDP_MAX_K as usize || cmd.flags != 0 {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        let size = topk_result_size(1, k, dim, gathered_dtype(dtype).bytes(1), true, 0)
            .ok_or(err(CXLKV_NDP_ERR_ARGS))?;
        let raw = self.args(qp, cmd, (n * 24 + k * 4) as u64, size)?;
        let (blocks, order) = self.resolve(&raw[..n * 24], n, &want)?;
        let tokens: Vec<u32> = raw[n * 24..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let values = self.gather_rows(&blocks, &order, tokens.iter().copied(), dtype, dim)?;
        self.still_valid(&blocks)?;
        let hits: Vec<Hit> = tokens
            .iter()
            .map(|&index| Hit { index, score: 0.0 })
            .collect();
        let out = encode_topk_result(
            &[hits],
            k,
            dim,
            gathered_dtype(dtype),
            Some(&values),
            &[],
            &ScanStats::default(),
        );
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats: ScanStats::default(),
        })
    }

    pub(super) fn build_bounds(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> Outcome {
        let (dtype, want) = self.common(qp, cmd)?;
        let dim = cmd.dim as usize;
        if cmd.nblocks != 1 || cmd.flags != 0 {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        let raw = self.args(qp, cmd, 24, 64 + 8 * dim as u64)?;
        let (blocks, _) = self.resolve(&raw, 1, &want)?;
        let b = &blocks[0];
        if !self.pool.verify_payload(&b.block).unwrap_or(false) {
            return Err(err(CXLKV_NDP_ERR_CHECKSUM));
        }
        // The block's keys as one bounds block (resolve_block checked that it holds tokens).
        let (lo, hi) = self.with_rows(b, b.k_off, b.head_bytes, dtype, dim, |keys| {
            let bounds = block_bounds(keys, keys.len());
            (bounds.min(0).to_vec(), bounds.max(0).to_vec())
        })?;
        let (slo, shi) = read_bounds(self.mem(), b, dim).map_err(|_| err(CXLKV_NDP_ERR_RANGE))?;
        self.still_valid(&blocks)?;
        let same = lo
            .iter()
            .zip(&slo)
            .chain(hi.iter().zip(&shi))
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let header = cxlkv_ndp_result {
            lists: 1,
            per_list: 2,
            dim: dim as u32,
            dtype: 3,
            bounds_off: 64,
            bounds_match: u32::from(same),
            total_bytes: 64 + 8 * dim as u64,
            ..Default::default()
        };
        let mut out = format::as_bytes(&header).to_vec();
        for x in lo.iter().chain(&hi) {
            out.extend_from_slice(&x.to_le_bytes());
        }
        self.touch(b);
        let stats = ScanStats {
            bytes_scanned: b.head_bytes,
            blocks_scanned: 1,
            blocks_pruned: 0,
        };
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats,
        })
    }

    pub(super) fn hotlist(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> Outcome {
        let max = cmd.k as usize;
        if max == 0 || max > CXLKV_NDP_MAX_K as usize {
            return Err(err(CXLKV_NDP_ERR_ARGS));
        }
        self.args(qp, cmd, 0, 64)?;
        let n = max.min(((u64::from(cmd.result_len) - 64) / 32) as usize);
        let entries = self.hottest(n);
        let header = cxlkv_ndp_result {
            lists: 1,
            per_list: entries.len() as u32,
            bounds_off: 64,
            total_bytes: 64 + 32 * entries.len() as u64,
            ..Default::default()
        };
        let mut out = format::as_bytes(&header).to_vec();
        for e in &entries {
            out.extend_from_slice(format::as_bytes(e));
        }
        Ok(Done {
            result_bytes: self.write_result(cmd, &out)?,
            stats: ScanStats::default(),
        })
    }
}
