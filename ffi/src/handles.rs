//! The registry of live handles. Every handle the library gives out is an `Arc` whose address
//! goes to the caller and whose reference is recorded here with its kind; every call looks its
//! handle up before touching it, so a NULL, released or foreign pointer, or a handle of another
//! type, is refused with `CXLKV_ERR_INVALID_HANDLE` instead of being dereferenced.
//!
//! Ownership (after rustls-ffi's `Arc`-backed handles):
//! - `register` moves the object into an `Arc`; the registry holds that reference.
//! - `borrow` clones the registry's reference for one call. The call owns it, so the object lives
//!   until the call returns even if another thread releases the handle meanwhile.
//! - `unregister` (the release functions) takes the registry's reference out, exactly once: later
//!   lookups fail, calls already inside keep theirs, and the object is dropped when the last
//!   reference goes, by whichever thread drops it (the releasing one, or the last call to return).
//! - `take` is `unregister` for a release that consumes the object (a pin released, a reservation
//!   committed or aborted): it waits for the calls still inside to return, then hands the object
//!   back by value.
//!
//! No pointer is ever turned back into a reference: a call reaches the object only through the
//! reference the registry lent it, and the type check is `Arc::downcast`, so this module has no
//! `unsafe`. A released address that the allocator hands out again for a new handle of the same
//! kind is the one misuse this cannot catch.

use crate::errors::cxlkv_result::{self, CXLKV_ERR_INVALID_HANDLE};
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// The type of a registered handle.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Pool,
    Participant,
    Pinned,
    Reservation,
    Device,
}

/// A live handle: its kind and the registry's reference to its object.
struct Entry {
    kind: Kind,
    object: Arc<dyn Any + Send + Sync>,
}

impl Entry {
    /// Whether this is a handle of `kind` whose object is a `T`.
    fn is<T: Any>(&self, kind: Kind) -> bool {
        self.kind == kind && self.object.is::<T>()
    }
}

/// The live handles by address. Held only to look up, insert or remove: never across a call's
/// body, and never while an object is dropped.
fn registry() -> MutexGuard<'static, BTreeMap<usize, Entry>> {
    static LIVE: OnceLock<Mutex<BTreeMap<usize, Entry>>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Moves `b` into a registered handle of `kind`; its address goes to the caller.
pub(crate) fn register<T: Any + Send + Sync>(b: Box<T>, kind: Kind) -> *mut T {
    let object: Arc<T> = Arc::from(b);
    let p = Arc::as_ptr(&object).cast_mut();
    registry().insert(p as usize, Entry { kind, object });
    p
}

/// Lends a live handle of `kind` to one call: the returned reference keeps the object alive until
/// the call drops it, whatever other threads release meanwhile.
pub(crate) fn borrow<T: Any + Send + Sync>(
    p: *const T,
    kind: Kind,
) -> Result<Arc<T>, cxlkv_result> {
    let object = match registry().get(&(p as usize)) {
        Some(e) if e.kind == kind => e.object.clone(),
        _ => return Err(CXLKV_ERR_INVALID_HANDLE),
    };
    // The type check: a kind has one type, so this fails only for a mistyped `borrow` call.
    object.downcast().map_err(|_| CXLKV_ERR_INVALID_HANDLE)
}

/// Takes a handle out of the registry: calls that start after this fail with
/// `CXLKV_ERR_INVALID_HANDLE`. Returns the registry's reference; dropping it frees the object
/// unless calls are still inside, in which case the last of them to return frees it.
pub(crate) fn unregister<T: Any + Send + Sync>(
    p: *mut T,
    kind: Kind,
) -> Result<Arc<T>, cxlkv_result> {
    let entry = {
        let mut reg = registry();
        match reg.get(&(p as usize)) {
            Some(e) if e.is::<T>(kind) => reg.remove(&(p as usize)),
            _ => None,
        }
    };
    let entry = entry.ok_or(CXLKV_ERR_INVALID_HANDLE)?;
    entry
        .object
        .downcast()
        .map_err(|_| CXLKV_ERR_INVALID_HANDLE)
}

/// Takes a handle out of the registry, waits until no call is inside it any more, and returns its
/// object by value. No new call can reach it once it is unregistered, so the wait ends when the
/// calls already inside return. Only for handle types no other object keeps a reference to.
pub(crate) fn take<T: Any + Send + Sync>(p: *mut T, kind: Kind) -> Result<T, cxlkv_result> {
    let mut object = unregister(p, kind)?;
    let mut waited = 0u32;
    loop {
        match Arc::try_unwrap(object) {
            Ok(t) => return Ok(t),
            Err(shared) => object = shared,
        }
        // Calls are short: yield a few times, then sleep between checks so a slow one costs no CPU.
        if waited < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
        waited = waited.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::thread;

    /// An object that counts its drops.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counted() -> (*mut Counted, Arc<AtomicUsize>) {
        let drops = Arc::new(AtomicUsize::new(0));
        let p = register(Box::new(Counted(drops.clone())), Kind::Pinned);
        (p, drops)
    }

    #[test]
    fn a_call_in_flight_keeps_a_released_handle_alive() {
        let (p, drops) = counted();
        let call = borrow(p, Kind::Pinned).unwrap();
        drop(unregister(p, Kind::Pinned).unwrap());
        assert_eq!(drops.load(Ordering::SeqCst), 0, "freed under the call");
        assert_eq!(
            borrow(p, Kind::Pinned).err(),
            Some(CXLKV_ERR_INVALID_HANDLE)
        );
        drop(call);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "freed when the last call returned"
        );
    }

    #[test]
    fn released_foreign_and_mistyped_handles_are_refused() {
        let (p, drops) = counted();
        assert_eq!(
            borrow(p, Kind::Device).err(),
            Some(CXLKV_ERR_INVALID_HANDLE)
        );
        assert_eq!(
            borrow(p.cast::<u64>(), Kind::Pinned).err(),
            Some(CXLKV_ERR_INVALID_HANDLE),
            "the right kind with another type"
        );
        assert_eq!(
            unregister(p, Kind::Reservation).err(),
            Some(CXLKV_ERR_INVALID_HANDLE)
        );
        assert_eq!(
            borrow(std::ptr::null::<Counted>(), Kind::Pinned).err(),
            Some(CXLKV_ERR_INVALID_HANDLE)
        );
        let local = Counted(Arc::new(AtomicUsize::new(0)));
        assert_eq!(
            borrow(&local as *const Counted, Kind::Pinned).err(),
            Some(CXLKV_ERR_INVALID_HANDLE)
        );
        drop(unregister(p, Kind::Pinned).unwrap());
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(
            unregister(p, Kind::Pinned).err(),
            Some(CXLKV_ERR_INVALID_HANDLE),
            "released twice"
        );
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn take_waits_for_the_calls_inside() {
        let (p, drops) = counted();
        let addr = p as usize;
        let returned = Arc::new(AtomicBool::new(false));
        let (inside, entered) = mpsc::channel();
        let call = {
            let returned = returned.clone();
            thread::spawn(move || {
                let me = borrow(addr as *const Counted, Kind::Pinned).unwrap();
                inside.send(()).unwrap();
                thread::sleep(Duration::from_millis(50));
                returned.store(true, Ordering::SeqCst);
                drop(me);
            })
        };
        entered.recv().unwrap();
        let object = take(p, Kind::Pinned).unwrap();
        assert!(
            returned.load(Ordering::SeqCst),
            "took it while a call was inside"
        );
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(object);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        call.join().unwrap();
    }
}
