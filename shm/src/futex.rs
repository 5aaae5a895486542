//! Futex wait and wake on a 32-bit word of shared memory (the low half of a little-endian u64
//! ring index), so that a client and a device on the same host can sleep instead of spinning.
//! Memory without a stable address (simulators) gets a short sleep instead.

use crate::mem::SharedMemory;
use std::time::Duration;

/// Blocks while the low 32 bits of the u64 at `off` equal `expected`, at most `timeout`, or until
/// woken. Returns early (spuriously) at will; callers re-check their condition.
pub fn wait(mem: &dyn SharedMemory, off: u64, expected: u32, timeout: Duration) {
    let Ok(Some(addr)) = mem.raw_range(off, 4) else {
        std::thread::sleep(timeout.min(Duration::from_micros(200)));
        return;
    };
    if (addr as usize) & 3 != 0 {
        std::thread::sleep(timeout.min(Duration::from_micros(200)));
        return;
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `addr` points at 4 bytes inside the mapping (checked by raw_range) and is 4-byte
    // aligned (checked above). FUTEX_WAIT only reads the word atomically in the kernel and
    // compares it with `expected`; no Rust reference to shared memory is created. The mapping
    // outlives the call because `mem` is borrowed for its duration.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            addr as *const u32,
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        );
    }
}

/// Wakes every waiter on the word at `off` (in any process mapping the same memory).
pub fn wake(mem: &dyn SharedMemory, off: u64) {
    let Ok(Some(addr)) = mem.raw_range(off, 4) else {
        return;
    };
    if (addr as usize) & 3 != 0 {
        return;
    }
    // SAFETY: as in `wait`: an in-bounds, aligned address; FUTEX_WAKE does not access the word's
    // contents from Rust, it only wakes threads queued on it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            addr as *const u32,
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}
