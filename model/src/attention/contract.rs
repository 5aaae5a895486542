//! The contract between the model and a backend: the [`Attention`] trait, the
//! [`AttentionShape`] a backend is built for, and checks of the slices the model hands over.
//! Layouts and causality are described in the parent module.

use crate::config::Config;
use crate::error::{Error, Result};

/// What a backend needs to know about the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Layers (each has its own keys and values).
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Factor applied to `q·k` before the softmax (`1/sqrt(head_dim)`).
    pub scale: f32,
}

impl AttentionShape {
    /// The shape of `cfg`'s attention.
    pub fn of(cfg: &Config) -> AttentionShape {
        AttentionShape {
            layers: cfg.layers,
            heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            scale: cfg.attention_scale(),
        }
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// Where K and V live and how queries attend to them. One instance holds one sequence.
///
/// A backend that splits the keys (say, old positions in the pool, scored by the near-data
/// device, and recent ones in private memory) computes a [`Partial`](super::Partial) over each share and merges
/// them: the merged output is exact, not an approximation.
pub trait Attention {
    /// A short name for messages (`dense`, `dense-f16`).
    fn name(&self) -> &str;

    /// Positions held for `layer`.
    fn len(&self, layer: usize) -> usize;

    /// True if `layer` holds no position.
    fn is_empty(&self, layer: usize) -> bool {
        self.len(layer) == 0
    }

    /// Appends the keys and values of `t` new positions of `layer`, `[kv_heads][t][head_dim]`
    /// each (`t = k.len() / (kv_heads · head_dim)`).
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()>;

    /// Attention of the last `t` positions' queries `q` (`[t][heads][head_dim]`) into `out`
    /// (same layout), each over the positions up to its own (causal).
    fn attend(&mut self, layer: usize, q: &[f32], out: &mut [f32]) -> Result<()>;

    /// Forgets every position of every layer (a new sequence). [`stats`](Attention::stats)
    /// keep counting.
    fn clear(&mut self);

    /// What the backend has read and moved since it was built.
    fn stats(&self) -> AttentionStats;
}

/// What a backend read and moved, cumulative since it was built (not reset by `clear`). A host
/// backend moves nothing across a link; the pool and near-data backends count every byte the
/// host read from or wrote to pool memory, which on CXL hardware crosses the link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttentionStats {
    /// Query-head attentions computed: one per query head, per token, per layer.
    pub query_heads: u64,
    /// Value rows that entered those attentions, summed over them (a dense attention over `n`
    /// positions adds `n` per query head; a top-k one adds the rows it selected).
    pub value_rows: u64,
    /// Bytes the host read from pool memory (keys and values pulled, results, completions).
    pub link_read_bytes: u64,
    /// Bytes the host wrote to pool memory (keys and values appended, commands, arguments).
    pub link_write_bytes: u64,
    /// Commands sent to the near-data device.
    pub device_commands: u64,
    /// Key and value bytes the device read in place, next to the memory.
    pub device_scan_bytes: u64,
    /// Execution time the device reported, ns.
    pub device_ns: u64,
    /// Query-head attentions computed over a selection of the stored positions (top-k, top-p):
    /// the count [`AttentionStats::left_out_mass_e9`] is summed over.
    pub selected_heads: u64,
    /// Softmax mass the selections left out, summed over `selected_heads`, in units of 1e-9
    /// (an integer so that stats stay `Eq`); [`AttentionStats::left_out_mass`] is the mean.
    pub left_out_mass_e9: u64,
    /// Key rows re-scored exactly after a key sketch's scoring, summed over the selected query
    /// heads (each counts its group's candidate union).
    pub rescored_rows: u64,
}

impl AttentionStats {
    /// The difference `self − before` of two snapshots of the same backend.
    pub fn since(&self, before: &AttentionStats) -> AttentionStats {
        AttentionStats {
            query_heads: self.query_heads - before.query_heads,
            value_rows: self.value_rows - before.value_rows,
            link_read_bytes: self.link_read_bytes - before.link_read_bytes,
            link_write_bytes: self.link_write_bytes - before.link_write_bytes,
            device_commands: self.device_commands - before.device_commands,
            device_scan_bytes: self.device_scan_bytes - before.device_scan_bytes,
            device_ns: self.device_ns - before.device_ns,
            selected_heads: self.selected_heads - before.selected_heads,
            left_out_mass_e9: self.left_out_mass_e9 - before.left_out_mass_e9,
            rescored_rows: self.rescored_rows - before.rescored_rows,
        }
    }

    /// The sum of two backends' stats (a layered backend's parts).
    pub fn add(&self, other: &AttentionStats) -> AttentionStats {
        AttentionStats {
            query_heads: self.query_heads + other.query_heads,
            value_rows: self.value_rows + other.value_rows,
            link_read_bytes: self.link_read_bytes + other.link_read_bytes,
            link_write_bytes: self.link_write_bytes + other.link_write_bytes,
            device_commands: self.device_commands + other.device_commands,
            device_scan_bytes: self.device_scan_bytes + other.device_scan_bytes,
            device_ns: self.device_ns + other.device_ns,
            selected_heads: self.selected_heads + other.selected_heads,
            left_out_mass_e9: self.left_out_mass_e9 + other.left_out_mass_e9,
            rescored_rows: self.rescored_rows + other.rescored_rows,
        }
    }

    /// Records one query head's selection that left out `mass` (0 to 1) of the softmax.
    pub fn record_left_out(&mut self, mass: f32) {
        self.selected_heads += 1;
        self.left_out_mass_e9 += (f64::from(mass.clamp(0.0, 1.0)) * 1e9).round() as u64;
    }

    /// Mean softmax mass the selections left out, over the selected query heads (`None` when
    /// nothing was selected).
    pub fn left_out_mass(&self) -> Option<f64> {
        (self.selected_heads > 0)
            .then(|| self.left_out_mass_e9 as f64 / 1e9 / self.selected_heads as f64)
    }
}

/// Checks the lengths handed to a backend: `t` whole positions of K and V, `out` as long as `q`.
/// Returns `t`. For backends' use.
pub fn check_append(shape: &AttentionShape, name: &str, k: &[f32], v: &[f32]) -> Result<usize> {
    let row = shape.kv_heads * shape.head_dim;
    if k.len() != v.len() || k.is_empty() || !k.len().is_multiple_of(row) {
        return Err(Error::Attention {
            backend: name.into(),
            reason: format!(
                "K ({}) and V ({}) must be equal, non-empty multiples of kv_heads × head_dim = {row}",
                k.len(),
                v.len()
            ),
        });
    }
    Ok(k.len() / row)
}

/// Checks a query block against what the layer holds; returns `t`, the number of queries.
pub fn check_attend(
    shape: &AttentionShape,
    name: &str,
    held: usize,
    q: &[f32],
    out: &[f32],
) -> Result<usize> {
    let row = shape.heads * shape.head_dim;
    let t = q.len() / row;
    if q.is_empty() || !q.len().is_multiple_of(row) || out.len() != q.len() || t > held {
        return Err(Error::Attention {
            backend: name.into(),
            reason: format!(
                "queries ({}) must be a non-empty multiple of heads × head_dim = {row}, output \
                 ({}) as long, and at most the {held} positions held",
                q.len(),
                out.len()
            ),
        });
    }
    Ok(t)
}
