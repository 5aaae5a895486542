//! loom models of the lock-free protocols whose orderings matter within one coherence domain, run
//! on the runtime's own code: the seqlock of an index slot (the owner's `write_slot`, the readers'
//! `Pool::read_slot` and `Pool::slot_version`) and the single-producer/single-consumer rings of
//! the NDP queue pairs (`ndp::Ring`, which the client and the device both call). The runtime,
//! built with `--cfg loom`, takes its fences from loom (`src/sync.rs`) and exposes those entry
//! points at memory offsets (`cxlkv_runtime::lockfree`); this file backs [`SharedMemory`] with
//! loom atomics, so loom sees every load, store, swap and fence the protocols make.
//!
//! Each model fails with an ordering it covers weakened in the runtime (docs/COHERENCE.md lists
//! which). loom does not explore load buffering, so the rings' credit direction (`release` and
//! `in_flight`) is beyond it.
//!
//! `publish` and `acquire` order nothing here: the protocols must hold by their own atomics and
//! fences, as on software-coherent memory, where those calls move cache lines. (On
//! hardware-coherent memory they are fences as well, which only removes behaviours.)
//!
//! Run (scripts/test.sh step "loom models"):
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p cxlkv-runtime --test loom_models
//! --release --target-dir target/loom`. Without `--cfg loom` this file is empty.
#![cfg(loom)]

use cxlkv_runtime::format::slot_version;
use cxlkv_runtime::format::Plain;
use cxlkv_runtime::lockfree;
use cxlkv_runtime::mem::{check_range, MemError, Result};
use cxlkv_runtime::{Key, SharedMemory};
use loom::sync::atomic::AtomicU64;
use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::Ordering;

/// Shared memory of `n` 64-bit words, each a loom atomic. Copies move whole words with Relaxed
/// loads and stores (a torn copy shows as words of different writes), so every access must be
/// 8-byte aligned; the protocols' words and the models' entries are.
struct LoomMemory {
    words: Vec<AtomicU64>,
}

