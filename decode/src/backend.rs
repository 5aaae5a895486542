//! [`Env::backend`]: the backend of a [`ModeSpec`] on an [`Env`].

use crate::env::Env;
use crate::error::{Error, Result};
use crate::mode::{Mode, ModeSpec};
use cxlkv_kernels::DType;
use cxlkv_model::{Attention, Dense};

impl Env {
    /// A backend for `spec`, holding one sequence (`sequence`: its id in the pool; backends alive
    /// at once need different ids). `dense` and `dense-f16` keep everything in private memory.
    pub fn backend(&self, spec: &ModeSpec, sequence: u64) -> Result<Box<dyn Attention + '_>> {
        if let Some(&l) = spec
            .dense_layers
            .iter()
            .find(|&&l| l >= self.shape().layers)
        {
            return Err(Error::Mode {
                found: spec.to_string(),
                why: format!(
                    "layer {l} does not exist (the model has {})",
                    self.shape().layers
                ),
            });
        }
        let inner: Box<dyn Attention + '_> = match spec.mode {
            Mode::Dense => return Ok(Box::new(Dense::new(self.shape(), DType::F32)?)),
            Mode::DenseF16 => return Ok(Box::new(Dense::new(self.shape(), DType::F16)?)),
            Mode::Pool => Box::new(crate::pool_attn::PoolAttention::new(self, spec, sequence)),
            Mode::NdpExact => Box::new(crate::exact::NdpExact::new(self, spec, sequence)),
            Mode::TopK { .. } | Mode::TopP { .. } => {
                Box::new(crate::select::Selected::new(self, spec, sequence))
            }
        };
        if spec.dense_layers.is_empty() {
            return Ok(inner);
        }
        Ok(Box::new(crate::layered::Layered::new(
            spec,
            Dense::new(self.shape(), DType::F32)?,
            inner,
        )))
    }
}
