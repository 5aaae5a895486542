//! Where the NDP device's structures are and what its words mean: the plain-data marker of the ABI
//! structs, register and ring-index offsets ([`reg`], [`qpi`]), the queue depth, the device area's
//! [`DeviceLayout`], completion statuses as [`DeviceStatus`], and the heartbeat clock.

use crate::format::Plain;
use crate::ndp::abi::*;
use crate::pool::Pool;

// SAFETY (for the impls below): bindgen emits them `#[repr(C)]`; the compile-time layout
// assertions in `abi.rs` pin every offset and the size, which leave no padding; all fields are
// integers, f32 or arrays of them, so every bit pattern is valid.
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_cmd {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_cpl {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_block {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_result {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_hot_entry {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_hit {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_select {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_list_info {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_attend {}
// SAFETY: see above.
unsafe impl Plain for cxlkv_ndp_partial {}

/// Byte offsets of register words (from the device area), for atomic access.
pub mod reg {
    use crate::ndp::abi::cxlkv_ndp_regs as R;
    use std::mem::offset_of;
    /// `magic`.
    pub const MAGIC: u64 = offset_of!(R, magic) as u64;
    /// `abi_major` and `abi_minor` (one u64 word).
    pub const ABI: u64 = offset_of!(R, abi_major) as u64;
    /// `capabilities`.
    pub const CAPABILITIES: u64 = offset_of!(R, capabilities) as u64;
    /// `generation`.
    pub const GENERATION: u64 = offset_of!(R, generation) as u64;
    /// `pid`.
    pub const PID: u64 = offset_of!(R, pid) as u64;
    /// `heartbeat_ns`.
    pub const HEARTBEAT: u64 = offset_of!(R, heartbeat_ns) as u64;
    /// `sleeping`.
    pub const SLEEPING: u64 = offset_of!(R, sleeping) as u64;
    /// `doorbell`.
    pub const DOORBELL: u64 = offset_of!(R, doorbell) as u64;
    /// `counters[0]`.
    pub const COUNTERS: u64 = offset_of!(R, counters) as u64;
    /// `link_bw_mbps`.
    pub const LINK_BW: u64 = offset_of!(R, link_bw_mbps) as u64;
    /// `link_latency_ns`.
    pub const LINK_LATENCY: u64 = offset_of!(R, link_latency_ns) as u64;
    /// `internal_bw_mbps`.
    pub const INTERNAL_BW: u64 = offset_of!(R, internal_bw_mbps) as u64;
    /// `hot_epoch` (then `hot_count`, `hot_epoch_ns`, then the window).
    pub const HOT_EPOCH: u64 = offset_of!(R, hot_epoch) as u64;
    /// `hot_count`.
    pub const HOT_COUNT: u64 = offset_of!(R, hot_count) as u64;
    /// `hot[0]`.
    pub const HOT: u64 = offset_of!(R, hot) as u64;
}

/// Byte offsets of ring indices within a queue pair.
pub mod qpi {
    use crate::ndp::abi::cxlkv_ndp_qp_indices as I;
    use std::mem::offset_of;
    /// `sq_tail` (client-written).
    pub const SQ_TAIL: u64 = offset_of!(I, sq_tail) as u64;
    /// `sq_head` (device-written).
    pub const SQ_HEAD: u64 = offset_of!(I, sq_head) as u64;
    /// `cq_tail` (device-written; the completion futex word).
    pub const CQ_TAIL: u64 = offset_of!(I, cq_tail) as u64;
    /// `cq_head` (client-written).
    pub const CQ_HEAD: u64 = offset_of!(I, cq_head) as u64;
    /// `cq_waiters` (client-written).
    pub const CQ_WAITERS: u64 = offset_of!(I, cq_waiters) as u64;
}

/// Queue depth (entries per ring).
pub const DEPTH: u64 = CXLKV_NDP_QUEUE_DEPTH as u64;

/// Where the device's structures are in a pool, derived from the superblock alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLayout {
    /// Pool offset of the register block.
    pub regs: u64,
    /// Pool offset of queue pair 0.
    pub qp0: u64,
    /// Bytes between queue pairs.
    pub qp_stride: u64,
    /// Queue pairs: one per participant slot, as many as fit in the device area.
    pub queue_pairs: u32,
}

impl DeviceLayout {
    /// The layout of `pool`'s device area.
    pub fn of(pool: &Pool) -> DeviceLayout {
        let sb = pool.superblock();
        let regs = sb.device_area_off;
        let stride = u64::from(CXLKV_NDP_QP_STRIDE);
        let room = sb
            .device_area_size
            .saturating_sub(u64::from(CXLKV_NDP_REGS_SIZE))
            / stride;
        DeviceLayout {
            regs,
            qp0: regs + u64::from(CXLKV_NDP_REGS_SIZE),
            qp_stride: stride,
            queue_pairs: room.min(u64::from(sb.participants)) as u32,
        }
    }

    /// Pool offset of queue pair `qp`'s indices.
    pub fn qp(&self, qp: u32) -> u64 {
        self.qp0 + u64::from(qp) * self.qp_stride
    }

    /// Pool offset of submission slot `index % DEPTH` of queue pair `qp`.
    pub fn sq_slot(&self, qp: u32, index: u64) -> u64 {
        self.qp(qp)
            + u64::from(CXLKV_NDP_QP_INDICES_SIZE)
            + (index % DEPTH) * u64::from(CXLKV_NDP_CMD_SIZE)
    }

    /// Pool offset of completion slot `index % DEPTH` of queue pair `qp`.
    pub fn cq_slot(&self, qp: u32, index: u64) -> u64 {
        self.qp(qp)
            + u64::from(CXLKV_NDP_QP_INDICES_SIZE)
            + DEPTH * u64::from(CXLKV_NDP_CMD_SIZE)
            + (index % DEPTH) * u64::from(CXLKV_NDP_CPL_SIZE)
    }
}

/// A completion status other than OK, as a typed error (the ABI's `CXLKV_NDP_ERR_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("device status {code} ({}), detail {detail}", status_name(*.code))]
pub struct DeviceStatus {
    /// `CXLKV_NDP_ERR_*`.
    pub code: u32,
    /// Index of the offending block or token, when there is one.
    pub detail: u32,
}

impl DeviceStatus {
    /// A status with no detail.
    pub fn new(code: u32) -> Self {
        DeviceStatus { code, detail: 0 }
    }
    /// A status naming entry `detail`.
    pub fn at(code: u32, detail: usize) -> Self {
        DeviceStatus {
            code,
            detail: detail.min(u32::MAX as usize) as u32,
        }
    }
}

/// Short name of a completion status.
pub fn status_name(code: u32) -> &'static str {
    match code {
        CXLKV_NDP_OK => "ok",
        CXLKV_NDP_ERR_OPCODE => "unknown opcode",
        CXLKV_NDP_ERR_RANGE => "buffer range not in the submitter's partition",
        CXLKV_NDP_ERR_ARGS => "arguments out of range",
        CXLKV_NDP_ERR_BLOCK => "block missing or invalid",
        CXLKV_NDP_ERR_LAYOUT => "block layout mismatch",
        CXLKV_NDP_ERR_STALE => "block changed during the scan",
        CXLKV_NDP_ERR_RESULT_SIZE => "result buffer too small",
        CXLKV_NDP_ERR_TOKEN => "token in no block",
        CXLKV_NDP_ERR_RING => "ring indices inconsistent",
        CXLKV_NDP_ERR_RESTARTED => "device restarted",
        CXLKV_NDP_ERR_INTERNAL => "internal device error",
        CXLKV_NDP_ERR_CHECKSUM => "payload checksum mismatch",
        CXLKV_NDP_ERR_ACCESS => "block of another tenant",
        _ => "unknown status",
    }
}

/// Nanoseconds since the Unix epoch (the heartbeat clock).
pub fn now_ns() -> u64 {
    crate::clock::system_now_ns()
}
