//! Typed KV blocks: the element-type codes (`CXLKV_DTYPE_*`), the block shape
//! (`cxlkv_kv_shape`) and `cxlkv_participant_put_kv`, which stores K and V with the per-head key
//! bounds the near-data device prunes on.

use crate::args::bytes_in;
use crate::errors::cxlkv_result::{self, CXLKV_ERR_INVALID_ARG, CXLKV_ERR_NULL};
use crate::errors::{fail, guard, map_err};
use crate::handles::{borrow, Kind};
use crate::keys::{cxlkv_key, key_arg};
use crate::metrics::record;
use crate::participant::cxlkv_participant;
use cxlkv_runtime::metrics::{Op, Outcome};
use std::time::Instant;

/// Element types (`cxlkv_kv_shape::dtype`, `cxlkv_score_request::dtype`).
pub const CXLKV_DTYPE_F16: u32 = 1;
/// bfloat16.
pub const CXLKV_DTYPE_BF16: u32 = 2;
/// IEEE binary32.
pub const CXLKV_DTYPE_F32: u32 = 3;

/// Shape of a typed KV block (`cxlkv_participant_put_kv`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_kv_shape {
    /// `CXLKV_DTYPE_*` of K and V.
    pub dtype: u32,
    /// Model layer.
    pub layer: u32,
    /// KV heads in the block.
    pub kv_heads: u32,
    /// Elements per head vector.
    pub head_dim: u32,
    /// Tokens in the block.
    pub tokens: u32,
    /// Sequence id (engine-chosen).
    pub sequence: u64,
    /// Position of the block's first token in its sequence.
    pub token_offset: u64,
}

/// An element-type argument: one of the `CXLKV_DTYPE_*` codes.
pub(crate) fn dtype_arg(d: u32) -> Result<cxlkv_kernels::DType, cxlkv_result> {
    u8::try_from(d)
        .ok()
        .and_then(cxlkv_kernels::DType::from_code)
        .ok_or_else(|| {
            fail(
                CXLKV_ERR_INVALID_ARG,
                format!("dtype {d}: use CXLKV_DTYPE_F16, _BF16 or _F32"),
            )
        })
}

/// Stores a typed KV block under `key`: K and V are `[kv_heads][tokens][head_dim]` elements of
/// `shape->dtype` (`k_len` and `v_len` bytes each); per-head key bounds are computed here so the
/// device can prune. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_put_kv(
    p: *const cxlkv_participant,
    key: *const cxlkv_key,
    shape: *const cxlkv_kv_shape,
    k: *const u8,
    k_len: usize,
    v: *const u8,
    v_len: usize,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        let key = key_arg(key)?;
        if shape.is_null() {
            return Err(fail(CXLKV_ERR_NULL, "shape is NULL"));
        }
        // SAFETY: non-null; the caller promises a valid shape for the call.
        let s = unsafe { shape.read_unaligned() };
        let shape = cxlkv_runtime::KvShape {
            dtype: dtype_arg(s.dtype)?,
            layer: s.layer,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            tokens: s.tokens,
            sequence: s.sequence,
            token_offset: s.token_offset,
        };
        let (k, v) = (bytes_in(k, k_len, "k")?, bytes_in(v, v_len, "v")?);
        let t0 = Instant::now();
        let r = me.inner.put_kv(key, &shape, k, v);
        let outcome = if r.is_ok() {
            Outcome::Ok
        } else {
            Outcome::Error
        };
        record(Op::Put, outcome, (k.len() + v.len()) as u64, 0, t0);
        r.map_err(map_err)?;
        Ok(())
    })
}
