//! The participant handle and the state behind it: the options of attaching, the counters it
//! publishes, what attaching recovered, and the owner-private state of its partition (free blocks,
//! eviction order, block to index slot), which lives in private memory and is rebuilt from the
//! index whenever a partition changes hands.

use super::beat::OwnLease;
use crate::format::counters;
use crate::policy::EvictionPolicy;
use crate::pool::Pool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

/// Options of [`Participant::attach`].
#[derive(Clone, Debug)]
pub struct AttachOptions {
    /// Run a heartbeat thread (disable only in tests that simulate a hung participant).
    pub heartbeat: bool,
    /// Try to own a partition (false: a read-only participant that can get and pin).
    pub own_partition: bool,
}

impl Default for AttachOptions {
    fn default() -> Self {
        AttachOptions {
            heartbeat: true,
            own_partition: true,
        }
    }
}

/// Counters of one participant, as published in its slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParticipantStats {
    /// Successful puts.
    pub puts: u64,
    /// Gets that found the key.
    pub hits: u64,
    /// Gets that did not.
    pub misses: u64,
    /// Optimistic reads retried.
    pub retries: u64,
    /// Blocks evicted to make room.
    pub evictions: u64,
    /// Blocks deleted.
    pub deletes: u64,
    /// Pins taken.
    pub pins: u64,
    /// Payload bytes written by puts.
    pub bytes_in: u64,
    /// Payload bytes copied out by gets that hit.
    pub bytes_out: u64,
    /// Device requests answered by the host because the device was unavailable or unsupported.
    pub fallbacks: u64,
    /// Pins refused because the pin table was full.
    pub pin_full: u64,
}

impl ParticipantStats {
    pub(crate) fn from_array(a: [u64; counters::COUNT as usize]) -> Self {
        ParticipantStats {
            puts: a[0],
            hits: a[1],
            misses: a[2],
            retries: a[3],
            evictions: a[4],
            deletes: a[5],
            pins: a[6],
            bytes_in: a[7],
            bytes_out: a[8],
            fallbacks: a[9],
            pin_full: a[10],
        }
    }

