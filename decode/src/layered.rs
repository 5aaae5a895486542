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
        self.dense.stats().add(&self.inner.stats())
    }
}
