//! Typed KV blocks: the element-type codes (`CXLKV_DTYPE_*`), the block shape
//! (`cxlkv_kv_shape`), `cxlkv_participant_put_kv`, which stores K and V with the per-head key
//! bounds the near-data device prunes on, and `cxlkv_participant_get_kv`, which reads them back.

use crate::args::{bytes_in, bytes_out, need, put_out};
use crate::errors::cxlkv_result::{
    self, CXLKV_ERR_BUFFER_TOO_SMALL, CXLKV_ERR_INVALID_ARG, CXLKV_ERR_NOT_FOUND,
};
use crate::errors::{fail, guard, map_err};
use crate::handles::{borrow, Kind};
use crate::keys::{cxlkv_key, key_arg};
use crate::participant::cxlkv_participant;
use crate::sized::{check_out, read_in, sized, write_out};
use cxlkv_runtime::{Codec, KvBlock};

/// Element types (`cxlkv_kv_shape::dtype`, `cxlkv_score_request::dtype`).
pub const CXLKV_DTYPE_F16: u32 = 1;
/// bfloat16.
pub const CXLKV_DTYPE_BF16: u32 = 2;
/// IEEE binary32.
pub const CXLKV_DTYPE_F32: u32 = 3;

/// Shape of a typed KV block (`cxlkv_participant_put_kv`, `cxlkv_participant_get_kv`). First
/// layout: all of it (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_kv_shape {
    /// `sizeof(cxlkv_kv_shape)` as the caller's header declares it (on output: the bytes written).
    pub struct_size: u32,
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

sized!(cxlkv_kv_shape, 40);

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
        let s = read_in(shape, cxlkv_kv_shape::default(), "shape")?;
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
        me.inner.put_kv(key, &shape, k, v).map_err(map_err)?;
        Ok(())
    })
}

/// Reads the typed KV block under `key` (stored by `cxlkv_participant_put_kv`): K into `k` and V
/// into `v` (`[kv_heads][tokens][head_dim]` elements each, `k_cap` and `v_cap` bytes of room), its
/// shape into `*shape` (whose `struct_size` the caller sets) and the bytes of K (= of V) into
/// `*kv_len`. `CXLKV_ERR_NOT_FOUND` on a miss; `CXLKV_ERR_BUFFER_TOO_SMALL` when either buffer is
/// smaller than the block's K or V, with the needed size stored in `*kv_len` (call with 0
/// capacities to learn it); `CXLKV_ERR_INVALID_ARG` when the block is not a typed KV block (a
/// plain `cxlkv_participant_put`) or its layout does not validate. Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cxlkv_participant_get_kv(
    p: *const cxlkv_participant,
    key: *const cxlkv_key,
    shape: *mut cxlkv_kv_shape,
    k: *mut u8,
    k_cap: usize,
    v: *mut u8,
    v_cap: usize,
    kv_len: *mut usize,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        let key = key_arg(key)?;
        check_out(shape, "shape")?;
        need(kv_len, "kv_len")?;
        let k_dst = bytes_out(k, k_cap, "k")?;
        let v_dst = bytes_out(v, v_cap, "v")?;
        let Some((payload, info)) = me.inner.get(key).map_err(map_err)? else {
            return Err(fail(CXLKV_ERR_NOT_FOUND, format!("key {key} not found")));
        };
        if info.codec != Codec::KvV1 {
            return Err(fail(
                CXLKV_ERR_INVALID_ARG,
                format!(
                    "key {key} holds a {:?} block, not a typed KV block",
                    info.codec
                ),
            ));
        }
        let block = KvBlock::parse(&payload).map_err(map_err)?;
        let n = block.k.len();
        if n > k_dst.len() || n > v_dst.len() {
            put_out(kv_len, n);
            return Err(fail(
                CXLKV_ERR_BUFFER_TOO_SMALL,
                format!(
                    "K and V need {n} bytes each, capacities {} and {}",
                    k_dst.len(),
                    v_dst.len()
                ),
            ));
        }
        k_dst[..n].copy_from_slice(block.k);
        v_dst[..n].copy_from_slice(block.v);
        let s = block.shape;
        write_out(
            shape,
            cxlkv_kv_shape {
                struct_size: 0,
                dtype: u32::from(s.dtype as u8),
                layer: s.layer,
                kv_heads: s.kv_heads,
                head_dim: s.head_dim,
                tokens: s.tokens,
                sequence: s.sequence,
                token_offset: s.token_offset,
            },
        );
        put_out(kv_len, n);
        Ok(())
    })
}
