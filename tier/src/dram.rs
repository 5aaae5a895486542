//! Tier 1: the process-local DRAM cache of promoted hot blocks.
//!
//! A set-associative table of [`Atomic`] entry pointers: a key hashes to one set of `ways`
//! slots. Readers probe the set under an epoch guard and copy the bytes out; writers replace a
//! slot's pointer with a compare-and-swap and hand the replaced entry to crossbeam-epoch, which
//! frees it only after every guard that could have loaded it is gone. So a reader on another thread
//! never touches freed memory, and neither side takes a lock.
//!
//! The cache holds replicas: every block in it also lives in the pool, so dropping an entry (a set
//! full of hotter blocks, a demotion of the pool copy) loses nothing.

use crossbeam_epoch::{self as epoch, Atomic, Owned, Shared};
use cxlkv_runtime::key::Key;
use std::sync::atomic::{AtomicU64, Ordering};

struct Entry {
    key: Key,
    bytes: Box<[u8]>,
    /// Logical time of the last hit, for choosing a victim within the set.
    used: AtomicU64,
}

/// The DRAM cache (module docs).
pub struct DramCache {
    slots: Box<[Atomic<Entry>]>,
    sets: usize,
    ways: usize,
    clock: AtomicU64,
    len: AtomicU64,
}

impl std::fmt::Debug for DramCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DramCache")
            .field("sets", &self.sets)
            .field("ways", &self.ways)
            .field("len", &self.len())
            .finish()
    }
}

/// Ways per set.
pub const WAYS: usize = 8;

impl DramCache {
    /// A cache of about `blocks` entries (rounded up to a power-of-two number of 8-way sets).
    pub fn new(blocks: usize) -> DramCache {
        let sets = blocks.div_ceil(WAYS).max(1).next_power_of_two();
        DramCache {
            slots: (0..sets * WAYS).map(|_| Atomic::null()).collect(),
            sets,
            ways: WAYS,
            clock: AtomicU64::new(0),
            len: AtomicU64::new(0),
        }
    }

