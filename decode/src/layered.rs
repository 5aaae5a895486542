//! Per-layer overrides: the layers a [`ModeSpec`] keeps exact (`+dense0`, `--dense-layers`) go to
//! a private [`Dense`] backend, the others to the mode's backend.

use crate::mode::ModeSpec;
use cxlkv_model::{Attention, AttentionStats, Dense, Result};

/// A backend with some layers computed by [`Dense`].
pub(crate) struct Layered<'e> {
    name: String,
    spec: ModeSpec,
    dense: Dense,
    inner: Box<dyn Attention + 'e>,
}

impl<'e> Layered<'e> {
    pub(crate) fn new(spec: &ModeSpec, dense: Dense, inner: Box<dyn Attention + 'e>) -> Self {
        Layered {
            name: spec.to_string(),
            spec: spec.clone(),
            dense,
            inner,
        }
    }

    fn pick(&mut self, layer: usize) -> &mut dyn Attention {
        if self.spec.is_dense_layer(layer) {
            &mut self.dense
        } else {
            self.inner.as_mut()
        }
    }
}

impl Attention for Layered<'_> {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self, layer: usize) -> usize {
        if self.spec.is_dense_layer(layer) {
            self.dense.len(layer)
        } else {
            self.inner.len(layer)
        }
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.pick(layer).append(layer, k, v)
    }

    fn attend(&mut self, layer: usize, q: &[f32], out: &mut [f32]) -> Result<()> {
        self.pick(layer).attend(layer, q, out)
    }

    fn clear(&mut self) {
        self.dense.clear();
        self.inner.clear();
    }

    fn stats(&self) -> AttentionStats {
        let (a, b) = (self.dense.stats(), self.inner.stats());
        AttentionStats {
            query_heads: a.query_heads + b.query_heads,
            value_rows: a.value_rows + b.value_rows,
            link_read_bytes: a.link_read_bytes + b.link_read_bytes,
            link_write_bytes: a.link_write_bytes + b.link_write_bytes,
            device_commands: a.device_commands + b.device_commands,
            device_scan_bytes: a.device_scan_bytes + b.device_scan_bytes,
            device_ns: a.device_ns + b.device_ns,
        }
    }
}
