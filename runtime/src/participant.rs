//! Participants: the processes (or hosts) attached to a pool.
//!
//! Attaching claims a slot in the participant table (its "host id") and, when one is free or its
//! owner is dead, a data partition. The participant alone writes its slot (heartbeat, counters,
//! pins) and its partition (allocator, index, blocks): there is one writer per cache line, and no
//! cross-host atomic is needed on the data path. The owner's allocator and eviction order live in
//! private memory and are rebuilt from the index when a partition changes hands.
//!
//! Crash model: a participant may die at any instruction. Its heartbeat then goes stale; after the
//! lease, the next participant that attaches takes its partition over by bumping the partition's
//! generation, repairs any index slot left mid-update, and keeps every committed block readable.

use crate::coherence::{self, Site};
use crate::format::{
    self, counters, decode_entry, encode_entry, partition, pin, read_plain, slot, BlockHeader,
    Codec, ENTRY_EMPTY, ENTRY_TOMBSTONE, INDEX_SLOT_SIZE, PINS_PER_PARTICIPANT, PIN_SIZE,
};
use crate::key::Key;
use crate::policy::{EvictionPolicy, Lru};
use crate::pool::{now_ns, BlockInfo, Location, Pool, PoolError, Probe, Result, SliceBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

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
        }
    }
}

/// Owner-private state of a partition: free blocks, eviction order, block → index slot.
struct OwnerState {
    partition: u32,
    free: Vec<u32>,
    /// Blocks removed from the index but still pinned by a reader: reused once unpinned.
    deferred: Vec<(u32, u64)>,
    /// For each block: (index slot, seq) while indexed.
    indexed: Vec<Option<(u32, u64)>>,
    policy: Box<dyn EvictionPolicy>,
    next_seq: u64,
}

/// A participant attached to a pool. Detaches (releasing its slot and partition, keeping every
/// block) when dropped.
pub struct Participant {
    pool: Pool,
    id: u32,
    token: u64,
    generation: u64,
    owner_word: u64,
    owner: Option<Mutex<OwnerState>>,
    counters: [AtomicU64; counters::COUNT as usize],
    pin_used: Mutex<u64>,
    fenced: Arc<AtomicBool>,
    /// Time (`now_ns`) of the last heartbeat this participant wrote.
    last_beat: Arc<AtomicU64>,
    /// The pool is software-coherent: a participant whose own lease lapsed fences itself.
    self_fencing: bool,
    heartbeat: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
    /// What attaching found and did (takeover, repaired slots), for reports.
    pub recovery: Recovery,
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
}

fn new_token(id: u32) -> u64 {
    let k = Key::from_bytes(
        &[
            now_ns().to_le_bytes(),
            u64::from(std::process::id()).to_le_bytes(),
            u64::from(id).to_le_bytes(),
        ]
        .concat(),
    );
    k.lo() | 1
}

impl Participant {
    /// Attaches to `pool`: claims a participant slot (a free one, or one whose holder is dead) and,
    /// unless asked not to, a partition (a free one, or one whose owner is dead).
    pub fn attach(pool: &Pool, opts: AttachOptions) -> Result<Participant> {
        let sb = *pool.superblock();
        let mem = pool.mem();
        let mut claimed = None;
        for i in 0..sb.participants {
            let off = pool.slot_off(i) + slot::TOKEN;
            // Pairs with the publish of the slot by its claimer (SlotWrite).
            coherence::acquire(mem, Site::LivenessRead, pool.slot_off(i), 64);
            let cur = mem.load_u64(off, Ordering::Acquire)?;
            if cur != 0 && !participant_dead(pool, i)? {
                continue;
            }
            let token = new_token(i);
            if mem.compare_exchange_u64(off, cur, token)?.is_ok() {
                claimed = Some((i, token));
                break;
            }
        }
        let (id, token) = claimed.ok_or(PoolError::NoFreeParticipant(sb.participants))?;
        Self::init_slot(pool, id, token, opts, None)
    }

    /// Attaches as participant `slot` without a compare-and-swap: the mode for hosts that share no
    /// hardware coherence (a software-coherent pool), where an operator assigns each host its slot.
    /// The slot must be free or its holder dead (lease expired); the participant then owns
    /// partition `slot % partitions` if that is free, orphaned or its own — a dead host's partition
    /// is taken over by the one successor the operator designates by attaching to its slot.
    pub fn attach_slot(pool: &Pool, slot_id: u32, opts: AttachOptions) -> Result<Participant> {
        let sb = *pool.superblock();
        if slot_id >= sb.participants {
            return Err(PoolError::BadConfig(format!(
                "slot {slot_id} of {} participants",
                sb.participants
            )));
        }
        let mem = pool.mem();
        // Pairs with the publish of the slot by its previous holder (SlotWrite, HeartbeatWrite).
        coherence::acquire(mem, Site::LivenessRead, pool.slot_off(slot_id), 64);
        let off = pool.slot_off(slot_id) + slot::TOKEN;
        if mem.load_u64(off, Ordering::Acquire)? != 0 && !participant_dead(pool, slot_id)? {
            return Err(PoolError::BadConfig(format!(
                "slot {slot_id} is held by a live participant"
            )));
        }
        let token = new_token(slot_id);
        mem.store_u64(off, token, Ordering::Relaxed)?;
        Self::init_slot(pool, slot_id, token, opts, Some(slot_id % sb.partitions))
    }

