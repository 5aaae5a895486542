//! The client's queue pair: [`NdpDevice`] opens the ring of its participant slot, writes commands
//! and rings the doorbell, and collects completions, spinning briefly and
//! then sleeping on the completion futex that the device wakes.
//!
//! Argument and result buffers are staging blocks that the client reserves in its own partition
//! ([`Participant::reserve`]; never committed, so never indexed nor evicted): one per command in
//! flight. A command that timed out keeps its block quarantined until its completion arrives or a
//! new device generation starts (which fails every command it found pending without running it),
//! so a late device can never write into a buffer that was handed to another command.

use crate::coherence::{self, Site};
use crate::format::Codec;
use crate::key::Key;
use crate::ndp::abi::*;
use crate::ndp::client::error::{FallbackReason, NdpError, Result};
use crate::ndp::client::request::{NdpOptions, NdpStats, OwnedRequest};
use crate::ndp::layout::{qpi, reg, DeviceLayout, DEPTH};
use crate::ndp::queue::Ring;
use crate::participant::{Participant, RawReservation};
use crate::pool::Pool;
use crate::sync::{fence, Ordering};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A command in flight, or one already settled on the host.
#[derive(Debug)]
pub struct Ticket(pub(super) u64);

/// A staging block: a command's argument and result buffer.
pub(super) struct Staging {
    /// Held for the life of the client; given back to the partition when the client drops.
    reservation: RawReservation,
    /// Pool offset of the payload.
    pub(super) off: u64,
    /// Tag of the command using it; a timed-out command keeps it until it completes.
    pub(super) owner: Option<u64>,
    /// Device generation that the owning command was submitted to.
    pub(super) generation: u64,
}

/// A command the client waits for: a SCORE_TOPK ticket, or a command run to completion.
pub(super) struct Pending {
    /// The command's tag on the ring.
    pub(super) tag: u64,
    /// The staging block holding its buffers, once submitted.
    pub(super) staging: Option<usize>,
    /// The request, for the host fallback.
    pub(super) req: OwnedRequest,
    /// Where the device writes the result, and how many bytes it may.
    pub(super) result_off: u64,
    pub(super) result_len: u64,
    /// What the device path cost so far.
    pub(super) stats: NdpStats,
    /// When it was submitted (its deadline counts from here).
    pub(super) start: Instant,
    /// Why it runs on the host without having been submitted.
    pub(super) forced: Option<FallbackReason>,
}

impl Pending {
    /// A command without a request to fall back on (NOP, GATHER, raw...), so that [`NdpDevice`]
    /// keeps its completion.
    pub(super) fn bare(tag: u64, start: Instant) -> Pending {
        Pending {
            tag,
            staging: None,
            req: OwnedRequest::empty(),
            result_off: 0,
            result_len: 0,
            stats: NdpStats::default(),
            start,
            forced: None,
        }
    }
}

/// The client of the NDP device, on the queue pair of `participant`'s slot. It owns a share of
/// its participant, whose partition holds the staging blocks.
pub struct NdpDevice {
    pub(super) participant: Arc<Participant>,
    pub(super) pool: Pool,
    pub(super) layout: DeviceLayout,
    pub(super) qp: u32,
    pub(super) opts: NdpOptions,
    pub(super) staging: Vec<Staging>,
    pub(super) sq_tail: u64,
    pub(super) cq_head: u64,
    pub(super) next_tag: u64,
    pub(super) done: HashMap<u64, cxlkv_ndp_cpl>,
    pub(super) pending: HashMap<u64, Pending>,
    pub(super) next_ticket: u64,
    /// This client's watch of the device's heartbeat (see [`NdpDevice::device_state`]).
    pub(super) beat_watch: Mutex<Option<BeatSeen>>,
}

/// The device heartbeat this client last saw change, and when (its own monotonic clock).
#[derive(Clone, Copy, Debug)]
pub(super) struct BeatSeen {
    /// The device generation it belongs to.
    generation: u64,
    /// The opaque `heartbeat_ns` value.
    heartbeat: u64,
    /// `Pool::monotonic_ns` when this client first saw that value.
    since_ns: u64,
}

