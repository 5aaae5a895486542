//! The `Device` class: the near-data device client of one participant (`Participant.device()`):
//! `score_topk` (plain top-k, or a selection: sinks, window, exclusion, top-p with a `k_max` cap),
//! `attend` (per-query attention partials) and `gather` over typed KV blocks, on the device or,
//! when it is absent, dead, late or lacks the capability, on the host with the same answer; and
//! `Device.merge_partials`, the merge of `attend` partials. The GIL is released while a command
//! runs; calls from several threads are serialized on the client.

use crate::buffer::{numpy, Bytes};
use crate::errors::Fail;
use crate::keys::key_of;
use cxlkv_kernels::{DType, GroupMode, Partial};
use cxlkv_runtime::api::Code;
use cxlkv_runtime::ndp::{
    AttendRequest, BlockSpec, NdpDevice, NdpOptions, NdpPath, NdpStats, ScoreRequest, Select,
};
use cxlkv_runtime::Participant;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A near-data device client.
#[pyclass(frozen, name = "Device", module = "cxlkv")]
pub struct PyDevice {
    dev: Mutex<Option<NdpDevice>>,
}

impl PyDevice {
    /// Opens the client for `me` (`timeout_ms` 0: the default timeout).
    pub fn open(me: Arc<Participant>, timeout_ms: u64) -> Result<PyDevice, Fail> {
        let mut opts = NdpOptions::default();
        if timeout_ms > 0 {
            opts.timeout = Duration::from_millis(timeout_ms);
        }
        let dev = NdpDevice::open(me, opts)?;
        Ok(PyDevice {
            dev: Mutex::new(Some(dev)),
        })
    }

    /// Runs `f` on the open client (locked; call without the GIL).
    fn with<T>(&self, f: impl FnOnce(&mut NdpDevice) -> Result<T, Fail>) -> Result<T, Fail> {
        let mut g = self.dev.lock().unwrap_or_else(|e| e.into_inner());
        let dev = g
            .as_mut()
            .ok_or_else(|| Fail::new(Code::InvalidHandle, "the device was closed"))?;
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

/// The numpy type string of stored elements (bf16 as its raw uint16 bits, int4 as its raw bytes
/// of two codes each).
fn elem(d: DType) -> &'static str {
    match d {
        DType::F16 => "<f2",
        DType::Bf16 => "<u2",
        DType::F32 => "<f4",
        DType::I8 => "|i1",
        DType::I4 => "|u1",
    }
}

/// The float32 query vectors of `obj` (a float32 array, or raw little-endian bytes), `G × dim`.
fn queries_of(obj: &Bound<'_, PyAny>, dim: usize) -> Result<Vec<f32>, Fail> {
    let q = Bytes::get(obj, "queries")?;
    let fmt = q.format();
    let raw = matches!(fmt.as_str(), "B" | "b" | "c");
    if !(raw || matches!(fmt.trim_start_matches(['<', '=', '@']), "f")) {
        return Err(Fail::bad(format!(
            "queries must be float32 (found buffer format {fmt:?}: convert with .astype(np.float32))"
        )));
    }
    if !q.len().is_multiple_of(4) {
        return Err(Fail::bad("queries must be float32 values"));
    }
    let qs: Vec<f32> = q
        .as_slice()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if dim == 0 || qs.is_empty() || !qs.len().is_multiple_of(dim) {
        return Err(Fail::bad(format!(
            "{} query floats are not whole queries of dim {dim}",
            qs.len()
        )));
    }
    Ok(qs)
}

/// Little-endian f32 values as bytes.
fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// A float32 numpy array (any shape, C order) as values.
fn f32s_of(obj: &Bound<'_, PyAny>, what: &str) -> Result<(Vec<f32>, Vec<usize>), Fail> {
    let py = obj.py();
    let bad = |e: PyErr| Fail::bad(format!("{what}: {e}"));
    let a = numpy(py)
        .map_err(bad)?
        .call_method1("ascontiguousarray", (obj, "<f4"))
        .map_err(bad)?;
    let shape: Vec<usize> = a.getattr("shape").and_then(|s| s.extract()).map_err(bad)?;
    let vals: Vec<f32> = a
        .call_method0("ravel")
        .and_then(|r| r.call_method0("tolist"))
        .and_then(|l| l.extract())
        .map_err(bad)?;
    Ok((vals, shape))
}

/// The partials of an `attend` answer (a dict with `out` `[G, dim]`, `max` `[G]`, `sum` `[G]`).
fn partials_of(d: &Bound<'_, PyAny>, i: usize) -> Result<Vec<Partial>, Fail> {
    let get = |name: &str| -> Result<(Vec<f32>, Vec<usize>), Fail> {
        let item = d
            .get_item(name)
            .map_err(|_| Fail::bad(format!("partials[{i}] has no {name:?} (an attend answer)")))?;
        f32s_of(&item, &format!("partials[{i}][{name:?}]"))
    };
    let (out, shape) = get("out")?;
    let (max, _) = get("max")?;
    let (sum, _) = get("sum")?;
    let g = max.len();
    if shape.len() != 2 || shape[0] != g || sum.len() != g || g == 0 {
        return Err(Fail::bad(format!(
            "partials[{i}]: out {shape:?}, max [{g}] and sum [{}] are not [G, dim], [G], [G]",
            sum.len()
        )));
    }
    let dim = shape[1];
    Ok((0..g)
        .map(|q| Partial {
            out: out[q * dim..(q + 1) * dim].to_vec(),
            max: max[q],
            sum: sum[q],
        })
        .collect())
}

/// An ATTEND answer as a dict: `out`, `max`, `sum`, `output` (normalized) and, given, `stats`.
fn attend_dict<'py>(
    py: Python<'py>,
    parts: &[Partial],
    dim: usize,
    stats: Option<&NdpStats>,
) -> PyResult<Bound<'py, PyDict>> {
    let g = parts.len();
    let out = f32_bytes(parts.iter().flat_map(|p| p.out.iter().copied()));
    let norm = f32_bytes(parts.iter().flat_map(Partial::finish));
    let d = PyDict::new(py);
    d.set_item("out", array(py, &out, "<f4", vec![g, dim])?)?;
    d.set_item(
        "max",
        array(py, &f32_bytes(parts.iter().map(|p| p.max)), "<f4", vec![g])?,
    )?;
    d.set_item(
        "sum",
        array(py, &f32_bytes(parts.iter().map(|p| p.sum)), "<f4", vec![g])?,
    )?;
    d.set_item("output", array(py, &norm, "<f4", vec![g, dim])?)?;
    if let Some(s) = stats {
        d.set_item("stats", stats_dict(py, s)?)?;
    }
    Ok(d)
}

