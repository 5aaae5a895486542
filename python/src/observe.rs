//! `cxlkv.metrics()` and `cxlkv.metrics_text()`: this process's metrics
//! (`cxlkv_runtime::metrics::global`, which the runtime's operations record into): calls by outcome,
//! bytes in and out and latency per operation, device fallbacks by reason, link bytes by path.
//! Given a pool, both add the counters every participant publishes in its pool slot (read from the
//! pool's memory, so other processes' participants too, as `cxlkv pool stat` shows them).

use crate::errors::Fail;
use crate::pool::PyPool;
use cxlkv_runtime::metrics::{fallback_name, global};
use cxlkv_runtime::pool_stats;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// This process's metrics as a dict: for each operation (`put`, `get`, `pin`, `delete`,
/// `score_topk`, `gather`, `attend`) a dict of `ok`, `miss`, `error` (calls), `bytes_in`, `bytes_out`,
/// `latency_count` and `latency_sum_s`; and `device_fallbacks` (a dict by reason),
/// `device_link_bytes`, `host_link_bytes`. With `pool`, also `participants`: for each held
/// participant slot of the pool (by slot number) a dict of its published counters (`puts`, `hits`,
/// `misses`, `retries`, `evictions`, `deletes`, `pins`, `bytes_in`, `bytes_out`, `fallbacks`,
/// `pin_full`) and its `pid` and `partition` (None without one).
#[pyfunction]
#[pyo3(signature = (pool=None))]
pub fn metrics<'py>(
    py: Python<'py>,
    pool: Option<PyRef<'py, PyPool>>,
) -> PyResult<Bound<'py, PyDict>> {
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
    if let Some(pool) = pool {
        let pool = pool.get()?;
        let st = py.detach(|| pool_stats(&pool).map_err(Fail::from))?;
        let parts = PyDict::new(py);
        for p in &st.participants {
            let e = PyDict::new(py);
            for (name, v) in p.counters.named() {
                e.set_item(name, v)?;
            }
            e.set_item("pid", p.pid)?;
            e.set_item("partition", p.partition)?;
            parts.set_item(p.id, e)?;
        }
        d.set_item("participants", parts)?;
    }
    Ok(d)
}

/// This process's metrics in the Prometheus text format (ends with `# EOF`);
/// docs/OBSERVABILITY.md names them. With `pool`, the pool-wide metrics (`cxlkv_pool_*`, as
/// `cxlkv pool stat --prometheus` prints them) are in the same exposition.
#[pyfunction]
#[pyo3(signature = (pool=None))]
pub fn metrics_text(py: Python<'_>, pool: Option<PyRef<'_, PyPool>>) -> PyResult<String> {
    match pool {
        None => Ok(global().encode()),
        Some(pool) => {
            let pool = pool.get()?;
            let st = py.detach(|| pool_stats(&pool).map_err(Fail::from))?;
            Ok(global().encode_with_pool(&st))
        }
    }
}