impl NdpDevice {
    /// Opens the device for `participant` (which must own a partition: staging buffers live there).
    /// Works without a device: every command then runs on the host.
    pub fn open(participant: Arc<Participant>, opts: NdpOptions) -> Result<NdpDevice> {
        let pool = participant.pool().clone();
        let layout = DeviceLayout::of(&pool);
        let qp = participant.id();
        if qp >= layout.queue_pairs {
            return Err(NdpError::NoQueuePair {
                participant: qp,
                queue_pairs: layout.queue_pairs,
            });
        }
        // Reservations return their blocks if anything below fails; they are detached from the
        // borrow of `participant` once the client is complete (and given back in `Drop`).
        let mut reserved = Vec::new();
        for i in 0..opts.staging.max(1) {
            let key = Key::from_bytes(
                format!("cxlkv-ndp-staging/{qp}/{}/{i}", participant.generation()).as_bytes(),
            );
            reserved.push(participant.reserve(key, pool.block_size(), Codec::Raw)?);
        }
        let mem = pool.memory();
        let base = layout.qp(qp);
        coherence::acquire(
            &**mem,
            Site::NdpCompleteRead,
            base,
            u64::from(CXLKV_NDP_QP_INDICES_SIZE),
        );
        // Our slot's previous holder may have left commands behind: continue after them and
        // ignore their completions (their tags are not ours).
        let sq_tail = mem.load_u64(base + qpi::SQ_TAIL, Ordering::Relaxed)?;
        // Acquire pairs with the device's Release store of cq_tail.
        let cq_tail = mem.load_u64(base + qpi::CQ_TAIL, Ordering::Acquire)?;
        mem.store_u64(base + qpi::CQ_HEAD, cq_tail, Ordering::Release)?;
        mem.store_u64(base + qpi::CQ_WAITERS, 0, Ordering::Relaxed)?;
        coherence::publish(
            &**mem,
            Site::NdpHeadWrite,
            base,
            u64::from(CXLKV_NDP_QP_INDICES_SIZE),
        );
        let staging = reserved
            .into_iter()
            .map(|r| Staging {
                off: r.payload_offset(),
                reservation: r.into_raw(),
                owner: None,
                generation: 0,
            })
            .collect();
        Ok(NdpDevice {
            pool,
            layout,
            qp,
            next_tag: (participant.generation() << 32) | 1,
            participant,
            opts,
            staging,
            sq_tail,
            cq_head: cq_tail,
            done: HashMap::new(),
            pending: HashMap::new(),
            next_ticket: 1,
            beat_watch: Mutex::new(None),
        })
    }

    /// The queue pair this client submits on.
    pub fn queue_pair(&self) -> u32 {
        self.qp
    }

    /// The participant this client submits for.
    pub fn participant(&self) -> &Arc<Participant> {
        &self.participant
    }

    /// The tenant this client's participant slot attached as (0 = none): the device serves its
    /// queue only blocks of this tenant or of tenant 0, and the host fallback reads as it.
    pub fn tenant(&self) -> Result<u64> {
        Ok(crate::ndp::block::slot_tenant(&self.pool, self.qp)?)
    }

    /// Pool offsets of the staging blocks (for tools and tests).
    pub fn staging_offsets(&self) -> Vec<u64> {
        self.staging.iter().map(|s| s.off).collect()
    }

    pub(super) fn reg(&self, off: u64) -> Result<u64> {
        let mem = self.pool.memory();
        coherence::acquire(&**mem, Site::NdpRegsRead, self.layout.regs + off, 8);
        Ok(mem.load_u64(self.layout.regs + off, Ordering::Acquire)?)
    }

