//! The steps of one host's operations ([`HostRun`]): each turn the routine steps (heartbeat, the
//! held pin's check, the predecessor's liveness, hotlist publish and read), then one operation on
//! a random key (put, delete, get, pin); and the steps that break the routine: the stall past the
//! lease, after which the host resumes as a zombie that must find itself fenced, and the
//! successor's takeover of a crashed or stalled host's partition.
//!
//! Each step tells the [`crate::model::Model`] what it did while it holds the baton; a step that
//! sees an invariant break records the violation and halts the host ([`Halt`]).

use crate::check::{check_hotlist, check_owners, check_read, watch_predecessor};
use crate::ctx::{Ctx, LEASE_NS};
use crate::model::{key_of, payload};
use crate::sync::lock;
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_runtime::hotness::{Access, Hotness};
use cxlkv_runtime::mem::SharedMemory;
use cxlkv_runtime::participant::{participant_dead, AttachOptions, Participant, PinnedBlock};
use cxlkv_runtime::pool::{Pool, PoolError};
use cxlkv_runtime::watch::beat_period_ns;
use std::sync::atomic::Ordering;

/// A host stops here: it recorded a violation, or the run was stopped.
pub(crate) struct Halt;

/// Records a violation, stops the run, and halts the calling host.
pub(crate) fn fail(ctx: &Ctx, s: String) -> Halt {
    ctx.fail(s);
    Halt
}

/// How every simulated host attaches: no heartbeat thread (heartbeats are steps), a partition of
/// its own.
pub(crate) fn attach_options() -> AttachOptions {
    AttachOptions {
        heartbeat: false,
        own_partition: true,
    }
}

/// A claim of partition `p` starts.
pub(crate) fn claim_started(ctx: &Ctx, p: u32) {
    lock(&ctx.model).claims.entry(p).or_default().0 += 1;
}

/// A claim of partition `p` returned; `beat`: the attaching host and the time before its attach
/// (its first heartbeat is no older).
pub(crate) fn claim_done(ctx: &Ctx, p: u32, beat: Option<(usize, u64)>) {
    let mut m = lock(&ctx.model);
    m.claims.entry(p).or_default().1 += 1;
    m.released.insert(p, false);
    if let Some((h, t)) = beat {
        m.beat_at[h] = t;
    }
}

/// A pin a host holds across turns, with the bytes it read when it pinned.
struct HeldPin<'a> {
    pin: PinnedBlock<'a>,
    bytes: Vec<u8>,
    /// The model's epoch when pinned: a stall since ends the pin's guarantee.
    epoch: u64,
    /// Turns left before it is released.
    left: u32,
}

/// One host's operations in a run, and what it holds between them.
pub(crate) struct HostRun<'a> {
    ctx: &'a Ctx,
    h: usize,
    who: String,
    pool: &'a Pool,
    me: &'a Participant,
    rng: SplitMix64,
    hot: Hotness,
    /// Dropped before `adopter` (field order): a pin is released before a detach.
    held: Option<HeldPin<'a>>,
    /// The partition of the host this one succeeds, once taken over.
    adopter: Option<Participant>,
    /// The host this one succeeds, when that host crashes or stalls in this run.
    successor_of: Option<usize>,
    /// Operations run so far.
    op: u32,
    /// This host still owns its partition (not fenced, not taken over).
    owner: bool,
    /// Simulated time just before its last heartbeat (attaching wrote one); its own clocks' readings
    /// at any simulated time are known ([`crate::clock::HostClock`]).
    last_beat: u64,
    /// Some hosts only read (they never scan pins, so nothing but their own publishes moves their
    /// slot's lines to memory).
    reader: bool,
}