    /// Initializes claimed slot `id` and claims a partition (`fixed`: exactly that one, no CAS).
    fn init_slot(
        pool: &Pool,
        id: u32,
        token: u64,
        opts: AttachOptions,
        fixed: Option<u32>,
    ) -> Result<Participant> {
        let mem = pool.mem();
        let base = pool.slot_off(id);
        // Wrapping: the word is shared memory and may hold anything (a corrupt u64::MAX panicked).
        let generation = mem
            .load_u64(base + slot::GENERATION, Ordering::Relaxed)?
            .wrapping_add(1);
        mem.store_u64(base + slot::GENERATION, generation, Ordering::Relaxed)?;
        mem.store_u64(
            base + slot::PID,
            u64::from(std::process::id()),
            Ordering::Relaxed,
        )?;
        mem.store_u64(base + slot::PARTITION, 0, Ordering::Relaxed)?;
        for c in 0..counters::COUNT {
            mem.store_u64(base + slot::COUNTERS + 8 * c, 0, Ordering::Relaxed)?;
        }
        for p in 0..PINS_PER_PARTICIPANT {
            mem.store_u64(
                base + slot::PINS + p * PIN_SIZE + pin::SEQ,
                0,
                Ordering::Relaxed,
            )?;
        }
        // Heartbeat last, Release: a reader that sees it fresh sees the slot initialized.
        mem.store_u64(base + slot::HEARTBEAT, pool.now_ns(), Ordering::Release)?;
        // Pairs with the LivenessRead and PinScanRead acquires of other participants.
        coherence::publish(mem, Site::SlotWrite, base, format::PARTICIPANT_SLOT_SIZE);

        let mut me = Participant {
            pool: pool.clone(),
            id,
            token,
            generation,
            owner_word: 0,
            owner: None,
            counters: Default::default(),
            pin_used: Mutex::new(0),
            fenced: Arc::new(AtomicBool::new(false)),
            last_beat: Arc::new(AtomicU64::new(pool.now_ns())),
            self_fencing: format::CoherenceMode::from_code(pool.superblock().coherence)
                == Some(format::CoherenceMode::Software),
            heartbeat: None,
            recovery: Recovery::default(),
        };
        if opts.own_partition {
            let claimed = match fixed {
                Some(p) => me.claim_fixed_partition(p)?,
                None => me.claim_partition()?,
            };
            if let Some((p, word, prev_owner)) = claimed {
                me.owner_word = word;
                let (state, mut rec) = recover_partition(pool, p, word)?;
                rec.took_over_from = prev_owner;
                me.recovery = rec;
                me.owner = Some(Mutex::new(state));
            }
        }
        if opts.heartbeat {
            me.heartbeat = Some(spawn_heartbeat(&me));
        }
        Ok(me)
    }

    /// Claims partition `p` with plain stores (see [`Participant::attach_slot`]): only the host the
    /// operator assigned to this slot ever claims it, so no other host races for the owner word.
    fn claim_fixed_partition(&self, p: u32) -> Result<Option<(u32, u64, Option<u32>)>> {
        let pool = &self.pool;
        let mem = pool.mem();
        let sb = pool.superblock();
        let my_slot = pool.slot_off(self.id);
        let off = pool.partition_off(p) + partition::OWNER;
        // Pairs with the OwnerWrite publish of the previous owner.
        coherence::acquire(mem, Site::OwnerRead, off, 8);
        let word = mem.load_u64(off, Ordering::Acquire)?;
        let holder = (word & 0xffff_ffff) as u32;
        let mut prev = None;
        if holder != 0 {
            let q = holder - 1;
            if q < sb.participants && q != self.id && !orphaned(pool, q, p)? {
                mem.store_u64(my_slot + slot::PARTITION, 0, Ordering::SeqCst)?;
                return Ok(None);
            }
            prev = Some(q);
        }
        mem.store_u64(
            my_slot + slot::PARTITION,
            u64::from(p) + 1,
            Ordering::SeqCst,
        )?;
        // Pairs with the LivenessRead acquire in `orphaned` of other hosts.
        coherence::publish(mem, Site::SlotWrite, my_slot + slot::PARTITION, 8);
        let gen = (word >> 32).wrapping_add(1) & 0xffff_ffff;
        let new = (gen << 32) | u64::from(self.id + 1);
        mem.store_u64(off, new, Ordering::SeqCst)?;
        // Pairs with the OwnerRead acquire of a fenced former owner (`check_fence`).
        coherence::publish(mem, Site::OwnerWrite, off, 8);
        Ok(Some((p, new, prev)))
    }

    /// Claims a free or orphaned partition. Returns (partition, new owner word, previous live owner
    /// that was found dead).
    fn claim_partition(&self) -> Result<Option<(u32, u64, Option<u32>)>> {
        let pool = &self.pool;
        let mem = pool.mem();
        let sb = pool.superblock();
        let my_slot = pool.slot_off(self.id);
        for p in 0..sb.partitions {
            let off = pool.partition_off(p) + partition::OWNER;
            coherence::acquire(mem, Site::OwnerRead, off, 8);
            let word = mem.load_u64(off, Ordering::Acquire)?;
            let holder = (word & 0xffff_ffff) as u32;
            let mut prev = None;
            if holder != 0 {
                let q = holder - 1;
                if q >= sb.participants {
                    // Corrupt owner word: the partition is orphaned.
                } else if q != self.id && !orphaned(pool, q, p)? {
                    // (A partition naming our own slot belonged to the dead holder we replaced.)
                    continue;
                } else {
                    prev = Some(q);
                }
            }
            // Announce the intent first so that nobody judges the partition orphaned between our
            // claim and our slot saying so. Pairs with the load in `orphaned`.
            mem.store_u64(
                my_slot + slot::PARTITION,
                u64::from(p) + 1,
                Ordering::SeqCst,
            )?;
            coherence::publish(mem, Site::SlotWrite, my_slot + slot::PARTITION, 8);
            let gen = (word >> 32).wrapping_add(1) & 0xffff_ffff;
            let new = (gen << 32) | u64::from(self.id + 1);
            if mem.compare_exchange_u64(off, word, new)?.is_ok() {
                coherence::publish(mem, Site::OwnerWrite, off, 8);
                return Ok(Some((p, new, prev)));
            }
        }
        mem.store_u64(my_slot + slot::PARTITION, 0, Ordering::SeqCst)?;
        Ok(None)
    }

    /// This participant's slot number (its host id).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Generation of this participant's slot (bumped on every claim).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The partition this participant owns, if any.
    pub fn partition(&self) -> Option<u32> {
        self.recovery.partition
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    fn count(&self, c: u64, n: u64) {
        let v = self.counters[c as usize].fetch_add(n, Ordering::Relaxed) + n;
        let off = self.pool.slot_off(self.id) + slot::COUNTERS + 8 * c;
        // Published for `cxlkv pool stat`; only this participant writes the word.
        let _ = self.pool.mem().store_u64(off, v, Ordering::Relaxed);
    }

    /// This participant's counters.
    pub fn stats(&self) -> ParticipantStats {
        ParticipantStats::from_array(std::array::from_fn(|i| {
            self.counters[i].load(Ordering::Relaxed)
        }))
    }

    /// On a software-coherent pool, true (and fenced for good) once this participant's own lease
    /// has lapsed: a successor may have taken its slot and partition over, and without cross-host
    /// coherence every further write to either could undo the successor's (two writers of one
    /// cache line). A live participant's heartbeat thread never lets this happen.
    fn lease_lost(&self) -> bool {
        if self.fenced.load(Ordering::Relaxed) {
            return true;
        }
        let lapsed = self.self_fencing
            && self
                .pool
                .now_ns()
                .saturating_sub(self.last_beat.load(Ordering::Relaxed))
                > self.pool.superblock().lease_ns;
        if lapsed {
            self.fenced.store(true, Ordering::Relaxed);
        }
        lapsed
    }

    /// True when this participant would write nothing more to shared memory on a
    /// software-coherent pool: it fenced itself, or its own lease lapsed (it is presumed dead, see
    /// `lease_lost`). The simulator uses it to know whether a detach releases the partition.
    pub fn presumed_dead(&self) -> bool {
        self.self_fencing && self.lease_lost()
    }

    fn fenced_error(&self) -> PoolError {
        PoolError::Fenced {
            partition: self.partition().unwrap_or(0),
            generation: (self.owner_word >> 32) as u32,
        }
    }

    fn owner(&self) -> Result<MutexGuard<'_, OwnerState>> {
        let m = self.owner.as_ref().ok_or(PoolError::NoPartition {
            participant: self.id,
        })?;
        let st = m.lock().unwrap_or_else(|e| e.into_inner());
        if self.self_fencing && self.lease_lost() {
            return Err(self.fenced_error());
        }
        self.check_fence(st.partition)?;
        Ok(st)
    }