    /// Whether a live device of this ABI is attached, and if not, why.
    ///
    /// The device's `heartbeat_ns` is an opaque value that changes at every beat (every 10 ms); it
    /// is never compared with this client's clock, so the device's and the client's clocks may
    /// differ by any amount (a guest beside a host device, a stepped wall clock). This client
    /// remembers the value it last saw change and when, on its own monotonic clock
    /// ([`Pool::monotonic_ns`]); the device is dead once that value stood still for more than
    /// `stale_after` while this client watched. A first look, or a new device generation, starts
    /// the watch and finds the device alive: a device that died before this client looked costs
    /// one `stale_after` (or the command's timeout, whichever is shorter) to find out.
    pub fn device_state(&self) -> Result<std::result::Result<u64, FallbackReason>> {
        // Acquire pairs with the device's Release store of the magic, written last at start.
        if self.reg(reg::MAGIC)? != CXLKV_NDP_MAGIC
            || self.reg(reg::ABI)? & 0xffff_ffff != u64::from(CXLKV_NDP_ABI_MAJOR)
        {
            return Ok(Err(FallbackReason::Absent));
        }
        let heartbeat = self.reg(reg::HEARTBEAT)?;
        let generation = self.reg(reg::GENERATION)?;
        let now = self.pool.monotonic_ns();
        let mut seen = self.beat_watch.lock().unwrap_or_else(|e| e.into_inner());
        match *seen {
            Some(s) if s.generation == generation && s.heartbeat == heartbeat => {
                if now.saturating_sub(s.since_ns) > self.opts.stale_after.as_nanos() as u64 {
                    return Ok(Err(FallbackReason::Dead));
                }
            }
            _ => {
                *seen = Some(BeatSeen {
                    generation,
                    heartbeat,
                    since_ns: now,
                })
            }
        }
        Ok(Ok(generation))
    }

    /// A device counter (`CXLKV_NDP_CTR_*`).
    pub fn counter(&self, index: u32) -> Result<u64> {
        self.reg(reg::COUNTERS + 8 * u64::from(index.min(CXLKV_NDP_COUNTERS - 1)))
    }

    /// Moves every new completion into `done`, releasing quarantined staging blocks.
    pub(super) fn drain(&mut self) -> Result<()> {
        let mem = self.pool.memory().clone();
        let cq = Ring::completion(&self.layout, self.qp);
        let tail = cq.tail(&*mem)?;
        if tail.wrapping_sub(self.cq_head) > DEPTH {
            // Not a state the device produces; resynchronise rather than read garbage.
            self.cq_head = tail;
        }
        while self.cq_head != tail {
            let c: cxlkv_ndp_cpl = cq.read(&*mem, self.cq_head)?;
            self.cq_head = self.cq_head.wrapping_add(1);
            if self.pending.values().any(|p| p.tag == c.tag) {
                // Its result is still to be read from the staging block: the block stays ours
                // until then (`finish_device`, `run_simple`). Releasing it here let a submission
                // in between overwrite an unread result (found by tests/ring_sim.rs).
                self.done.insert(c.tag, c);
            } else {
                // A command given up on (timed out): its quarantined staging block is free now.
                for s in &mut self.staging {
                    if s.owner == Some(c.tag) {
                        s.owner = None;
                    }
                }
            }
        }
        cq.release(&*mem, self.cq_head)?;
        Ok(())
    }

    /// Releases staging blocks held for commands of an older device generation (a new device fails
    /// such commands without running them, so nothing will write there any more).
    pub(super) fn release_old(&mut self, generation: u64) {
        for s in &mut self.staging {
            if s.owner.is_some() && s.generation != generation {
                s.owner = None;
            }
        }
    }

