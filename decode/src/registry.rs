//! The modes known ([`MODES`], the built-in definitions, and [`Modes`], a set a caller may
//! extend), the one parser ([`Modes::parse`]) and the one factory ([`ModeSpec::backend`]: the
//! backend of any mode, dense included, from the [`ModeDef`] the spec carries).

use crate::env::{Env, EnvOptions};
use crate::error::{Error, Result};
use crate::exact::NdpExact;
use crate::layered::Layered;
use crate::mode::{parse_arg, parse_layers, ModeArg, ModeDef, ModeSpec, Needs, Site, Takes};
use crate::pool_attn::PoolAttention;
use crate::pull::PullTopK;
use crate::select::Selected;
use crate::sparse::NdpSparse;
use cxlkv_kernels::DType;
use cxlkv_model::{Attention, AttentionShape, Dense};

/// The built-in modes, in the order help texts list them.
pub static MODES: [&ModeDef; 9] = [
    &DENSE, &DENSE_F16, &POOL, &NDP_EXACT, &NDP_TOPK, &NDP_TOPP, &TOPK, &TOPP, &PULL_TOPK,
];

/// A set of modes: the one parser of mode strings.
#[derive(Clone, Debug)]
pub struct Modes {
    defs: Vec<&'static ModeDef>,
}

impl Default for Modes {
    fn default() -> Self {
        Modes::builtin()
    }
}

impl Modes {
    /// The built-in [`MODES`].
    pub fn builtin() -> Modes {
        Modes {
            defs: MODES.to_vec(),
        }
    }

    /// These modes and `def` (which replaces a mode of the same name).
    pub fn with(mut self, def: &'static ModeDef) -> Modes {
        self.defs.retain(|d| d.name != def.name);
        self.defs.push(def);
        self
    }

    /// The definitions, in order.
    pub fn defs(&self) -> &[&'static ModeDef] {
        &self.defs
    }

    /// The mode called `name`.
    pub fn get(&self, name: &str) -> Option<&'static ModeDef> {
        self.defs.iter().copied().find(|d| d.name == name)
    }

    /// One line per mode (`  topk:K: ...`), for help texts.
    pub fn help(&self) -> String {
        let lines: Vec<String> = self
            .defs
            .iter()
            .map(|d| format!("  {}: {}", d.syntax, d.help))
            .collect();
        lines.join("\n")
    }

    fn known(&self) -> String {
        let names: Vec<&str> = self.defs.iter().map(|d| d.syntax).collect();
        format!(
            "{} (any of them + `+denseL` or `+denseA-B` to keep layers exact)",
            names.join(", ")
        )
    }

    /// Parses one mode: `NAME[:ARG][+denseL|+denseA-B]...`.
    pub fn parse(&self, s: &str) -> Result<ModeSpec> {
        let bad = |why: String| Error::Mode {
            found: s.to_string(),
            why,
        };
        let mut parts = s.trim().split('+');
        let head = parts.next().unwrap_or_default();
        let (name, arg) = match head.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (head, None),
        };
        let def = self
            .get(name)
            .ok_or_else(|| bad(format!("unknown mode; known: {}", self.known())))?;
        let arg = parse_arg(def, arg).map_err(&bad)?;
        let mut dense_layers = Vec::new();
        let mut dtype = None;
        for part in parts {
            if let Ok(t) = part.parse::<DType>() {
                if dtype.replace(t).is_some() {
                    return Err(bad("more than one element type".into()));
                }
                continue;
            }
            let Some(range) = part.strip_prefix("dense") else {
                return Err(bad(format!(
                    "unknown modifier +{part}; the modifiers are +denseL, +denseA-B and an \
                     element type (+f32, +f16, +bf16, +int8, +int4)"
                )));
            };
            dense_layers.extend(parse_layers(range).map_err(&bad)?);
        }
        let mut spec = ModeSpec {
            def,
            arg,
            dense_layers: Vec::new(),
            dtype,
        };
        spec.add_dense_layers(&dense_layers);
        Ok(spec)
    }

    /// Parses a comma-separated list of modes (`--modes dense,pool,topk:256`).
    pub fn parse_list(&self, s: &str) -> Result<Vec<ModeSpec>> {
        let specs: Vec<ModeSpec> = s
            .split(',')
            .filter(|m| !m.trim().is_empty())
            .map(|m| self.parse(m))
            .collect::<Result<_>>()?;
        if specs.is_empty() {
            return Err(Error::Mode {
                found: s.to_string(),
                why: format!("no mode given; known: {}", self.known()),
            });
        }
        Ok(specs)
    }
}