    fn check_fence(&self, p: u32) -> Result<()> {
        let off = self.pool.partition_off(p) + partition::OWNER;
        // Pairs with the OwnerWrite publish of a successor that took the partition over.
        coherence::acquire(self.pool.mem(), Site::OwnerRead, off, 8);
        let word = self.pool.mem().load_u64(off, Ordering::Acquire)?;
        if word != self.owner_word || self.fenced.load(Ordering::Relaxed) {
            self.fenced.store(true, Ordering::Relaxed);
            return Err(PoolError::Fenced {
                partition: p,
                generation: (word >> 32) as u32,
            });
        }
        Ok(())
    }

    /// Stores `payload` under `key` in this participant's partition (replacing an older block of
    /// the same key there), evicting least recently used unpinned blocks when the partition is full.
    pub fn put(&self, key: Key, payload: &[u8]) -> Result<Location> {
        self.put_with_codec(key, Codec::Raw, payload)
    }

    /// Stores a typed KV block (K and V `[kv_heads][tokens][head_dim]` of `shape.dtype`) under
    /// `key`; the key bounds are computed here so scorers can prune the block.
    pub fn put_kv(
        &self,
        key: Key,
        shape: &crate::kv::KvShape,
        k: &[u8],
        v: &[u8],
    ) -> Result<Location> {
        let payload = crate::kv::encode(shape, k, v)?;
        self.put_with_codec(key, Codec::KvV1, &payload)
    }

    pub(crate) fn put_with_codec(
        &self,
        key: Key,
        codec: Codec,
        payload: &[u8],
    ) -> Result<Location> {
        let cap = self.pool.block_size();
        if payload.len() as u64 > cap {
            return Err(PoolError::PayloadTooLarge {
                len: payload.len() as u64,
                capacity: cap,
            });
        }
        let mut st = self.owner()?;
        let block = self.allocate(&mut st)?;
        let p = st.partition;
        let off = self.pool.payload_off(p, block);
        // Checksummed from the private source, so the copy below never has to be read back.
        let crc = format::crc32c(payload);
        // The payload reaches memory before the header and index entry that announce it
        // (`finish_commit`); on software-coherent memory it is streamed there with non-temporal
        // stores, so no write-back pass follows. Pairs with the PayloadRead acquires of readers.
        if let Err(e) = coherence::write_published(self.pool.mem(), Site::BlockWrite, off, payload)
        {
            st.free.push(block);
            return Err(e.into());
        }
        crash_point("put:payload");
        self.finish_commit(&mut st, key, block, codec, payload.len() as u64, crc, true)
    }

