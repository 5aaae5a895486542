//! The `Pin` class: a pinned block as a read-only buffer in place (zero copy: `memoryview(pin)`,
//! `numpy.frombuffer(pin, ...)`), released by `release()` or at the end of a `with` block, also
//! when the block raises. While a view is exported the pin refuses to release (BufferError), so no
//! view ever outlives the pin that keeps its bytes in place.

use crate::buffer::{fill_view, numpy, BytesMut};
use crate::errors::Fail;
use crate::kv::{kv_block, PyKvBlock};
use cxlkv_runtime::api::Code;
use cxlkv_runtime::{Key, Participant, RawPin};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::c_int;
use std::sync::{Arc, Mutex, MutexGuard};

struct Held {
    raw: RawPin,
    /// Address of the payload (the pin keeps it in place and unchanged).
    addr: usize,
    len: usize,
    /// Its participant, kept attached while the pin is held and let go when it is released
    /// (not when the Python object is collected: a released pin must not hold the slot).
    participant: Arc<Participant>,
}

/// A pinned block (`Participant.pin(key)`).
#[pyclass(frozen, name = "Pin", module = "cxlkv")]
pub struct PyPin {
    held: Mutex<Option<Held>>,
    exports: Mutex<usize>,
}

impl PyPin {
    /// Pins `key` for `me`: None on a miss; UnavailableError on memory without stable addresses.
    pub fn take(me: Arc<Participant>, key: Key) -> Result<Option<PyPin>, Fail> {
        let Some(pinned) = me.pin(key)? else {
            return Ok(None);
        };
        let raw = pinned.into_raw();
        let addr = match me.raw_pin_ptr(&raw) {
            Ok(Some(p)) => p as usize,
            other => {
                me.unpin_raw(raw);
                return Err(match other {
                    Err(e) => e.into(),
                    _ => Fail::new(Code::Unavailable, "pool memory has no stable address"),
                });
            }
        };
        let len = raw.info().len as usize;
        Ok(Some(PyPin {
            held: Mutex::new(Some(Held {
                raw,
                addr,
                len,
                participant: me,
            })),
            exports: Mutex::new(0),
        }))
    }

    fn held(&self) -> MutexGuard<'_, Option<Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn live(&self) -> Result<(usize, usize), Fail> {
        self.held()
            .as_ref()
            .map(|h| (h.addr, h.len))
            .ok_or_else(|| Fail::new(Code::InvalidHandle, "the pin was released"))
    }
}

#[pymethods]
impl PyPin {
    /// Payload length in bytes.
    fn __len__(&self) -> PyResult<usize> {
        Ok(self.live()?.1)
    }

    /// True until `release()`.
    #[getter]
    fn pinned(&self) -> bool {
        self.held().is_some()
    }

    /// Copies payload bytes from `offset` into `out` (a writable buffer), as many as it holds;
    /// returns the count.
    #[pyo3(signature = (out, offset=0))]
    fn read_into(&self, py: Python<'_>, out: &Bound<'_, PyAny>, offset: usize) -> PyResult<usize> {
        let mut b = BytesMut::get(out, "out")?;
        // Counted as an export while the copy runs without the GIL: `release` refuses meanwhile,
        // and no lock is held across the copy (a thread waiting on it would hold the GIL).
        let (addr, len) = {
            let guard = self.held();
            let h = guard
                .as_ref()
                .ok_or_else(|| Fail::new(Code::InvalidHandle, "the pin was released"))?;
            *self.exports.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            (h.addr, h.len)
        };
        let done = || *self.exports.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        if offset > len {
            done();
            return Err(Fail::bad(format!("offset {offset} past a block of {len}")).into());
        }
        let n = b.len().min(len - offset);
        let src = addr + offset;
        let dst = b.as_mut_slice();
        py.detach(|| {
            // SAFETY: src..src + n lies in the pinned payload (n ≤ len - offset), which stays mapped
            // and unchanged while the pin is held, and it cannot be released while this copy is
            // counted as an export; dst has at least n bytes of the caller's memory, distinct from
            // pool memory.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), n) }
        });
        done();
        Ok(n)
    }

    /// The pinned typed KV block as a `KvBlock` whose K and V arrays view pool memory directly
    /// (read-only, zero copy). Release the arrays before the pin.
    fn kv(slf: &Bound<'_, Self>) -> PyResult<PyKvBlock> {
        let py = slf.py();
        let (addr, len) = slf.get().live()?;
        let flat = numpy(py)?.call_method1("frombuffer", (slf, "uint8"))?;
        // SAFETY: the pinned payload (addr, len) stays mapped and unchanged while the pin is held,
        // and `flat` holds an export of it, so the pin cannot be released during this call.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        kv_block(py, &flat, bytes)
    }

    /// Releases the pin; BufferError while views of it are still exported. Idempotent.
    fn release(&self) -> PyResult<()> {
        let mut held = self.held();
        let n = *self.exports.lock().unwrap_or_else(|e| e.into_inner());
        if n > 0 {
            return Err(PyBufferError::new_err(format!(
                "cannot release the pin: {n} view(s) of it are still exported (release them first)"
            )));
        }
        if let Some(h) = held.take() {
            h.participant.unpin_raw(h.raw);
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.release()?;
        Ok(false)
    }

    /// A read-only view of the pinned payload.
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
            .ok_or_else(|| PyBufferError::new_err("the pin was released"))?;
        // SAFETY: the payload stays in place and unchanged while the pin is held, and the pin is
        // not released while an export is counted (incremented below, under the same lock).
        unsafe { fill_view(view, slf.as_any(), h.addr, h.len, true, flags)? };
        *this.exports.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        Ok(())
    }

    /// # Safety
    /// Called by CPython with a view it got from `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut n = self.exports.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
    }

    fn __repr__(&self) -> String {
        match self.live() {
            Ok((_, len)) => format!("Pin({len} bytes)"),
            Err(_) => "Pin(released)".into(),
        }
    }
}

impl Drop for PyPin {
    fn drop(&mut self) {
        if let Some(h) = self
            .held
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            h.participant.unpin_raw(h.raw);
        }
    }
}
