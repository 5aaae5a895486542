//! Attention modes as users name them on the command line (`dense`, `pool`, `ndp-exact`,
//! `topk:256`, `topp:0.95`, each optionally `+dense0-2` to keep layers exact and `+int8` (any
//! `--dtype`) for its blocks' element type): what a mode is.
//!
//! A mode is a [`ModeDef`]: its name, the argument after `NAME:` ([`Takes`]), what it needs
//! (private memory, the pool, the device) and its constructor, which builds the backend on a
//! [`Site`]. A parsed mode is a [`ModeSpec`]; it carries its definition, so building its backend
//! needs no second table. The set of modes, the parser and the factory are in `registry.rs`.

use crate::env::Env;
use crate::error::{Error, Result};
use cxlkv_kernels::DType;
use cxlkv_model::{Attention, AttentionShape};
use std::fmt;

/// What a mode's backend needs beside the model's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Needs {
    /// Nothing: K/V in private memory.
    Private,
    /// The pool (an [`Env`](crate::Env)): K/V stored as typed blocks.
    Pool,
    /// The pool and its near-data device.
    Device,
}

/// The argument a mode takes after `NAME:`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takes {
    /// None (`dense`, `pool`).
    Nothing,
    /// A count of at least 1 (`topk:K`).
    Budget,
    /// A softmax mass in (0, 1] and an optional cap (`topp:P[:KMAX]`, cap
    /// [`DEFAULT_TOPP_K_MAX`] when left out).
    Mass,
}

/// A mode's parsed argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ModeArg {
    /// No argument.
    None,
    /// A count: tokens selected by score per query head (`topk:K`).
    Budget(usize),
    /// The smallest set of tokens whose exact softmax mass reaches `p`, at most `k_max`.
    Mass {
        /// Softmax mass to reach, in (0, 1].
        p: f32,
        /// Cap on the tokens selected, per query head.
        k_max: usize,
    },
}

/// The constructor of a mode's backend: for `spec` (its argument, its name for messages), on
/// `site` (the model's shape, the sequence, the run's [`Env`](crate::Env) if there is one).
pub type Build = for<'e> fn(&ModeSpec, &Site<'e>) -> Result<Box<dyn Attention + 'e>>;

/// One attention mode: everything the parser and the factory know about it.
pub struct ModeDef {
    /// The name, as written before any `:` (`topk`).
    pub name: &'static str,
    /// The syntax shown in help texts (`topk:K`).
    pub syntax: &'static str,
    /// One line for help texts.
    pub help: &'static str,
    /// The argument after `NAME:`.
    pub takes: Takes,
    /// What the backend needs beside the model's shape.
    pub needs: Needs,
    /// The constructor.
    pub build: Build,
}

impl fmt::Debug for ModeDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// Default cap of a `topp:P` mode without an explicit `:KMAX`.
pub const DEFAULT_TOPP_K_MAX: usize = 2048;

/// The argument of `def` from what followed `NAME:` (`None`: no colon).
pub(crate) fn parse_arg(def: &ModeDef, arg: Option<&str>) -> std::result::Result<ModeArg, String> {
    let name = def.name;
    match (def.takes, arg) {
        (Takes::Nothing, None) => Ok(ModeArg::None),
        (Takes::Nothing, Some(a)) => Err(format!("{name} takes no argument (got {a:?})")),
        (Takes::Budget | Takes::Mass, None) => {
            Err(format!("{name} needs a budget, e.g. {}", def.syntax))
        }
        (Takes::Budget, Some(k)) => {
            let k: usize = k
                .parse()
                .map_err(|_| format!("{name} budget {k:?} is not a count"))?;
            if k == 0 {
                return Err(format!("{name} needs k ≥ 1"));
            }
            Ok(ModeArg::Budget(k))
        }
        (Takes::Mass, Some(rest)) => {
            let (p, k_max) = match rest.split_once(':') {
                Some((p, m)) => (
                    p,
                    m.parse::<usize>()
                        .ok()
                        .filter(|&m| m > 0)
                        .ok_or_else(|| format!("top-p cap {m:?} is not a count ≥ 1"))?,
                ),
                None => (rest, DEFAULT_TOPP_K_MAX),
            };
            let p: f32 = p
                .parse()
                .map_err(|_| format!("top-p mass {p:?} is not a number"))?;
            if !(p > 0.0 && p <= 1.0) {
                return Err(format!("top-p mass {p} is outside (0, 1]"));
            }
            Ok(ModeArg::Mass { p, k_max })
        }
    }
}