    /// Writes a command and rings the doorbell. Returns the bytes written across the link.
    pub(super) fn push(
        &mut self,
        cmd: &cxlkv_ndp_cmd,
    ) -> Result<std::result::Result<u64, FallbackReason>> {
        let mem = self.pool.memory().clone();
        let sq = Ring::submission(&self.layout, self.qp);
        if sq.in_flight(&*mem, self.sq_tail)? >= DEPTH {
            return Ok(Err(FallbackReason::Busy));
        }
        sq.produce(&*mem, &mut self.sq_tail, cmd)?;
        let mut sent = u64::from(CXLKV_NDP_CMD_SIZE) + 8;
        // Dekker pair with the device going to sleep: it stores `sleeping` then re-reads every
        // sq_tail (SeqCst); we store sq_tail then read `sleeping` (SeqCst). One of us sees the other.
        fence(Ordering::SeqCst);
        if self.reg(reg::SLEEPING)? != 0 {
            let bell = self.layout.regs + reg::DOORBELL;
            let mut cur = mem.load_u64(bell, Ordering::Relaxed)?;
            while let Err(actual) = mem.compare_exchange_u64(bell, cur, cur.wrapping_add(1))? {
                cur = actual;
            }
            coherence::publish(&*mem, Site::NdpSubmitWrite, bell, 8);
            cxlkv_shm::futex::wake(&*mem, bell);
            sent += 8;
        }
        Ok(Ok(sent))
    }

    pub(super) fn new_tag(&mut self) -> u64 {
        let t = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        t
    }

    /// Waits for the completion of `tag` until `deadline`, spinning first, then sleeping on the
    /// completion futex in short slices while the device's heartbeat stays fresh.
    pub(super) fn await_tag(
        &mut self,
        tag: u64,
        deadline: Instant,
    ) -> Result<std::result::Result<cxlkv_ndp_cpl, FallbackReason>> {
        let mem = self.pool.memory().clone();
        let base = self.layout.qp(self.qp);
        let spin_until = Instant::now() + self.opts.spin;
        let mut slice = Duration::from_micros(20);
        loop {
            self.drain()?;
            if let Some(c) = self.done.remove(&tag) {
                return Ok(Ok(c));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Err(FallbackReason::Timeout));
            }
            if now < spin_until {
                std::hint::spin_loop();
                continue;
            }
            if let Err(why) = self.device_state()? {
                return Ok(Err(why));
            }
            // Announce the wait, then re-check: the device stores cq_tail then reads cq_waiters
            // (SeqCst), we store cq_waiters then read cq_tail (SeqCst).
            mem.store_u64(base + qpi::CQ_WAITERS, 1, Ordering::SeqCst)?;
            let tail = mem.load_u64(base + qpi::CQ_TAIL, Ordering::SeqCst)?;
            if tail == self.cq_head {
                cxlkv_shm::futex::wait(
                    &*mem,
                    base + qpi::CQ_TAIL,
                    tail as u32,
                    slice.min(deadline - now),
                );
                slice = (slice * 2).min(Duration::from_millis(5));
            }
            mem.store_u64(base + qpi::CQ_WAITERS, 0, Ordering::Relaxed)?;
        }
    }

    /// Frees a staging block once its command's result has been copied out (or will not be).
    pub(super) fn release_staging(&mut self, si: Option<usize>) {
        if let Some(si) = si {
            self.staging[si].owner = None;
        }
    }

    /// Stores an arbitrary value as this queue pair's `sq_tail` (tests of ring validation) and
    /// returns the value the client will continue from.
    pub fn corrupt_sq_tail(&mut self, value: u64) -> Result<()> {
        let mem = self.pool.memory();
        let base = self.layout.qp(self.qp);
        mem.store_u64(base + qpi::SQ_TAIL, value, Ordering::Release)?;
        self.sq_tail = value;
        Ok(())
    }

    /// Re-reads the device's `sq_head` and continues submitting from it (after a ring error).
    pub fn resync(&mut self) -> Result<()> {
        let mem = self.pool.memory();
        let base = self.layout.qp(self.qp);
        let head = mem.load_u64(base + qpi::SQ_HEAD, Ordering::Acquire)?;
        self.sq_tail = head;
        mem.store_u64(base + qpi::SQ_TAIL, head, Ordering::Release)?;
        Ok(())
    }
}

impl Drop for NdpDevice {
    fn drop(&mut self) {
        // The staging blocks go back to the partition's free list.
        for s in self.staging.drain(..) {
            self.participant.abort_raw(s.reservation);
        }
    }
}
