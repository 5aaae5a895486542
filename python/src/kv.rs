//! Typed KV blocks as numpy arrays: the `KvBlock` class that `Participant.get_kv` and `Pin.kv`
//! return (K and V as `[kv_heads][tokens][head_dim]` arrays that view one buffer), the dtype
//! argument rule of `put_kv`, and `parse_kv` for a payload already in a buffer.

use crate::buffer::{numpy, Bytes};
use crate::errors::Fail;
use cxlkv_kernels::DType;
use cxlkv_runtime::KvShape;
use pyo3::prelude::*;
use pyo3::types::PySlice;

/// A typed KV block: `k` and `v` are numpy arrays `[kv_heads, tokens, head_dim]` of `dtype`
/// (`float16`, `float32`; bf16 as `ml_dtypes.bfloat16` when that package is installed, else the
/// raw `uint16` bits), viewing the buffer the block was read into (or the pinned block itself).
#[pyclass(frozen, name = "KvBlock", module = "cxlkv")]
pub struct PyKvBlock {
    /// Keys.
    #[pyo3(get)]
    k: Py<PyAny>,
    /// Values.
    #[pyo3(get)]
    v: Py<PyAny>,
    /// `f16`, `bf16` or `f32`.
    #[pyo3(get)]
    dtype: &'static str,
    /// Model layer.
    #[pyo3(get)]
    layer: u32,
    /// Sequence id.
    #[pyo3(get)]
    sequence: u64,
    /// Position of the first token.
    #[pyo3(get)]
    token_offset: u64,
    /// (kv_heads, tokens, head_dim).
    #[pyo3(get)]
    shape: (u32, u32, u32),
}

#[pymethods]
impl PyKvBlock {
    fn __repr__(&self) -> String {
        format!(
            "KvBlock(dtype={}, shape={:?}, layer={}, sequence={}, token_offset={})",
            self.dtype, self.shape, self.layer, self.sequence, self.token_offset
        )
    }
}

/// The numpy dtype of `d`.
fn np_dtype<'py>(py: Python<'py>, d: DType) -> PyResult<Bound<'py, PyAny>> {
    let np = numpy(py)?;
    match d {
        DType::F16 => np.getattr("float16"),
        DType::F32 => np.getattr("float32"),
        DType::I8 => np.getattr("int8"),
        // Two codes per byte: the raw bytes.
        DType::I4 => np.getattr("uint8"),
        DType::Bf16 => match py.import("ml_dtypes") {
            Ok(m) => m.getattr("bfloat16"),
            Err(_) => np.getattr("uint16"),
        },
    }
}

/// The KvBlock of the typed payload `bytes` (the first `len` bytes of `flat`, a one-dimensional
/// uint8 numpy array over the same memory).
pub fn kv_block(py: Python<'_>, flat: &Bound<'_, PyAny>, bytes: &[u8]) -> PyResult<PyKvBlock> {
    let b = cxlkv_runtime::KvBlock::parse(bytes).map_err(Fail::from)?;
    let s = b.shape;
    let t = b.k.len();
    let k_off = cxlkv_runtime::kv::LAYOUT_SIZE;
    let dt = np_dtype(py, s.dtype)?;
    let dims = (s.kv_heads as usize, s.tokens as usize, s.head_dim as usize);
    let view = |off: usize| -> PyResult<Py<PyAny>> {
        let part = flat.get_item(PySlice::new(py, off as isize, (off + t) as isize, 1))?;
        Ok(part
            .call_method1("view", (&dt,))?
            .call_method1("reshape", dims)?
            .unbind())
    };
    Ok(PyKvBlock {
        k: view(k_off)?,
        v: view(k_off + t)?,
        dtype: s.dtype.name(),
        layer: s.layer,
        sequence: s.sequence,
        token_offset: s.token_offset,
        shape: (s.kv_heads, s.tokens, s.head_dim),
    })
}

/// The dtype of a `put_kv` tensor: the `dtype` argument (`f16`, `bf16`, `f32`) or, without it,
/// the buffer's own item format (float16 or float32).
pub fn dtype_arg(name: Option<&str>, k: &Bytes) -> Result<DType, Fail> {
    let d = match name {
        Some(n) => n.parse::<DType>().map_err(Fail::bad)?,
        None => match k.format().trim_start_matches(['<', '=', '@']) {
            "e" => DType::F16,
            "f" => DType::F32,
            other => {
                return Err(Fail::bad(format!(
                    "K has item format {other:?}: pass float16 or float32 arrays, or dtype='bf16' \
                     with 2-byte items"
                )))
            }
        },
    };
    if k.item_size() != d.bytes(1) && k.item_size() != 1 {
        return Err(Fail::bad(format!(
            "K has {}-byte items, dtype {} needs {}",
            k.item_size(),
            d.name(),
            d.bytes(1)
        )));
    }
    Ok(d)
}

/// The shape of a `put_kv` block: `shape` if given, else K's three dimensions.
pub fn shape_arg(
    shape: Option<(u32, u32, u32)>,
    k: &Bytes,
    dtype: DType,
    layer: u32,
    sequence: u64,
    token_offset: u64,
) -> Result<KvShape, Fail> {
    let (kv_heads, tokens, head_dim) = match shape {
        Some(s) => s,
        None => match *k.shape() {
            [h, t, d] => {
                let c = |x: usize| u32::try_from(x).map_err(|_| Fail::bad("K too large"));
                (c(h)?, c(t)?, c(d)?)
            }
            ref other => {
                return Err(Fail::bad(format!(
                    "K has shape {other:?}: pass [kv_heads, tokens, head_dim] arrays or shape=(h, t, d)"
                )))
            }
        },
    };
    Ok(KvShape {
        dtype,
        layer,
        kv_heads,
        head_dim,
        tokens,
        sequence,
        token_offset,
    })
}
