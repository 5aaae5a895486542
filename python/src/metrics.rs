//! Recording into this process's metrics (`cxlkv_runtime::metrics::global`, shared with the C ABI
//! when both are loaded through one runtime): the participant and device methods call these for
//! every operation (outcome, bytes in and out, latency). [`crate::observe`] reads them back.

use cxlkv_runtime::metrics::{global, Op, Outcome};
use cxlkv_runtime::{BlockInfo, PoolError};
use std::time::Instant;

/// Records one call of `op` that started at `t0`.
pub fn record(op: Op, outcome: Outcome, bytes_in: u64, bytes_out: u64, t0: Instant) {
    global().record(op, outcome, bytes_in, bytes_out, t0.elapsed());
}

/// Records a get from `get_into`'s result: a hit gives out the block's bytes.
pub fn record_read(op: Op, r: &Result<Option<BlockInfo>, PoolError>, t0: Instant) {
    match r {
        Ok(Some(info)) => record(op, Outcome::Ok, 0, info.len, t0),
        Ok(None) => record(op, Outcome::Miss, 0, 0, t0),
        Err(_) => record(op, Outcome::Error, 0, 0, t0),
    }
}

/// Records a call that either succeeded or failed.
pub fn record_result<T, E>(op: Op, r: &Result<T, E>, bytes_in: u64, bytes_out: u64, t0: Instant) {
    match r {
        Ok(_) => record(op, Outcome::Ok, bytes_in, bytes_out, t0),
        Err(_) => record(op, Outcome::Error, 0, 0, t0),
    }
}