    /// Reserves a block for `len` bytes under `key`: the caller writes the payload in place (zero
    /// copy) and then commits. Dropping the reservation without committing frees the block.
    pub fn reserve(&self, key: Key, len: u64, codec: Codec) -> Result<Reservation<'_>> {
        let cap = self.pool.block_size();
        if len > cap {
            return Err(PoolError::PayloadTooLarge { len, capacity: cap });
        }
        let mut st = self.owner()?;
        let block = self.allocate(&mut st)?;
        Ok(Reservation {
            participant: self,
            partition: st.partition,
            block,
            key,
            len,
            codec,
            done: false,
        })
    }

    /// Takes a free block, reusing deferred ones whose pins are gone, else evicting.
    fn allocate(&self, st: &mut OwnerState) -> Result<u32> {
        if let Some(b) = st.free.pop() {
            return Ok(b);
        }
        if !st.deferred.is_empty() {
            let pins = self.live_pins(st.partition)?;
            if let Some(i) = st
                .deferred
                .iter()
                .position(|(b, s)| !pins.contains(&(*b, *s)))
            {
                return Ok(st.deferred.swap_remove(i).0);
            }
        }
        let pins = self.live_pins(st.partition)?;
        let mut skipped = Vec::new();
        let result = loop {
            let Some(victim) = st.policy.victim() else {
                break Err(PoolError::PartitionFull(st.partition));
            };
            let (slot, seq) = st.indexed[victim as usize].expect("policy tracks indexed blocks");
            if pins.contains(&(victim, seq)) {
                skipped.push(victim);
                continue;
            }
            self.unindex(st, victim, slot)?;
            // The Dekker pair with `pin`: we removed the entry, then look for pins; a reader
            // stores its pin, then re-checks the entry. SeqCst on both sides means at least one of
            // us sees the other.
            fence(Ordering::SeqCst);
            self.count(counters::EVICTIONS, 1);
            if self.pinned_now(st.partition, victim, seq)? {
                st.deferred.push((victim, seq));
                continue;
            }
            break Ok(victim);
        };
        for b in skipped {
            st.policy.insert(b);
        }
        result
    }

    /// Writes header and index entry for a filled block; the last step of put and commit.
    /// `payload_published`: the payload is already in memory (a put's `write_published`); else
    /// (an in-place reservation) it is published here.
    #[allow(clippy::too_many_arguments)]
    fn finish_commit(
        &self,
        st: &mut OwnerState,
        key: Key,
        block: u32,
        codec: Codec,
        len: u64,
        crc: u32,
        payload_published: bool,
    ) -> Result<Location> {
        let pool = &self.pool;
        let mem = pool.mem();
        let p = st.partition;
        if let Err(e) = self.check_fence(p) {
            st.free.push(block);
            return Err(e);
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        mem.store_u64(
            pool.partition_off(p) + partition::NEXT_SEQ,
            st.next_seq,
            Ordering::Relaxed,
        )?;
        let mut h = BlockHeader {
            key_lo: key.lo(),
            key_hi: key.hi(),
            seq,
            len,
            codec: codec as u32,
            payload_crc: crc,
            owner_generation: self.owner_word >> 32,
            ..Default::default()
        };
        h.header_crc = h.compute_crc();
        let hoff = pool.header_off(p, block);
        format::write_plain(mem, hoff, &h)?;
        // Payload and header reach memory before the index entry that points at them. Pairs with
        // the acquires in `Pool::checked_header` and the payload read.
        if !payload_published {
            coherence::publish(mem, Site::BlockWrite, pool.payload_off(p, block), len);
        }
        coherence::publish(mem, Site::BlockWrite, hoff, format::BLOCK_HEADER_SIZE);
        crash_point("put:header");

        // Replace an existing entry for the key, else insert at the first free slot on its path.
        let n = pool.superblock().index_slots;
        let mask = n - 1;
        let home = pool.home_slot(key);
        let mut target = None;
        let mut old = None;
        for i in 0..n {
            let s = (home + i) & mask;
            let (_, k, entry) = self.own_slot(p, s)?;
            if entry == ENTRY_EMPTY {
                target.get_or_insert(s);
                break;
            }
            if entry == ENTRY_TOMBSTONE {
                target.get_or_insert(s);
                continue;
            }
            if k == key {
                target = Some(s);
                old = decode_entry(entry);
                break;
            }
        }
        let Some(s) = target else {
            st.free.push(block);
            return Err(PoolError::PartitionFull(p));
        };
        write_slot(pool, p, s, key, encode_entry(block, seq))?;
        crash_point("put:indexed");
        st.indexed[block as usize] = Some((s, seq));
        st.policy.insert(block);
        if let Some((old_block, old_seq)) = old {
            if (old_block as usize) < st.indexed.len() && old_block != block {
                st.indexed[old_block as usize] = None;
                st.policy.remove(old_block);
                fence(Ordering::SeqCst); // Dekker pair with `pin`, as in `allocate`.
                if self.pinned_now(p, old_block, old_seq)? {
                    st.deferred.push((old_block, old_seq));
                } else {
                    st.free.push(old_block);
                }
            }
        }
        self.count(counters::PUTS, 1);
        Ok(Location {
            partition: p,
            slot: s,
            version: 0,
            block,
            seq,
        })
    }

    /// The owner's view of one of its slots (no concurrent writer, so no seqlock loop).
    fn own_slot(&self, p: u32, s: u32) -> Result<(u64, Key, u64)> {
        let off = self.pool.index_slot_off(p, s);
        let m = self.pool.mem();
        Ok((
            m.load_u64(off, Ordering::Relaxed)?,
            Key::from_parts(
                m.load_u64(off + 8, Ordering::Relaxed)?,
                m.load_u64(off + 16, Ordering::Relaxed)?,
            ),
            m.load_u64(off + 24, Ordering::Relaxed)?,
        ))
    }

    /// Removes `block`'s index entry at `slot`.
    fn unindex(&self, st: &mut OwnerState, block: u32, slot: u32) -> Result<()> {
        // Backward-shift deletion (Knuth's Algorithm R), so that eviction churn leaves no
        // tombstones behind and probe paths stay short. Invariant kept at every step for readers:
        // a live key stays findable from its home slot. The hole is a tombstone while the shift
        // runs (probes continue past it); an entry moves to the hole only if the hole lies on its
        // probe path, and it is written there before its old slot becomes the new hole. A reader
        // that raced a move may see a miss and retry; it never sees wrong data (the seqlock).
        let p = st.partition;
        let mask = self.pool.superblock().index_slots - 1;
        write_slot(&self.pool, p, slot, Key(0), ENTRY_TOMBSTONE)?;
        st.indexed[block as usize] = None;
        st.policy.remove(block);
        let mut hole = slot;
        let mut j = slot;
        loop {
            j = (j + 1) & mask;
            if j == slot {
                break; // wrapped around a table with no empty slot
            }
            let (_, key, entry) = self.own_slot(p, j)?;
            if entry == ENTRY_EMPTY {
                break;
            }
            let Some((b, seq)) = decode_entry(entry) else {
                continue;
            };
            let home = self.pool.home_slot(key);
            // Keys whose home lies cyclically in (hole, j] do not pass through the hole.
            let home_after_hole = if hole <= j {
                hole < home && home <= j
            } else {
                home > hole || home <= j
            };
            if home_after_hole {
                continue;
            }
            write_slot(&self.pool, p, hole, key, entry)?;
            if let Some(e) = st.indexed.get_mut(b as usize) {
                *e = Some((hole, seq));
            }
            write_slot(&self.pool, p, j, Key(0), ENTRY_TOMBSTONE)?;
            hole = j;
        }
        // Every entry between the hole and the empty slot that ended the scan has its home after
        // the hole, so no probe path needs the hole: it becomes empty.
        if j != slot {
            write_slot(&self.pool, p, hole, Key(0), ENTRY_EMPTY)?;
        }
        Ok(())
    }

    /// Deletes `key` from this participant's partition. `Ok(false)` if it is nowhere;
    /// [`PoolError::NotOwner`] if it lives in another participant's partition.
    pub fn delete(&self, key: Key) -> Result<bool> {
        let mut st = self.owner()?;
        let p = st.partition;
        match self.pool.probe(p, key)? {
            Probe::Found(loc) => {
                self.unindex(&mut st, loc.block, loc.slot)?;
                fence(Ordering::SeqCst); // Dekker pair with `pin`, as in `allocate`.
                if self.pinned_now(p, loc.block, loc.seq)? {
                    st.deferred.push((loc.block, loc.seq));
                } else {
                    st.free.push(loc.block);
                }
                self.count(counters::DELETES, 1);
                Ok(true)
            }
            Probe::Absent | Probe::Busy => match self.pool.locate(key)? {
                Some(loc) => Err(PoolError::NotOwner {
                    key,
                    partition: loc.partition,
                }),
                None => Ok(false),
            },
        }
    }

    /// Copies the block under `key` into a new vector (any partition); `None` on a miss.
    pub fn get(&self, key: Key) -> Result<Option<(Vec<u8>, BlockInfo)>> {
        let mut v = Vec::new();
        let mut retries = 0;
        let r = self.pool.read_validated(key, &mut v, &mut retries);
        self.after_get(&r, retries);
        Ok(r?.map(|i| (v, i)))
    }

    /// Copies the block under `key` into `buf`; `None` on a miss; [`PoolError::BufferTooSmall`]
    /// with the needed size if `buf` is too small.
    pub fn get_into(&self, key: Key, buf: &mut [u8]) -> Result<Option<BlockInfo>> {
        let mut retries = 0;
        let r = self
            .pool
            .read_validated(key, &mut SliceBuf(buf), &mut retries);
        self.after_get(&r, retries);
        r
    }

    fn after_get(&self, r: &Result<Option<BlockInfo>>, retries: u64) {
        if retries > 0 {
            self.count(counters::RETRIES, retries);
        }
        match r {
            Ok(Some(info)) => {
                self.count(counters::HITS, 1);
                if let (Some(m), true) = (
                    &self.owner,
                    Some(info.location.partition) == self.partition(),
                ) {
                    let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
                    if st.indexed[info.location.block as usize].map(|(_, s)| s)
                        == Some(info.location.seq)
                    {
                        st.policy.touch(info.location.block);
                    }
                }
            }
            Ok(None) => self.count(counters::MISSES, 1),
            Err(_) => {}
        }
    }

    /// How many leading keys of `chain` are present.
    pub fn lookup_prefix(&self, chain: &[Key]) -> Result<usize> {
        self.pool.lookup_prefix(chain)
    }

    /// Pins the block under `key`: while the pin is held (and this participant is alive) its
    /// owner will not reuse the block, so the returned view stays valid for zero-copy reads.
    pub fn pin(&self, key: Key) -> Result<Option<PinnedBlock<'_>>> {
        if self.self_fencing && self.lease_lost() {
            return Err(self.fenced_error());
        }
        let entry = self.take_pin_entry()?;
        match self.pin_in(entry, key) {
            Ok(Some(pinned)) => {
                self.count(counters::PINS, 1);
                Ok(Some(pinned))
            }
            other => {
                self.unpin(entry);
                if matches!(other, Ok(None)) {
                    self.count(counters::MISSES, 1);
                }
                other
            }
        }
    }

    /// Pins `key` using pin entry `entry` of our slot; the caller frees the entry on `None`/error.
    fn pin_in(&self, entry: u64, key: Key) -> Result<Option<PinnedBlock<'_>>> {
        let pool = &self.pool;
        let mem = pool.mem();
        for _ in 0..crate::pool::READ_RETRIES {
            let Some(loc) = pool.locate(key)? else {
                return Ok(None);
            };
            self.record_pin(entry, &loc)?;
            let Some(h) = pool.checked_header(key, &loc)? else {
                continue;
            };
            // Validate the payload once; after this, the pin keeps it in place.
            let poff = pool.payload_off(loc.partition, loc.block);
            // Pairs with the BlockWrite publish of the payload.
            coherence::acquire(mem, Site::PayloadRead, poff, h.len);
            if crc_of(mem, poff, h.len)? != h.payload_crc
                || pool.slot_version(loc.partition, loc.slot)? != loc.version
            {
                continue;
            }
            let codec = Codec::from_code(h.codec).expect("checked header");
            return Ok(Some(PinnedBlock {
                participant: self,
                entry,
                info: BlockInfo {
                    len: h.len,
                    codec,
                    location: loc,
                },
                payload_off: poff,
            }));
        }
        Ok(None)
    }

    /// Pins a block found with [`Pool::block_ref`](crate::pool::Pool::block_ref) without
    /// checksumming its payload (for in-place scanners such as the NDP device, which would
    /// otherwise read every byte twice). `None` if the block changed since `r` was taken. While the
    /// returned pin is held the owner will neither reuse nor rewrite the block, so its payload is
    /// immutable and may be read in place.
    pub fn pin_block(&self, r: &crate::pool::BlockRef) -> Result<Option<PinnedBlock<'_>>> {
        if self.self_fencing && self.lease_lost() {
            return Err(self.fenced_error());
        }
        let entry = self.take_pin_entry()?;
        let loc = r.location;
        // Either the owner sees this pin, or we see below that the slot changed.
        let pinned = self
            .record_pin(entry, &loc)
            .and_then(|()| self.pool.still_valid(r));
        match pinned {
            Ok(true) => {
                self.count(counters::PINS, 1);
                let codec = Codec::from_code(r.header.codec).unwrap_or(Codec::Raw);
                Ok(Some(PinnedBlock {
                    participant: self,
                    entry,
                    info: BlockInfo {
                        len: r.header.len,
                        codec,
                        location: loc,
                    },
                    payload_off: r.payload_off,
                }))
            }
            other => {
                self.unpin(entry);
                other.map(|_| None)
            }
        }
    }

    /// Reserves a free entry of this participant's pin table (released by `unpin`).
    fn take_pin_entry(&self) -> Result<u64> {
        let mut used = self.pin_used.lock().unwrap_or_else(|e| e.into_inner());
        let free = (!*used).trailing_zeros() as u64;
        if free >= PINS_PER_PARTICIPANT {
            return Err(PoolError::PinTableFull(PINS_PER_PARTICIPANT));
        }
        *used |= 1 << free;
        Ok(free)
    }

    fn unpin(&self, entry: u64) {
        let off = self.pool.slot_off(self.id) + slot::PINS + entry * PIN_SIZE + pin::SEQ;
        // A fenced participant's slot may belong to a successor now (it cleared our pins).
        if !(self.self_fencing && self.lease_lost()) {
            // Release: our reads of the block happen before the owner may reuse it.
            let _ = self.pool.mem().store_u64(off, 0, Ordering::Release);
            coherence::publish(self.pool.mem(), Site::PinWrite, off, 8);
        }
        *self.pin_used.lock().unwrap_or_else(|e| e.into_inner()) &= !(1 << entry);
    }

    /// (block, seq) pairs of partition `p` pinned by live participants.
    /// Records pin entry `entry` for the block at `loc`, then fences: the Dekker pair with the
    /// owner's fence between unindexing a block and scanning pins (`allocate`, `delete`).
    fn record_pin(&self, entry: u64, loc: &Location) -> Result<()> {
        let mem = self.pool.mem();
        let eoff = self.pool.slot_off(self.id) + slot::PINS + entry * PIN_SIZE;
        let where_ = (u64::from(loc.partition) << 32) | u64::from(loc.block);
        mem.store_u64(eoff + pin::WHERE, where_, Ordering::Relaxed)?;
        mem.store_u64(eoff + pin::SEQ, loc.seq, Ordering::Release)?;
        // Pairs with the owner's PinScanRead acquire before it reuses a block.
        coherence::publish(mem, Site::PinWrite, eoff, PIN_SIZE);
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Calls `visit(block, seq)` for each pin on partition `p` held by a live participant, until
    /// it returns true; returns whether it did.
    fn scan_pins(&self, p: u32, mut visit: impl FnMut(u32, u64) -> bool) -> Result<bool> {
        let pool = &self.pool;
        let mem = pool.mem();
        for q in 0..pool.superblock().participants {
            let base = pool.slot_off(q);
            // Our own slot: we are its only writer, so our cached lines are the truth and need no
            // invalidation (which would also write our dirty heartbeat line back, hiding a missing
            // HeartbeatWrite publish from the simulator).
            if q != self.id {
                // Pairs with the PinWrite publishes of pin holders (and their SlotWrite claims).
                coherence::acquire(mem, Site::PinScanRead, base, format::PARTICIPANT_SLOT_SIZE);
                if mem.load_u64(base + slot::TOKEN, Ordering::Acquire)? == 0
                    || participant_dead(pool, q)?
                {
                    continue;
                }
            }
            for e in 0..PINS_PER_PARTICIPANT {
                let eoff = base + slot::PINS + e * PIN_SIZE;
                let seq = mem.load_u64(eoff + pin::SEQ, Ordering::Acquire)?;
                if seq == 0 {
                    continue;
                }
                let w = mem.load_u64(eoff + pin::WHERE, Ordering::Relaxed)?;
                if (w >> 32) as u32 == p && visit(w as u32, seq) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// (block, seq) pairs of partition `p` pinned by live participants.
    fn live_pins(&self, p: u32) -> Result<std::collections::HashSet<(u32, u64)>> {
        let mut set = std::collections::HashSet::new();
        self.scan_pins(p, |b, s| {
            set.insert((b, s));
            false
        })?;
        Ok(set)
    }

    fn pinned_now(&self, p: u32, block: u32, seq: u64) -> Result<bool> {
        self.scan_pins(p, |b, s| (b, s) == (block, seq))
    }

    /// Writes a fresh heartbeat now (the heartbeat thread does this every quarter lease).
    pub fn beat(&self) -> Result<()> {
        if self.self_fencing && self.lease_lost() {
            return Err(self.fenced_error());
        }
        let off = self.pool.slot_off(self.id) + slot::HEARTBEAT;
        let now = self.pool.now_ns();
        self.last_beat.store(now, Ordering::Relaxed);
        self.pool.mem().store_u64(off, now, Ordering::Release)?;
        // Pairs with the LivenessRead acquire of whoever judges this participant's liveness.
        coherence::publish(self.pool.mem(), Site::HeartbeatWrite, off, 8);
        Ok(())
    }

    /// Number of blocks indexed in this participant's partition.
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

    fn detach_shared(&mut self) {
        if let Some((tx, h)) = self.heartbeat.take() {
            drop(tx);
            let _ = h.join();
        }
        if self.self_fencing && self.lease_lost() {
            // Presumed dead: the slot and partition may be a successor's now; write nothing.
            return;
        }
        let pool = &self.pool;
        let mem = pool.mem();
        let base = pool.slot_off(self.id);
        if let Some(p) = self.partition() {
            // Hand the partition back (generation kept): its blocks stay readable and the next
            // participant to attach adopts them.
            let off = pool.partition_off(p) + partition::OWNER;
            let released = self.owner_word & !0xffff_ffff;
            // Without cross-host coherence the compare-and-swap below compares against this
            // host's copy: refresh it first, so a successor's takeover is not undone. Pairs with
            // the OwnerWrite publish of the successor.
            coherence::acquire(mem, Site::OwnerRead, off, 8);
            let _ = mem.compare_exchange_u64(off, self.owner_word, released);
            coherence::publish(mem, Site::OwnerWrite, off, 8);
        }
        // A participant presumed dead may have lost its slot to a successor with the same id: then
        // nothing in the slot is ours, and clearing its PARTITION word would make the successor's
        // live partition look orphaned to the next attacher (fix: the slot was cleared blindly).
        coherence::acquire(mem, Site::LivenessRead, base, 8);
        if mem.load_u64(base + slot::TOKEN, Ordering::Acquire).ok() != Some(self.token) {
            return;
        }
        for e in 0..PINS_PER_PARTICIPANT {
            let _ = mem.store_u64(
                base + slot::PINS + e * PIN_SIZE + pin::SEQ,
                0,
                Ordering::Relaxed,
            );
        }
        let _ = mem.store_u64(base + slot::PARTITION, 0, Ordering::Relaxed);
        let _ = mem.compare_exchange_u64(base + slot::TOKEN, self.token, 0);
        coherence::publish(mem, Site::SlotWrite, base, format::PARTICIPANT_SLOT_SIZE);
    }
}

impl Drop for Participant {
    fn drop(&mut self) {
        self.detach_shared();
    }
}

pub(crate) fn crc_of(mem: &dyn cxlkv_shm::mem::SharedMemory, off: u64, len: u64) -> Result<u32> {
    // Checksummed through a small private buffer: shared memory is never borrowed as a slice.
    let mut buf = [0u8; 16 << 10];
    let mut crc = format::Crc32c::default();
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        mem.read(off + done, &mut buf[..n])?;
        crc.update(&buf[..n]);
        done += n as u64;
    }
    Ok(crc.finish())
}

/// True when participant `q`'s heartbeat is older than the pool's lease (or it holds no slot).
pub fn participant_dead(pool: &Pool, q: u32) -> Result<bool> {
    let base = pool.slot_off(q);
    let mem = pool.mem();
    // Pairs with the SlotWrite and HeartbeatWrite publishes of participant `q`.
    coherence::acquire(mem, Site::LivenessRead, base, 64);
    if mem.load_u64(base + slot::TOKEN, Ordering::Acquire)? == 0 {
        return Ok(true);
    }
    let hb = mem.load_u64(base + slot::HEARTBEAT, Ordering::Acquire)?;
    Ok(pool.now_ns().saturating_sub(hb) > pool.superblock().lease_ns)
}

/// True when partition `p`, owned by participant `q`, has no live owner: `q` is dead, or its slot
/// has been reclaimed by someone who does not hold `p`.
fn orphaned(pool: &Pool, q: u32, p: u32) -> Result<bool> {
    if participant_dead(pool, q)? {
        return Ok(true);
    }
    let off = pool.slot_off(q) + slot::PARTITION;
    Ok(pool.mem().load_u64(off, Ordering::SeqCst)? != u64::from(p) + 1)
}

/// Test-only crash injection: with the `crash-points` feature, `CXLKV_CRASH_AT=SITE:N` makes the
/// process SIGKILL itself the N-th time it reaches `SITE`, so tests can kill a writer at every step
/// of the write protocol. Without the feature this compiles to nothing.
#[inline(always)]
pub(crate) fn crash_point(site: &'static str) {
    #[cfg(feature = "crash-points")]
    {
        use std::sync::OnceLock;
        static SPEC: OnceLock<Option<(String, u64)>> = OnceLock::new();
        static HITS: AtomicU64 = AtomicU64::new(0);
        let spec = SPEC.get_or_init(|| {
            let v = std::env::var("CXLKV_CRASH_AT").ok()?;
            let (site, n) = v.rsplit_once(':')?;
            Some((site.to_string(), n.parse().ok()?))
        });
        if let Some((s, n)) = spec {
            if s == site && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *n {
                // SAFETY: kill(2) on our own pid with SIGKILL has no memory-safety preconditions.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
        }
    }
    #[cfg(not(feature = "crash-points"))]
    let _ = site;
}

/// Names of the crash points (see `crash_point`), in the order a put reaches them.
pub const CRASH_SITES: [&str; 5] = [
    "put:payload",
    "put:header",
    "slot:odd",
    "slot:fields",
    "put:indexed",
];

/// Seqlock write of one index slot (owner only).
pub(crate) fn write_slot(pool: &Pool, p: u32, s: u32, key: Key, entry: u64) -> Result<()> {
    let off = pool.index_slot_off(p, s);
    let mem = pool.mem();
    let v = mem.load_u64(off, Ordering::Relaxed)?;
    let odd = (v | 1).wrapping_add(if v & 1 == 1 { 2 } else { 0 });
    mem.store_u64(off, odd, Ordering::Relaxed)?;
    // The odd version reaches memory before any field does. Pairs with the IndexRead acquires in
    // `Pool::read_slot` / `Pool::slot_version`.
    coherence::publish(mem, Site::IndexWrite, off, 8);
    crash_point("slot:odd");
    // Orders the odd version before the field stores; pairs with the Acquire fence before a
    // reader's version re-check in `Pool::read_slot` / `Pool::slot_version`.
    fence(Ordering::Release);
    mem.store_u64(off + 8, key.lo(), Ordering::Relaxed)?;
    mem.store_u64(off + 16, key.hi(), Ordering::Relaxed)?;
    mem.store_u64(off + 24, entry, Ordering::Relaxed)?;
    crash_point("slot:fields");
    // Release: fields (and the block they point to) before the even version. Pairs with the
    // Acquire load of the version in `Pool::read_slot`.
    mem.store_u64(off, odd.wrapping_add(1), Ordering::Release)?;
    coherence::publish(mem, Site::IndexWrite, off, INDEX_SLOT_SIZE);
    Ok(())
}

/// Rebuilds owner state for partition `p` from shared memory: repairs slots left mid-update,
/// drops entries whose block does not validate, and frees every unreferenced block.
fn recover_partition(pool: &Pool, p: u32, word: u64) -> Result<(OwnerState, Recovery)> {
    let sb = pool.superblock();
    let mem = pool.mem();
    let nblocks = sb.blocks_per_partition as usize;
    let mut indexed: Vec<Option<(u32, u64)>> = vec![None; nblocks];
    let mut rec = Recovery {
        partition: Some(p),
        ..Default::default()
    };
    // Pairs with the IndexWrite and BlockWrite publishes of the partition's previous owner.
    coherence::acquire(
        mem,
        Site::RecoveryRead,
        pool.partition_off(p),
        sb.payloads_off,
    );
    let mut max_seq = mem.load_u64(
        pool.partition_off(p) + partition::NEXT_SEQ,
        Ordering::Acquire,
    )?;
    if max_seq > format::MAX_SEQ {
        // Corrupt: no index entry can hold such a sequence number (and incrementing it overflowed).
        // Restart above the highest live entry found below; its blocks stay valid.
        max_seq = 0;
    }
    for s in 0..sb.index_slots {
        let off = pool.index_slot_off(p, s);
        let v = mem.load_u64(off, Ordering::Acquire)?;
        let slot: format::IndexSlot = read_plain(mem, off)?;
        let key = Key::from_parts(slot.key_lo, slot.key_hi);
        let mid_update = v & 1 == 1;
        let keep = match decode_entry(slot.entry) {
            Some((b, seq)) if (b as usize) < nblocks && indexed[b as usize].is_none() => {
                let loc = Location {
                    partition: p,
                    slot: s,
                    version: v,
                    block: b,
                    seq,
                };
                match pool.checked_header(key, &loc)? {
                    Some(h)
                        if {
                            // Pairs with the BlockWrite publish of the previous owner.
                            coherence::acquire(
                                mem,
                                Site::RecoveryRead,
                                pool.payload_off(p, b),
                                h.len,
                            );
                            crc_of(mem, pool.payload_off(p, b), h.len)? == h.payload_crc
                        } =>
                    {
                        indexed[b as usize] = Some((s, seq));
                        max_seq = max_seq.max(seq + 1);
                        true
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        let live = decode_entry(slot.entry).is_some();
        if mid_update || (live && !keep) {
            // Either finish the interrupted update as the entry now reads, or drop a bad entry.
            let entry = if keep {
                slot.entry
            } else if slot.entry == ENTRY_EMPTY {
                ENTRY_EMPTY
            } else {
                ENTRY_TOMBSTONE
            };
            if mid_update {
                rec.repaired_slots += 1;
                // Make the version even first so write_slot's odd/even dance stays consistent.
                mem.store_u64(off, v.wrapping_add(1), Ordering::Relaxed)?;
            }
            if live && !keep {
                rec.dropped_entries += 1;
            }
            write_slot(pool, p, s, if keep { key } else { Key(0) }, entry)?;
        }
    }
    // An entry made empty above may have broken no chain: empties are only created when a slot
    // was empty before the crash (entry unchanged) — tombstones keep chains intact otherwise.
    let mut by_seq: Vec<(u64, u32)> = indexed
        .iter()
        .enumerate()
        .filter_map(|(b, e)| e.map(|(_, seq)| (seq, b as u32)))
        .collect();
    by_seq.sort_unstable();
    let mut policy: Box<dyn EvictionPolicy> = Box::new(Lru::new(nblocks));
    for &(_, b) in &by_seq {
        policy.insert(b);
    }
    rec.blocks = by_seq.len() as u64;
    let free = (0..nblocks as u32)
        .rev()
        .filter(|b| indexed[*b as usize].is_none())
        .collect();
    let next_seq = max_seq.max(1);
    mem.store_u64(
        pool.partition_off(p) + partition::NEXT_SEQ,
        next_seq,
        Ordering::Relaxed,
    )?;
    let _ = word;
    Ok((
        OwnerState {
            partition: p,
            free,
            deferred: Vec::new(),
            indexed,
            policy,
            next_seq,
        },
        rec,
    ))
}

fn spawn_heartbeat(me: &Participant) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<()>();
    let pool = me.pool.clone();
    let id = me.id;
    let token = me.token;
    let fenced = me.fenced.clone();
    let last_beat = me.last_beat.clone();
    let watch = me.partition().map(|p| (p, me.owner_word));
    let period = Duration::from_nanos((pool.superblock().lease_ns / 4).max(1_000_000));
    let h = std::thread::Builder::new()
        .name(format!("cxlkv-heartbeat-{id}"))
        .spawn(move || loop {
            match rx.recv_timeout(period) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let mem = pool.mem();
            let base = pool.slot_off(id);
            // Stop beating if our slot was reclaimed (we were presumed dead).
            if mem.load_u64(base + slot::TOKEN, Ordering::Acquire).ok() != Some(token) {
                fenced.store(true, Ordering::Relaxed);
                return;
            }
            let now = pool.now_ns();
            last_beat.store(now, Ordering::Relaxed);
            let _ = mem.store_u64(base + slot::HEARTBEAT, now, Ordering::Release);
            coherence::publish(mem, Site::HeartbeatWrite, base + slot::HEARTBEAT, 8);
            if let Some((p, word)) = watch {
                if mem
                    .load_u64(pool.partition_off(p) + partition::OWNER, Ordering::Acquire)
                    .ok()
                    != Some(word)
                {
                    fenced.store(true, Ordering::Relaxed);
                }
            }
        })
        .expect("spawn heartbeat thread");
    (tx, h)
}

/// A block reserved for an in-place write; see [`Participant::reserve`].
pub struct Reservation<'a> {
    participant: &'a Participant,
    partition: u32,
    block: u32,
    key: Key,
    len: u64,
    codec: Codec,
    done: bool,
}

impl Reservation<'_> {
    /// Payload length reserved.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length reservation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `bytes` at `offset` within the reserved payload.
    pub fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        cxlkv_shm::mem::check_range(offset, bytes.len() as u64, self.len)?;
        let pool = &self.participant.pool;
        pool.mem()
            .write(pool.payload_off(self.partition, self.block) + offset, bytes)?;
        Ok(())
    }

    /// Pool offset of the reserved payload (what an NDP command names as its buffer; docs/ABI.md).
    pub fn payload_offset(&self) -> u64 {
        self.participant
            .pool
            .payload_off(self.partition, self.block)
    }

    /// Address of the reserved payload for in-place writes (`None` on memory without stable
    /// addresses). Valid until commit or drop; only the reserver may write through it.
    pub fn as_mut_ptr(&self) -> Result<Option<*mut u8>> {
        let pool = &self.participant.pool;
        Ok(pool
            .mem()
            .raw_range(pool.payload_off(self.partition, self.block), self.len)?)
    }

    /// Checksums the payload in place and publishes the block under its key.
    pub fn commit(mut self) -> Result<Location> {
        self.done = true;
        let p = self.participant;
        let crc = crc_of(
            p.pool.mem(),
            p.pool.payload_off(self.partition, self.block),
            self.len,
        )?;
        let mut st = p.owner()?;
        p.finish_commit(
            &mut st, self.key, self.block, self.codec, self.len, crc, false,
        )
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Some(m) = &self.participant.owner {
                m.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .free
                    .push(self.block);
            }
        }
    }
}

/// A pinned block: its payload stays in place until this is dropped.
pub struct PinnedBlock<'a> {
    participant: &'a Participant,
    entry: u64,
    info: BlockInfo,
    payload_off: u64,
}

impl PinnedBlock<'_> {
    /// Length, codec and location of the block.
    pub fn info(&self) -> BlockInfo {
        self.info
    }

    /// Payload length.
    pub fn len(&self) -> u64 {
        self.info.len
    }

    /// True for an empty payload.
    pub fn is_empty(&self) -> bool {
        self.info.len == 0
    }

    /// Copies payload bytes at `offset` into `dst`.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        cxlkv_shm::mem::check_range(offset, dst.len() as u64, self.info.len)?;
        Ok(self
            .participant
            .pool
            .mem()
            .read(self.payload_off + offset, dst)?)
    }

    /// Address of the payload for zero-copy readers and DMA registration (`None` on memory without
    /// stable addresses). Valid until the pin is dropped; the memory must only be read.
    pub fn as_ptr(&self) -> Result<Option<*const u8>> {
        Ok(self
            .participant
            .pool
            .mem()
            .raw_range(self.payload_off, self.info.len)?
            .map(|p| p as *const u8))
    }
}

