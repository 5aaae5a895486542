//! The `Device` class: the near-data device client of one participant (`Participant.device()`):
//! `score_topk` and `gather` over typed KV blocks, on the device or, when it is absent, dead or
//! late, on the host with the same answer. The GIL is released while a command runs; calls from
//! several threads are serialized on the client.

use crate::buffer::{numpy, Bytes};
use crate::errors::{code, Fail};
use crate::keys::key_of;
use crate::metrics::record;
use cxlkv_kernels::{DType, GroupMode};
use cxlkv_runtime::metrics::{global, Op, Outcome};
use cxlkv_runtime::ndp::{
    host_score_topk, BlockSpec, NdpDevice, NdpOptions, NdpPath, NdpStats, ScoreRequest,
};
use cxlkv_runtime::Participant;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A near-data device client.
#[pyclass(frozen, name = "Device", module = "cxlkv")]
pub struct PyDevice {
    dev: Mutex<Option<NdpDevice>>,
    participant: Arc<Participant>,
}

impl PyDevice {
    /// Opens the client for `me` (`timeout_ms` 0: the default timeout).
    pub fn open(me: Arc<Participant>, timeout_ms: u64) -> Result<PyDevice, Fail> {
        let mut opts = NdpOptions::default();
        if timeout_ms > 0 {
            opts.timeout = Duration::from_millis(timeout_ms);
        }
        let dev = NdpDevice::open(me.clone(), opts)?;
        Ok(PyDevice {
            dev: Mutex::new(Some(dev)),
            participant: me,
        })
    }

    /// Runs `f` on the open client (locked; call without the GIL).
    fn with<T>(&self, f: impl FnOnce(&mut NdpDevice) -> Result<T, Fail>) -> Result<T, Fail> {
        let mut g = self.dev.lock().unwrap_or_else(|e| e.into_inner());
        let dev = g
            .as_mut()
            .ok_or_else(|| Fail::new(code::INVALID_HANDLE, "the device was closed"))?;
        f(dev)
    }
}

/// Block arguments: an iterable of `(key, token_offset)` pairs.
fn blocks_of(obj: &Bound<'_, PyAny>) -> Result<Vec<BlockSpec>, Fail> {
    let mut out = Vec::new();
    let it = obj
        .try_iter()
        .map_err(|_| Fail::bad("blocks must be an iterable of (key, token_offset) pairs"))?;
    for (i, b) in it.enumerate() {
        let b = b.map_err(|e| Fail::bad(format!("blocks: {e}")))?;
        let pair = |j: usize| b.get_item(j).ok();
        let (Some(k), Some(t)) = (pair(0), pair(1)) else {
            return Err(Fail::bad(format!(
                "blocks[{i}] must be a (key, token_offset) pair"
            )));
        };
        out.push(BlockSpec {
            key: key_of(&k).map_err(|f| f.context(format!("blocks[{i}]")))?,
            token_offset: t
                .extract()
                .map_err(|_| Fail::bad(format!("blocks[{i}]: bad token offset")))?,
        });
    }
    if out.is_empty() {
        return Err(Fail::bad("no blocks"));
    }
    Ok(out)
}

fn dtype_of(name: &str) -> Result<DType, Fail> {
    name.parse::<DType>().map_err(Fail::bad)
}

/// What a command cost and who computed it, as a dict.
fn stats_dict<'py>(py: Python<'py>, s: &NdpStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let path = match s.path {
        Some(NdpPath::Device) => "device".to_string(),
        Some(NdpPath::Host(why)) => format!("host ({why:?})"),
        None => "none".into(),
    };
    d.set_item("on_device", s.path == Some(NdpPath::Device))?;
    d.set_item("path", path)?;
    d.set_item("blocks_scanned", s.blocks_scanned)?;
    d.set_item("blocks_pruned", s.blocks_pruned)?;
    d.set_item("link_bytes", s.link_bytes())?;
    d.set_item("bytes_scanned", s.bytes_scanned)?;
    d.set_item("device_ns", s.device_ns)?;
    d.set_item(
        "elapsed_ns",
        u64::try_from(s.elapsed.as_nanos()).unwrap_or(u64::MAX),
    )?;
    Ok(d)
}

/// Little-endian bytes as a numpy array of `dtype` (a numpy type string) with `shape`.
fn array<'py>(
    py: Python<'py>,
    bytes: &[u8],
    dtype: &str,
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    numpy(py)?
        .call_method1("frombuffer", (PyBytes::new(py, bytes), dtype))?
        .call_method1("reshape", (shape,))
}

/// The numpy type string of stored elements (bf16 as its raw uint16 bits).
fn elem(d: DType) -> &'static str {
    match d {
        DType::F16 => "<f2",
        DType::Bf16 => "<u2",
        DType::F32 => "<f4",
    }
}

