//! The `Pool` class: create or open a pool on a backend spec, its geometry, the index-only
//! queries (`contains`, `batch_contains`, `lookup_prefix`), `check`, `attach`, `unlink`, and the
//! tenant table (`declare_tenant`, `set_tenant_quota`, `tenants`). A pool handle reads as no
//! tenant: tenant 0's blocks only.

use crate::errors::Fail;
use crate::keys::{key_of, keys_of};
use crate::participant::PyParticipant;
use cxlkv_runtime::api::Code;
use cxlkv_runtime::region::{group_id, user_id, Access, Backend, RegionOptions, PRIVATE_MODE};
use cxlkv_runtime::tenant::{self, Tenant};
use cxlkv_runtime::{Pool, PoolConfig, Region};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::RwLock;
use std::time::Duration;

/// An open pool. `Pool.create(spec, size, ...)` or `Pool.open(spec)`; `close()` (or a `with`
/// block) drops this handle; participants attached through it keep the mapping. Thread-safe.
#[pyclass(frozen, name = "Pool", module = "cxlkv")]
pub struct PyPool {
    pool: RwLock<Option<Pool>>,
    spec: String,
}

/// A user or group as Python gives it: a name or a number.
#[derive(FromPyObject)]
enum Id {
    Number(u32),
    Name(String),
}

impl Id {
    fn resolve(self, lookup: fn(&str) -> cxlkv_runtime::region::Result<u32>) -> Result<u32, Fail> {
        match self {
            Id::Number(n) => Ok(n),
            Id::Name(s) => lookup(&s).map_err(|e| Fail::bad(e.to_string())),
        }
    }
}

fn backend(spec: &str) -> Result<Backend, Fail> {
    spec.parse()
        .map_err(|e: cxlkv_runtime::region::RegionError| Fail::bad(e.to_string()))
}

impl PyPool {
    /// The open pool, or ClosedError.
    pub fn get(&self) -> Result<Pool, Fail> {
        self.pool
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| Fail::new(Code::InvalidHandle, "the pool was closed"))
    }
}

#[pymethods]
impl PyPool {
    /// Creates a pool of `size` bytes on `spec` (`shm:NAME`, `file:PATH`, `dax:PATH`,
    /// `numa:N[:NAME]`); `block_size` (a multiple of 4096, default 256 KiB), `participants`
    /// (default 8), `lease_ms` (default 2000) and `pins` (pins each participant can hold at once,
    /// 1..=65536, default 64) as `cxlkv pool create`; so are `mode` (permission bits of the
    /// created file, default 0o600: its owner alone), `owner` and `group` (a name or a number;
    /// default: the creating process's), docs/SECURITY.md.
    #[staticmethod]
    #[pyo3(signature = (spec, size, block_size=None, participants=None, lease_ms=None, pins=None, mode=None, owner=None, group=None))]
    #[allow(clippy::too_many_arguments)]
    fn create(
        py: Python<'_>,
        spec: String,
        size: u64,
        block_size: Option<u64>,
        participants: Option<u32>,
        lease_ms: Option<u64>,
        pins: Option<u32>,
        mode: Option<u32>,
        owner: Option<Id>,
        group: Option<Id>,
    ) -> PyResult<PyPool> {
        let b = backend(&spec)?;
        let access = Access {
            mode: mode.unwrap_or(PRIVATE_MODE),
            owner: owner.map(|o| o.resolve(user_id)).transpose()?,
            group: group.map(|g| g.resolve(group_id)).transpose()?,
        };
        let mut cfg = PoolConfig::default();
        if let Some(bs) = block_size {
            cfg.block_size = bs;
        }
        if let Some(p) = participants {
            cfg.participants = p;
        }
        if let Some(l) = lease_ms {
            cfg.lease = Duration::from_millis(l);
        }
        if let Some(n) = pins {
            cfg.pins_per_participant = n;
        }
        let pool = py.detach(|| {
            Pool::create_on_with(&b, size, &cfg, &RegionOptions::default(), &access)
                .map_err(Fail::from)
        })?;
        Ok(PyPool {
            pool: RwLock::new(Some(pool)),
            spec,
        })
    }

    /// Opens the pool on `spec`, validating its superblock. `prefault=True` faults every page of
    /// this process's mapping in now (writable), so that no later first touch pays a page fault:
    /// what the cross-pod bridge does before it lends the mapping to Mooncake's transfers.
    #[staticmethod]
    #[pyo3(signature = (spec, prefault=false))]
    fn open(py: Python<'_>, spec: String, prefault: bool) -> PyResult<PyPool> {
        let b = backend(&spec)?;
        let opts = RegionOptions {
            prefault,
            ..RegionOptions::default()
        };
        let pool = py.detach(|| Pool::open_on(&b, &opts).map_err(Fail::from))?;
        Ok(PyPool {
            pool: RwLock::new(Some(pool)),
            spec,
        })
    }

    /// The backend spec this handle was opened with.
    #[getter]
    fn spec(&self) -> &str {
        &self.spec
    }

    /// Payload capacity of a block, in bytes.
    #[getter]
    fn block_size(&self) -> PyResult<u64> {
        Ok(self.get()?.block_size())
    }

