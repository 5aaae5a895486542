//! Per-block scan heat: every scan of a block adds one unit, every hotlist epoch halves it; the
//! hottest blocks are the device's HOTLIST and its register window.

use cxlkv_runtime::key::Key;
use cxlkv_runtime::ndp::abi::cxlkv_ndp_hot_entry;
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default, Clone, Copy)]
struct Heat {
    heat: f64,
    accesses: u64,
}

/// Heat per block key, shared by the workers (which add) and the housekeeping thread (which
/// decays).
#[derive(Default)]
pub struct HotTable {
    heat: Mutex<HashMap<(u64, u64), Heat>>,
}

impl HotTable {
    /// Counts one scan of the block under `key`.
    pub fn touch(&self, key: Key) {
        let mut hot = self.heat.lock().unwrap_or_else(|e| e.into_inner());
        let h = hot.entry((key.lo(), key.hi())).or_default();
        h.heat += 1.0;
        h.accesses += 1;
    }

    /// The hottest blocks, hottest first (at most `max`).
    pub fn hottest(&self, max: usize) -> Vec<cxlkv_ndp_hot_entry> {
        let hot = self.heat.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<cxlkv_ndp_hot_entry> = hot
            .iter()
            .map(|(&(lo, hi), h)| cxlkv_ndp_hot_entry {
                key_lo: lo,
                key_hi: hi,
                heat: (h.heat * 256.0) as u64,
                accesses: h.accesses,
            })
            .collect();
        v.sort_by(|a, b| b.heat.cmp(&a.heat).then(a.key_lo.cmp(&b.key_lo)));
        v.truncate(max);
        v
    }

    /// Ends an epoch: every heat halves, and blocks below one 256th are forgotten.
    pub fn decay(&self) {
        let mut hot = self.heat.lock().unwrap_or_else(|e| e.into_inner());
        hot.retain(|_, h| {
            h.heat *= 0.5;
            h.heat >= 1.0 / 256.0
        });
    }
}

/// Keys of the blocks named in hotlist entries.
pub fn hot_key(e: &cxlkv_ndp_hot_entry) -> Key {
    Key::from_parts(e.key_lo, e.key_hi)
}
