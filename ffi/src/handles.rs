//! The registry of live handles. Every handle the library gives out is a `Box` turned into a raw
//! pointer and recorded here with its kind; every call looks its handle up before touching it, so
//! a NULL, released or foreign pointer, or a handle of another type, is refused with
//! `CXLKV_ERR_INVALID_HANDLE` instead of being dereferenced.
//!
//! Ownership: `register` gives the box to the registry, `unregister` (the release functions) takes
//! it back exactly once, `borrow` lends it for the length of one call. A released address that the
//! allocator hands out again for a new handle of the same kind is the one misuse this cannot catch.

use crate::errors::cxlkv_result::{self, CXLKV_ERR_INVALID_HANDLE};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The type of a registered handle.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Pool,
    Participant,
    Pinned,
    Reservation,
    Device,
}

fn registry() -> MutexGuard<'static, BTreeMap<usize, Kind>> {
    static LIVE: OnceLock<Mutex<BTreeMap<usize, Kind>>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Hands `b` to the registry as a handle of `kind`; the pointer goes to the caller.
pub(crate) fn register<T>(b: Box<T>, kind: Kind) -> *mut T {
    let p = Box::into_raw(b);
    registry().insert(p as usize, kind);
    p
}

/// Removes a handle from the registry and takes ownership back.
pub(crate) fn unregister<T>(p: *mut T, kind: Kind) -> Result<Box<T>, cxlkv_result> {
    let mut reg = registry();
    match reg.get(&(p as usize)) {
        Some(&k) if k == kind => {
            reg.remove(&(p as usize));
            // SAFETY: `p` was produced by Box::into_raw in `register` with this kind and has not
            // been unregistered since (it was still in the registry), so we own it exactly once.
            Ok(unsafe { Box::from_raw(p) })
        }
        _ => Err(CXLKV_ERR_INVALID_HANDLE),
    }
}

/// Borrows a live handle of `kind`. The registry lock is held only for the check: a handle must
/// not be released by one thread while another uses it (documented per function in the header).
pub(crate) fn borrow<'a, T>(p: *const T, kind: Kind) -> Result<&'a T, cxlkv_result> {
    if p.is_null() {
        return Err(CXLKV_ERR_INVALID_HANDLE);
    }
    match registry().get(&(p as usize)) {
        // SAFETY: the address is a live handle of this kind (registered by `register`, not yet
        // unregistered), so it points to a valid, initialized T owned by the registry.
        Some(&k) if k == kind => Ok(unsafe { &*p }),
        _ => Err(CXLKV_ERR_INVALID_HANDLE),
    }
}