    /// The pool's geometry: pool_size, block_size, participants, partitions,
    /// blocks_per_partition, pins_per_participant, version_major, version_minor.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let pool = self.get()?;
        let sb = pool.superblock();
        let d = PyDict::new(py);
        d.set_item("pool_size", sb.pool_size)?;
        d.set_item("block_size", sb.block_size)?;
        d.set_item("participants", sb.participants)?;
        d.set_item("partitions", sb.partitions)?;
        d.set_item("blocks_per_partition", sb.blocks_per_partition)?;
        d.set_item("pins_per_participant", sb.pins())?;
        d.set_item("version_major", sb.version_major)?;
        d.set_item("version_minor", sb.version_minor)?;
        Ok(d)
    }

    /// Attaches a participant (a slot and, if one is free or dead, a partition). With `tenant`
    /// (a name) and `salt` (its secret bytes), as that tenant ([`Participant.attach`]).
    #[pyo3(signature = (tenant=None, salt=None))]
    fn attach(
        &self,
        py: Python<'_>,
        tenant: Option<String>,
        salt: Option<Vec<u8>>,
    ) -> PyResult<PyParticipant> {
        crate::participant::attach(py, &self.get()?, tenant, salt)
    }

    /// Declares tenant `name` with `quota` blocks (0 = unlimited) and returns its id; a tenant
    /// already declared keeps its quota (docs/SECURITY.md, "Tenants inside one pool").
    #[pyo3(signature = (name, quota=0))]
    fn declare_tenant(&self, name: &str, quota: u64) -> PyResult<u32> {
        let pool = self.get()?;
        Tenant::new(name, b"").map_err(Fail::from)?;
        Ok(tenant::declare(&pool, name, quota).map_err(Fail::from)?)
    }

    /// Sets the quota (blocks; 0 = unlimited) of the declared tenant `name`.
    fn set_tenant_quota(&self, name: &str, quota: u64) -> PyResult<()> {
        let pool = self.get()?;
        tenant::set_quota(&pool, name, quota).map_err(Fail::from)?;
        Ok(())
    }

    /// Each tenant's use: a list of dicts with `id`, `name`, `partitions`, `blocks` and `quota`
    /// (tenant 0, the public space, first).
    fn tenants<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let pool = self.get()?;
        let rows = tenant::usage(&pool).map_err(Fail::from)?;
        rows.into_iter()
            .map(|t| {
                let d = PyDict::new(py);
                d.set_item("id", t.id)?;
                d.set_item("name", t.name)?;
                d.set_item("partitions", t.partitions)?;
                d.set_item("blocks", t.blocks)?;
                d.set_item("quota", t.quota)?;
                Ok(d)
            })
            .collect()
    }

    /// True when `key` is in the pool (index only, no payload read).
    fn contains(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let (pool, k) = (self.get()?, key_of(key)?);
        Ok(py.detach(|| pool.contains(k).map_err(Fail::from))?)
    }

    /// Bytes held under `key` (a multi-block object's whole length), or None on a miss: the size
    /// of the buffer `get_into` needs.
    fn length(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        let (pool, k) = (self.get()?, key_of(key)?);
        Ok(py.detach(|| pool.length(k).map_err(Fail::from))?)
    }

    /// `[contains(k) for k in keys]` in one call.
    fn batch_contains(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
        let (pool, ks) = (self.get()?, keys_of(keys)?);
        Ok(py.detach(|| {
            ks.iter()
                .map(|&k| pool.contains(k).map_err(Fail::from))
                .collect::<Result<Vec<_>, _>>()
        })?)
    }

    /// How many leading keys of the chain `keys` are present (the cached prefix).
    fn lookup_prefix(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let (pool, ks) = (self.get()?, keys_of(keys)?);
        Ok(py.detach(|| pool.lookup_prefix(&ks).map_err(Fail::from))?)
    }

    /// Validates every structure (as `cxlkv pool check`): a dict with `ok`, `errors` and `notes`
    /// (lists of "place: what"), `blocks_checked`, `bytes_checked`.
    fn check<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let pool = self.get()?;
        let r = py.detach(|| cxlkv_runtime::check(&pool).map_err(Fail::from))?;
        let text = |f: &[cxlkv_runtime::check::Finding]| -> Vec<String> {
            f.iter()
                .map(|x| format!("{}: {}", x.place, x.what))
                .collect()
        };
        let d = PyDict::new(py);
        d.set_item("ok", r.errors.is_empty())?;
        d.set_item("errors", text(&r.errors))?;
        d.set_item("notes", text(&r.notes))?;
        d.set_item("blocks_checked", r.blocks_checked)?;
        d.set_item("bytes_checked", r.bytes_checked)?;
        Ok(d)
    }

    /// Removes this pool's backing file (shm or file specs); open mappings stay valid.
    fn unlink(&self) -> PyResult<()> {
        unlink(&self.spec)
    }

    /// Drops this handle (participants keep the mapping). Idempotent.
    fn close(&self) {
        self.pool.write().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        let state = if self.get().is_ok() { "open" } else { "closed" };
        format!("Pool({:?}, {state})", self.spec)
    }
}

/// Removes the backing file of the shm or file pool `spec` (mappings stay valid).
#[pyfunction]
pub fn unlink(spec: &str) -> PyResult<()> {
    let b = backend(spec)?;
    Region::unlink(&b).map_err(|e| Fail::from(cxlkv_runtime::PoolError::from(e)))?;
    Ok(())
}
