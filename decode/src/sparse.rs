//! `ndp-topk:K` and `ndp-topp:P[:KMAX]`: the device selects and attends. For a decode step, one
//! sparse ATTEND per KV head (ABI 1.2, [`cxlkv_runtime::ndp::sparse`]): the device scores every
//! stored key for each query of the GQA group, selects per query the sinks, the stored part of
//! the local window and the `K` best others (or the fewest reaching softmax mass `P`, at most
//! `KMAX`), takes the union over the group and returns each query's exact partial over the union
//! only, with the mass it leaves out. Only partials cross the link, as with `ndp-exact`; the
//! device reads every key but only the selected value rows. The host merges each partial with its
//! own over the open block.
//!
//! With `--sketch int4:C` ([`crate::env::SketchOption`]) the device scores the blocks' key
//! sketches instead of the keys, re-scores the `C` best candidates per query on the exact keys
//! and selects among them ([`cxlkv_runtime::ndp::sketch`]): it reads the sketch, the candidates'
//! keys and the selection's values.
//!
//! A prefill (several queries at once) is exact on the host, as `topk`/`topp` do.

use crate::env::Env;
use crate::exact::count;
use crate::mode::{ModeArg, ModeSpec};
use crate::select::selection;
use crate::store::Store;
use cxlkv_model::{Attention, AttentionStats, HostAttention, Result};
use cxlkv_runtime::ndp::client::{AttendRequest, Sparse};

/// The `ndp-topk` / `ndp-topp` backend.
pub(crate) struct NdpSparse<'e> {
    env: &'e Env,
    store: Store<'e>,
    name: String,
    arg: ModeArg,
    host: HostAttention,
    stats: AttentionStats,
}

impl<'e> NdpSparse<'e> {
    pub(crate) fn new(env: &'e Env, spec: &ModeSpec, sequence: u64) -> Self {
        let name = spec.to_string();
        NdpSparse {
            env,
            store: Store::new(env, spec, sequence),
            name,
            arg: spec.arg,
            host: HostAttention::new(),
            stats: AttentionStats::default(),
        }
    }
}

impl Attention for NdpSparse<'_> {
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
        let mut ndp = self.env.ndp();
        let mut tickets = Vec::with_capacity(shape.kv_heads);
        for kv in 0..shape.kv_heads {
            let req = AttendRequest {
                queries: &q[kv * g * d..(kv + 1) * g * d],
                dim: d,
                blocks: self.store.stored(layer),
                sequence: self.store.sequence(),
                layer: layer as u32,
                kv_head: kv as u32,
                dtype: self.store.dtype(),
                scale: Some(shape.scale),
                sparse: Some(Sparse {
                    select,
                    k,
                    candidates: self.env.options().sketch.candidates(),
                }),
            };
            tickets.push(ndp.submit_attend(&req).map_err(|e| {
                self.store
                    .err(format!("sparse ATTEND of layer {layer}: {e}"))
            })?);
        }
        let open_rows = held - stored;
        for (kv, ticket) in tickets.into_iter().enumerate() {
            let got = ndp.wait_attend(ticket).map_err(|e| {
                self.store
                    .err(format!("sparse ATTEND of layer {layer}: {e}"))
            })?;
            count(&mut self.stats, &got.stats);
            if got.partials.len() != g || got.selection.len() != g {
                return Err(self.store.err(format!(
                    "sparse ATTEND returned {} partials and {} selections for {g} queries",
                    got.partials.len(),
                    got.selection.len()
                )));
            }
            let open = self.host.group(
                &shape,
                self.store.host_head(layer, kv, stored),
                &q[kv * g * d..(kv + 1) * g * d],
            );
            for (j, (mut p, o)) in got.partials.into_iter().zip(&open).enumerate() {
                p.merge(o);
                let at = (kv * g + j) * d;
                p.finish_into(&mut out[at..at + d]);
                let (rows, left) = got.selection[j];
                self.stats.value_rows += rows as u64 + open_rows as u64;
                self.stats.record_left_out(left);
                self.stats.rescored_rows += got.rescored.unwrap_or(0) as u64;
            }
            self.stats.query_heads += g as u64;
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.store.clear();
    }

    fn stats(&self) -> AttentionStats {
        self.store.with_link(&self.stats)
    }
}