/// Index that pads the lists of a selected SCORE_TOPK past their length.
const NO_TOKEN: u32 = u32::MAX;

#[pymethods]
impl PyDevice {
    /// Top-k attention scores over typed blocks of one sequence: `queries` is a float32 buffer of
    /// `G × dim` values (one GQA group), `blocks` `(key, token_offset)` pairs. Returns a dict:
    /// `indices` (uint32) and `scores` (float32, `q·k` unscaled) numpy arrays `[lists, n]` (one
    /// list per query, or one with `group_max`; best first), `counts` (uint32 `[lists]`: each
    /// list's length), `left_out_mass` (float32 `[lists]`, with a selection; else empty), `values`
    /// (`[lists, n, dim]` of the stored dtype, bf16 as uint16 bits, with `gather_values`; else
    /// empty) and `stats`. Plain top-k: every list has n = min(k, tokens). `prune` skips blocks on
    /// their key bounds (exact; ignored with a selection, which scores every token); `host`
    /// computes on the host (the reference).
    ///
    /// Selection (any of these makes it one): `sinks` (tokens `0..sinks` always included),
    /// `window=(start, end)` (always included; must end within the stored tokens), `exclude=(start,
    /// end)` (never returned nor counted: the host holds it), `top_p` in (0, 1] (the fewest
    /// best-scored tokens whose softmax mass, with the forced ones', reaches p; `k` is then the cap
    /// `k_max`). Lists may then differ in length: n is the longest, shorter ones are padded with
    /// index 2**32-1, score -inf (and zero value rows) past `counts`. `left_out_mass` is the
    /// softmax mass (of `scale · q·k`, `scale` default `1/sqrt(dim)`, over the stored tokens less
    /// the excluded ones) of the tokens not returned.
    #[pyo3(signature = (queries, dim, blocks, *, sequence, layer, kv_head, dtype, k,
                        group_max=false, prune=false, gather_values=false, host=false,
                        sinks=0, window=None, exclude=None, top_p=None, scale=None))]
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
        sinks: u64,
        window: Option<(u64, u64)>,
        exclude: Option<(u64, u64)>,
        top_p: Option<f32>,
        scale: Option<f32>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let qs = queries_of(queries, dim)?;
        let select = Select {
            sinks,
            window,
            exclude,
            top_p,
        };
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
            scale,
            select,
        };
        let top = py.detach(|| {
            self.with(|d| {
                if host {
                    d.score_topk_on_host(&req)
                } else {
                    d.score_topk(&req)
                }
                .map_err(Fail::from)
            })
        })?;
        let lists = top.indices.len();
        let n = top.indices.iter().map(Vec::len).max().unwrap_or(0);
        let row = dt.bytes(dim);
        let (mut idx, mut sc, mut vals) = (Vec::new(), Vec::new(), Vec::new());
        let mut at = 0;
        for (ix, ss) in top.indices.iter().zip(&top.scores) {
            let pad = n - ix.len();
            idx.extend(ix.iter().copied().chain(std::iter::repeat_n(NO_TOKEN, pad)));
            sc.extend(
                ss.iter()
                    .copied()
                    .chain(std::iter::repeat_n(f32::NEG_INFINITY, pad)),
            );
            if gather_values {
                let len = ix.len() * row;
                let got = top.values.get(at..at + len).ok_or_else(|| {
                    Fail::new(Code::Unavailable, "the value rows of the answer are short")
                })?;
                vals.extend_from_slice(got);
                vals.resize(vals.len() + pad * row, 0);
                at += len;
            }
        }
        let counts: Vec<u8> = top
            .indices
            .iter()
            .flat_map(|l| (l.len() as u32).to_le_bytes())
            .collect();
        let idx: Vec<u8> = idx.iter().flat_map(|x| x.to_le_bytes()).collect();
        let d = PyDict::new(py);
        d.set_item("indices", array(py, &idx, "<u4", vec![lists, n])?)?;
        d.set_item("scores", array(py, &f32_bytes(sc), "<f4", vec![lists, n])?)?;
        d.set_item("counts", array(py, &counts, "<u4", vec![lists])?)?;
        let lom = f32_bytes(top.left_out_mass.iter().copied());
        d.set_item(
            "left_out_mass",
            array(py, &lom, "<f4", vec![top.left_out_mass.len()])?,
        )?;
        let vshape = if gather_values {
            vec![lists, n, dim]
        } else {
            vec![0]
        };
        d.set_item("values", array(py, &vals, elem(dt), vshape)?)?;
        d.set_item("stats", stats_dict(py, &top.stats)?)?;
        Ok(d)
    }

    /// Attention of the `G` queries of one GQA group (`queries`: float32, `G × dim`) over every
    /// token of typed blocks of one sequence, as per-query partials that merge across blocks,
    /// devices and the host's own tokens. Returns a dict of numpy float32 arrays: `out` `[G, dim]`
    /// (`Σ_t exp(s_t − max) · v_t`, unnormalized), `max` `[G]` (the largest `s_t = scale · q·k_t`),
    /// `sum` `[G]` (`Σ_t exp(s_t − max)`), `output` `[G, dim]` (`out / sum`: softmax(s) · V, the
    /// attention output when these blocks are all the keys), and `stats`. `scale` defaults to
    /// `1/sqrt(dim)`; `host` computes on the host (the reference; the device gives the same
    /// partials). Merge partials with `Device.merge_partials`.
    #[pyo3(signature = (queries, dim, blocks, *, sequence, layer, kv_head, dtype, scale=None,
                        host=false))]
    #[allow(clippy::too_many_arguments)]
    fn attend<'py>(
        &self,
        py: Python<'py>,
        queries: &Bound<'_, PyAny>,
        dim: usize,
        blocks: &Bound<'_, PyAny>,
        sequence: u64,
        layer: u32,
        kv_head: u32,
        dtype: &str,
        scale: Option<f32>,
        host: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let qs = queries_of(queries, dim)?;
        let specs = blocks_of(blocks)?;
        let req = AttendRequest {
            queries: &qs,
            dim,
            blocks: &specs,
            sequence,
            layer,
            kv_head,
            dtype: dtype_of(dtype)?,
            scale,
            sparse: None,
        };
        let got = py.detach(|| {
            self.with(|d| {
                if host {
                    d.attend_on_host(&req)
                } else {
                    d.attend(&req)
                }
                .map_err(Fail::from)
            })
        })?;
        attend_dict(py, &got.partials, dim, Some(&got.stats))
    }

    /// Merges `attend` answers over disjoint token sets of the same queries (a sequence's blocks
    /// split across commands or devices, the host's own recent tokens) into one, in list order:
    /// per query, `m = max(m_i)`, `sum = Σ_i exp(m_i − m) · sum_i`, `out = Σ_i exp(m_i − m) ·
    /// out_i`, and `output = out / sum`. Each item is a dict (or mapping) with float32-convertible
    /// `out` `[G, dim]`, `max` `[G]` and `sum` `[G]`; the answer has the same keys (no `stats`).
    /// An empty partial (`sum` 0, `max` -inf) is the identity.
    #[staticmethod]
    fn merge_partials<'py>(
        py: Python<'py>,
        partials: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut merged: Option<Vec<Partial>> = None;
        let it = partials
            .try_iter()
            .map_err(|_| Fail::bad("partials must be an iterable of attend answers"))?;
        for (i, item) in it.enumerate() {
            let item = item?;
            let parts = partials_of(&item, i)?;
            match &mut merged {
                None => merged = Some(parts),
                Some(m) => {
                    let same = m.len() == parts.len() && m[0].out.len() == parts[0].out.len();
                    if !same {
                        return Err(Fail::bad(format!(
                            "partials[{i}] is [{}, {}], partials[0] [{}, {}]",
                            parts.len(),
                            parts[0].out.len(),
                            m.len(),
                            m[0].out.len()
                        ))
                        .into());
                    }
                    for (a, b) in m.iter_mut().zip(&parts) {
                        a.merge(b);
                    }
                }
            }
        }
        let m = merged.ok_or_else(|| Fail::bad("no partials to merge"))?;
        let dim = m[0].out.len();
        attend_dict(py, &m, dim, None)
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
        let (rows, st) = py.detach(|| {
            self.with(|d| {
                d.gather(&specs, sequence, layer, kv_head, dt, dim, &tokens)
                    .map_err(Fail::from)
            })
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
