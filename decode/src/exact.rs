//! `ndp-exact`: keys and values stored in the pool as the model produces them; for a decode step
//! the device computes each query's exact partial attention over the stored blocks (`ATTEND`, one
//! command per KV head, all in flight together) and the host merges it with its own partial over
//! the open block by the log-sum-exp rule of split-K ("flash") decoding.
//!
//! A prefill (several queries at once, each seeing a different prefix) is computed on the host
//! over the stored and open rows, as `pool` does: the rows of the prompt are still in host memory
//! then, so only blocks stored before the prefill are read back.

use crate::env::Env;
use crate::host::{dense_attend, group_partials};
use crate::mode::ModeSpec;
use crate::store::Store;
use cxlkv_kernels::ScoreKernel;
use cxlkv_model::attention::check_attend;
use cxlkv_model::{Attention, AttentionStats, Result};
use cxlkv_runtime::ndp::client::{AttendRequest, NdpPath, NdpStats};

/// The `ndp-exact` backend.
pub(crate) struct NdpExact<'e> {
    env: &'e Env,
    store: Store<'e>,
    name: String,
    kernel: ScoreKernel,
    scores: Vec<f32>,
    stats: AttentionStats,
}

impl<'e> NdpExact<'e> {
    pub(crate) fn new(env: &'e Env, spec: &ModeSpec, sequence: u64) -> Self {
        let name = spec.to_string();
        NdpExact {
            env,
            store: Store::new(env, &name, sequence),
            name,
            kernel: ScoreKernel::detect(),
            scores: Vec::new(),
            stats: AttentionStats::default(),
        }
    }
}

/// Adds what one command cost to `stats`.
pub(crate) fn count(stats: &mut AttentionStats, s: &NdpStats) {
    stats.link_write_bytes += s.bytes_to_device;
    stats.link_read_bytes += s.bytes_from_device + s.host_scan_bytes;
    if s.path == Some(NdpPath::Device) {
        stats.device_commands += 1;
        stats.device_scan_bytes += s.bytes_scanned;
        stats.device_ns += s.device_ns;
    }
}

impl Attention for NdpExact<'_> {
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
        let shape = self.store.shape();
        if layer >= shape.layers {
            return Err(self.store.err(format!("layer {layer} of {}", shape.layers)));
        }
        let held = self.store.len(layer);
        let t = check_attend(&shape, &self.name, held, q, out)?;
        let stored = self.store.stored_len(layer);
        if t > 1 || stored == 0 {
            let rows = self.store.all_rows(layer)?;
            dense_attend(
                &shape,
                &self.kernel,
                self.store.dtype(),
                &rows.k,
                &rows.v,
                held,
                q,
                out,
                &mut self.scores,
                &mut self.stats,
            );
            return Ok(());
        }
        let (d, g) = (shape.head_dim, shape.group());
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
                scale: shape.scale,
            };
            tickets.push(
                ndp.submit_attend(&req)
                    .map_err(|e| self.store.err(format!("ATTEND of layer {layer}: {e}")))?,
            );
        }
        for (kv, ticket) in tickets.into_iter().enumerate() {
            let got = ndp
                .wait_attend(ticket)
                .map_err(|e| self.store.err(format!("ATTEND of layer {layer}: {e}")))?;
            count(&mut self.stats, &got.stats);
            if got.partials.len() != g {
                return Err(self.store.err(format!(
                    "ATTEND returned {} partials for a group of {g}",
                    got.partials.len()
                )));
            }
            let open = group_partials(
                &shape,
                &self.kernel,
                self.store.dtype(),
                self.store.host_rows(layer, kv, stored, false),
                self.store.host_rows(layer, kv, stored, true),
                &q[kv * g * d..(kv + 1) * g * d],
                &mut self.scores,
            );
            for (j, (mut p, o)) in got.partials.into_iter().zip(open).enumerate() {
                p.merge(&o);
                let at = (kv * g + j) * d;
                p.finish_into(&mut out[at..at + d]);
            }
            self.stats.query_heads += g as u64;
            self.stats.value_rows += (g * held) as u64;
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.store.clear();
    }

    fn stats(&self) -> AttentionStats {
        let s = &self.store.stats;
        AttentionStats {
            link_read_bytes: self.stats.link_read_bytes + s.link_read_bytes,
            link_write_bytes: self.stats.link_write_bytes + s.link_write_bytes,
            ..self.stats
        }
    }
}
