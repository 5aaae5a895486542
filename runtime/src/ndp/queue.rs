//! One ring of a queue pair, as both of its ends use it: the client produces into the submission
//! ring and consumes the completion ring, the device (crate `cxlkv-ndp`) the other way round.
//!
//! Each ring is single-producer, single-consumer, with free-running 64-bit indices: the producer
//! owns `tail`, the consumer owns `head`, entry `i` lives in slot `i % depth`. The orderings are
//! the io-uring pair: the producer writes the slot, then publishes `tail` with Release; the
//! consumer loads `tail` with Acquire, copies the slot out, then hands the slot back by storing
//! `head` with Release; the producer loads `head` with Acquire before it reuses a slot. Every step
//! also names its coherence [`Site`], so the rings work on software-coherent memory too.
//!
//! What an end does with the indices it reads (the device treats an impossible `tail` as a ring
//! error, the client resynchronises) stays with that end: these are the shared memory steps only,
//! and they are what `tests/loom_models.rs` runs under loom.

use crate::coherence::{self, Site};
use crate::format::Plain;
use crate::ndp::abi::{CXLKV_NDP_CMD_SIZE, CXLKV_NDP_CPL_SIZE, CXLKV_NDP_QP_INDICES_SIZE};
use crate::ndp::layout::{qpi, DeviceLayout, DEPTH};
use crate::sync::Ordering;
use cxlkv_shm::mem::{read_obj, write_obj, Result};
use cxlkv_shm::SharedMemory;

/// Where one ring's indices and slots are, and the coherence sites of its two ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ring {
    /// Offset of the consumer's index word.
    head: u64,
    /// Offset of the producer's index word.
    tail: u64,
    /// Offset of slot 0.
    slots: u64,
    /// Bytes per slot.
    entry: u64,
    /// Slots in the ring.
    depth: u64,
    /// The producer's publish of a slot and of `tail`.
    write: Site,
    /// The consumer's acquire of `tail` and of a slot.
    read: Site,
}

impl Ring {
    /// The submission ring of queue pair `qp`: the client produces commands, the device consumes.
    pub fn submission(layout: &DeviceLayout, qp: u32) -> Ring {
        let base = layout.qp(qp);
        Ring {
            head: base + qpi::SQ_HEAD,
            tail: base + qpi::SQ_TAIL,
            slots: base + u64::from(CXLKV_NDP_QP_INDICES_SIZE),
            entry: u64::from(CXLKV_NDP_CMD_SIZE),
            depth: DEPTH,
            write: Site::NdpSubmitWrite,
            read: Site::NdpSubmitRead,
        }
    }

    /// The completion ring of queue pair `qp`: the device produces completions, the client
    /// consumes.
    pub fn completion(layout: &DeviceLayout, qp: u32) -> Ring {
        let base = layout.qp(qp);
        Ring {
            head: base + qpi::CQ_HEAD,
            tail: base + qpi::CQ_TAIL,
            slots: base
                + u64::from(CXLKV_NDP_QP_INDICES_SIZE)
                + DEPTH * u64::from(CXLKV_NDP_CMD_SIZE),
            entry: u64::from(CXLKV_NDP_CPL_SIZE),
            depth: DEPTH,
            write: Site::NdpCompleteWrite,
            read: Site::NdpCompleteRead,
        }
    }

    /// A ring of `depth` slots of `entry` bytes from `slots`, with its indices at `head` and
    /// `tail` (the loom models' small rings; the device's rings come from the constructors
    /// above).
    #[cfg(loom)]
    pub(crate) fn new(head: u64, tail: u64, slots: u64, entry: u64, depth: u64) -> Ring {
        Ring {
            head,
            tail,
            slots,
            entry,
            depth,
            write: Site::NdpSubmitWrite,
            read: Site::NdpSubmitRead,
        }
    }

