//! # cxlkv-python
//!
//! The Python package `cxlkv` (built with maturin: `pip install ./python`): the shared KV pool and
//! the near-data device client, bound straight to the Rust API of `cxlkv-runtime` (not the C
//! ABI). The extension module is `cxlkv._cxlkv`; `python/cxlkv/__init__.py` re-exports it and adds
//! the LMCache-shaped `CxlkvBackend`.
//!
//! - Zero copy: puts read, and gets write, the caller's own buffer (any buffer-protocol object,
//!   DLPack tensors through numpy) with the GIL released during the copy ([`buffer`]); pins export
//!   the pinned payload itself as a read-only buffer ([`pin`]).
//! - Batches: `batch_put`, `batch_get_into`, `batch_contains`, `lookup_prefix` run a whole batch in
//!   one call without the GIL ([`participant`], [`pool`]).
//! - Typed KV blocks as numpy arrays ([`kv`]); the device's `score_topk` and `gather` ([`device`]).
//! - Thread safety: every class is `Send + Sync` with no shared scratch buffer; a device client
//!   serializes its commands. Locks are taken only without the GIL, or never held across a release
//!   of it.
//! - Errors: `cxlkv.Error` and its subclasses with `.code` (the runtime's result numbers,
//!   `cxlkv.ERR_*`, which the C ABI's `cxlkv_result` carries too) and `.message` ([`errors`]).
//!
//! - Metrics: `cxlkv.metrics()` (a dict) and `cxlkv.metrics_text()` (Prometheus text) read the
//!   counts, bytes and latencies of puts, gets, pins, deletes and device commands that the runtime
//!   records inside those operations, by the rules of `cxlkv_runtime::metrics` (so they count
//!   what the C ABI and Rust callers count); given a pool, also its participants' slot counters
//!   ([`observe`]). The registry is this extension module's own copy of the runtime's: a process
//!   that also loads `libcxlkv.so` has a second one, which only the C calls read.
//!
//! - Parity with the C ABI: the same pool, batch, typed-KV and device calls (SCORE_TOPK with a
//!   selection, ATTEND, GATHER), reserve/commit included ([`reservation`]: a writable zero-copy
//!   view of the reserved block that cannot outlive the commit). No tickets, on purpose: every
//!   device call releases the GIL, so Python threads overlap commands the way C tickets do.
//!
//! Modules: [`observe`], [`errors`], [`buffer`] (the only one that makes slices of raw addresses), [`keys`],
//! [`pool`], [`participant`], [`pin`], [`reservation`], [`batch`], [`kv`], [`device`]; `bench`
//! (reference loops for python/bench.py) only with the non-default `bench-loops` feature, which
//! the wheel leaves out.

pub mod batch;
#[cfg(feature = "bench-loops")]
pub mod bench;
pub mod buffer;
pub mod checksum;
pub mod device;
pub mod errors;
pub mod keys;
pub mod kv;
pub mod observe;
pub mod participant;
pub mod pin;
pub mod pool;
pub mod reservation;

use pyo3::prelude::*;

/// cxlkv: a shared KV pool on CXL memory and its near-data device.
#[pymodule]
fn _cxlkv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<keys::PyKey>()?;
    m.add_class::<pool::PyPool>()?;
    m.add_class::<participant::PyParticipant>()?;
    m.add_class::<pin::PyPin>()?;
    m.add_class::<reservation::PyReservation>()?;
    m.add_class::<batch::PyReservationBatch>()?;
    m.add_class::<kv::PyKvBlock>()?;
    m.add_class::<device::PyDevice>()?;
    m.add_function(wrap_pyfunction!(keys::key_chain, m)?)?;
    m.add_function(wrap_pyfunction!(pool::unlink, m)?)?;
    m.add_function(wrap_pyfunction!(checksum::crc32c, m)?)?;
    m.add_function(wrap_pyfunction!(observe::metrics, m)?)?;
    m.add_function(wrap_pyfunction!(observe::metrics_text, m)?)?;
    #[cfg(feature = "bench-loops")]
    {
        m.add_function(wrap_pyfunction!(bench::_bench_rust_get, m)?)?;
        m.add_function(wrap_pyfunction!(bench::_bench_memcpy, m)?)?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