#[pymethods]
impl PyDevice {
    /// Top-k attention scores over typed blocks of one sequence: `queries` is a float32 buffer of
    /// `G × dim` values (one GQA group), `blocks` `(key, token_offset)` pairs. Returns a dict:
    /// `indices` (uint32) and `scores` (float32) numpy arrays `[lists, n]` (one list per query, or
    /// one with `group_max`; n = min(k, tokens), best first), `values` (`[lists, n, dim]` of the
    /// stored dtype, bf16 as uint16 bits, with `gather_values`; else empty) and `stats`. `prune` skips blocks
    /// on their key bounds (exact); `host` computes on the host (the reference).
    #[pyo3(signature = (queries, dim, blocks, *, sequence, layer, kv_head, dtype, k,
                        group_max=false, prune=false, gather_values=false, host=false))]
    #[allow(clippy::too_many_arguments)]
    fn score_topk<'py>(
        &self,
        py: Python<'py>,
        queries: &Bound<'_, PyAny>,
        dim: usize,
        blocks: &Bound<'_, PyAny>,
        sequence: u64,
        layer: u32,
        kv_head: u32,
        dtype: &str,
        k: usize,
        group_max: bool,
        prune: bool,
        gather_values: bool,
        host: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let q = Bytes::get(queries, "queries")?;
        if !q.len().is_multiple_of(4) {
            return Err(Fail::bad("queries must be float32 values").into());
        }
        let qs: Vec<f32> = q
            .as_slice()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let specs = blocks_of(blocks)?;
        let dt = dtype_of(dtype)?;
        let req = ScoreRequest {
            queries: &qs,
            dim,
            blocks: &specs,
            sequence,
            layer,
            kv_head,
            dtype: dt,
            k,
            mode: if group_max {
                GroupMode::GroupMax
            } else {
                GroupMode::PerQuery
            },
            prune,
            gather_values,
            scale: 1.0 / (dim.max(1) as f32).sqrt(),
            select: Default::default(),
        };
        if dim == 0 || qs.is_empty() || !qs.len().is_multiple_of(dim) || k == 0 {
            return Err(Fail::bad(format!(
                "{} query floats are not whole queries of dim {dim}, or k = {k}",
                qs.len()
            ))
            .into());
        }
        let top = py.detach(|| {
            let t0 = Instant::now();
            let top = if host {
                let kernel = NdpOptions::default().kernel;
                host_score_topk(self.participant.pool(), &req, kernel).map_err(Fail::from)
            } else {
                self.with(|d| d.score_topk(&req).map_err(Fail::from))
            };
            match &top {
                Ok(t) => {
                    let hits: usize = t.indices.iter().map(Vec::len).sum();
                    let out = (hits * 8 + t.values.len()) as u64;
                    global().record_device(Op::ScoreTopk, &t.stats, q.len() as u64, out);
                }
                Err(_) => record(Op::ScoreTopk, Outcome::Error, 0, 0, t0),
            }
            top
        })?;
        let lists = top.indices.len();
        let n = top.indices.first().map_or(0, Vec::len);
        let idx: Vec<u8> = top
            .indices
            .iter()
            .flatten()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let sc: Vec<u8> = top
            .scores
            .iter()
            .flatten()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let d = PyDict::new(py);
        d.set_item("indices", array(py, &idx, "<u4", vec![lists, n])?)?;
        d.set_item("scores", array(py, &sc, "<f4", vec![lists, n])?)?;
        let vshape = if gather_values {
            vec![lists, n, dim]
        } else {
            vec![0]
        };
        d.set_item("values", array(py, &top.values, elem(dt), vshape)?)?;
        d.set_item("stats", stats_dict(py, &top.stats)?)?;
        Ok(d)
    }

    /// The value rows of `tokens` from typed blocks of one sequence: `(values, stats)`, values a
    /// `[len(tokens), dim]` numpy array of `dtype` (bf16 as uint16 bits), in token order.
    #[pyo3(signature = (blocks, tokens, *, sequence, layer, kv_head, dtype, dim))]
    #[allow(clippy::too_many_arguments)]
    fn gather<'py>(
        &self,
        py: Python<'py>,
        blocks: &Bound<'_, PyAny>,
        tokens: Vec<u32>,
        sequence: u64,
        layer: u32,
        kv_head: u32,
        dtype: &str,
        dim: usize,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyDict>)> {
        let specs = blocks_of(blocks)?;
        let dt = dtype_of(dtype)?;
        if tokens.is_empty() || dim == 0 {
            return Err(Fail::bad("tokens and dim must be non-empty / positive").into());
        }
        let (rows, st) = py.detach(|| {
            let t0 = Instant::now();
            let got = self.with(|d| {
                d.gather(&specs, sequence, layer, kv_head, dt, dim, &tokens)
                    .map_err(Fail::from)
            });
            match &got {
                Ok((rows, st)) => {
                    let tokens_in = 4 * tokens.len() as u64;
                    global().record_device(Op::Gather, st, tokens_in, rows.len() as u64);
                }
                Err(_) => record(Op::Gather, Outcome::Error, 0, 0, t0),
            }
            got
        })?;
        let n = tokens.len();
        Ok((
            array(py, &rows, elem(dt), vec![n, dim])?,
            stats_dict(py, &st)?,
        ))
    }

    /// A NOP round trip through the device; its latency in nanoseconds (UnavailableError without
    /// a device: NOP has no host path).
    fn nop(&self, py: Python<'_>) -> PyResult<u64> {
        let t = py.detach(|| self.with(|d| d.nop().map_err(Fail::from)))?;
        Ok(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Closes the client (its staging blocks go back). Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| drop(self.dev.lock().unwrap_or_else(|e| e.into_inner()).take()));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.close(py);
        false
    }
}
