//! The device's threads: each worker serves a fixed subset of the queue pairs (ring indices
//! checked, one command at a time, completions written and the client woken) and sleeps on the
//! doorbell when idle; the housekeeping thread beats the heartbeat and ends hotlist epochs.

use crate::device::commands::{err, Done, Outcome};
use crate::device::config::DeviceError;
use crate::device::model::Device;
use cxlkv_runtime::coherence::{self, Site};
use cxlkv_runtime::mem::{read_obj, write_obj};
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::{futex_wait, futex_wake, qpi, reg, Ring, DEPTH};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

impl Device {
    pub(super) fn flush_restarted(&self, qp: u32) -> Result<(), DeviceError> {
        let mem = self.mem();
        let base = self.layout.qp(qp);
        coherence::acquire(
            mem,
            Site::NdpSubmitRead,
            base,
            u64::from(CXLKV_NDP_QP_INDICES_SIZE),
        );
        let head = mem.load_u64(base + qpi::SQ_HEAD, Ordering::Relaxed)?;
        let tail = mem.load_u64(base + qpi::SQ_TAIL, Ordering::Acquire)?;
        let mut cq_tail = mem.load_u64(base + qpi::CQ_TAIL, Ordering::Relaxed)?;
        if tail.wrapping_sub(head) <= DEPTH {
            let mut i = head;
            while i != tail {
                let cmd: cxlkv_ndp_cmd = read_obj(mem, self.layout.sq_slot(qp, i))?;
                self.write_cpl(
                    qp,
                    &mut cq_tail,
                    cxlkv_ndp_cpl {
                        tag: cmd.tag,
                        status: CXLKV_NDP_ERR_RESTARTED,
                        ..Default::default()
                    },
                )?;
                i = i.wrapping_add(1);
            }
        } else if head != tail {
            self.write_cpl(
                qp,
                &mut cq_tail,
                cxlkv_ndp_cpl {
                    status: CXLKV_NDP_ERR_RING,
                    ..Default::default()
                },
            )?;
        }
        mem.store_u64(base + qpi::SQ_HEAD, tail, Ordering::Release)?;
        coherence::publish(mem, Site::NdpHeadWrite, base + qpi::SQ_HEAD, 8);
        Ok(())
    }

    /// Writes a completion at `cq_tail` and publishes the new tail; wakes a sleeping client.
    pub(super) fn write_cpl(
        &self,
        qp: u32,
        cq_tail: &mut u64,
        mut c: cxlkv_ndp_cpl,
    ) -> Result<(), DeviceError> {
        let mem = self.mem();
        let base = self.layout.qp(qp);
        c.index = *cq_tail;
        c.generation = self.generation;
        // The entry (and the result buffer written before it) before the index.
        Ring::completion(&self.layout, qp).produce(mem, cq_tail, &c)?;
        // Dekker pair with the client's SeqCst store of cq_waiters before its re-check of cq_tail.
        fence(Ordering::SeqCst);
        if mem.load_u64(base + qpi::CQ_WAITERS, Ordering::SeqCst)? != 0 {
            futex_wake(mem, base + qpi::CQ_TAIL);
        }
        Ok(())
    }