    /// Entries the cache can hold.
    pub fn capacity(&self) -> usize {
        self.sets * self.ways
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed) as usize
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn set(&self, key: Key) -> &[Atomic<Entry>] {
        let s = ((key.lo() ^ key.hi()).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize
            & (self.sets - 1);
        &self.slots[s * self.ways..(s + 1) * self.ways]
    }

    /// Copies the cached bytes of `key` into `out` (replacing its contents); false on a miss.
    pub fn get(&self, key: Key, out: &mut Vec<u8>) -> bool {
        let guard = epoch::pin();
        for slot in self.set(key) {
            let p = slot.load(Ordering::Acquire, &guard);
            // SAFETY: `p` was loaded under `guard`; entries are freed only through
            // `defer_destroy` after being unlinked, which waits for every guard pinned before the
            // unlink, so the entry stays allocated while `guard` lives. The Acquire load pairs
            // with the Release CAS that published it, so its fields are initialized.
            if let Some(e) = unsafe { p.as_ref() } {
                if e.key == key {
                    out.clear();
                    out.extend_from_slice(&e.bytes);
                    e.used.store(
                        self.clock.fetch_add(1, Ordering::Relaxed),
                        Ordering::Relaxed,
                    );
                    return true;
                }
            }
        }
        false
    }

    /// True if `key` is cached.
    pub fn contains(&self, key: Key) -> bool {
        let guard = epoch::pin();
        self.set(key).iter().any(|slot| {
            // SAFETY: as in `get`: loaded under a live guard, freed only by deferred destruction.
            unsafe { slot.load(Ordering::Acquire, &guard).as_ref() }.is_some_and(|e| e.key == key)
        })
    }

    /// Caches a copy of `bytes` under `key`, replacing an older copy of the key or, in a full set,
    /// the least recently hit entry. Returns the key it displaced, if any.
    pub fn insert(&self, key: Key, bytes: &[u8]) -> Option<Key> {
        let guard = epoch::pin();
        let mut new = Owned::new(Entry {
            key,
            bytes: bytes.into(),
            used: AtomicU64::new(self.clock.fetch_add(1, Ordering::Relaxed)),
        });
        loop {
            let set = self.set(key);
            // Choose: the key's own slot, else an empty one, else the least recently hit.
            let mut target: Option<(usize, Shared<'_, Entry>)> = None;
            let mut oldest = u64::MAX;
            for (i, slot) in set.iter().enumerate() {
                let p = slot.load(Ordering::Acquire, &guard);
                // SAFETY: as in `get`.
                match unsafe { p.as_ref() } {
                    Some(e) if e.key == key => {
                        target = Some((i, p));
                        break;
                    }
                    None if oldest != 0 || target.is_none() => {
                        target = Some((i, p));
                        oldest = 0;
                    }
                    Some(e) => {
                        let u = e.used.load(Ordering::Relaxed).saturating_add(1);
                        if u < oldest {
                            oldest = u;
                            target = Some((i, p));
                        }
                    }
                    None => {}
                }
            }
            let (i, old) = target.expect("a set has at least one way");
            // Release: the entry's fields before its pointer; pairs with the Acquire loads above.
            match set[i].compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire, &guard) {
                Ok(_) => {
                    // SAFETY: `old` is unlinked by the successful CAS; no new reader can load it,
                    // and readers that did hold a guard that delays the destruction.
                    let displaced = unsafe { old.as_ref() }.map(|e| e.key).filter(|k| *k != key);
                    if old.is_null() {
                        self.len.fetch_add(1, Ordering::Relaxed);
                    } else {
                        // SAFETY: unlinked above and unlinked only once (our CAS won), so it is
                        // destroyed exactly once, after all current guards are dropped.
                        unsafe { guard.defer_destroy(old) };
                    }
                    return displaced;
                }
                Err(e) => new = e.new, // raced with another writer: choose again
            }
        }
    }

    /// Drops the cached copy of `key`; true if there was one.
    pub fn remove(&self, key: Key) -> bool {
        let guard = epoch::pin();
        for slot in self.set(key) {
            loop {
                let p = slot.load(Ordering::Acquire, &guard);
                // SAFETY: as in `get`.
                match unsafe { p.as_ref() } {
                    Some(e) if e.key == key => {
                        if slot
                            .compare_exchange(
                                p,
                                Shared::null(),
                                Ordering::AcqRel,
                                Ordering::Acquire,
                                &guard,
                            )
                            .is_ok()
                        {
                            // SAFETY: unlinked by our CAS (once); destroyed after current guards.
                            unsafe { guard.defer_destroy(p) };
                            self.len.fetch_sub(1, Ordering::Relaxed);
                            return true;
                        }
                    }
                    _ => break,
                }
            }
        }
        false
    }
}

impl Drop for DramCache {
    fn drop(&mut self) {
        // SAFETY: `&mut self` proves no other thread can reach the slots any more, so no guard
        // protects these entries and they can be freed now.
        let guard = unsafe { epoch::unprotected() };
        for slot in self.slots.iter() {
            let p = slot.swap(Shared::null(), Ordering::Relaxed, guard);
            if !p.is_null() {
                // SAFETY: unlinked just above, with exclusive access; freed exactly once.
                drop(unsafe { p.into_owned() });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_replace_remove() {
        let c = DramCache::new(16);
        let mut out = Vec::new();
        assert!(!c.get(Key(1), &mut out));
        c.insert(Key(1), b"one");
        assert!(c.get(Key(1), &mut out) && out == b"one");
        c.insert(Key(1), b"uno");
        assert!(c.get(Key(1), &mut out) && out == b"uno");
        assert_eq!(c.len(), 1);
        assert!(c.remove(Key(1)) && !c.contains(Key(1)) && c.is_empty());
    }

    #[test]
    fn full_set_displaces_least_recently_hit() {
        let c = DramCache::new(1); // one set of WAYS
        for k in 0..WAYS as u128 {
            c.insert(Key(k), &[k as u8]);
        }
        let mut out = Vec::new();
        for k in 1..WAYS as u128 {
            assert!(c.get(Key(k), &mut out));
        }
        assert_eq!(c.insert(Key(100), b"x"), Some(Key(0)));
        assert_eq!(c.len(), WAYS);
    }
}
