//! loom models of the two lock-free protocols whose orderings matter within one coherence domain:
//! the seqlock index slot (participant.rs `write_slot`, pool.rs `read_slot` / `slot_version`) and
//! the single-producer/single-consumer rings of the NDP queues (runtime/src/ndp, head/tail with
//! Acquire/Release).
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p cxlkv-runtime --test
//! loom_models --release`. Without `--cfg loom` this file is empty.
#![allow(unexpected_cfgs)] // `loom` is set by RUSTFLAGS="--cfg loom" for this file only.
#![cfg(loom)]

/// The private `sync` shim: loom's atomics here, std's in the runtime.
mod sync {
    pub use loom::sync::atomic::{fence, AtomicU64, Ordering};
    pub use loom::sync::Arc;
    pub use loom::thread;
}

use sync::{fence, thread, Arc, AtomicU64, Ordering};

/// An index slot: version, key (two words in the pool; one suffices here) and entry.
struct Slot {
    version: AtomicU64,
    key: AtomicU64,
    entry: AtomicU64,
}

/// `write_slot`: odd version (compare-and-swap, AcqRel, as the pool's `compare_exchange_u64`),
/// Release fence, fields, even version (compare-and-swap, AcqRel). The swaps fail only when a
/// successor retagged the slot, which this model (one owner) does not include.
fn write_slot(s: &Slot, key: u64, entry: u64) {
    let v = s.version.load(Ordering::Acquire);
    let odd = v | 1;
    s.version
        .compare_exchange(v, odd, Ordering::AcqRel, Ordering::Acquire)
        .unwrap();
    // Pairs with the reader's Acquire fence before its version re-check.
    fence(Ordering::Release);
    s.key.store(key, Ordering::Relaxed);
    s.entry.store(entry, Ordering::Relaxed);
    // Pairs with the reader's Acquire load of the version.
    s.version
        .compare_exchange(odd, odd + 1, Ordering::AcqRel, Ordering::Acquire)
        .unwrap();
}

/// `read_slot`: one attempt; `Some` only for a consistent snapshot.
fn read_slot(s: &Slot) -> Option<(u64, u64, u64)> {
    let v1 = s.version.load(Ordering::Acquire);
    if v1 & 1 == 1 {
        return None;
    }
    let key = s.key.load(Ordering::Relaxed);
    let entry = s.entry.load(Ordering::Relaxed);
    // Pairs with the writer's Release fence after the odd version.
    fence(Ordering::Acquire);
    let v2 = s.version.load(Ordering::Relaxed);
    (v1 == v2).then_some((v1, key, entry))
}

#[test]
fn seqlock_slot_snapshots_are_never_torn() {
    loom::model(|| {
        let s = Arc::new(Slot {
            version: AtomicU64::new(0),
            key: AtomicU64::new(0),
            entry: AtomicU64::new(0),
        });
        let w = {
            let s = s.clone();
            thread::spawn(move || {
                write_slot(&s, 1, 101);
                write_slot(&s, 2, 202);
            })
        };
        for _ in 0..2 {
            if let Some((v, key, entry)) = read_slot(&s) {
                // Each version names exactly one write: 0 = initial, 2 = first, 4 = second.
                let want = match v {
                    0 => (0, 0),
                    2 => (1, 101),
                    4 => (2, 202),
                    _ => panic!("impossible version {v}"),
                };
                assert_eq!((key, entry), want, "torn snapshot at version {v}");
            }
        }
        w.join().unwrap();
    });
}

const RING: u64 = 2;

/// An SPSC ring of `RING` one-word entries with free-running head and tail.
struct Ring {
    head: AtomicU64,
    tail: AtomicU64,
    slots: [AtomicU64; RING as usize],
}

impl Ring {
    fn push(&self, v: u64) -> bool {
        let tail = self.tail.load(Ordering::Relaxed);
        // Acquire pairs with the consumer's Release store of head: its read of the slot we are
        // about to overwrite happened before.
        let head = self.head.load(Ordering::Acquire);
        if tail - head == RING {
            return false;
        }
        self.slots[(tail % RING) as usize].store(v, Ordering::Relaxed);
        // Release pairs with the consumer's Acquire load of tail.
        self.tail.store(tail + 1, Ordering::Release);
        true
    }

    fn pop(&self) -> Option<u64> {
        let head = self.head.load(Ordering::Relaxed);
        // Pairs with the producer's Release store of tail.
        let tail = self.tail.load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        let v = self.slots[(head % RING) as usize].load(Ordering::Relaxed);
        // Pairs with the producer's Acquire load of head.
        self.head.store(head + 1, Ordering::Release);
        Some(v)
    }
}

#[test]
fn spsc_ring_delivers_in_order_without_loss() {
    loom::model(|| {
        let r = Arc::new(Ring {
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            slots: [AtomicU64::new(0), AtomicU64::new(0)],
        });
        let p = {
            let r = r.clone();
            thread::spawn(move || {
                let mut sent = 0;
                for v in 1..=3u64 {
                    if r.push(v) {
                        sent = v;
                    } else {
                        break;
                    }
                }
                sent
            })
        };
        let mut got = Vec::new();
        for _ in 0..3 {
            if let Some(v) = r.pop() {
                got.push(v);
            }
        }
        let sent = p.join().unwrap();
        while let Some(v) = r.pop() {
            got.push(v);
        }
        assert_eq!(
            got,
            (1..=sent).collect::<Vec<_>>(),
            "ring lost, duplicated or reordered"
        );
    });
}