    /// Offset of the slot of entry `index`.
    pub fn slot(&self, index: u64) -> u64 {
        self.slots + (index % self.depth) * self.entry
    }

    /// Offset of the producer's index word (`sq_tail`, `cq_tail`: the futex word a sleeping
    /// consumer waits on).
    pub fn tail_offset(&self) -> u64 {
        self.tail
    }

    /// Producer: entries the consumer has not handed back, with `tail` the producer's own index
    /// (`depth` or more: no room). A consumer index that is not a plausible one shows as a
    /// number over `depth`; each end decides what that means.
    pub fn in_flight(&self, mem: &dyn SharedMemory, tail: u64) -> Result<u64> {
        coherence::acquire(mem, Site::NdpHeadRead, self.head, 8);
        // Acquire pairs with the consumer's Release store of head in `release`: its copy of the
        // slot we may overwrite next happened before.
        let head = mem.load_u64(self.head, Ordering::Acquire)?;
        Ok(tail.wrapping_sub(head))
    }

    /// Producer: writes `entry` at index `*tail`, then publishes `*tail + 1` (which it stores in
    /// `*tail`). The caller has checked for room ([`in_flight`](Self::in_flight)).
    pub fn produce<T: Plain>(
        &self,
        mem: &dyn SharedMemory,
        tail: &mut u64,
        entry: &T,
    ) -> Result<()> {
        debug_assert!(std::mem::size_of::<T>() as u64 <= self.entry);
        let slot = self.slot(*tail);
        write_obj(mem, slot, entry)?;
        coherence::publish(mem, self.write, slot, self.entry);
        *tail = tail.wrapping_add(1);
        // Release: the slot before the index. Pairs with the consumer's Acquire load in `tail`.
        mem.store_u64(self.tail, *tail, Ordering::Release)?;
        coherence::publish(mem, self.write, self.tail, 8);
        Ok(())
    }

    /// Consumer: the producer's index; entries up to it may be read.
    pub fn tail(&self, mem: &dyn SharedMemory) -> Result<u64> {
        coherence::acquire(mem, self.read, self.tail, 8);
        // Acquire pairs with the producer's Release store in `produce`, after the slot.
        mem.load_u64(self.tail, Ordering::Acquire)
    }

    /// Consumer: a private copy of entry `index` (below the producer's index). The producer may
    /// rewrite the slot once it is handed back, so the consumer checks and uses only this copy.
    pub fn read<T: Plain>(&self, mem: &dyn SharedMemory, index: u64) -> Result<T> {
        debug_assert!(std::mem::size_of::<T>() as u64 <= self.entry);
        let slot = self.slot(index);
        coherence::acquire(mem, self.read, slot, self.entry);
        read_obj(mem, slot)
    }

    /// Consumer: hands back every slot below `head`.
    pub fn release(&self, mem: &dyn SharedMemory, head: u64) -> Result<()> {
        // Release: our copies of the entries before the producer may overwrite their slots.
        // Pairs with the producer's Acquire load in `in_flight`.
        mem.store_u64(self.head, head, Ordering::Release)?;
        coherence::publish(mem, Site::NdpHeadWrite, self.head, 8);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_lie_where_the_layout_puts_them() {
        let layout = DeviceLayout {
            regs: 4096,
            qp0: 8192,
            qp_stride: 4096,
            queue_pairs: 2,
        };
        let sq = Ring::submission(&layout, 1);
        let cq = Ring::completion(&layout, 1);
        for i in [0, 1, DEPTH - 1, DEPTH, 3 * DEPTH + 5] {
            assert_eq!(sq.slot(i), layout.sq_slot(1, i));
            assert_eq!(cq.slot(i), layout.cq_slot(1, i));
        }
        assert_eq!(sq.tail_offset(), layout.qp(1) + qpi::SQ_TAIL);
        assert_eq!(cq.tail_offset(), layout.qp(1) + qpi::CQ_TAIL);
    }
}
