//! The `Participant` class: writes its own partition, reads all of them. Puts and gets copy
//! straight between the caller's buffer and the pool with the GIL released; the batch calls run
//! a whole batch in one release. No scratch buffer is shared, so one participant may be used from
//! many threads at once.

use crate::batch::PyReservationBatch;
use crate::buffer::{numpy, Bytes, BytesMut};
use crate::device::PyDevice;
use crate::errors::Fail;
use crate::keys::{key_of, keys_of};
use crate::kv::{dtype_arg, kv_block, shape_arg, PyKvBlock};
use crate::pin::PyPin;
use crate::reservation::PyReservation;
use cxlkv_runtime::api::Code;
use cxlkv_runtime::{Key, Participant, PoolError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use std::sync::{Arc, RwLock};

/// A participant attached to a pool (`Pool.attach()`). `detach()` (or a `with` block) gives its
/// slot back; its blocks stay in the pool. Pins and devices keep it attached until released.
#[pyclass(frozen, name = "Participant", module = "cxlkv")]
pub struct PyParticipant {
    inner: RwLock<Option<Arc<Participant>>>,
}

impl PyParticipant {
    /// Wraps an attached participant.
    pub fn new(p: Arc<Participant>) -> PyParticipant {
        PyParticipant {
            inner: RwLock::new(Some(p)),
        }
    }

    /// The participant, or ClosedError after `detach`.
    pub fn inner(&self) -> Result<Arc<Participant>, Fail> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| Fail::new(Code::InvalidHandle, "the participant was detached"))
    }
}

/// Attaches to `pool`, as `tenant` with `salt` when a tenant is named (both or neither).
pub fn attach(
    py: Python<'_>,
    pool: &cxlkv_runtime::Pool,
    tenant: Option<String>,
    salt: Option<Vec<u8>>,
) -> PyResult<PyParticipant> {
    let tenant = match (tenant, salt) {
        (None, None) => None,
        (Some(name), Some(salt)) => {
            Some(cxlkv_runtime::Tenant::new(&name, &salt).map_err(Fail::from)?)
        }
        _ => return Err(Fail::bad("tenant and salt go together: give both or neither").into()),
    };
    let me = py.detach(|| {
        match &tenant {
            Some(t) => Participant::attach_as(pool, t),
            None => pool.attach(),
        }
        .map_err(Fail::from)
    })?;
    Ok(PyParticipant::new(Arc::new(me)))
}

/// `get_into` with the library's miss and too-small rules.
fn get_into(me: &Participant, key: Key, dst: &mut [u8]) -> Result<Option<usize>, Fail> {
    match me.get_into(key, dst) {
        Ok(info) => Ok(info.map(|i| i.len as usize)),
        Err(PoolError::BufferTooSmall { needed, capacity }) => Err(Fail::new(
            Code::BufferTooSmall,
            format!("block {key} has {needed} bytes, the buffer {capacity}"),
        )),
        Err(e) => Err(e.into()),
    }
}