impl ModeSpec {
    /// Parses one built-in mode (see [`Modes::parse`]).
    pub fn parse(s: &str) -> Result<ModeSpec> {
        Modes::builtin().parse(s)
    }

    /// Parses a comma-separated list of built-in modes (see [`Modes::parse_list`]).
    pub fn parse_list(s: &str) -> Result<Vec<ModeSpec>> {
        Modes::builtin().parse_list(s)
    }

    /// `dense`, the reference.
    pub fn dense() -> ModeSpec {
        ModeSpec {
            def: &DENSE,
            arg: ModeArg::None,
            dense_layers: Vec::new(),
            dtype: None,
        }
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
        if let Some(e) = env.filter(|e| e.shape() != shape) {
            return Err(Error::Mode {
                found: self.to_string(),
                why: format!(
                    "the Env was opened for {:?}, not this model's {shape:?}",
                    e.shape()
                ),
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

/// `ndp-topk:K`: the device selects (sinks, window, the `K` best per query), takes the GQA union
/// and returns only partials over it.
pub(crate) static NDP_TOPK: ModeDef = ModeDef {
    name: "ndp-topk",
    syntax: "ndp-topk:K",
    help: "sinks + local window + the K best stored tokens per query head, attended by the device \
           over the GQA group's union: only partials cross",
    takes: Takes::Budget,
    needs: Needs::Device,
    build: build_sparse,
};

/// `ndp-topp:P[:KMAX]`: the device selects the fewest tokens holding mass `P` and attends them.
pub(crate) static NDP_TOPP: ModeDef = ModeDef {
    name: "ndp-topp",
    syntax: "ndp-topp:P[:KMAX]",
    help: "the fewest stored tokens holding softmax mass P per query head (at most KMAX, default \
           2048), attended by the device over the GQA group's union: only partials cross",
    takes: Takes::Mass,
    needs: Needs::Device,
    build: build_sparse,
};

/// `pull-topk:K`: the host selects on its own key copy and pulls only the union's value rows.
pub(crate) static PULL_TOPK: ModeDef = ModeDef {
    name: "pull-topk",
    syntax: "pull-topk:K",
    help: "baseline (SAC-style): the host scores its own key copy, selects sinks + window + the K \
           best per query head and pulls only the GQA group's union of value rows",
    takes: Takes::Budget,
    needs: Needs::Pool,
    build: |spec, site| {
        let env = site.env(spec)?;
        if spec.arg == ModeArg::None {
            return Err(Error::Mode {
                found: spec.to_string(),
                why: "a selection mode needs a budget".into(),
            });
        }
        Ok(Box::new(PullTopK::new(env, spec, site.sequence())))
    },
};

fn build_sparse<'e>(spec: &ModeSpec, site: &Site<'e>) -> Result<Box<dyn Attention + 'e>> {
    let env = site.env(spec)?;
    if spec.arg == ModeArg::None {
        return Err(Error::Mode {
            found: spec.to_string(),
            why: "a selection mode needs a budget or a mass".into(),
        });
    }
    Ok(Box::new(NdpSparse::new(env, spec, site.sequence())))
}

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
            // Blocks sized for the widest element type a mode stores.
            let widest = specs
                .iter()
                .filter(|s| s.uses_pool())
                .filter_map(|s| s.dtype)
                .chain([opts.dtype])
                .max_by_key(|t| t.bytes(64))
                .unwrap_or(opts.dtype);
            Env::open_sized(opts, shape, max_tokens, widest).map(Some)
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mode::DEFAULT_TOPP_K_MAX;

    #[test]
    fn modes_parse_and_print_back() {
        for s in [
            "dense",
            "dense-f16",
            "pool",
            "ndp-exact",
            "topk:256",
            "topp:0.95",
            "topp:0.99:512",
            "topk:64+dense0",
            "topp:0.9+dense0-2+dense5",
            "ndp-topk:64",
            "ndp-topp:0.95:512+dense0",
            "pull-topk:256",
            "ndp-exact+int8",
            "ndp-topp:0.99+dense0+int4",
        ] {
            assert_eq!(ModeSpec::parse(s).unwrap().to_string(), s);
        }
        let q = ModeSpec::parse("ndp-topk:8+int8+dense1").unwrap();
        assert_eq!(
            (q.dtype, q.dense_layers.as_slice()),
            (Some(DType::I8), &[1][..])
        );
        assert!(ModeSpec::parse("ndp-exact+int8+f16").is_err());
        assert!(ModeSpec::parse("ndp-exact+int7").is_err());
        let m = ModeSpec::parse("topk:8+dense3+dense1-2").unwrap();
        assert_eq!(m.dense_layers, vec![1, 2, 3]);
        assert!(m.is_dense_layer(2) && !m.is_dense_layer(0));
        let p = ModeSpec::parse("topp:0.5").unwrap();
        assert_eq!(p.name(), "topp");
        assert_eq!(
            p.arg,
            ModeArg::Mass {
                p: 0.5,
                k_max: DEFAULT_TOPP_K_MAX
            }
        );
        let list = ModeSpec::parse_list("dense, pool,topk:4").unwrap();
        assert_eq!(list.len(), 3);
        assert!(!list[0].uses_pool() && list[1].uses_pool() && !list[1].uses_device());
        assert!(list[2].uses_device());
        assert_eq!(list[0], ModeSpec::dense());
    }

    #[test]
    fn bad_modes_say_why() {
        for (s, why) in [
            ("flash", "unknown mode"),
            ("topk", "needs a budget"),
            ("topk:0", "k ≥ 1"),
            ("topk:x", "not a count"),
            ("topp:0", "outside (0, 1]"),
            ("topp:1.5", "outside (0, 1]"),
            ("topp:nan", "outside (0, 1]"),
            ("topp:0.9:0", "cap"),
            ("pool+sparse", "unknown modifier"),
            ("topk:4+dense3-1", "empty"),
            ("topk:4+densex", "not a layer"),
            ("dense:3", "no argument"),
        ] {
            let e = ModeSpec::parse(s).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(s), "{s}: {e}");
        }
        assert!(ModeSpec::parse_list(" , ").is_err());
    }

    /// Moved from `cxlkv-model` (`unknown_backend_lists_the_known`), where the backend names
    /// were a second table: an unknown name is an error naming it and listing the known ones,
    /// and a private mode builds without a pool.
    #[test]
    fn unknown_mode_lists_the_known() {
        let e = ModeSpec::parse("flash").unwrap_err().to_string();
        assert!(
            e.contains("\"flash\"") && e.contains("dense, dense-f16, pool, ndp-exact"),
            "{e}"
        );
        let shape = cxlkv_model::AttentionShape {
            layers: 1,
            heads: 2,
            kv_heads: 1,
            head_dim: 16,
            scale: cxlkv_kernels::attention::default_scale(16),
        };
        let f16 = ModeSpec::parse("dense-f16").unwrap();
        assert_eq!(f16.backend(shape, None, 1).unwrap().name(), "dense-f16");
        let e = ModeSpec::parse("pool")
            .unwrap()
            .backend(shape, None, 1)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("needs the pool"), "{e}");
    }

    #[test]
    fn an_env_of_another_shape_is_refused() {
        let shape = cxlkv_model::AttentionShape {
            layers: 1,
            heads: 2,
            kv_heads: 1,
            head_dim: 16,
            scale: cxlkv_kernels::attention::default_scale(16),
        };
        let opts = EnvOptions {
            device: crate::DeviceChoice::Host,
            block_tokens: 4,
            ..EnvOptions::default()
        };
        let pool = ModeSpec::parse("pool").unwrap();
        let env = Env::open_for(std::slice::from_ref(&pool), &opts, shape, 16)
            .unwrap()
            .expect("pool needs an Env");
        let other = cxlkv_model::AttentionShape { layers: 2, ..shape };
        let e = pool
            .backend(other, Some(&env), 1)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("opened for"), "{e}");
        assert_eq!(pool.backend(shape, Some(&env), 1).unwrap().name(), "pool");
        let dense = [ModeSpec::dense()];
        assert!(Env::open_for(&dense, &opts, shape, 16).unwrap().is_none());
    }
}
