//! Reference loops for `python/bench.py`, run in Rust without the interpreter: the same batched
//! gets through the Rust API into the same destination, and a plain memcpy, so the bench can
//! report the package's throughput as a ratio to both, measured in the same run.

use crate::buffer::{Bytes, BytesMut};
use crate::errors::Fail;
use crate::keys::keys_of;
use crate::participant::PyParticipant;
use pyo3::prelude::*;
use std::time::Instant;

/// Seconds for `rounds` passes of `Participant::get_into` of every key into its row of `out`
/// (one buffer split into `len(keys)` equal rows), with no Python between the gets.
#[pyfunction]
pub fn _bench_rust_get(
    py: Python<'_>,
    participant: &PyParticipant,
    keys: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    rounds: usize,
) -> PyResult<f64> {
    let (me, ks) = (participant.inner()?, keys_of(keys)?);
    let mut b = BytesMut::get(out, "out")?;
    if ks.is_empty() || !b.len().is_multiple_of(ks.len()) {
        return Err(Fail::bad("out must split into one equal row per key").into());
    }
    let row = b.len() / ks.len();
    Ok(py.detach(|| {
        let dst = b.as_mut_slice();
        let t = Instant::now();
        for _ in 0..rounds {
            for (&k, r) in ks.iter().zip(dst.chunks_mut(row)) {
                match me.get_into(k, r) {
                    Ok(Some(_)) => {}
                    Ok(None) => return Err(Fail::bad(format!("bench key {k} missing"))),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(t.elapsed().as_secs_f64())
    })?)
}

/// Seconds for `rounds` passes that copy each `dst`-sized row of `src` into `dst` in turn (the
/// access pattern of single gets of `len(src) / len(dst)` blocks into one buffer).
#[pyfunction]
pub fn _bench_memcpy(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    dst: &Bound<'_, PyAny>,
    rounds: usize,
) -> PyResult<f64> {
    let (s, mut d) = (Bytes::get(src, "src")?, BytesMut::get(dst, "dst")?);
    if d.is_empty() || !s.len().is_multiple_of(d.len()) {
        return Err(Fail::bad("src must be whole rows of dst's length").into());
    }
    Ok(py.detach(|| {
        let (s, d) = (s.as_slice(), d.as_mut_slice());
        let t = Instant::now();
        for _ in 0..rounds {
            for row in s.chunks_exact(d.len()) {
                d.copy_from_slice(std::hint::black_box(row));
                std::hint::black_box(&mut *d);
            }
        }
        t.elapsed().as_secs_f64()
    }))
}
