//! `topk:K` and `topp:P[:KMAX]`: the device scores every stored key of a decode step's queries
//! and returns, per query head, the attention sinks (positions `0 .. sinks`), the stored part of
//! the local window (the last `window` positions) and the best-scoring others — the `K` best, or
//! the fewest whose exact softmax mass reaches `P` (at most `KMAX`). The value rows of the GQA
//! group's union are then gathered once per KV head (GATHER), so a token several queries chose
//! crosses the link once; each query attends its own list's rows. The host adds the open block's rows (always attended) and computes the softmax over
//! the selected and open positions only: an approximation whose error is the mass left out.
//!
//! A prefill (several queries at once) is exact, computed on the host as `pool` does; the
//! selection applies to decode steps.

use crate::env::Env;
use crate::exact::count;
use crate::mode::{ModeArg, ModeSpec};
use crate::store::Store;
use cxlkv_kernels::{GroupMode, KeyRows, Partial};
use cxlkv_model::{Attention, AttentionStats, HostAttention, Result};
use cxlkv_runtime::ndp::abi::CXLKV_NDP_MAX_K;
use cxlkv_runtime::ndp::client::{ScoreRequest, Select};

/// The selection backends.
pub(crate) struct Selected<'e> {
    env: &'e Env,
    store: Store<'e>,
    name: String,
    arg: ModeArg,
    host: HostAttention,
    stats: AttentionStats,
}

impl<'e> Selected<'e> {
    pub(crate) fn new(env: &'e Env, spec: &ModeSpec, sequence: u64) -> Self {
        let name = spec.to_string();
        Selected {
            env,
            store: Store::new(env, spec, sequence),
            name,
            arg: spec.arg,
            host: HostAttention::new(),
            stats: AttentionStats::default(),
        }
    }
}

/// The selection of a decode step at `held` positions, `stored` of them in the pool, for a mode
/// with argument `arg` (a budget or a mass): the request's `select` and per-query cap `k`. The
/// sinks and the stored part of the local window are forced in and come on top of the budget.
pub(crate) fn selection(env: &Env, arg: ModeArg, held: usize, stored: usize) -> (Select, usize) {
    let o = env.options();
    let sinks = (o.sinks as usize).min(stored);
    let window_start = held.saturating_sub(o.window as usize).min(stored);
    let window = (window_start < stored).then_some((window_start as u64, stored as u64));
    // Positions forced in: the sinks and the stored part of the window, counted once.
    let forced = sinks + (stored - window_start.max(sinks));
    let (budget, top_p) = match arg {
        ModeArg::Budget(k) => (k, None),
        ModeArg::Mass { p, k_max } => (k_max, Some(p)),
        ModeArg::None => unreachable!("the registry builds a selection with its argument"),
    };
    let k = (budget + forced).min(stored).min(CXLKV_NDP_MAX_K as usize);
    (
        Select {
            sinks: sinks as u64,
            window,
            exclude: None,
            top_p,
        },
        k,
    )
}

impl Attention for Selected<'_> {
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
        let dtype = self.store.dtype();
        // Gathered rows come back in the store's row type (f32 for quantized blocks).
        let row_dtype = self.store.row_dtype();
        let row = row_dtype.bytes(d);
        let (select, k) = selection(self.env, self.arg, held, stored);
        let mut ndp = self.env.ndp();
        let mut tickets = Vec::with_capacity(shape.kv_heads);
        for kv in 0..shape.kv_heads {
            let req = ScoreRequest {
                queries: &q[kv * g * d..(kv + 1) * g * d],
                dim: d,
                blocks: self.store.stored(layer),
                sequence: self.store.sequence(),
                layer: layer as u32,
                kv_head: kv as u32,
                dtype,
                k,
                mode: GroupMode::PerQuery,
                // Top-p needs every score for the exact mass; top-k may skip blocks on bounds.
                prune: select.top_p.is_none(),
                // Values are gathered once per KV head for the group's union (below).
                gather_values: false,
                select,
                scale: Some(shape.scale),
            };
            tickets.push(
                ndp.submit_score(&req)
                    .map_err(|e| self.store.err(format!("SCORE_TOPK of layer {layer}: {e}")))?,
            );
        }
        let open_rows = held - stored;
        for (kv, ticket) in tickets.into_iter().enumerate() {
            let r = ndp
                .wait(ticket)
                .map_err(|e| self.store.err(format!("SCORE_TOPK of layer {layer}: {e}")))?;
            count(&mut self.stats, &r.stats);
            if r.indices.len() != g || r.scores.len() != g {
                return Err(self.store.err(format!(
                    "SCORE_TOPK returned {} lists for {g} queries",
                    r.indices.len()
                )));
            }
            // The GQA union: a token chosen by several queries of the group crosses once.
            let mut union: Vec<u32> = r.indices.iter().flatten().copied().collect();
            union.sort_unstable();
            union.dedup();
            let mut rows = Vec::with_capacity(union.len() * row);
            for part in union.chunks(CXLKV_NDP_MAX_K as usize) {
                let (got, st) = ndp
                    .gather(
                        self.store.stored(layer),
                        self.store.sequence(),
                        layer as u32,
                        kv as u32,
                        dtype,
                        d,
                        part,
                    )
                    .map_err(|e| self.store.err(format!("GATHER of layer {layer}: {e}")))?;
                count(&mut self.stats, &st);
                rows.extend_from_slice(&got);
            }
            if rows.len() != union.len() * row {
                return Err(self.store.err(format!(
                    "GATHER returned {} bytes for {} rows",
                    rows.len(),
                    union.len()
                )));
            }
            let open = self.host.group(
                &shape,
                self.store.host_head(layer, kv, stored),
                &q[kv * g * d..(kv + 1) * g * d],
            );
            for (j, o) in open.into_iter().enumerate() {
                // This query's rows, looked up in the union.
                let mut bytes = Vec::with_capacity(r.indices[j].len() * row);
                for t in &r.indices[j] {
                    let at = union.binary_search(t).expect("every hit is in the union");
                    bytes.extend_from_slice(&rows[at * row..(at + 1) * row]);
                }
                let values = KeyRows::new(&bytes, row_dtype, d)
                    .map_err(|e| self.store.err(format!("gathered values: {e}")))?;
                let scores = &r.scores[j];
                let mut p = Partial::over(&values, |i| shape.scale * scores[i]);
                p.merge(&o);
                let at = (kv * g + j) * d;
                p.finish_into(&mut out[at..at + d]);
                self.stats.value_rows += (scores.len() + open_rows) as u64;
                if let Some(&m) = r.left_out_mass.get(j) {
                    self.stats.record_left_out(m);
                }
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
