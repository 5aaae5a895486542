//! The device's metrics in the Prometheus text format: its counters (`regs.counters`, the same
//! numbers clients read from the pool) and a latency histogram per opcode, which only the
//! device's process holds. `cxlkv-ndpd --metrics ADDR` serves them over HTTP
//! ([`crate::metrics_http`]).

use crate::device::model::Device;
use cxlkv_runtime::metrics::{encode_registry, Labels};
use cxlkv_runtime::ndp::abi::*;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::{Registry, Unit};
use std::time::Duration;

/// The `opcode` label of a command's opcode.
pub fn opcode_name(opcode: u32) -> &'static str {
    match opcode {
        CXLKV_NDP_OP_NOP => "nop",
        CXLKV_NDP_OP_SCORE_TOPK => "score_topk",
        CXLKV_NDP_OP_GATHER => "gather",
        CXLKV_NDP_OP_BUILD_BOUNDS => "build_bounds",
        CXLKV_NDP_OP_HOTLIST => "hotlist",
        CXLKV_NDP_OP_ATTEND => "attend",
        _ => "unknown",
    }
}

/// The device's counters: (name, help, `CXLKV_NDP_CTR_*`, unit).
const COUNTERS: [(&str, &str, u32, Option<Unit>); 8] = [
    (
        "cxlkv_ndp_commands",
        "Commands the device executed",
        CXLKV_NDP_CTR_COMMANDS,
        None,
    ),
    (
        "cxlkv_ndp_errors",
        "Commands that completed with an error",
        CXLKV_NDP_CTR_ERRORS,
        None,
    ),
    (
        "cxlkv_ndp_scanned",
        "Key bytes the device read next to the memory",
        CXLKV_NDP_CTR_BYTES_SCANNED,
        Some(Unit::Bytes),
    ),
    (
        "cxlkv_ndp_returned",
        "Result and completion bytes sent back over the link",
        CXLKV_NDP_CTR_BYTES_RETURNED,
        Some(Unit::Bytes),
    ),
    (
        "cxlkv_ndp_received",
        "Command and argument bytes received over the link",
        CXLKV_NDP_CTR_BYTES_RECEIVED,
        Some(Unit::Bytes),
    ),
    (
        "cxlkv_ndp_blocks_scanned",
        "Blocks whose keys were scanned",
        CXLKV_NDP_CTR_BLOCKS_SCANNED,
        None,
    ),
    (
        "cxlkv_ndp_blocks_pruned",
        "Blocks skipped on their key bounds",
        CXLKV_NDP_CTR_BLOCKS_PRUNED,
        None,
    ),
    (
        "cxlkv_ndp_refused",
        "Commands refused for naming a block of another tenant",
        CXLKV_NDP_CTR_REFUSED,
        None,
    ),
];

impl Device {
    /// Records one command's latency under its opcode.
    pub(super) fn observe_latency(&self, opcode: u32, took: Duration) {
        let l: Labels = vec![("opcode", opcode_name(opcode))];
        self.latency.get_or_create(&l).observe(took.as_secs_f64());
    }

    /// Adds the device's metrics, as they are now, to `reg`.
    pub fn register_metrics(&self, reg: &mut Registry) {
        for (name, help, ctr, unit) in COUNTERS {
            let c = ConstCounter::new(self.counter(ctr));
            match unit {
                Some(u) => reg.register_with_unit(name, help, u, c),
                None => reg.register(name, help, c),
            }
        }
        reg.register_with_unit(
            "cxlkv_ndp_busy",
            "Time the workers spent executing commands",
            Unit::Seconds,
            ConstCounter::new(self.counter(CXLKV_NDP_CTR_BUSY_NS) as f64 / 1e9),
        );
        reg.register_with_unit(
            "cxlkv_ndp_command_latency",
            "Latency of a command on the device, by opcode",
            Unit::Seconds,
            self.latency.clone(),
        );
    }

    /// The text exposition of the device's metrics now (ends with `# EOF`).
    pub fn encode_metrics(&self) -> String {
        let mut reg = Registry::default();
        self.register_metrics(&mut reg);
        encode_registry(&reg)
    }
}
