//! `ndp-exact`: keys and values stored in the pool as the model produces them; for a decode step
//! the device computes each query's exact partial attention over the stored blocks (`ATTEND`, one
//! command per KV head, all in flight together) and the host merges it with its own partial over
//! the open block by the log-sum-exp rule of split-K ("flash") decoding.
//!
//! Several queries at once (a prefill, or a chunk of a long text), each seeing its own causal
//! prefix: the device takes the stored blocks that every one of them sees whole (those stored
//! before the call), packing the queries of several tokens into one command (up to 16 queries);
//! the host takes the rows after them, up to each query's own position. Before any block is
//! stored, everything is on the host.

use crate::env::Env;
use crate::mode::ModeSpec;
use crate::store::Store;
use cxlkv_model::{Attention, AttentionStats, HostAttention, Result};
use cxlkv_runtime::ndp::client::{AttendRequest, NdpPath, NdpStats};

/// The `ndp-exact` backend.
pub(crate) struct NdpExact<'e> {
    env: &'e Env,
    store: Store<'e>,
    name: String,
    host: HostAttention,
    stats: AttentionStats,
}

impl<'e> NdpExact<'e> {
    pub(crate) fn new(env: &'e Env, spec: &ModeSpec, sequence: u64) -> Self {
        let name = spec.to_string();
        NdpExact {
            env,
            store: Store::new(env, spec, sequence),
            name,
            host: HostAttention::new(),
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
        let (held, t) = self.store.check_attend(&self.name, layer, q, out)?;
        let shape = self.store.shape();
        // The device takes the stored blocks every query sees whole; the host the rows after.
        let bt = self.store.block_tokens();
        let n_dev = self.store.stored(layer).len().min((held - t + 1) / bt);
        let dev_end = n_dev * bt;
        let dtype = self.store.dtype();
        if n_dev == 0 || dev_end < self.store.tail_start(layer) {
            self.store
                .attend_on_host(&mut self.host, layer, q, out, &mut self.stats)?;
            return Ok(());
        }
        let (d, g) = (shape.head_dim, shape.group());
        let row = shape.heads * d;
        let group = |i: usize, kv: usize| &q[i * row + kv * g * d..i * row + (kv + 1) * g * d];
        // One command per KV head and run of tokens whose queries fit a device group (<= 16).
        let per_cmd = (16 / g).max(1);
        let jobs: Vec<(usize, usize, usize)> = (0..shape.kv_heads)
            .flat_map(|kv| {
                (0..t)
                    .step_by(per_cmd)
                    .map(move |i| (kv, i, (i + per_cmd).min(t)))
            })
            .collect();
        let mut parts = Vec::with_capacity(jobs.len());
        {
            let mut ndp = self.env.ndp();
            let blocks = &self.store.stored(layer)[..n_dev];
            // As many in flight as the client has staging blocks.
            for wave in jobs.chunks(self.env.staging()) {
                let mut tickets = Vec::with_capacity(wave.len());
                for &(kv, i0, i1) in wave {
                    let queries: Vec<f32> = (i0..i1)
                        .flat_map(|i| group(i, kv).iter().copied())
                        .collect();
                    let req = AttendRequest {
                        queries: &queries,
                        dim: d,
                        blocks,
                        sequence: self.store.sequence(),
                        layer: layer as u32,
                        kv_head: kv as u32,
                        dtype,
                        scale: Some(shape.scale),
                        sparse: None,
                    };
                    tickets
                        .push(ndp.submit_attend(&req).map_err(|e| {
                            self.store.err(format!("ATTEND of layer {layer}: {e}"))
                        })?);
                }
                for (ticket, &(_, i0, i1)) in tickets.into_iter().zip(wave) {
                    let got = ndp
                        .wait_attend(ticket)
                        .map_err(|e| self.store.err(format!("ATTEND of layer {layer}: {e}")))?;
                    count(&mut self.stats, &got.stats);
                    if got.partials.len() != (i1 - i0) * g {
                        return Err(self.store.err(format!(
                            "ATTEND returned {} partials for {} queries",
                            got.partials.len(),
                            (i1 - i0) * g
                        )));
                    }
                    parts.push(got.partials);
                }
            }
        }
        for (&(kv, i0, i1), dev) in jobs.iter().zip(parts) {
            let mut dev = dev.into_iter();
            let after = self.store.host_head(layer, kv, dev_end);
            for i in i0..i1 {
                let visible = held - t + i + 1;
                let open = self
                    .host
                    .group(&shape, after.slice(0, visible - dev_end), group(i, kv));
                for (j, o) in open.iter().enumerate() {
                    let mut p = dev.next().expect("partials counted above");
                    p.merge(o);
                    let at = i * row + (kv * g + j) * d;
                    p.finish_into(&mut out[at..at + d]);
                }
                self.stats.query_heads += g as u64;
                self.stats.value_rows += (g * visible) as u64;
            }
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
