//! The fences and spin hints of the lock-free protocols (the index-slot seqlock, the NDP rings),
//! from std, or from loom when the crate is built with `--cfg loom` for the models in
//! `tests/loom_models.rs` (the shape of crossbeam-epoch's `primitive` module).
//!
//! Shared words themselves need no swap: the protocols reach them only through
//! [`SharedMemory`](cxlkv_shm::SharedMemory), which a model backs with loom atomics. What the
//! protocol code calls directly, fences and spin-wait hints, comes from here, so that loom sees
//! every ordering the real code states.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::fence;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::fence;
pub(crate) use std::sync::atomic::Ordering;

/// A spin-wait hint; under loom a yield, so that a model explores the other threads instead of a
/// spinning one.
#[inline(always)]
pub(crate) fn spin_loop() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