/// Where a backend is built: the model's attention shape, the sequence it holds, and the run's
/// [`Env`] (the pool and the device) if one is open.
pub struct Site<'e> {
    pub(crate) shape: AttentionShape,
    pub(crate) env: Option<&'e Env>,
    pub(crate) sequence: u64,
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

/// A mode, its argument, and the layers that stay exact under it.
#[derive(Clone, Debug)]
pub struct ModeSpec {
    pub(crate) def: &'static ModeDef,
    /// The mode's argument.
    pub arg: ModeArg,
    /// Layers computed by exact dense attention whatever the mode (`+dense0-1`, `--dense-layers`);
    /// sorted, no duplicates. Modes that keep K/V in private memory ignore them.
    pub dense_layers: Vec<usize>,
    /// Element type of this mode's stored blocks (`+int8`), instead of the [`Env`]'s
    /// (`EnvOptions::dtype`), so that one run compares dtypes; modes that keep K/V in private
    /// memory ignore it.
    pub dtype: Option<DType>,
}

impl PartialEq for ModeSpec {
    fn eq(&self, other: &ModeSpec) -> bool {
        self.def.name == other.def.name
            && self.arg == other.arg
            && self.dense_layers == other.dense_layers
            && self.dtype == other.dtype
    }
}

impl ModeSpec {
    /// The mode's definition.
    pub fn def(&self) -> &'static ModeDef {
        self.def
    }

    /// The mode's name (`topk`, without argument or layers).
    pub fn name(&self) -> &'static str {
        self.def.name
    }

    /// Adds layers that stay exact (the command line's `--dense-layers`).
    pub fn add_dense_layers(&mut self, layers: &[usize]) {
        self.dense_layers.extend_from_slice(layers);
        self.dense_layers.sort_unstable();
        self.dense_layers.dedup();
    }

    /// True if `layer` is computed by exact dense attention under this spec.
    pub fn is_dense_layer(&self, layer: usize) -> bool {
        self.dense_layers.binary_search(&layer).is_ok()
    }

    /// True if the mode keeps K/V in the pool (and so needs an [`Env`](crate::Env)).
    pub fn uses_pool(&self) -> bool {
        self.def.needs >= Needs::Pool
    }

    /// True if the mode sends commands to the near-data device.
    pub fn uses_device(&self) -> bool {
        self.def.needs == Needs::Device
    }
}

/// Parses `--dense-layers 0,3-5` (also used after `+dense`: `0`, `0-2`).
pub fn parse_layers(s: &str) -> std::result::Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for item in s.split(',').filter(|x| !x.is_empty()) {
        let num = |x: &str| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("layer {x:?} is not a layer number"))
        };
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("layer range {a}-{b} is empty"));
                }
                out.extend(a..=b);
            }
            None => out.push(num(item)?),
        }
    }
    if out.is_empty() {
        return Err(format!("no layer in {s:?}"));
    }
    Ok(out)
}

impl fmt::Display for ModeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.def.name)?;
        match self.arg {
            ModeArg::None => {}
            ModeArg::Budget(k) => write!(f, ":{k}")?,
            ModeArg::Mass { p, k_max } if k_max == DEFAULT_TOPP_K_MAX => write!(f, ":{p}")?,
            ModeArg::Mass { p, k_max } => write!(f, ":{p}:{k_max}")?,
        }
        // Runs of consecutive layers print as ranges.
        let mut i = 0;
        let d = &self.dense_layers;
        while i < d.len() {
            let mut j = i;
            while j + 1 < d.len() && d[j + 1] == d[j] + 1 {
                j += 1;
            }
            if i == j {
                write!(f, "+dense{}", d[i])?;
            } else {
                write!(f, "+dense{}-{}", d[i], d[j])?;
            }
            i = j + 1;
        }
        if let Some(t) = self.dtype {
            write!(f, "+{}", t.name())?;
        }
        Ok(())
    }
}
