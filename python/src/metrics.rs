//! `cxlkv.metrics()` and `cxlkv.metrics_text()`: this process's metrics
//! (`cxlkv_runtime::metrics::global`, shared with the C ABI when both are loaded through one
//! runtime), which the participant and device methods record into: calls by outcome, bytes in
//! and out and latency per operation, device fallbacks by reason, link bytes by path.

use cxlkv_runtime::metrics::{fallback_name, global, Op, Outcome};
use cxlkv_runtime::{BlockInfo, PoolError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::time::Instant;

/// Records one call of `op` that started at `t0`.
pub fn record(op: Op, outcome: Outcome, bytes_in: u64, bytes_out: u64, t0: Instant) {
    global().record(op, outcome, bytes_in, bytes_out, t0.elapsed());
}

/// Records a get from `get_into`'s result: a hit gives out the block's bytes.
pub fn record_read(op: Op, r: &Result<Option<BlockInfo>, PoolError>, t0: Instant) {
    match r {
        Ok(Some(info)) => record(op, Outcome::Ok, 0, info.len, t0),
        Ok(None) => record(op, Outcome::Miss, 0, 0, t0),
        Err(_) => record(op, Outcome::Error, 0, 0, t0),
    }
}

/// Records a call that either succeeded or failed.
pub fn record_result<T, E>(op: Op, r: &Result<T, E>, bytes_in: u64, bytes_out: u64, t0: Instant) {
    match r {
        Ok(_) => record(op, Outcome::Ok, bytes_in, bytes_out, t0),
        Err(_) => record(op, Outcome::Error, 0, 0, t0),
    }
}

/// This process's metrics as a dict: for each operation (`put`, `get`, `pin`, `delete`,
/// `score_topk`, `gather`) a dict of `ok`, `miss`, `error` (calls), `bytes_in`, `bytes_out`,
/// `latency_count` and `latency_sum_s`; and `device_fallbacks` (a dict by reason),
/// `device_link_bytes`, `host_link_bytes`.
#[pyfunction]
pub fn metrics(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = global().snapshot();
    let d = PyDict::new(py);
    for (op, o) in &s.ops {
        let e = PyDict::new(py);
        e.set_item("ok", o.ok)?;
        e.set_item("miss", o.miss)?;
        e.set_item("error", o.error)?;
        e.set_item("bytes_in", o.bytes_in)?;
        e.set_item("bytes_out", o.bytes_out)?;
        e.set_item("latency_count", o.latency.count)?;
        e.set_item("latency_sum_s", o.latency.sum_s)?;
        d.set_item(op.name(), e)?;
    }
    let f = PyDict::new(py);
    for &(r, n) in &s.fallbacks {
        f.set_item(fallback_name(r), n)?;
    }
    d.set_item("device_fallbacks", f)?;
    d.set_item("device_link_bytes", s.device_link_bytes)?;
    d.set_item("host_link_bytes", s.host_link_bytes)?;
    Ok(d)
}

/// This process's metrics in the Prometheus text format (ends with `# EOF`); README,
/// "Observability", names them.
#[pyfunction]
pub fn metrics_text() -> String {
    global().encode()
}
