//! A participant's life: attaching (claiming a slot, then a partition), the heartbeat that keeps
//! it alive, and detaching, which hands the partition back with every block kept.
//!
//! A slot or partition is reclaimed from a dead holder only: one whose heartbeat counter this pool
//! handle watched stand still for a lease ([`crate::watch`]). Attaching never waits for that: the
//! first attach through a fresh handle finds every holder alive (its watch starts there), and a
//! later attach through the same handle, a lease on, finds the dead ones dead.

use super::beat::OwnLease;
use super::liveness::participant_dead;
use super::state::{AttachOptions, Participant, Recovery};
use crate::coherence::{self, Site};
use crate::format::{self, counters, partition, pin, slot};
use crate::key::Key;
use crate::pool::{now_ns, Pool, PoolError, Result};
use crate::tenant::Tenant;
use crate::watch::beat_period_ns;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// A fresh token for slot `id`: nonzero (zero marks a free slot) and distinct across processes
/// and attaches, so a holder can tell whether its slot was reclaimed.
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
    /// unless asked not to, a partition (a free one, or one whose owner is dead). "Dead" is this
    /// pool handle's judgement (see the module): retry through the same handle to reclaim a holder
    /// that is not yet known dead.
    pub fn attach(pool: &Pool, opts: AttachOptions) -> Result<Participant> {
        Self::attach_claiming(&pool.scoped(0), opts, None)
    }

    /// Attaches to `pool` as `tenant` (format 3.2, [`crate::tenant`]) with default options: the
    /// tenant's declared entry, or on a hardware-coherent pool one registered now with the pool's
    /// default quota ([`PoolError::UnknownTenant`] on a software-coherent pool). The participant
    /// claims only a partition of its tenant or one without live blocks, writes blocks of its
    /// tenant, puts under its tenant's quota, and reads only its tenant's and tenant 0's blocks.
    pub fn attach_as(pool: &Pool, tenant: &Tenant) -> Result<Participant> {
        Self::attach_as_with(pool, tenant, AttachOptions::default())
    }

    /// [`Participant::attach_as`] with options.
    pub fn attach_as_with(
        pool: &Pool,
        tenant: &Tenant,
        opts: AttachOptions,
    ) -> Result<Participant> {
        let id = crate::tenant::resolve(pool, tenant.name())?;
        Self::attach_claiming(&pool.scoped(id), opts, Some(tenant.clone()))
    }

    /// [`Participant::attach_slot`] as `tenant`, which must be declared in the pool (a
    /// software-coherent pool's tenants are declared at create).
    pub fn attach_slot_as(
        pool: &Pool,
        slot_id: u32,
        tenant: &Tenant,
        opts: AttachOptions,
    ) -> Result<Participant> {
        let t = crate::tenant::find(pool, tenant.name())?
            .ok_or_else(|| PoolError::UnknownTenant(tenant.name().to_owned()))?;
        Self::attach_slot_claiming(&pool.scoped(t.id), slot_id, opts, Some(tenant.clone()))
    }

    /// Claims a free (or dead holder's) slot by compare-and-swap and initializes it; `pool` reads
    /// as the participant's tenant.
    fn attach_claiming(
        pool: &Pool,
        opts: AttachOptions,
        tenant: Option<Tenant>,
    ) -> Result<Participant> {
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
        Self::init_slot(pool, id, token, opts, None, tenant)
    }

    /// Attaches as participant `slot` without a compare-and-swap: the mode for hosts that share no
    /// hardware coherence (a software-coherent pool), where an operator assigns each host its slot.
    /// The slot must be free or its holder dead (its heartbeat watched standing still for a lease
    /// through this pool handle); the participant then owns
    /// partition `slot % partitions` if that is free, orphaned or its own — a dead host's partition
    /// is taken over by the one successor the operator designates by attaching to its slot.
    pub fn attach_slot(pool: &Pool, slot_id: u32, opts: AttachOptions) -> Result<Participant> {
        Self::attach_slot_claiming(&pool.scoped(0), slot_id, opts, None)
    }

    fn attach_slot_claiming(
        pool: &Pool,
        slot_id: u32,
        opts: AttachOptions,
        tenant: Option<Tenant>,
    ) -> Result<Participant> {
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
        Self::init_slot(
            pool,
            slot_id,
            token,
            opts,
            Some(slot_id % sb.partitions),
            tenant,
        )
    }

    /// Initializes claimed slot `id` and claims a partition (`assigned`: exactly that one, no CAS).
    /// `pool` reads as the participant's tenant (`tenant`'s id, or 0).
    fn init_slot(
        pool: &Pool,
        id: u32,
        token: u64,
        opts: AttachOptions,
        assigned: Option<u32>,
        tenant: Option<Tenant>,
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
        // Before the first heartbeat (the device reads it for the queues of this slot).
        mem.store_u64(
            base + slot::TENANT,
            u64::from(pool.tenant()),
            Ordering::Relaxed,
        )?;
        let layout = *pool.slot_layout();
        for c in 0..counters::COUNT {
            mem.store_u64(base + layout.counter(c), 0, Ordering::Relaxed)?;
        }
        for p in 0..layout.pins {
            mem.store_u64(base + layout.pin(p) + pin::SEQ, 0, Ordering::Relaxed)?;
        }
        // Heartbeat last, Release: a reader that sees it move sees the slot initialized.
        let lease = Arc::new(OwnLease::start(pool, id)?);
        // Pairs with the LivenessRead and PinScanRead acquires of other participants.
        coherence::publish(mem, Site::SlotWrite, base, layout.size);

        let mut me = Participant {
            pool: pool.clone(),
            id,
            token,
            generation,
            owner_word: 0,
            owner: None,
            counters: Default::default(),
            pin_used: Mutex::new(vec![0; layout.pins.div_ceil(64) as usize]),
            lease,
            self_fencing: format::CoherenceMode::from_code(pool.superblock().coherence)
                == Some(format::CoherenceMode::Software),
            heartbeat: None,
            recovery: Recovery::default(),
            tenant,
            holdings: Default::default(),
            // Only compare-and-swap participants of a hardware-coherent pool claim further
            // partitions (docs/COHERENCE.md).
            grows: assigned.is_none()
                && format::CoherenceMode::from_code(pool.superblock().coherence)
                    == Some(format::CoherenceMode::Hardware),
        };
        if opts.own_partition {
            let owned = match assigned {
                Some(p) => me.claim_assigned_partition(p)?,
                None => me.claim_free_partition()?,
            };
            if let Some((claim, state, mut rec)) = owned {
                me.owner_word = claim.owner_word;
                rec.took_over_from = claim.took_over_from;
                me.recovery = rec;
                me.owner = Some(Mutex::new(state));
            }
        }
        if opts.heartbeat {
            me.heartbeat = Some(spawn_heartbeat(&me));
        }
        Ok(me)
    }

    /// Advances the heartbeat counter now (the heartbeat thread does this every eighth of a
    /// lease). On a software-coherent pool a participant whose own lease lapsed is fenced instead.
    pub fn beat(&self) -> Result<()> {
        if self.self_fencing && self.lease_lost() {
            return Err(self.fenced_error());
        }
        self.lease.beat(&self.pool, self.id)
    }

    fn detach_shared(&mut self) {
        // Keys this process handed to the cross-pod bridge go out before it may exit (bounded).
        crate::crosspod::flush_publishes(crate::crosspod::FLUSH_LIMIT);
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
        let layout = *self.pool.slot_layout();
        for e in 0..layout.pins {
            let _ = mem.store_u64(base + layout.pin(e) + pin::SEQ, 0, Ordering::Relaxed);
        }
        let _ = mem.store_u64(base + slot::PARTITION, 0, Ordering::Relaxed);
        let _ = mem.compare_exchange_u64(base + slot::TOKEN, self.token, 0);
        coherence::publish(mem, Site::SlotWrite, base, layout.size);
    }
}

