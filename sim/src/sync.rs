//! Locking that outlives an unwinding host: a simulated crash or a stuck run unwinds a host
//! thread, and a panicking host may poison a lock that the others and the final check still read.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data over from a poisoned lock.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
