//! `pull-topk:K`: the field's approach (SAC-style), the baseline the near-data modes are measured
//! against. The host keeps its own copy of the stored keys (the "sketch"; today the exact f32 keys
//! as the model produced them, which is the best selection a host sketch can give), scores every
//! stored position of a decode step's queries on it, selects per query the sinks, the stored part
//! of the local window and the `K` best others, takes the union over the GQA group and pulls only
//! the union's value rows across the link from the typed blocks in the pool. The attention over
//! the pulled rows and the open block is computed on the host.
//!
//! A prefill (several queries at once) is exact on the host, as `topk`/`topp` do.

use crate::env::Env;
use crate::mode::{ModeArg, ModeSpec};
use crate::select::selection;
use crate::store::{push_rows, Store};
use cxlkv_kernels::{DType, KeyRows, Partial, QueryGroup, ScoreKernel};
use cxlkv_model::{Attention, AttentionStats, HostAttention, Result};
use cxlkv_runtime::ndp::select::Selection;
use cxlkv_runtime::ndp::sparse::{left_out, union};
use cxlkv_runtime::ndp::{host_gather, slot_tenant, BlockExpect};

/// The `pull-topk` backend.
pub(crate) struct PullTopK<'e> {
    env: &'e Env,
    store: Store<'e>,
    name: String,
    arg: ModeArg,
    host: HostAttention,
    stats: AttentionStats,
    kernel: ScoreKernel,
    /// The host's key copy: `[layer][kv_head]`, rows of `head_dim` f32 (little-endian bytes, as
    /// the score kernel reads them) in position order.
    keys: Vec<Vec<Vec<u8>>>,
}

impl<'e> PullTopK<'e> {
    pub(crate) fn new(env: &'e Env, spec: &ModeSpec, sequence: u64) -> Self {
        let name = spec.to_string();
        let store = Store::new(env, spec, sequence);
        let shape = store.shape();
        PullTopK {
            env,
            store,
            name,
            arg: spec.arg,
            host: HostAttention::new(),
            stats: AttentionStats::default(),
            kernel: ScoreKernel::detect(),
            keys: vec![vec![Vec::new(); shape.kv_heads]; shape.layers],
        }
    }
}

impl Attention for PullTopK<'_> {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self, layer: usize) -> usize {
        self.store.len(layer)
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.store.append(layer, k, v)?;
        let shape = self.store.shape();
        let per_head = k.len() / shape.kv_heads;
        for (h, dst) in self.keys[layer].iter_mut().enumerate() {
            push_rows(dst, &k[h * per_head..(h + 1) * per_head], DType::F32);
        }
        Ok(())
    }

    fn attend(&mut self, layer: usize, q: &[f32], out: &mut [f32]) -> Result<()> {
        let (held, t) = self.store.check_attend(&self.name, layer, q, out)?;
        let shape = self.store.shape();
        let stored = self.store.stored_len(layer);
        if t > 1 || stored == 0 {
            self.store
                .attend_on_host(&mut self.host, layer, q, out, &mut self.stats)?;
            return Ok(());
        }
        let (d, g) = (shape.head_dim, shape.group());
        let (select, k) = selection(self.env, self.arg, held, stored);
        let dtype = self.store.dtype();
        let open_rows = held - stored;
        let bad = |e: String| self.store.err(e);
        for kv in 0..shape.kv_heads {
            let qs = &q[kv * g * d..(kv + 1) * g * d];
            let queries = QueryGroup::new(qs, d).map_err(|e| bad(e.to_string()))?;
            // Score the host's keys, select per query, take the group's union.
            let kbytes = &self.keys[layer][kv][..DType::F32.bytes(stored * d)];
            let keys = KeyRows::new(kbytes, DType::F32, d).map_err(|e| bad(e.to_string()))?;
            let mut scores = vec![0f32; stored * g];
            self.kernel.score(&queries, &keys, &mut scores);
            let mut sel = Selection::new(select, k, shape.scale, g, &[(0, stored as u64)])
                .map_err(|e| bad(format!("selection: {e}")))?;
            sel.feed(0, &scores, g, false);
            let picked = sel.finish();
            let u = union(&picked.lists);
            // Pull the union's value rows across the link.
            // Read as the tenant this process's participant attached as, like the device would.
            let tenant = slot_tenant(self.env.pool(), self.env.participant().id())
                .map_err(|e| bad(format!("reading this participant's tenant: {e}")))?;
            let want = BlockExpect {
                tenant,
                sequence: self.store.sequence(),
                layer: layer as u32,
                kv_head: kv as u32,
                dtype,
                dim: d as u32,
            };
            let (vals, st) = host_gather(self.env.pool(), self.store.stored(layer), &want, &u)
                .map_err(|e| bad(format!("pulling the selected rows of layer {layer}: {e}")))?;
            self.stats.link_read_bytes += st.host_scan_bytes;
            // Rows of quantized blocks come back dequantized (the store's row type).
            let values =
                KeyRows::new(&vals, self.store.row_dtype(), d).map_err(|e| bad(e.to_string()))?;
            let parts: Vec<Partial> = (0..g)
                .map(|j| Partial::over(&values, |i| shape.scale * scores[u[i] as usize * g + j]))
                .collect();
            let left = left_out(&parts, &picked.log_sum_exp);
            let open = self
                .host
                .group(&shape, self.store.host_head(layer, kv, stored), qs);
            for (j, (mut p, o)) in parts.into_iter().zip(&open).enumerate() {
                p.merge(o);
                let at = (kv * g + j) * d;
                p.finish_into(&mut out[at..at + d]);
                self.stats.value_rows += (u.len() + open_rows) as u64;
                self.stats.record_left_out(left[j]);
            }
            self.stats.query_heads += g as u64;
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.store.clear();
        for l in &mut self.keys {
            for h in l {
                h.clear();
            }
        }
    }

    fn stats(&self) -> AttentionStats {
        self.store.with_link(&self.stats)
    }
}