#[pymethods]
impl PyParticipant {
    /// Attaches to `pool` (as `pool.attach()`); with `tenant` (a name declared in the pool, or on
    /// a hardware-coherent pool registered now) and `salt` (the tenant's secret bytes, which stay
    /// in this process), as that tenant: it writes its tenant's blocks under its quota and reads
    /// only its tenant's and tenant 0's. Form its keys with `key_chain(..., salt=salt)` and
    /// `Key.from_bytes(name, salt=salt)` (docs/PYTHON.md, the Tenants item).
    #[staticmethod]
    #[pyo3(signature = (pool, tenant=None, salt=None))]
    fn attach<'py>(
        pool: &Bound<'py, PyAny>,
        tenant: Option<String>,
        salt: Option<Vec<u8>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // Through the pool's own method, which owns the Rust pool handle.
        pool.call_method1("attach", (tenant, salt))
    }

    /// The tenant id it attached as (0: none, the pool's public space).
    #[getter]
    fn tenant(&self) -> PyResult<u32> {
        Ok(self.inner()?.tenant_id())
    }

    /// This participant's slot number.
    #[getter]
    fn id(&self) -> PyResult<u32> {
        Ok(self.inner()?.id())
    }

    /// The partition it owns (None when it owns none and cannot write).
    #[getter]
    fn partition(&self) -> PyResult<Option<u32>> {
        Ok(self.inner()?.partition())
    }

    /// Payload capacity of a block, in bytes.
    #[getter]
    fn block_size(&self) -> PyResult<u64> {
        Ok(self.inner()?.pool().block_size())
    }

    /// The largest value `put` accepts: values over one block are stored as multi-block objects
    /// (parts, then a manifest, visible only whole), up to what one partition holds.
    #[getter]
    fn max_object_len(&self) -> PyResult<u64> {
        Ok(self.inner()?.max_object_len())
    }

    /// Stores the bytes of `data` (any buffer: bytes, bytearray, numpy array...) under `key`,
    /// evicting least recently used unpinned blocks of the partition if needed. Data larger than
    /// a block becomes a multi-block object; every read works on it unchanged (`pin` excepted).
    fn put(&self, py: Python<'_>, key: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let (me, k, b) = (self.inner()?, key_of(key)?, Bytes::get(data, "data")?);
        py.detach(|| me.put(k, b.as_slice()).map(drop).map_err(Fail::from))?;
        Ok(())
    }

    /// Stores `data` under `key` unless some participant already holds `key` (in any
    /// partition): True if stored, False if it was present (nothing written). Two participants
    /// putting the same new key at the same instant may both store it; a reader then finds one
    /// of them, whole.
    fn put_if_absent(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let (me, k, b) = (self.inner()?, key_of(key)?, Bytes::get(data, "data")?);
        Ok(py.detach(|| {
            me.put_if_absent(k, b.as_slice())
                .map(|o| o.stored())
                .map_err(Fail::from)
        })?)
    }

    /// Bytes held under `key` (a multi-block object's whole length), or None on a miss: the size
    /// of the buffer `get_into` needs.
    fn length(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        let (me, k) = (self.inner()?, key_of(key)?);
        Ok(py.detach(|| me.length(k).map_err(Fail::from))?)
    }

    /// Copies the block under `key` into `out` (a writable, contiguous buffer: a numpy array, a
    /// bytearray...) with no intermediate copy; returns its length, or None on a miss.
    /// BadInputError (code 5) when `out` is smaller than the block.
    fn get_into(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<Option<usize>> {
        let (me, k, mut b) = (self.inner()?, key_of(key)?, BytesMut::get(out, "out")?);
        Ok(py.detach(|| get_into(&me, k, b.as_mut_slice()))?)
    }

    /// The block's bytes as `bytes` (a copy), or None on a miss. `get_into` avoids the copy.
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let (me, k) = (self.inner()?, key_of(key)?);
        let got = py.detach(|| me.get(k).map_err(Fail::from))?;
        Ok(got.map(|(v, _)| PyBytes::new(py, &v)))
    }

    /// Stores `values[i]` under `keys[i]` for every i, in one call without the GIL. Stops at the
    /// first failure (the earlier items stay stored) and raises it, naming the item.
    fn batch_put(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (me, ks) = (self.inner()?, keys_of(keys)?);
        let mut bufs = Vec::with_capacity(ks.len());
        for (i, v) in values
            .try_iter()
            .map_err(|_| Fail::bad("values must be an iterable of buffers"))?
            .enumerate()
        {
            bufs.push(Bytes::get(&v?, &format!("values[{i}]"))?);
        }
        if bufs.len() != ks.len() {
            return Err(Fail::bad(format!("{} keys but {} values", ks.len(), bufs.len())).into());
        }
        py.detach(|| {
            for (i, (k, b)) in ks.iter().zip(&bufs).enumerate() {
                me.put(*k, b.as_slice())
                    .map_err(|e| Fail::from(e).context(format!("batch_put item {i}")))?;
            }
            Ok::<_, Fail>(())
        })?;
        Ok(())
    }

    /// Copies the block of each of `keys` into `out` without the GIL and without intermediate
    /// copies: `out` is a list (or tuple) of writable buffers, one per key, or one writable buffer
    /// (e.g. a 2-D numpy array) split into `len(keys)` equal rows. Returns each block's length,
    /// None for a miss. A row too small for its block raises (code 5), naming the item.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Option<usize>>> {
        let (me, ks) = (self.inner()?, keys_of(keys)?);
        let ctx = |i: usize| move |f: Fail| f.context(format!("batch_get_into item {i}"));
        if out.is_instance_of::<PyList>() || out.is_instance_of::<PyTuple>() {
            let mut bufs = Vec::with_capacity(ks.len());
            for (i, o) in out.try_iter()?.enumerate() {
                bufs.push(BytesMut::get(&o?, &format!("out[{i}]"))?);
            }
            if bufs.len() != ks.len() {
                return Err(
                    Fail::bad(format!("{} keys but {} buffers", ks.len(), bufs.len())).into(),
                );
            }
            return Ok(py.detach(|| {
                ks.iter()
                    .zip(bufs.iter_mut())
                    .enumerate()
                    .map(|(i, (&k, b))| get_into(&me, k, b.as_mut_slice()).map_err(ctx(i)))
                    .collect::<Result<Vec<_>, _>>()
            })?);
        }
        let mut b = BytesMut::get(out, "out")?;
        if ks.is_empty() {
            return Ok(Vec::new());
        }
        if !b.len().is_multiple_of(ks.len()) {
            return Err(Fail::bad(format!(
                "out has {} bytes, not a whole number of rows for {} keys",
                b.len(),
                ks.len()
            ))
            .into());
        }
        let row = b.len() / ks.len();
        Ok(py.detach(|| {
            let rows = b.as_mut_slice().chunks_mut(row.max(1));
            ks.iter()
                .zip(rows)
                .enumerate()
                .map(|(i, (&k, r))| get_into(&me, k, r).map_err(ctx(i)))
                .collect::<Result<Vec<_>, _>>()
        })?)
    }

    /// True when `key` is in the pool (index only).
    fn contains(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let (me, k) = (self.inner()?, key_of(key)?);
        Ok(py.detach(|| me.pool().contains(k).map_err(Fail::from))?)
    }

    /// `[contains(k) for k in keys]` in one call.
    fn batch_contains(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
        let (me, ks) = (self.inner()?, keys_of(keys)?);
        Ok(py.detach(|| {
            ks.iter()
                .map(|&k| me.pool().contains(k).map_err(Fail::from))
                .collect::<Result<Vec<_>, _>>()
        })?)
    }

    /// How many leading keys of the chain `keys` are present (the cached prefix to reuse).
    fn lookup_prefix(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let (me, ks) = (self.inner()?, keys_of(keys)?);
        Ok(py.detach(|| me.lookup_prefix(&ks).map_err(Fail::from))?)
    }

    /// Deletes `key` from this participant's partition: True if deleted, False if absent;
    /// NotOwnerError if another participant owns it.
    fn delete(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let (me, k) = (self.inner()?, key_of(key)?);
        Ok(py.detach(|| me.delete(k).map_err(Fail::from))?)
    }

    /// Pins the block under `key` (None on a miss): a `Pin`, a read-only zero-copy buffer of the
    /// payload in pool memory that its owner neither reuses nor rewrites until `release()` (or the
    /// end of a `with` block).
    fn pin(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<PyPin>> {
        let (me, k) = (self.inner()?, key_of(key)?);
        Ok(py.detach(|| PyPin::take(me, k))?)
    }

    /// Reserves `length` bytes under `key` for an in-place write: a `Reservation`, a writable
    /// zero-copy buffer in pool memory. Fill it, then `commit()` (or `abort()`); as a `with` block
    /// it commits at the end, or aborts if the block raises. Longer than a block: BadInputError
    /// (code 6).
    fn reserve(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        length: u64,
    ) -> PyResult<PyReservation> {
        let (me, k) = (self.inner()?, key_of(key)?);
        Ok(py.detach(|| PyReservation::take(me, k, length))?)
    }

    /// Reserves `length` bytes under each of `keys`, in order, for one transfer that fills them
    /// all: a `ReservationBatch` (its `addresses` in pool memory; `commit_trailed(sizes)` commits
    /// them together). Stops at the first key that cannot be reserved (the batch is then shorter
    /// and `stopped` holds the error), and with `evict=False` at the first that would evict a
    /// block (or exceed the tenant's quota): then `stopped` is None. Longer than a block:
    /// BadInputError.
    #[pyo3(signature = (keys, length, evict=true))]
    fn reserve_many(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        length: u64,
        evict: bool,
    ) -> PyResult<PyReservationBatch> {
        let (me, ks) = (self.inner()?, keys_of(keys)?);
        Ok(py.detach(|| PyReservationBatch::take(me, &ks, length, evict))?)
    }

    /// Evicts least recently used unpinned blocks of this participant's partition until
    /// `blocks` are free (at most half the partition), or only the `keep_newest` most recently
    /// used are left, or nothing is left to evict; returns how many it evicted. Keeps room ahead
    /// of reservations that must not wait on eviction (`reserve_many(..., evict=False)`).
    #[pyo3(signature = (blocks, keep_newest=0))]
    fn keep_free(&self, py: Python<'_>, blocks: u64, keep_newest: u64) -> PyResult<u64> {
        let me = self.inner()?;
        Ok(py.detach(|| me.keep_free(blocks, keep_newest).map_err(Fail::from))?)
    }

    /// Stores a typed KV block: `k` and `v` are `[kv_heads, tokens, head_dim]` arrays (float16 or
    /// float32, or 2-byte items with `dtype='bf16'`; any buffer with `shape=(h, t, d)`). Per-head
    /// key bounds for the near-data device are computed here.
    #[pyo3(signature = (key, k, v, *, layer=0, sequence=0, token_offset=0, dtype=None, shape=None))]
    #[allow(clippy::too_many_arguments)]
    fn put_kv(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        layer: u32,
        sequence: u64,
        token_offset: u64,
        dtype: Option<&str>,
        shape: Option<(u32, u32, u32)>,
    ) -> PyResult<()> {
        let (me, key) = (self.inner()?, key_of(key)?);
        let (kb, vb) = (Bytes::get(k, "k")?, Bytes::get(v, "v")?);
        let d = dtype_arg(dtype, &kb)?;
        let s = shape_arg(shape, &kb, d, layer, sequence, token_offset)?;
        py.detach(|| {
            me.put_kv(key, &s, kb.as_slice(), vb.as_slice())
                .map(drop)
                .map_err(Fail::from)
        })?;
        Ok(())
    }

    /// The typed KV block under `key` as a `KvBlock` (K and V numpy arrays viewing one private
    /// copy of the payload), or None on a miss.
    fn get_kv(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<PyKvBlock>> {
        let (me, k) = (self.inner()?, key_of(key)?);
        let flat = numpy(py)?.call_method1("empty", (me.pool().block_size(), "uint8"))?;
        let mut b = BytesMut::get(&flat, "block")?;
        let Some(n) = py.detach(|| get_into(&me, k, b.as_mut_slice()))? else {
            return Ok(None);
        };
        Ok(Some(kv_block(py, &flat, &b.as_mut_slice()[..n])?))
    }

    /// This participant's counters: puts, hits, misses, retries, evictions, deletes, pins.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner()?.stats();
        let d = PyDict::new(py);
        for (name, v) in [
            ("puts", s.puts),
            ("hits", s.hits),
            ("misses", s.misses),
            ("retries", s.retries),
            ("evictions", s.evictions),
            ("deletes", s.deletes),
            ("pins", s.pins),
        ] {
            d.set_item(name, v)?;
        }
        Ok(d)
    }

    /// A client of the pool's near-data device on this participant's queue pair; `timeout_ms` is
    /// how long a command may take before the host computes it instead (0: the default, 2000).
    /// Works without a device (everything then runs on the host).
    #[pyo3(signature = (timeout_ms=0))]
    fn device(&self, py: Python<'_>, timeout_ms: u64) -> PyResult<PyDevice> {
        let me = self.inner()?;
        Ok(py.detach(|| PyDevice::open(me, timeout_ms))?)
    }

    /// Gives the slot back (pins and devices still held keep it attached until released).
    /// Idempotent; later calls raise ClosedError.
    fn detach(&self, py: Python<'_>) {
        let p = self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(|| drop(p));
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
        self.detach(py);
        false
    }

    fn __repr__(&self) -> String {
        match self.inner() {
            Ok(p) => match p.partition() {
                Some(part) => format!("Participant(id={}, partition={part})", p.id()),
                None => format!("Participant(id={}, no partition)", p.id()),
            },
            Err(_) => "Participant(detached)".into(),
        }
    }
}