impl Drop for PinnedBlock<'_> {
    fn drop(&mut self) {
        self.participant.unpin(self.entry);
    }
}

/// A pin detached from the borrow of its participant, for language bindings (the C ABI): it must
/// be given back to the same participant with [`Participant::unpin_raw`]. Dropping it without
/// doing so leaks the pin until the participant detaches.
#[derive(Debug)]
pub struct RawPin {
    entry: u64,
    info: BlockInfo,
    payload_off: u64,
}

impl RawPin {
    /// Length, codec and location of the pinned block.
    pub fn info(&self) -> BlockInfo {
        self.info
    }
}

impl PinnedBlock<'_> {
    /// Detaches the pin from its borrow; see [`RawPin`].
    pub fn into_raw(self) -> RawPin {
        let raw = RawPin {
            entry: self.entry,
            info: self.info,
            payload_off: self.payload_off,
        };
        std::mem::forget(self);
        raw
    }
}

/// A reservation detached from the borrow of its participant, for language bindings: finish it
/// with [`Participant::commit_raw`] or [`Participant::abort_raw`] on the same participant.
#[derive(Debug)]
pub struct RawReservation {
    partition: u32,
    block: u32,
    key: Key,
    len: u64,
    codec: Codec,
}

impl RawReservation {
    /// Payload length reserved.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length reservation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Reservation<'_> {
    /// Detaches the reservation from its borrow; see [`RawReservation`].
    pub fn into_raw(mut self) -> RawReservation {
        self.done = true;
        RawReservation {
            partition: self.partition,
            block: self.block,
            key: self.key,
            len: self.len,
            codec: self.codec,
        }
    }
}