impl Drop for Participant {
    fn drop(&mut self) {
        self.detach_shared();
    }
}

fn spawn_heartbeat(me: &Participant) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<()>();
    let pool = me.pool.clone();
    let id = me.id;
    let token = me.token;
    let lease = me.lease.clone();
    let self_fencing = me.self_fencing;
    let watch = me.partition().map(|p| (p, me.owner_word));
    let period = Duration::from_nanos(beat_period_ns(pool.superblock().lease_ns));
    let h = std::thread::Builder::new()
        .name(format!("cxlkv-heartbeat-{id}"))
        .spawn(move || loop {
            match rx.recv_timeout(period) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let mem = pool.mem();
            let base = pool.slot_off(id);
            // Stop beating if our slot was reclaimed (we were presumed dead), or, on a
            // software-coherent pool, once our own lease lapsed (this thread was held up for longer
            // than the margin: a successor may take the slot over, and we must not write it).
            if mem.load_u64(base + slot::TOKEN, Ordering::Acquire).ok() != Some(token)
                || (self_fencing && lease.lapsed(&pool))
            {
                lease.fenced.store(true, Ordering::Relaxed);
                return;
            }
            let _ = lease.beat(&pool, id);
            if let Some((p, word)) = watch {
                if mem
                    .load_u64(pool.partition_off(p) + partition::OWNER, Ordering::Acquire)
                    .ok()
                    != Some(word)
                {
                    lease.fenced.store(true, Ordering::Relaxed);
                }
            }
        })
        .expect("spawn heartbeat thread");
    (tx, h)
}

impl Pool {
    /// Attaches a new participant to this pool (see [`crate::participant`]).
    pub fn attach(&self) -> Result<Participant> {
        Participant::attach(self, AttachOptions::default())
    }
}
