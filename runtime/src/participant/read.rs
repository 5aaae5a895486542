//! Reads through a participant: copies validated by the pool's optimistic read path, counted in
//! the participant's slot, and touching the eviction order of its own blocks.

use super::state::Participant;
use crate::format::counters;
use crate::key::Key;
use crate::pool::{BlockInfo, Result, SliceBuf};

impl Participant {
    /// Copies the block under `key` into a new vector (any partition); `None` on a miss.
    pub fn get(&self, key: Key) -> Result<Option<(Vec<u8>, BlockInfo)>> {
        let mut v = Vec::new();
        let mut retries = 0;
        let r = self.pool.read_validated(key, &mut v, &mut retries);
        self.after_get(&r, retries);
        Ok(r?.map(|i| (v, i)))
    }

    /// Copies the block under `key` into `buf`; `None` on a miss; [`PoolError::BufferTooSmall`](crate::pool::PoolError::BufferTooSmall)
    /// with the needed size if `buf` is too small.
    pub fn get_into(&self, key: Key, buf: &mut [u8]) -> Result<Option<BlockInfo>> {
        let mut retries = 0;
        let r = self
            .pool
            .read_validated(key, &mut SliceBuf(buf), &mut retries);
        self.after_get(&r, retries);
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