impl Participant {
    /// Address of a raw pin's payload (`None` on memory without stable addresses).
    pub fn raw_pin_ptr(&self, pin: &RawPin) -> Result<Option<*const u8>> {
        Ok(self
            .pool
            .mem()
            .raw_range(pin.payload_off, pin.info.len)?
            .map(|p| p as *const u8))
    }

    /// Releases a pin taken with [`PinnedBlock::into_raw`].
    pub fn unpin_raw(&self, pin: RawPin) {
        self.unpin(pin.entry);
    }

    /// Address of a raw reservation's payload, for in-place writes.
    pub fn raw_reservation_ptr(&self, r: &RawReservation) -> Result<Option<*mut u8>> {
        Ok(self
            .pool
            .mem()
            .raw_range(self.pool.payload_off(r.partition, r.block), r.len)?)
    }

    /// Commits a reservation taken with [`Reservation::into_raw`].
    pub fn commit_raw(&self, r: RawReservation) -> Result<Location> {
        Reservation {
            participant: self,
            partition: r.partition,
            block: r.block,
            key: r.key,
            len: r.len,
            codec: r.codec,
            done: false,
        }
        .commit()
    }

    /// Abandons a reservation taken with [`Reservation::into_raw`]; its block is freed.
    pub fn abort_raw(&self, r: RawReservation) {
        drop(Reservation {
            participant: self,
            partition: r.partition,
            block: r.block,
            key: r.key,
            len: r.len,
            codec: r.codec,
            done: false,
        });
    }
}
