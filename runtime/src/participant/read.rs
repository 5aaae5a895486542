//! Reads through a participant: copies validated by the pool's optimistic read path, counted in
//! the participant's slot, and touching the eviction order of its own blocks.

use super::state::Participant;
use crate::format::counters;
use crate::key::Key;
use crate::metrics::{count_call, Op, Outcome};
use crate::pool::{BlockInfo, Result, SliceBuf};
use std::time::Instant;

/// A get's outcome and bytes out in the metrics.
fn got(info: Option<&BlockInfo>) -> (Outcome, u64, u64) {
    match info {
        Some(i) => (Outcome::Ok, 0, i.len),
        None => (Outcome::Miss, 0, 0),
    }
}

impl Participant {
    /// Copies the block under `key` into a new vector (any partition); `None` on a miss. Counted
    /// as a `get` (of the block's bytes; a miss, or a failure) in the process's metrics.
    pub fn get(&self, key: Key) -> Result<Option<(Vec<u8>, BlockInfo)>> {
        let t0 = Instant::now();
        let mut v = Vec::new();
        let mut retries = 0;
        let r = self.pool.read_validated(key, &mut v, &mut retries);
        self.after_get(&r, retries);
        count_call(Op::Get, t0, &r, |i| got(i.as_ref()));
        Ok(r?.map(|i| (v, i)))
    }

    /// Copies the block under `key` into `buf`; `None` on a miss; [`PoolError::BufferTooSmall`](crate::pool::PoolError::BufferTooSmall)
    /// with the needed size if `buf` is too small (counted as a failed `get`).
    pub fn get_into(&self, key: Key, buf: &mut [u8]) -> Result<Option<BlockInfo>> {
        let t0 = Instant::now();
        let mut retries = 0;
        let r = self
            .pool
            .read_validated(key, &mut SliceBuf(buf), &mut retries);
        self.after_get(&r, retries);
        count_call(Op::Get, t0, &r, |i| got(i.as_ref()));
        r
    }

    fn after_get(&self, r: &Result<Option<BlockInfo>>, retries: u64) {
        if retries > 0 {
            self.count(counters::RETRIES, retries);
        }
        match r {
            Ok(Some(info)) => {
                self.count(counters::HITS, 1);
                self.count(counters::BYTES_OUT, info.len);
                if let (Some(m), true) = (
                    &self.owner,
                    Some(info.location.partition) == self.partition(),
                ) {
                    let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
                    if st.indexed[info.location.block as usize].map(|(_, s)| s)
                        == Some(info.location.seq)
                    {
                        st.policy.touch(info.location.block);
                    }
                }
            }
            Ok(None) => self.count(counters::MISSES, 1),
            Err(_) => {}
        }
    }

    /// How many leading keys of `chain` are present.
    pub fn lookup_prefix(&self, chain: &[Key]) -> Result<usize> {
        self.pool.lookup_prefix(chain)
    }
}
