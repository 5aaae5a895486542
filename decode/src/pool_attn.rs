//! `pool`: keys and values written to the pool as typed blocks as the model produces them; every
//! attention reads every stored block back over the link and computes on the host exactly as the
//! dense reference does. The baseline that pulls everything across.

use crate::env::Env;
use crate::mode::ModeSpec;
use crate::store::Store;
use cxlkv_model::{Attention, AttentionStats, HostAttention, Result};

/// The `pool` backend.
pub(crate) struct PoolAttention<'e> {
    store: Store<'e>,
    name: String,
    host: HostAttention,
    stats: AttentionStats,
}

impl<'e> PoolAttention<'e> {
    pub(crate) fn new(env: &'e Env, spec: &ModeSpec, sequence: u64) -> Self {
        let name = spec.to_string();
        PoolAttention {
            store: Store::new(env, spec, sequence),
            name,
            host: HostAttention::new(),
            stats: AttentionStats::default(),
        }
    }
}

impl Attention for PoolAttention<'_> {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self, layer: usize) -> usize {
        self.store.len(layer)
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.store.append(layer, k, v)
    }

    fn attend(&mut self, layer: usize, q: &[f32], out: &mut [f32]) -> Result<()> {
        self.store.check_attend(&self.name, layer, q, out)?;
        self.store
            .attend_on_host(&mut self.host, layer, q, out, &mut self.stats)?;
        Ok(())
    }

    fn clear(&mut self) {
        self.store.clear();
    }

    fn stats(&self) -> AttentionStats {
        self.store.with_link(&self.stats)
    }
}