    /// The counters as (name, value) pairs in [`counters::NAMES`] order.
    pub fn named(&self) -> [(&'static str, u64); counters::COUNT as usize] {
        let v = [
            self.puts,
            self.hits,
            self.misses,
            self.retries,
            self.evictions,
            self.deletes,
            self.pins,
            self.bytes_in,
            self.bytes_out,
            self.fallbacks,
            self.pin_full,
        ];
        std::array::from_fn(|i| (counters::NAMES[i], v[i]))
    }
}

/// Owner-private state of a partition: free blocks, eviction order, block → index slot.
pub(super) struct OwnerState {
    pub(super) partition: u32,
    pub(super) free: Vec<u32>,
    /// Blocks removed from the index but still pinned by a reader: reused once unpinned.
    pub(super) deferred: Vec<(u32, u64)>,
    /// For each block: (index slot, seq) while indexed.
    pub(super) indexed: Vec<Option<(u32, u64)>>,
    /// Blocks indexed (the `Some`s of `indexed`), published as `partition::LIVE`.
    pub(super) live: u64,
    pub(super) policy: Box<dyn EvictionPolicy>,
    pub(super) next_seq: u64,
    /// Multi-block objects: manifest block → its parts' (block, seq). Parts stay out of the
    /// eviction policy; the object is evicted, replaced and deleted as a unit with its manifest.
    pub(super) objects: HashMap<u32, Vec<(u32, u64)>>,
}

/// The further partitions a participant holds, each through an extra slot.
#[derive(Default)]
pub(super) struct Holdings {
    pub(super) extra: Vec<Arc<Participant>>,
    /// No further claim before this instant (the last attempt found nothing to claim).
    pub(super) retry_at: Option<std::time::Instant>,
}

/// A participant attached to a pool. Detaches (releasing its slot and partition, keeping every
/// block) when dropped.
pub struct Participant {
    pub(super) pool: Pool,
    pub(super) id: u32,
    pub(super) token: u64,
    pub(super) generation: u64,
    pub(super) owner_word: u64,
    pub(super) owner: Option<Mutex<OwnerState>>,
    pub(super) counters: [AtomicU64; counters::COUNT as usize],
    /// Pin-table entries in use, one bit each (64 to a word).
    pub(super) pin_used: Mutex<Vec<u64>>,
    /// Its heartbeat and own lease (shared with the heartbeat thread), and whether it is fenced.
    pub(super) lease: Arc<OwnLease>,
    /// The pool is software-coherent: a participant whose own lease lapsed fences itself.
    pub(super) self_fencing: bool,
    pub(super) heartbeat: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
    /// What attaching found and did (takeover, repaired slots), for reports.
    pub recovery: Recovery,
    /// The tenant it attached as (its salt's derived key stays in private memory).
    pub(super) tenant: Option<crate::tenant::Tenant>,
    /// Further partitions held through extra slots ([`super::holdings`]).
    pub(super) holdings: Mutex<Holdings>,
    /// Claims further partitions when its own is full (false: an extra, or an assigned slot).
    pub(super) grows: bool,
}

/// What attaching did to take a partition into ownership.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Partition owned, if any.
    pub partition: Option<u32>,
    /// The participant whose partition was taken over because it was dead.
    pub took_over_from: Option<u32>,
    /// Live blocks found in the partition.
    pub blocks: u64,
    /// Index slots left mid-update by a crashed owner and repaired.
    pub repaired_slots: u64,
    /// Index entries dropped because their block did not validate.
    pub dropped_entries: u64,
    /// Index slots quarantined: left mid-update by a former owner (now or at an earlier takeover).
    pub quarantined_slots: u64,
    /// Blocks quarantined: claimed for writing by a former owner and never committed.
    pub quarantined_blocks: u64,
}

impl Participant {
    /// This participant's slot number (its host id).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Generation of this participant's slot (bumped on every claim).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The partition this participant owns through its own slot, if any (further ones it claimed
    /// as it filled: [`Participant::partitions`]).
    pub fn partition(&self) -> Option<u32> {
        self.recovery.partition
    }

    /// The pool, as a handle that reads as this participant's tenant.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The tenant this participant attached as (`None`: tenant-less, the pool's public space).
    pub fn tenant(&self) -> Option<&crate::tenant::Tenant> {
        self.tenant.as_ref()
    }

    /// This participant's tenant id (0: none).
    pub fn tenant_id(&self) -> u32 {
        self.pool.tenant
    }

    /// Adds `n` to counter `c`, published in this participant's slot.
    pub(super) fn count(&self, c: u64, n: u64) {
        let v = self.counters[c as usize].fetch_add(n, Ordering::Relaxed) + n;
        let off = self.pool.slot_off(self.id) + self.pool.slot_layout().counter(c);
        // Published for `cxlkv pool stat`; only this participant writes the word.
        let _ = self.pool.mem().store_u64(off, v, Ordering::Relaxed);
    }

    /// Counts `n` device requests that the host answered itself because the device was
    /// unavailable or did not support them (published as `fallbacks` in this participant's slot;
    /// called by the layers that run NDP requests on a participant's behalf).
    pub fn count_fallbacks(&self, n: u64) {
        self.count(counters::FALLBACKS, n);
    }

    /// This participant's counters.
    pub fn stats(&self) -> ParticipantStats {
        ParticipantStats::from_array(std::array::from_fn(|i| {
            self.counters[i].load(Ordering::Relaxed)
        }))
    }

    /// Number of blocks indexed in this participant's own partition (not its further ones).
    pub fn live_blocks(&self) -> usize {
        self.owner.as_ref().map_or(0, |m| {
            m.lock()
                .unwrap_or_else(|e| e.into_inner())
                .indexed
                .iter()
                .filter(|e| e.is_some())
                .count()
        })
    }
}
