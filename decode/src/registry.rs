//! The one factory: [`ModeSpec::backend`] builds the backend of any mode, dense included, from
//! the [`ModeDef`] the spec carries; and the built-in modes' definitions.

use crate::env::{Env, EnvOptions};
use crate::error::{Error, Result};
use crate::exact::NdpExact;
use crate::layered::Layered;
use crate::mode::{ModeArg, ModeDef, ModeSpec, Needs, Takes};
use crate::pool_attn::PoolAttention;
use crate::select::Selected;
use cxlkv_kernels::DType;
use cxlkv_model::{Attention, AttentionShape, Dense};

/// Where a backend is built: the model's attention shape, the sequence it holds, and the run's
/// [`Env`] (the pool and the device) if one is open.
pub struct Site<'e> {
    shape: AttentionShape,
    env: Option<&'e Env>,
    sequence: u64,
}

impl<'e> Site<'e> {
    /// The model's attention shape.
    pub fn shape(&self) -> AttentionShape {
        self.shape
    }

    /// The sequence's id in the pool (backends alive at once on one [`Env`] hold different ids).
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The run's [`Env`]; an error naming `spec` if none is open.
    pub fn env(&self, spec: &ModeSpec) -> Result<&'e Env> {
        self.env.ok_or_else(|| Error::Mode {
            found: spec.to_string(),
            why: "this mode needs the pool: open an Env (Env::open) and build it there".into(),
        })
    }
}

impl ModeSpec {
    /// The backend of this mode for a model of `shape`, holding one sequence (`sequence`: its id
    /// in the pool). `env` is the run's pool and device; the modes that keep K/V in private
    /// memory need none. Layers kept exact (`+dense…`) go to a private [`Dense`] backend.
    pub fn backend<'e>(
        &self,
        shape: AttentionShape,
        env: Option<&'e Env>,
        sequence: u64,
    ) -> Result<Box<dyn Attention + 'e>> {
        if let Some(&l) = self.dense_layers.iter().find(|&&l| l >= shape.layers) {
            return Err(Error::Mode {
                found: self.to_string(),
                why: format!("layer {l} does not exist (the model has {})", shape.layers),
            });
        }
        let site = Site {
            shape,
            env,
            sequence,
        };
        let inner = (self.def().build)(self, &site)?;
        if self.dense_layers.is_empty() || self.def().needs == Needs::Private {
            return Ok(inner);
        }
        Ok(Box::new(Layered::new(
            self,
            Dense::new(shape, DType::F32)?,
            inner,
        )))
    }
}

impl Env {
    /// A backend for `spec` on this run's pool and device, holding one sequence (`sequence`: its
    /// id in the pool; backends alive at once need different ids). The same as
    /// [`ModeSpec::backend`] with this `Env`.
    pub fn backend(&self, spec: &ModeSpec, sequence: u64) -> Result<Box<dyn Attention + '_>> {
        spec.backend(self.shape(), Some(self), sequence)
    }
}

/// `dense`: private memory, f32 K/V.
pub(crate) static DENSE: ModeDef = ModeDef {
    name: "dense",
    syntax: "dense",
    help: "private memory, f32 K/V: the reference",
    takes: Takes::Nothing,
    needs: Needs::Private,
    build: |_, site| Ok(Box::new(Dense::new(site.shape(), DType::F32)?)),
};

/// `dense-f16`: private memory, f16 K/V.
pub(crate) static DENSE_F16: ModeDef = ModeDef {
    name: "dense-f16",
    syntax: "dense-f16",
    help: "private memory, f16 K/V",
    takes: Takes::Nothing,
    needs: Needs::Private,
    build: |_, site| Ok(Box::new(Dense::new(site.shape(), DType::F16)?)),
};

/// `pool`: K/V in the pool, every key and value read back by the host.
pub(crate) static POOL: ModeDef = ModeDef {
    name: "pool",
    syntax: "pool",
    help: "K/V in the pool as typed blocks, every key and value pulled back by the host",
    takes: Takes::Nothing,
    needs: Needs::Pool,
    build: |spec, site| {
        let env = site.env(spec)?;
        Ok(Box::new(PoolAttention::new(env, spec, site.sequence())))
    },
};

/// `ndp-exact`: the device's exact partials over the stored blocks, merged with the host's.
pub(crate) static NDP_EXACT: ModeDef = ModeDef {
    name: "ndp-exact",
    syntax: "ndp-exact",
    help: "K/V in the pool, exact partial attention computed by the device, merged on the host",
    takes: Takes::Nothing,
    needs: Needs::Device,
    build: |spec, site| {
        let env = site.env(spec)?;
        Ok(Box::new(NdpExact::new(env, spec, site.sequence())))
    },
};

/// `topk:K`: sinks, local window and the `K` best stored tokens, values gathered by the device.
pub(crate) static TOPK: ModeDef = ModeDef {
    name: "topk",
    syntax: "topk:K",
    help: "sinks + local window + the K best stored tokens per query head, values gathered by \
           the device",
    takes: Takes::Budget,
    needs: Needs::Device,
    build: build_selected,
};

/// `topp:P[:KMAX]`: the fewest stored tokens holding softmax mass `P`.
pub(crate) static TOPP: ModeDef = ModeDef {
    name: "topp",
    syntax: "topp:P[:KMAX]",
    help: "the fewest stored tokens holding softmax mass P (0 < P <= 1), at most KMAX (default \
           2048)",
    takes: Takes::Mass,
    needs: Needs::Device,
    build: build_selected,
};

fn build_selected<'e>(spec: &ModeSpec, site: &Site<'e>) -> Result<Box<dyn Attention + 'e>> {
    let env = site.env(spec)?;
    if spec.arg == ModeArg::None {
        return Err(Error::Mode {
            found: spec.to_string(),
            why: "a selection mode needs a budget or a mass".into(),
        });
    }
    Ok(Box::new(Selected::new(env, spec, site.sequence())))
}

impl Env {
    /// The [`Env`] a run of `specs` needs: opened (see [`Env::open`]) if any of them keeps K/V
    /// in the pool, `None` if all are private.
    pub fn open_for(
        specs: &[ModeSpec],
        opts: &EnvOptions,
        shape: AttentionShape,
        max_tokens: usize,
    ) -> Result<Option<Env>> {
        if specs.iter().any(ModeSpec::uses_pool) {
            Env::open(opts, shape, max_tokens).map(Some)
        } else {
            Ok(None)
        }
    }
}
