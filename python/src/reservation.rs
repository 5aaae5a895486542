//! The `Reservation` class: a block reserved for an in-place write (`Participant.reserve(key,
//! length)`), exported as a writable buffer of exactly `length` bytes in pool memory (zero copy:
//! `memoryview(r)[:] = ...`, `numpy.frombuffer(r, ...)`, or `r.write(data)`), published under its
//! key by `commit()` or freed by `abort()`. A `with` block commits when it ends normally and aborts
//! when it raises. While a view is exported the reservation refuses to commit or abort
//! (BufferError), so no view can write into a block once it is published or reused. The C ABI's
//! `cxlkv_participant_reserve` / `cxlkv_reservation_commit` on the same runtime calls; a commit
//! counts as a `put` of the reserved length in the metrics.

use crate::buffer::{fill_view, Bytes};
use crate::errors::Fail;
use cxlkv_runtime::api::Code;
use cxlkv_runtime::{Codec, Key, Participant, RawReservation};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::c_int;
use std::sync::{Arc, Mutex, MutexGuard};

struct Held {
    raw: RawReservation,
    /// Address of the reserved payload (only this reservation writes it until commit).
    addr: usize,
    len: usize,
    /// Its participant, kept attached while the reservation is held and let go when it is released
    /// (not when the Python object is collected: a released reservation must not hold the slot).
    participant: Arc<Participant>,
}

/// A reserved block awaiting its commit (`Participant.reserve(key, length)`).
#[pyclass(frozen, name = "Reservation", module = "cxlkv")]
pub struct PyReservation {
    held: Mutex<Option<Held>>,
    exports: Mutex<usize>,
}

impl PyReservation {
    /// Reserves `len` bytes under `key` for `me`: UnavailableError on memory without stable
    /// addresses.
    pub fn take(me: Arc<Participant>, key: Key, len: u64) -> Result<PyReservation, Fail> {
        let raw = me.reserve(key, len, Codec::Raw)?.into_raw();
        let addr = match me.raw_reservation_ptr(&raw) {
            Ok(Some(p)) => p as usize,
            other => {
                me.abort_raw(raw);
                return Err(match other {
                    Err(e) => e.into(),
                    _ => Fail::new(Code::Unavailable, "pool memory has no stable address"),
                });
            }
        };
        Ok(PyReservation {
            held: Mutex::new(Some(Held {
                raw,
                addr,
                len: len as usize,
                participant: me,
            })),
            exports: Mutex::new(0),
        })
    }

    fn held(&self) -> MutexGuard<'_, Option<Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn exports(&self) -> MutexGuard<'_, usize> {
        self.exports.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the reservation out to commit or abort it (`None` once finished); BufferError while
    /// views of it are exported.
    fn finish(&self) -> PyResult<Option<Held>> {
        let mut held = self.held();
        let n = *self.exports();
        if n > 0 && held.is_some() {
            return Err(PyBufferError::new_err(format!(
                "cannot finish the reservation: {n} view(s) of it are still exported (release \
                 them first)"
            )));
        }
        Ok(held.take())
    }
}

#[pymethods]
impl PyReservation {
    /// Reserved length in bytes.
    fn __len__(&self) -> PyResult<usize> {
        self.held()
            .as_ref()
            .map(|h| h.len)
            .ok_or_else(|| Fail::new(Code::InvalidHandle, "the reservation was finished").into())
    }

    /// True until `commit()` or `abort()`.
    #[getter]
    fn open(&self) -> bool {
        self.held().is_some()
    }

    /// Copies the bytes of `data` (any buffer) into the reserved payload at `offset`, without the
    /// GIL; returns their count. BadInputError when they do not fit.
    #[pyo3(signature = (data, offset=0))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: usize) -> PyResult<usize> {
        let b = Bytes::get(data, "data")?;
        // Counted as an export while the copy runs: commit and abort refuse meanwhile.
        let (addr, len) = {
            let guard = self.held();
            let h = guard
                .as_ref()
                .ok_or_else(|| Fail::new(Code::InvalidHandle, "the reservation was finished"))?;
            *self.exports() += 1;
            (h.addr, h.len)
        };
        let n = b.len();
        let fits = offset <= len && n <= len - offset;
        if fits {
            let src = b.as_slice();
            py.detach(|| {
                // SAFETY: addr + offset .. + n lies in the reserved payload (checked), which stays
                // mapped and is written by this reservation alone until it is finished, which
                // cannot happen while this copy is counted as an export; src is the caller's
                // memory, distinct from pool memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), (addr + offset) as *mut u8, n)
                }
            });
        }
        *self.exports() -= 1;
        if !fits {
            return Err(Fail::bad(format!(
                "{n} bytes at offset {offset} do not fit a reservation of {len}"
            ))
            .into());
        }
        Ok(n)
    }

    /// Checksums the payload in place and publishes it under its key (a `put` of the reserved
    /// length in the metrics). With `length`, only the first `length` bytes are the block; with
    /// `crc`, it publishes only if their CRC-32C is `crc`, else BadInputError and the block is
    /// freed (one pass over the bytes checks them and makes the block's checksum). BufferError
    /// while views are exported; ClosedError once finished.
    #[pyo3(signature = (length=None, crc=None))]
    fn commit(&self, py: Python<'_>, length: Option<u64>, crc: Option<u32>) -> PyResult<()> {
        let Some(h) = self.finish()? else {
            return Err(Fail::new(Code::InvalidHandle, "the reservation was finished").into());
        };
        py.detach(|| {
            let r = match (length, crc) {
                (None, None) => h.participant.commit_raw(h.raw),
                _ => {
                    let len = length.unwrap_or(h.raw.len());
                    h.participant.commit_raw_prefix(h.raw, len, crc)
                }
            };
            r.map(drop).map_err(Fail::from)
        })?;
        Ok(())
    }

    /// Frees the reserved block unpublished. BufferError while views are exported. Idempotent.
    fn abort(&self) -> PyResult<()> {
        if let Some(h) = self.finish()? {
            h.participant.abort_raw(h.raw);
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Commits when the block ended normally, aborts when it raised.
    fn __exit__(
        &self,
        py: Python<'_>,
        t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        if t.is_none() && self.open() {
            self.commit(py, None, None)?;
        } else {
            self.abort()?;
        }
        Ok(false)
    }

    /// A writable view of the reserved payload.
    ///
    /// # Safety
    /// Called by CPython with a valid `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let guard = this.held();
        let h = guard
            .as_ref()
            .ok_or_else(|| PyBufferError::new_err("the reservation was finished"))?;
        // SAFETY: the reserved payload stays mapped and is this reservation's alone until it is
        // finished, which is refused while an export is counted (incremented below, under the
        // same lock).
        unsafe { fill_view(view, slf.as_any(), h.addr, h.len, false, flags)? };
        *this.exports() += 1;
        Ok(())
    }

    /// # Safety
    /// Called by CPython with a view it got from `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut n = self.exports();
        *n = n.saturating_sub(1);
    }

    fn __repr__(&self) -> String {
        match self.held().as_ref() {
            Some(h) => format!("Reservation({} bytes)", h.len),
            None => "Reservation(finished)".into(),
        }
    }
}

impl Drop for PyReservation {
    fn drop(&mut self) {
        if let Some(h) = self
            .held
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            h.participant.abort_raw(h.raw);
        }
    }
}