    pub(super) fn worker(&self, w: usize, workers: usize) {
        let qps: Vec<u32> = (w as u32..self.layout.queue_pairs)
            .step_by(workers)
            .collect();
        let mem = self.mem();
        // Device-owned indices, cached (nobody else writes them).
        let mut heads: Vec<u64> = qps
            .iter()
            .map(|&q| {
                mem.load_u64(self.layout.qp(q) + qpi::SQ_HEAD, Ordering::Relaxed)
                    .unwrap_or(0)
            })
            .collect();
        let mut cq_tails: Vec<u64> = qps
            .iter()
            .map(|&q| {
                mem.load_u64(self.layout.qp(q) + qpi::CQ_TAIL, Ordering::Relaxed)
                    .unwrap_or(0)
            })
            .collect();
        let mut last_work = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let mut did = false;
            for (i, &qp) in qps.iter().enumerate() {
                did |= self.service(qp, &mut heads[i], &mut cq_tails[i]);
            }
            if did {
                last_work = Instant::now();
                continue;
            }
            if last_work.elapsed() < self.cfg.idle_spin {
                std::hint::spin_loop();
                continue;
            }
            self.sleep(&qps, &heads);
            last_work = Instant::now();
        }
    }

    /// Sleeps on the doorbell unless a submission arrived meanwhile.
    pub(super) fn sleep(&self, qps: &[u32], heads: &[u64]) {
        let mem = self.mem();
        let bell = self.layout.regs + reg::DOORBELL;
        let seen = mem.load_u64(bell, Ordering::SeqCst).unwrap_or(0);
        {
            let mut n = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            *n += 1;
            let _ = mem.store_u64(self.layout.regs + reg::SLEEPING, 1, Ordering::SeqCst);
        }
        // Dekker pair with the client's fence between its sq_tail store and its `sleeping` load.
        fence(Ordering::SeqCst);
        let pending = qps.iter().zip(heads).any(|(&q, &h)| {
            mem.load_u64(self.layout.qp(q) + qpi::SQ_TAIL, Ordering::SeqCst)
                .is_ok_and(|t| t != h)
        });
        if !pending && !self.stop.load(Ordering::SeqCst) {
            futex_wait(mem, bell, seen as u32, Duration::from_millis(10));
        }
        let mut n = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        if *n == 0 {
            let _ = mem.store_u64(self.layout.regs + reg::SLEEPING, 0, Ordering::SeqCst);
        }
    }

    /// Takes at most one command from queue pair `qp`; true if it did any work.
    pub(super) fn service(&self, qp: u32, head: &mut u64, cq_tail: &mut u64) -> bool {
        let mem = self.mem();
        let sq = Ring::submission(&self.layout, qp);
        let Ok(tail) = sq.tail(mem) else {
            return false;
        };
        if tail == *head {
            return false;
        }
        if tail.wrapping_sub(*head) > DEPTH {
            // The client's index is not one it could have produced: resynchronise, then report
            // (in this order, so a client that sees the error completion or counter and resyncs
            // from SQ_HEAD reads the new head, not the old one).
            *head = tail;
            let _ = sq.release(mem, *head);
            let _ = self.write_cpl(
                qp,
                cq_tail,
                cxlkv_ndp_cpl {
                    status: CXLKV_NDP_ERR_RING,
                    ..Default::default()
                },
            );
            self.count(CXLKV_NDP_CTR_ERRORS, 1);
            return true;
        }
        // Room in the completion ring? A cq_head that is not a plausible index is ignored (the
        // entry is written in the ring either way; only that client's view suffers).
        let used = Ring::completion(&self.layout, qp)
            .in_flight(mem, *cq_tail)
            .unwrap_or(0);
        if used == DEPTH {
            return false;
        }
        // A private copy: the client may rewrite the slot; we check and use only this copy.
        let cmd: cxlkv_ndp_cmd = match sq.read(mem, *head) {
            Ok(c) => c,
            Err(_) => return false,
        };
        *head = head.wrapping_add(1);
        // Our copy of the slot before the client may reuse it.
        let _ = sq.release(mem, *head);
        let cpl = self.execute(qp, &cmd);
        let _ = self.write_cpl(qp, cq_tail, cpl);
        true
    }

    /// Runs one command; never panics, always answers.
    pub(super) fn execute(&self, qp: u32, cmd: &cxlkv_ndp_cmd) -> cxlkv_ndp_cpl {
        let t0 = Instant::now();
        self.count(CXLKV_NDP_CTR_COMMANDS, 1);
        let run = || -> Outcome {
            match u32::from(cmd.opcode) {
                CXLKV_NDP_OP_NOP => Ok(Done::default()),
                CXLKV_NDP_OP_SCORE_TOPK => self.score_topk(qp, cmd),
                CXLKV_NDP_OP_GATHER => self.gather(qp, cmd),
                CXLKV_NDP_OP_BUILD_BOUNDS => self.build_bounds(qp, cmd),
                CXLKV_NDP_OP_HOTLIST => self.hotlist(qp, cmd),
                CXLKV_NDP_OP_ATTEND => self.attend(qp, cmd),
                _ => Err(err(CXLKV_NDP_ERR_OPCODE)),
            }
        };
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
            .unwrap_or(Err(err(CXLKV_NDP_ERR_INTERNAL)));
        let took = t0.elapsed();
        let ns = took.as_nanos() as u64;
        self.count(CXLKV_NDP_CTR_BUSY_NS, ns);
        self.observe_latency(u32::from(cmd.opcode), took);
        match out {
            Ok(d) => {
                self.count(CXLKV_NDP_CTR_BYTES_SCANNED, d.stats.bytes_scanned);
                self.count(
                    CXLKV_NDP_CTR_BYTES_RETURNED,
                    d.result_bytes + u64::from(CXLKV_NDP_CPL_SIZE),
                );
                self.count(
                    CXLKV_NDP_CTR_BYTES_RECEIVED,
                    u64::from(CXLKV_NDP_CMD_SIZE) + u64::from(cmd.args_len),
                );
                self.count(
                    CXLKV_NDP_CTR_BLOCKS_SCANNED,
                    u64::from(d.stats.blocks_scanned),
                );
                self.count(
                    CXLKV_NDP_CTR_BLOCKS_PRUNED,
                    u64::from(d.stats.blocks_pruned),
                );
                cxlkv_ndp_cpl {
                    tag: cmd.tag,
                    status: CXLKV_NDP_OK,
                    result_bytes: d.result_bytes,
                    bytes_scanned: d.stats.bytes_scanned,
                    device_ns: ns,
                    blocks_scanned: d.stats.blocks_scanned,
                    blocks_pruned: d.stats.blocks_pruned,
                    ..Default::default()
                }
            }
            Err(s) => {
                self.count(CXLKV_NDP_CTR_ERRORS, 1);
                if s.code == CXLKV_NDP_ERR_ACCESS {
                    self.count(CXLKV_NDP_CTR_REFUSED, 1);
                }
                cxlkv_ndp_cpl {
                    tag: cmd.tag,
                    status: s.code,
                    detail: s.detail,
                    device_ns: ns,
                    ..Default::default()
                }
            }
        }
    }

    pub(super) fn housekeeping(&self) {
        let mem = self.mem();
        let r = self.layout.regs;
        let mut epoch_start = Instant::now();
        let mut epochs = 0u64;
        // The heartbeat is an opaque value that must change at every beat (clients watch it stand
        // still on their own clocks, docs/ABI.md): the wall clock for people reading the register,
        // forced forward when the clock stood still or was stepped back.
        let mut beat = mem
            .load_u64(r + reg::HEARTBEAT, Ordering::Relaxed)
            .unwrap_or(0);
        while !self.stop.load(Ordering::Relaxed) {
            beat = cxlkv_runtime::ndp::now_ns().max(beat.wrapping_add(1));
            let _ = mem.store_u64(r + reg::HEARTBEAT, beat, Ordering::Release);
            mem.publish(r + reg::HEARTBEAT, 8);
            if epoch_start.elapsed() >= self.cfg.hot_epoch {
                epoch_start = Instant::now();
                epochs += 1;
                let top = self.hottest(CXLKV_NDP_HOTLIST_WINDOW as usize);
                for (i, e) in top.iter().enumerate() {
                    let _ = write_obj(mem, r + reg::HOT + 32 * i as u64, e);
                }
                let _ = mem.store_u64(r + reg::HOT_COUNT, top.len() as u64, Ordering::Relaxed);
                let _ = mem.store_u64(r + reg::HOT_EPOCH, epochs, Ordering::Release);
                mem.publish(
                    r + reg::HOT_EPOCH,
                    64 + 32 * CXLKV_NDP_HOTLIST_WINDOW as u64,
                );
                self.hot.decay();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
