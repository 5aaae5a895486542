//! Block keys: the `Key` class, key arguments (a `Key`, an `int` below 2**128, or a `str` / bytes
//! name hashed like the C ABI's `cxlkv_key_from_bytes`), and `key_chain`.

use crate::errors::Fail;
use cxlkv_runtime::{Key, KeyChain};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// A 128-bit block key. `Key(x)` takes an int (the key itself), or a str / bytes name (hashed);
/// `Key.from_parts(lo, hi)`. Hashable, comparable, `int(key)` gives the 128-bit value.
#[pyclass(frozen, eq, hash, name = "Key", module = "cxlkv")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyKey(pub Key);

#[pymethods]
impl PyKey {
    #[new]
    fn new(value: &Bound<'_, PyAny>) -> PyResult<PyKey> {
        Ok(PyKey(key_of(value)?))
    }

    /// The key with low and high 64-bit halves `lo` and `hi`.
    #[staticmethod]
    fn from_parts(lo: u64, hi: u64) -> PyKey {
        PyKey(Key::from_parts(lo, hi))
    }

    /// The key of an opaque name (an engine's own cache-key bytes); with `salt` (a tenant's
    /// secret bytes), the tenant's salted key of it.
    #[staticmethod]
    #[pyo3(signature = (name, salt=None))]
    fn from_bytes(name: &[u8], salt: Option<&[u8]>) -> PyKey {
        PyKey(match salt {
            Some(s) => Key::from_bytes_salted(s, name),
            None => Key::from_bytes(name),
        })
    }

    /// Low 64 bits.
    #[getter]
    fn lo(&self) -> u64 {
        self.0.lo()
    }

    /// High 64 bits.
    #[getter]
    fn hi(&self) -> u64 {
        self.0.hi()
    }

    fn __int__(&self) -> u128 {
        self.0 .0
    }

    fn __repr__(&self) -> String {
        format!("Key({:032x})", self.0 .0)
    }
}

/// A key argument.
pub fn key_of(obj: &Bound<'_, PyAny>) -> Result<Key, Fail> {
    if let Ok(k) = obj.cast::<PyKey>() {
        return Ok(k.get().0);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        let s = s
            .to_str()
            .map_err(|e| Fail::bad(format!("key: bad string ({e})")))?;
        return Ok(Key::from_bytes(s.as_bytes()));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Key::from_bytes(b.as_bytes()));
    }
    if let Ok(v) = obj.extract::<u128>() {
        return Ok(Key(v));
    }
    Err(Fail::bad(format!(
        "key must be a Key, str, bytes or an int in 0..2**128, not {}",
        obj.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    )))
}

/// A sequence of key arguments.
pub fn keys_of(obj: &Bound<'_, PyAny>) -> Result<Vec<Key>, Fail> {
    let iter = obj
        .try_iter()
        .map_err(|_| Fail::bad("keys must be an iterable of keys"))?;
    let mut out = Vec::with_capacity(obj.len().unwrap_or(0));
    for (i, k) in iter.enumerate() {
        let k = k.map_err(|e| Fail::bad(format!("keys: {e}")))?;
        out.push(key_of(&k).map_err(|f| f.context(format!("keys[{i}]")))?);
    }
    Ok(out)
}

/// Keys of `tokens` in chunks of `chunk` tokens for (`namespace`, `model`, layers
/// `layer_first..=layer_last`): the same keys every engine computes for the same prefix. With
/// `salt` (a tenant's secret bytes), the tenant's salted chain: only holders of the salt form it.
#[pyfunction]
#[pyo3(signature = (namespace, model, layer_first, layer_last, tokens, chunk, *, salt=None))]
#[allow(clippy::too_many_arguments)]
pub fn key_chain(
    namespace: &str,
    model: &str,
    layer_first: u32,
    layer_last: u32,
    tokens: Vec<u32>,
    chunk: usize,
    salt: Option<&[u8]>,
) -> PyResult<Vec<PyKey>> {
    if chunk == 0 || tokens.is_empty() {
        return Err(Fail::bad("tokens and chunk must be non-empty / positive").into());
    }
    let chain = match salt {
        Some(s) => KeyChain::salted(s, namespace, model, layer_first, layer_last),
        None => KeyChain::new(namespace, model, layer_first, layer_last),
    };
    Ok(chain.keys(&tokens, chunk).into_iter().map(PyKey).collect())
}
