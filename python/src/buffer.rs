//! Caller buffers through the buffer protocol (bytes, bytearray, memoryview, numpy arrays of any
//! dtype, array.array...) and, for objects without it (CPU torch tensors), DLPack through
//! `numpy.from_dlpack`; and the read-only view a pin exports. This is the extension's only module
//! that turns raw addresses into slices.
//!
//! The rule that makes the slices sound: a [`Bytes`] / [`BytesMut`] holds the exporter's
//! `Py_buffer` (the exporter keeps the memory in place and, for a bytearray, refuses to resize
//! while it is held) for as long as the slice lives. The slices point at the *caller's* memory,
//! never at pool memory: pool bytes move only through the runtime's copy APIs. Calls release the
//! GIL while they copy, so a caller that writes the same object from another Python thread at the
//! same time races with the copy, as with any extension that releases the GIL (numpy's own copies
//! included); the result is then unspecified bytes in that caller's object, nothing else.

use crate::errors::Fail;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use std::os::raw::c_int;

static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The numpy module (imported once).
pub fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    NUMPY
        .get_or_try_init(py, || Ok::<_, PyErr>(py.import("numpy")?.unbind()))
        .map(|m| m.bind(py))
}

/// The contiguous buffer of `obj`: its own buffer protocol, else DLPack through numpy.
fn contiguous(obj: &Bound<'_, PyAny>, what: &str) -> Result<PyUntypedBuffer, Fail> {
    let buf = match PyUntypedBuffer::get(obj) {
        Ok(b) => b,
        Err(first) if obj.hasattr("__dlpack__").unwrap_or(false) => {
            let py = obj.py();
            let arr = numpy(py)
                .and_then(|np| np.call_method1("from_dlpack", (obj,)))
                .map_err(|e| Fail::bad(format!("{what}: DLPack import failed: {e}")))?;
            PyUntypedBuffer::get(&arr).map_err(|e| {
                Fail::bad(format!(
                    "{what}: no buffer ({first}), and its DLPack array has none ({e})"
                ))
            })?
        }
        Err(e) => {
            return Err(Fail::bad(format!(
                "{what}: a buffer-protocol object (bytes, bytearray, numpy array...) or a DLPack \
                 tensor is needed, not {} ({e})",
                obj.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            )))
        }
    };
    if !buf.is_c_contiguous() {
        return Err(Fail::bad(format!(
            "{what}: the buffer is not C-contiguous (use numpy.ascontiguousarray)"
        )));
    }
    Ok(buf)
}

/// A caller's contiguous, readable bytes, held for the duration of a call.
pub struct Bytes(PyUntypedBuffer);

impl Bytes {
    /// The bytes of `obj`; `what` names the argument in errors.
    pub fn get(obj: &Bound<'_, PyAny>, what: &str) -> Result<Bytes, Fail> {
        contiguous(obj, what).map(Bytes)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len_bytes()
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        let n = self.0.len_bytes();
        if n == 0 {
            return &[];
        }
        // SAFETY: the held Py_buffer is C-contiguous (checked) with `n` bytes at buf_ptr, which the
        // exporter keeps valid and in place until the buffer is released (when `self` drops, after
        // the returned borrow ends). Concurrent writers are the caller's race (module docs).
        unsafe { std::slice::from_raw_parts(self.0.buf_ptr().cast::<u8>(), n) }
    }
}

/// A caller's contiguous, writable bytes, held for the duration of a call.
pub struct BytesMut(PyUntypedBuffer);

impl BytesMut {
    /// The writable bytes of `obj`; a read-only buffer is an error.
    pub fn get(obj: &Bound<'_, PyAny>, what: &str) -> Result<BytesMut, Fail> {
        let b = contiguous(obj, what)?;
        if b.readonly() {
            return Err(Fail::bad(format!(
                "{what}: the buffer is read-only (pass a bytearray or a writable numpy array)"
            )));
        }
        Ok(BytesMut(b))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len_bytes()
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let n = self.0.len_bytes();
        if n == 0 {
            return &mut [];
        }
        // SAFETY: as in `Bytes::as_slice`, and the exporter declared the buffer writable; `&mut
        // self` makes this the only slice this process's Rust code holds on it.
        unsafe { std::slice::from_raw_parts_mut(self.0.buf_ptr().cast::<u8>(), n) }
    }
}

/// Fills `view` with a one-dimensional byte view of `len` bytes at `addr`, owned by `owner` (a
/// pin, read-only: a request for a writable view fails with BufferError; or a reservation,
/// writable).
///
/// # Safety
/// `view` is the pointer CPython handed to `__getbuffer__`; `addr..addr + len` stays mapped until
/// the matching `__releasebuffer__`, unchanged when `readonly` (the pin guarantees it: the block's
/// owner neither reuses nor rewrites a pinned block), and written by no one else when not (the
/// reservation guarantees it: the block is unpublished and cannot be committed meanwhile).
pub unsafe fn fill_view(
    view: *mut ffi::Py_buffer,
    owner: &Bound<'_, PyAny>,
    addr: usize,
    len: usize,
    readonly: bool,
    flags: c_int,
) -> PyResult<()> {
    let len = ffi::Py_ssize_t::try_from(len)
        .map_err(|_| pyo3::exceptions::PyBufferError::new_err("block too large for a view"))?;
    // SAFETY: the caller's contract above; PyBuffer_FillInfo takes a new reference to `owner`
    // (released with the view) and sets format/shape/strides for a one-dimensional byte buffer.
    let rc = unsafe {
        ffi::PyBuffer_FillInfo(
            view,
            owner.as_ptr(),
            addr as *mut std::ffi::c_void,
            len,
            c_int::from(readonly),
            flags,
        )
    };
    if rc != 0 {
        return Err(PyErr::fetch(owner.py()));
    }
    Ok(())
}

impl Bytes {
    /// The exporter's shape (its `ndim` extents).
    pub fn shape(&self) -> &[usize] {
        self.0.shape()
    }

    /// The exporter's struct-module item format (`e` for float16, `f` for float32, `B`...).
    pub fn format(&self) -> String {
        self.0.format().to_string_lossy().into_owned()
    }

    /// Bytes per item.
    pub fn item_size(&self) -> usize {
        self.0.item_size()
    }
}
