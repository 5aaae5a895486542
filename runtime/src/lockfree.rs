//! The lock-free protocols at memory offsets, for the loom models in `tests/loom_models.rs`.
//! Compiled only with `--cfg loom`; each item calls the code the pool and the NDP rings run, on
//! whatever [`SharedMemory`] the model backs with loom atomics.

use crate::key::Key;
use crate::ndp::queue::Ring;
use cxlkv_shm::mem::Result;
use cxlkv_shm::SharedMemory;

/// `Participant`'s seqlock write of the index slot at `off` (the owner's `write_slot`):
/// `Ok(Err(version))` when the slot says the writer is fenced.
pub fn write_slot(
    mem: &dyn SharedMemory,
    off: u64,
    key: Key,
    entry: u64,
    generation: u64,
) -> Result<std::result::Result<(), u64>> {
    crate::participant::write_slot_at(mem, off, key, entry, generation)
}

/// `Pool::read_slot`'s seqlock read of the slot at `off`: (version, key, entry), or `None` after
/// its spin budget.
pub fn read_slot(mem: &dyn SharedMemory, off: u64) -> Result<Option<(u64, Key, u64)>> {
    crate::pool::read_slot_at(mem, off)
}

/// `Pool::slot_version`: the version re-check that ends an optimistic read.
pub fn slot_version(mem: &dyn SharedMemory, off: u64) -> Result<u64> {
    crate::pool::slot_version_at(mem, off)
}

/// A ring of `depth` slots of `entry` bytes from `slots`, with its indices at `head` and `tail`:
/// [`Ring`]'s steps (those of the NDP submission and completion rings) on a ring small enough for
/// loom to explore.
pub fn ring(head: u64, tail: u64, slots: u64, entry: u64, depth: u64) -> Ring {
    Ring::new(head, tail, slots, entry, depth)
}
