//! Block keys: the `cxlkv_key` struct, its conversion to the runtime's `Key`, key arguments, and
//! the functions that compute keys (`cxlkv_key_chain` for token prefixes, `cxlkv_key_from_bytes`
//! for opaque names, and their `_salted` twins for tenants).

use crate::args::{bytes_in, cstr, need, put_out, slice_in};
use crate::errors::cxlkv_result::{
    self, CXLKV_ERR_BUFFER_TOO_SMALL, CXLKV_ERR_INVALID_ARG, CXLKV_ERR_NULL,
};
use crate::errors::{fail, guard};
use cxlkv_runtime::{Key, KeyChain};
use std::ffi::c_char;

/// A 128-bit block key (see `cxlkv_key_chain`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct cxlkv_key {
    /// Low 64 bits.
    pub lo: u64,
    /// High 64 bits.
    pub hi: u64,
}

impl From<cxlkv_key> for Key {
    fn from(k: cxlkv_key) -> Key {
        Key::from_parts(k.lo, k.hi)
    }
}

impl From<Key> for cxlkv_key {
    fn from(k: Key) -> cxlkv_key {
        cxlkv_key {
            lo: k.lo(),
            hi: k.hi(),
        }
    }
}

/// A key argument (required).
pub(crate) fn key_arg(k: *const cxlkv_key) -> Result<Key, cxlkv_result> {
    if k.is_null() {
        return Err(fail(CXLKV_ERR_NULL, "key is NULL"));
    }
    // SAFETY: non-null; the caller promises a valid cxlkv_key; read_unaligned tolerates packing.
    Ok(unsafe { k.read_unaligned() }.into())
}

/// A non-empty key chain argument of `n` keys.
pub(crate) fn key_slice(keys: *const cxlkv_key, n: usize) -> Result<Vec<Key>, cxlkv_result> {
    if n == 0 {
        return Err(fail(CXLKV_ERR_INVALID_ARG, "empty key chain"));
    }
    Ok(slice_in(keys, n, "keys")?
        .iter()
        .map(|&k| k.into())
        .collect())
}

/// Computes the key chain of `tokens[0..n_tokens]` split into chunks of `chunk` tokens for
/// (`ns`, `model`, layers `layer_first..=layer_last`): the same keys every engine computes for the
/// same prefix. Writes `ceil(n_tokens / chunk)` keys to `keys` (capacity `cap`); the count goes to
/// `*n_keys`. `CXLKV_ERR_BUFFER_TOO_SMALL` stores the needed count in `*n_keys`. Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cxlkv_key_chain(
    ns: *const c_char,
    model: *const c_char,
    layer_first: u32,
    layer_last: u32,
    tokens: *const u32,
    n_tokens: usize,
    chunk: usize,
    keys: *mut cxlkv_key,
    cap: usize,
    n_keys: *mut usize,
) -> cxlkv_result {
    guard(|| {
        let chain = ChainArgs::read(ns, model, tokens, n_tokens, chunk, n_keys)?;
        chain.write(
            KeyChain::new(chain.ns, chain.model, layer_first, layer_last),
            keys,
            cap,
            n_keys,
        )
    })
}

/// `cxlkv_key_chain` salted with a tenant's secret `salt[0..salt_len]` (format 3.2): the chain's
/// seed is a keyed BLAKE3 hash under a key derived from the salt (docs/FORMAT.md §6), so only a
/// holder of the salt forms these keys. Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cxlkv_key_chain_salted(
    salt: *const u8,
    salt_len: usize,
    ns: *const c_char,
    model: *const c_char,
    layer_first: u32,
    layer_last: u32,
    tokens: *const u32,
    n_tokens: usize,
    chunk: usize,
    keys: *mut cxlkv_key,
    cap: usize,
    n_keys: *mut usize,
) -> cxlkv_result {
    guard(|| {
        let salt = bytes_in(salt, salt_len, "salt")?;
        let chain = ChainArgs::read(ns, model, tokens, n_tokens, chunk, n_keys)?;
        chain.write(
            KeyChain::salted(salt, chain.ns, chain.model, layer_first, layer_last),
            keys,
            cap,
            n_keys,
        )
    })
}

/// The checked arguments of a key chain call.
struct ChainArgs<'a> {
    ns: &'a str,
    model: &'a str,
    tokens: &'a [u32],
    chunk: usize,
}

impl<'a> ChainArgs<'a> {
    fn read(
        ns: *const c_char,
        model: *const c_char,
        tokens: *const u32,
        n_tokens: usize,
        chunk: usize,
        n_keys: *mut usize,
    ) -> Result<ChainArgs<'a>, cxlkv_result> {
        let ns = cstr(ns, "ns")?;
        let model = cstr(model, "model")?;
        need(n_keys, "n_keys")?;
        if chunk == 0 || n_tokens == 0 {
            return Err(fail(
                CXLKV_ERR_INVALID_ARG,
                "n_tokens and chunk must be positive",
            ));
        }
        let tokens = slice_in(tokens, n_tokens, "tokens")?;
        Ok(ChainArgs {
            ns,
            model,
            tokens,
            chunk,
        })
    }

    /// Writes the chain's keys (or the needed count, with `CXLKV_ERR_BUFFER_TOO_SMALL`).
    fn write(
        &self,
        chain: KeyChain,
        keys: *mut cxlkv_key,
        cap: usize,
        n_keys: *mut usize,
    ) -> Result<(), cxlkv_result> {
        let need = self.tokens.len().div_ceil(self.chunk);
        if need > cap || keys.is_null() {
            put_out(n_keys, need);
            return Err(fail(
                CXLKV_ERR_BUFFER_TOO_SMALL,
                format!("{need} keys needed, room for {cap}"),
            ));
        }
        for (i, k) in chain.keys(self.tokens, self.chunk).iter().enumerate() {
            // SAFETY: i < need ≤ cap, and the caller promises `cap` writable keys at `keys`.
            unsafe { keys.add(i).write_unaligned((*k).into()) };
        }
        put_out(n_keys, need);
        Ok(())
    }
}

/// The key of an opaque name (`bytes[0..len]`, e.g. an engine's own cache-key string), in
/// `*key`. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_key_from_bytes(
    bytes: *const u8,
    len: usize,
    key: *mut cxlkv_key,
) -> cxlkv_result {
    guard(|| {
        need(key, "key")?;
        let b = bytes_in(bytes, len, "bytes")?;
        put_out(key, Key::from_bytes(b).into());
        Ok(())
    })
}

/// The key of an opaque name salted with a tenant's secret `salt[0..salt_len]` (format 3.2; the
/// keyed BLAKE3 hash of `bytes[0..len]`, docs/FORMAT.md §6), in `*key`. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_key_from_bytes_salted(
    salt: *const u8,
    salt_len: usize,
    bytes: *const u8,
    len: usize,
    key: *mut cxlkv_key,
) -> cxlkv_result {
    guard(|| {
        need(key, "key")?;
        let salt = bytes_in(salt, salt_len, "salt")?;
        let b = bytes_in(bytes, len, "bytes")?;
        put_out(key, Key::from_bytes_salted(salt, b).into());
        Ok(())
    })
}
