//! `cxlkv.crc32c(data)`: the pool's own checksum (CRC-32C, Castagnoli, hardware-accelerated where
//! the CPU has it) of any buffer, with the GIL released. The cross-pod bridge checks each block it
//! imports with it before the commit (docs/CROSSPOD.md).

use crate::buffer::Bytes;
use pyo3::prelude::*;

/// CRC-32C of a buffer (any buffer-protocol object), the checksum the pool keeps for every block.
#[pyfunction]
pub fn crc32c(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<u32> {
    let b = Bytes::get(data, "data")?;
    Ok(py.detach(|| cxlkv_runtime::format::crc32c(b.as_slice())))
}