impl LoomMemory {
    fn new(n: usize) -> Arc<LoomMemory> {
        Arc::new(LoomMemory {
            words: (0..n).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// The words of `[offset, offset + len)`.
    fn span(&self, offset: u64, len: u64) -> Result<std::ops::Range<usize>> {
        let at = check_range(offset, len, self.size())?;
        if !at.is_multiple_of(8) || !len.is_multiple_of(8) {
            return Err(MemError::Misaligned { offset, align: 8 });
        }
        Ok(at / 8..(at + len as usize) / 8)
    }
}

impl SharedMemory for LoomMemory {
    fn size(&self) -> u64 {
        8 * self.words.len() as u64
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let span = self.span(offset, dst.len() as u64)?;
        for (w, out) in self.words[span].iter().zip(dst.chunks_exact_mut(8)) {
            out.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        Ok(())
    }
    fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let span = self.span(offset, src.len() as u64)?;
        for (w, b) in self.words[span].iter().zip(src.chunks_exact(8)) {
            w.store(u64::from_le_bytes(b.try_into().unwrap()), Ordering::Relaxed);
        }
        Ok(())
    }
    fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<()> {
        for w in &self.words[self.span(offset, len)?] {
            w.store(u64::from_le_bytes([byte; 8]), Ordering::Relaxed);
        }
        Ok(())
    }
    fn load_u64(&self, offset: u64, order: Ordering) -> Result<u64> {
        let i = self.span(offset, 8)?.start;
        Ok(self.words[i].load(order))
    }
    fn store_u64(&self, offset: u64, value: u64, order: Ordering) -> Result<()> {
        let i = self.span(offset, 8)?.start;
        self.words[i].store(value, order);
        Ok(())
    }
    /// With the orderings of `Region`'s swap (AcqRel, Acquire on failure).
    fn compare_exchange_u64(
        &self,
        offset: u64,
        current: u64,
        new: u64,
    ) -> Result<std::result::Result<u64, u64>> {
        let i = self.span(offset, 8)?.start;
        Ok(self.words[i].compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire))
    }
    fn publish(&self, _offset: u64, _len: u64) {}
    fn acquire(&self, _offset: u64, _len: u64) {}
    fn raw_range(&self, offset: u64, len: u64) -> Result<Option<*mut u8>> {
        check_range(offset, len, self.size())?;
        Ok(None)
    }
}

/// The generation of the slot's owner in the seqlock models.
const GENERATION: u64 = 1;

/// One owner rewrites an index slot twice with the real `write_slot` while a reader takes
/// snapshots with the real `Pool::read_slot`: every snapshot it returns is one whole write.
#[test]
fn seqlock_slot_snapshots_are_never_torn() {
    loom::model(|| {
        let mem = LoomMemory::new(4);
        let v0 = slot_version::retag(0, GENERATION);
        mem.store_u64(0, v0, Ordering::Relaxed).unwrap();
        let w = {
            let mem = mem.clone();
            thread::spawn(move || {
                for (key, entry) in [(1, 101), (2, 202)] {
                    let wrote = lockfree::write_slot(&*mem, 0, Key(key), entry, GENERATION);
                    assert_eq!(wrote, Ok(Ok(())), "the slot's owner was fenced");
                }
            })
        };
        for _ in 0..2 {
            if let Some((v, key, entry)) = lockfree::read_slot(&*mem, 0).unwrap() {
                // Each version names exactly one write: v0 = initial, then one per write.
                let want = match v - v0 {
                    0 => (Key(0), 0),
                    2 => (Key(1), 101),
                    4 => (Key(2), 202),
                    d => panic!("impossible version v0 + {d}"),
                };
                assert_eq!(
                    (key, entry),
                    want,
                    "torn snapshot at version v0 + {}",
                    v - v0
                );
            }
        }
        w.join().unwrap();
    });
}

/// The optimistic read: a reader finds an entry with `read_slot`, copies the block it points to,
/// and keeps the copy only if `Pool::slot_version` still shows the version it found. The owner
/// meanwhile unindexes the entry (real `write_slot`, as `unindex`) and then reuses the block.
/// A copy the version check lets through is never of the reused block.
#[test]
fn optimistic_reads_never_keep_a_reused_block() {
    const PAYLOAD: u64 = 32; // one word after the slot stands for the block
    loom::model(|| {
        let mem = LoomMemory::new(5);
        let v0 = slot_version::retag(0, GENERATION);
        mem.store_u64(0, v0, Ordering::Relaxed).unwrap();
        // The put that indexed the block, before the reader starts.
        mem.write(PAYLOAD, &111u64.to_le_bytes()).unwrap();
        lockfree::write_slot(&*mem, 0, Key(7), 1, GENERATION)
            .unwrap()
            .unwrap();
        let w = {
            let mem = mem.clone();
            thread::spawn(move || {
                let wrote = lockfree::write_slot(&*mem, 0, Key(0), 0, GENERATION);
                assert_eq!(wrote, Ok(Ok(())), "the slot's owner was fenced");
                // Reuse of the block: only after its index entry is gone.
                mem.write(PAYLOAD, &222u64.to_le_bytes()).unwrap();
            })
        };
        if let Some((v, key, entry)) = lockfree::read_slot(&*mem, 0).unwrap() {
            if key == Key(7) && entry == 1 {
                let mut copy = [0u8; 8];
                mem.read(PAYLOAD, &mut copy).unwrap();
                if lockfree::slot_version(&*mem, 0).unwrap() == v {
                    assert_eq!(
                        u64::from_le_bytes(copy),
                        111,
                        "kept a copy of the reused block"
                    );
                }
            }
        }
        w.join().unwrap();
    });
}

/// A ring entry of two words written as one value: a copy mixing two entries shows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Entry {
    value: u64,
    check: u64,
}

// SAFETY: `#[repr(C)]`, two u64 fields: no padding, and every bit pattern is valid.
unsafe impl Plain for Entry {}

impl Entry {
    fn of(value: u64) -> Entry {
        Entry {
            value,
            check: !value,
        }
    }
}

/// Ring depth in the model: small, so that the producer fills it and must wait for the consumer.
const DEPTH: u64 = 2;

/// A producer pushes 1, 2, 3 into a two-slot ring with the real `Ring` steps (room check,
/// produce) while the consumer pops with the real steps (tail, read, release): what the consumer
/// gets is every value sent, once, in order, never a slot the producer was rewriting.
#[test]
fn ring_delivers_in_order_without_loss() {
    loom::model(|| {
        // Words: head, tail, then DEPTH slots of two words.
        let mem = LoomMemory::new(2 + 2 * DEPTH as usize);
        let ring = lockfree::ring(0, 8, 16, 16, DEPTH);
        let p = {
            let mem = mem.clone();
            thread::spawn(move || {
                let mut tail = 0;
                let mut sent = 0;
                for v in 1..=3u64 {
                    if ring.in_flight(&*mem, tail).unwrap() >= DEPTH {
                        break;
                    }
                    ring.produce(&*mem, &mut tail, &Entry::of(v)).unwrap();
                    sent = v;
                }
                sent
            })
        };
        let mut head = 0;
        let mut got = Vec::new();
        let mut pop = |got: &mut Vec<Entry>| -> bool {
            let tail = ring.tail(&*mem).unwrap();
            if tail == head {
                return false;
            }
            got.push(ring.read(&*mem, head).unwrap());
            head += 1;
            ring.release(&*mem, head).unwrap();
            true
        };
        for _ in 0..3 {
            pop(&mut got);
        }
        let sent = p.join().unwrap();
        while pop(&mut got) {}
        let want: Vec<Entry> = (1..=sent).map(Entry::of).collect();
        assert_eq!(
            got, want,
            "ring lost, duplicated, reordered or tore an entry"
        );
    });
}