impl<'a> HostRun<'a> {
    /// Host `h`'s run as `me`, attached at `attach_time`.
    pub(crate) fn new(
        ctx: &'a Ctx,
        h: usize,
        pool: &'a Pool,
        me: &'a Participant,
        attach_time: u64,
    ) -> HostRun<'a> {
        let mut rng = SplitMix64::new(ctx.seed.wrapping_mul(7919) ^ h as u64);
        let reader = rng.below(3) == 0;
        HostRun {
            ctx,
            h,
            who: format!("host {h}"),
            pool,
            me,
            rng,
            hot: Hotness::new(1 << 40),
            held: None,
            adopter: None,
            successor_of: ctx.crash.filter(|&c| (c + 1) % ctx.hosts.len() == h),
            op: 0,
            owner: true,
            last_beat: attach_time,
            reader,
        }
    }

    /// Records a violation and halts this host.
    fn fail(&self, s: String) -> Halt {
        fail(self.ctx, s)
    }

    /// Runs the host's operations, and for a successor waits for the succession to settle: it
    /// goes on until it has taken over, or the host it succeeds finished without crashing.
    pub(crate) fn operate(&mut self) -> Result<(), Halt> {
        loop {
            if self.ctx.stopped() {
                return Err(Halt);
            }
            // (Also a host that fenced itself: its successor must still take its slot over.)
            if self.ctx.stall == Some((self.h, self.op)) {
                self.stall();
            }
            let settled = match self.successor_of {
                Some(c) => self.succession_settled(c)?,
                None => true,
            };
            if self.op >= self.ctx.ops && settled {
                return Ok(());
            }
            self.op += 1;
            lock(&self.ctx.model).ops += 1;
            self.turn()?;
        }
    }

    /// Takes host `c`'s partition over once `c` crashed and this host's watch found it dead (its
    /// heartbeat stood still for a lease of this host's clock); true when there is nothing left to
    /// wait for (taken over, or `c` finished without crashing).
    fn succession_settled(&mut self, c: usize) -> Result<bool, Halt> {
        let (crashed, done) = {
            let m = lock(&self.ctx.model);
            (m.crashed == Some(c), m.finished[c])
        };
        if crashed && self.adopter.is_none() {
            let dead = participant_dead(self.pool, c as u32)
                .map_err(|e| self.fail(format!("{}: watch of {c}: {e}", self.who)))?;
            if dead {
                self.take_over(c)?;
            }
        }
        Ok(self.adopter.is_some() || (done && !crashed))
    }

    /// True while this host is the successor of crashed host `c` and has not taken it over yet.
    fn awaiting_takeover(&self, c: usize) -> bool {
        self.successor_of == Some(c)
            && self.adopter.is_none()
            && lock(&self.ctx.model).crashed == Some(c)
    }

    /// One turn: the routine steps, then one operation on a random key.
    fn turn(&mut self) -> Result<(), Halt> {
        let prev_beat = self.heartbeat()?;
        self.check_pin(prev_beat)?;
        // Watch the predecessor's heartbeat, as a deployment's successor would: a live host (its
        // last beat, published, within a lease of the watcher's clock) must never look dead.
        if self.owner && self.rng.below(3) == 0 {
            watch_predecessor(self.ctx, self.pool, self.h)
                .map_err(|e| self.fail(format!("{}: liveness read: {e}", self.who)))?;
        }
        // Hotness: publish this host's hotlist now and then, and read another host's.
        if self.owner && self.rng.below(6) == 0 {
            self.publish_hotlist()?;
        }
        if self.rng.below(6) == 0 {
            self.read_hotlist()?;
        }
        let mut choice = self.rng.below(10);
        if self.reader && choice < 4 {
            choice += 4;
        }
        let hosts = self.ctx.hosts.len() as u64;
        let keys = self.ctx.keys as u64;
        // Writes go to this host's own keys, reads to anyone's; but a successor waiting for its
        // watch to find its crashed predecessor dead leaves that host's keys alone, so that its
        // cache still holds the lines it read before the crash, stale, when it takes over (what a
        // recovery that skipped `recovery-read` would trip on).
        let (kh, ki) = if choice < 4 {
            (self.h, self.rng.below(keys) as usize)
        } else {
            let kh = self.rng.below(hosts) as usize;
            let kh = if self.awaiting_takeover(kh) {
                self.h
            } else {
                kh
            };
            (kh, self.rng.below(keys) as usize)
        };
        match choice {
            0..=2 => self.put(kh, ki)?,
            3 => self.delete(kh, ki)?,
            4..=7 => self.get(kh, ki)?,
            _ if self.held.is_some() => return Ok(()),
            _ => self.pin(kh, ki)?,
        }
        let mut m = lock(&self.ctx.model);
        let held = m.pins.values().filter(|&&p| p == self.h as u32).count();
        m.pin_slack.insert(self.h as u32, held);
        if m.violation.is_some() {
            drop(m);
            self.ctx.stop.store(true, Ordering::SeqCst);
            self.ctx.sched.unpark_all();
            return Err(Halt);
        }
        Ok(())
    }

    /// The stall step: stall (beating no more) until the successor's watch found this host dead and
    /// took it over, then resume as a zombie that must find itself fenced: its own clock ran on
    /// through the stall.
    fn stall(&mut self) {
        let (ctx, h, who) = (self.ctx, self.h, &self.who);
        {
            let mut m = lock(&ctx.model);
            m.crashed = Some(h);
            m.zombie = Some(h);
            m.epoch += 1;
            m.log(format!("{who}: STALL past its lease"));
        }
        while !lock(&ctx.model).taken_over && !ctx.stopped() && !ctx.sched.stuck() {
            ctx.sched.yield_forced(h);
        }
        lock(&ctx.model).log(format!("{who}: resumes after the takeover"));
        self.owner = false;
    }

    /// The takeover step: this host, the designated successor, attaches to crashed host `c`'s
    /// slot, recovering its partition, which must keep every block `c` committed and indexed.
    fn take_over(&mut self, c: usize) -> Result<(), Halt> {
        let (ctx, who) = (self.ctx, &self.who);
        claim_started(ctx, c as u32);
        let p = Participant::attach_slot(self.pool, c as u32, attach_options())
            .map_err(|e| self.fail(format!("{who}: takeover of {c} failed: {e}")))?;
        claim_done(ctx, c as u32, None);
        let mut m = lock(&ctx.model);
        let rec = p.recovery.clone();
        m.log(format!("{who}: takeover of {c}: {rec:?}"));
        // The crashed owner's operation in flight may have unindexed one block per pin it found on
        // a victim, plus one.
        let slack = 1 + m.pin_slack.get(&(c as u32)).copied().unwrap_or(0);
        let before = m.last_live[c];
        if (rec.blocks as usize) + slack < before {
            m.fail(format!(
                "{who}: takeover of {c} recovered {} blocks; {before} were committed and indexed",
                rec.blocks
            ));
        }
        m.taken_over = true;
        self.adopter = Some(p);
        Ok(())
    }

    /// The heartbeat step: beat now and then, and always once a beat period of this host's
    /// monotonic clock passed since the last (as a live host's heartbeat thread would). Returns the
    /// time of the beat before.
    fn heartbeat(&mut self) -> Result<u64, Halt> {
        let now = self.ctx.sched.now();
        let prev_beat = self.last_beat;
        let since = self.ctx.clocks[self.h].mono_between(prev_beat, now);
        if self.rng.below(4) == 0 || since > beat_period_ns(LEASE_NS) {
            self.last_beat = now;
            match self.me.beat() {
                Ok(()) => lock(&self.ctx.model).beat_at[self.h] = now,
                Err(PoolError::Fenced { .. })
                    if !self.owner || self.ctx.own_lease_lapsed(self.h, prev_beat) =>
                {
                    if self.owner {
                        lock(&self.ctx.model)
                            .log(format!("{}: own lease lapsed; fenced itself", self.who));
                        self.owner = false;
                    }
                }
                Err(e) => return Err(self.fail(format!("{}: beat: {e}", self.who))),
            }
        }
        Ok(prev_beat)
    }

    /// The held-pin step: a pinned block must not have been reused while the pin's lease is live
    /// (this host's heartbeat, last beaten at `prev_beat`, fresh). Releases the pin after its last
    /// turn.
    fn check_pin(&mut self, prev_beat: u64) -> Result<(), Halt> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let who = &self.who;
        let loc = held.pin.info().location;
        let off = self.pool.partition_offset(loc.partition).expect("valid")
            + self.pool.superblock().payloads_off
            + u64::from(loc.block) * self.pool.block_size();
        self.ctx.hosts[self.h].acquire(off, held.pin.len());
        let mut now = vec![0u8; held.pin.len() as usize];
        held.pin
            .read(0, &mut now)
            .map_err(|e| self.fail(format!("{who}: pinned read: {e}")))?;
        let epoch = lock(&self.ctx.model).epoch;
        if epoch == held.epoch
            && self.ctx.within_every_lease(prev_beat)
            && self.owner
            && now != held.bytes
        {
            return Err(self.fail(format!(
                "{who}: pinned block {loc:?} was reused while pinned"
            )));
        }
        if held.left > 0 {
            self.held = Some(HeldPin {
                left: held.left - 1,
                ..held
            });
        } else {
            lock(&self.ctx.model).pins.remove(&self.h);
        }
        Ok(())
    }

    /// The hotlist publish step: the model keeps every list published, and marks the publish in
    /// flight meanwhile.
    fn publish_hotlist(&mut self) -> Result<(), Halt> {
        let (ctx, h) = (self.ctx, self.h);
        let list = self.hot.hotlist();
        lock(&ctx.model).hl_busy[h] = true;
        let r = self.hot.publish(self.me);
        let mut m = lock(&ctx.model);
        m.hl_busy[h] = false;
        match r {
            Ok(()) => m.hotlists[h].push(list),
            Err(PoolError::Fenced { .. }) if ctx.own_lease_lapsed(h, self.last_beat) => {
                self.owner = false
            }
            Err(e) => {
                drop(m);
                return Err(self.fail(format!("{}: hotlist publish: {e}", self.who)));
            }
        }
        Ok(())
    }

    /// The hotlist read step: read a random other host's hotlist.
    fn read_hotlist(&mut self) -> Result<(), Halt> {
        let q = self.rng.below(self.ctx.hosts.len() as u64) as usize;
        if q != self.h {
            check_hotlist(self.ctx, self.pool, self.h, q)
                .map_err(|e| self.fail(format!("{}: hotlist read: {e}", self.who)))?;
        }
        Ok(())
    }

    /// A new version for a write of key `(kh, ki)`, recorded as started.
    fn start_version(&self, kh: usize, ki: usize) -> u64 {
        let mut m = lock(&self.ctx.model);
        m.next_version += 1;
        let v = m.next_version;
        m.started.insert((kh, ki), v);
        v
    }

    /// The last committed version of key `(kh, ki)` and whether it was a delete.
    fn committed(&self, kh: usize, ki: usize) -> (u64, bool) {
        lock(&self.ctx.model)
            .committed
            .get(&(kh, ki))
            .copied()
            .unwrap_or((0, false))
    }

    /// The put step: it commits only while this host owns its partition; a fenced put is
    /// expected once the partition was taken over or this host's lease lapsed.
    fn put(&mut self, kh: usize, ki: usize) -> Result<(), Halt> {
        let (ctx, h, who) = (self.ctx, self.h, &self.who);
        let v = self.start_version(kh, ki);
        match self.me.put(key_of(kh, ki), &payload(kh, ki, v)) {
            Ok(_) if !self.owner => {
                return Err(self.fail(format!(
                    "{who}: put ({kh},{ki}) committed after its partition was taken over"
                )));
            }
            Err(PoolError::Fenced { .. })
                if !self.owner || ctx.own_lease_lapsed(h, self.last_beat) =>
            {
                self.owner = false;
                lock(&ctx.model).log(format!("{who}: put ({kh},{ki}) fenced"));
            }
            Ok(_) => {
                let mut m = lock(&ctx.model);
                m.committed.insert((kh, ki), (v, false));
                m.last_live[h] = self.me.live_blocks();
                m.log(format!("{who}: put ({kh},{ki}) v{v}"));
            }
            Err(PoolError::PartitionFull(_)) => {
                let mut m = lock(&ctx.model);
                m.last_live[h] = self.me.live_blocks();
                m.log(format!("{who}: put ({kh},{ki}) full"));
            }
            Err(e) => return Err(self.fail(format!("{who}: put ({kh},{ki}) v{v}: {e}"))),
        }
        Ok(())
    }

    /// The delete step: committed (as a version of its own) under the same rule as a put.
    fn delete(&mut self, kh: usize, ki: usize) -> Result<(), Halt> {
        let (ctx, h, who) = (self.ctx, self.h, &self.who);
        let v = self.start_version(kh, ki);
        match self.me.delete(key_of(kh, ki)) {
            Ok(_) if !self.owner => {
                return Err(self.fail(format!(
                    "{who}: delete ({kh},{ki}) ran after its partition was taken over"
                )));
            }
            Err(PoolError::Fenced { .. })
                if !self.owner || ctx.own_lease_lapsed(h, self.last_beat) =>
            {
                self.owner = false;
                lock(&ctx.model).log(format!("{who}: delete ({kh},{ki}) fenced"));
            }
            Ok(found) => {
                let mut m = lock(&ctx.model);
                m.committed.insert((kh, ki), (v, true));
                m.last_live[h] = self.me.live_blocks();
                m.log(format!("{who}: delete ({kh},{ki}) v{v} found={found}"));
            }
            Err(e) => return Err(self.fail(format!("{who}: delete ({kh},{ki}): {e}"))),
        }
        Ok(())
    }

    /// The get step: a miss or a version no older than the one committed before the get.
    fn get(&mut self, kh: usize, ki: usize) -> Result<(), Halt> {
        let lo = self.committed(kh, ki);
        let key = key_of(kh, ki);
        self.hot.record(key, Access::Get);
        match self.me.get(key) {
            Ok(r) => check_read(
                self.ctx,
                &self.who,
                kh,
                ki,
                lo,
                r.as_ref().map(|(b, _)| &b[..]),
            ),
            Err(e) => return Err(self.fail(format!("{}: get ({kh},{ki}): {e}", self.who))),
        }
        Ok(())
    }

    /// The pin step: the pinned bytes are checked as a get's, then held for a few turns (see
    /// [`HostRun::check_pin`]); the model counts the pin against the partition's slack.
    fn pin(&mut self, kh: usize, ki: usize) -> Result<(), Halt> {
        let (ctx, h, me) = (self.ctx, self.h, self.me);
        let who = format!("{} (pin)", self.who);
        let lo = self.committed(kh, ki);
        let key = key_of(kh, ki);
        self.hot.record(key, Access::Pin);
        match me.pin(key) {
            Ok(Some(pin)) => {
                let mut bytes = vec![0u8; pin.len() as usize];
                pin.read(0, &mut bytes)
                    .map_err(|e| self.fail(format!("{}: pinned read: {e}", self.who)))?;
                check_read(ctx, &who, kh, ki, lo, Some(&bytes));
                let epoch = {
                    let mut m = lock(&ctx.model);
                    let part = pin.info().location.partition;
                    m.pins.insert(h, part);
                    *m.pin_slack.entry(part).or_default() += 1;
                    m.epoch
                };
                let left = 1 + self.rng.below(4) as u32;
                self.held = Some(HeldPin {
                    pin,
                    bytes,
                    epoch,
                    left,
                });
            }
            Ok(None) => check_read(ctx, &who, kh, ki, lo, None),
            Err(PoolError::PinTableFull(_)) => {}
            Err(PoolError::Fenced { .. })
                if !self.owner || ctx.own_lease_lapsed(h, self.last_beat) =>
            {
                self.owner = false
            }
            Err(e) => return Err(self.fail(format!("{}: pin ({kh},{ki}): {e}", self.who))),
        }
        Ok(())
    }

    /// The end of the operations: drop the pin held, record the blocks this host's partitions
    /// hold indexed, wait (parked) until every host is done, then read every live owner's keys
    /// through this host's own (possibly stale) cache. Returns the partition taken over, with the
    /// host it was taken from, and whether this host still owns its own.
    pub(crate) fn finish(mut self) -> Result<(Option<(Participant, usize)>, bool), Halt> {
        let (ctx, h) = (self.ctx, self.h);
        self.held = None;
        {
            let mut m = lock(&ctx.model);
            if self.owner {
                m.live_blocks.insert(h, self.me.live_blocks());
            }
            if let (Some(a), Some(c)) = (&self.adopter, self.successor_of) {
                m.live_blocks.insert(c, a.live_blocks());
            }
            m.done_ops[h] = true;
        }
        ctx.sched.unpark_all();
        loop {
            if ctx.stopped() {
                return Err(Halt);
            }
            if lock(&ctx.model).done_ops.iter().all(|&d| d) {
                break;
            }
            // Off the schedule until another host is done (the hosts at work share the clock); a
            // host planned to crash crashes here if it has not yet.
            ctx.hosts[h].crash_if_planned();
            ctx.sched.park(h);
            let _ = ctx.hosts[h].load_u64(0, Ordering::Relaxed);
        }
        check_owners(ctx, &self.who, self.pool);
        Ok((self.adopter.take().zip(self.successor_of), self.owner))
    }
}
