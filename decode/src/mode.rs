//! Attention modes as users name them on the command line (`dense`, `pool`, `ndp-exact`,
//! `topk:256`, `topp:0.95`, each optionally `+dense0-2` to keep layers exact): the one parser.
//!
//! A mode is a [`ModeDef`]: its name, the argument after `NAME:` ([`Takes`]), what it needs
//! (private memory, the pool, the device) and its constructor. [`Modes`] is a set of them (the
//! built-in [`MODES`], plus any a caller adds) and parses strings into [`ModeSpec`]s; a spec
//! carries its definition, so building its backend needs no second table (`registry.rs`).

use crate::error::{Error, Result};
use crate::registry::Site;
use cxlkv_model::Attention;
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

/// The built-in modes, in the order help texts list them.
pub static MODES: [&ModeDef; 6] = [
    &crate::registry::DENSE,
    &crate::registry::DENSE_F16,
    &crate::registry::POOL,
    &crate::registry::NDP_EXACT,
    &crate::registry::TOPK,
    &crate::registry::TOPP,
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
        for part in parts {
            let Some(range) = part.strip_prefix("dense") else {
                return Err(bad(format!(
                    "unknown modifier +{part}; the modifier is +denseL or +denseA-B"
                )));
            };
            dense_layers.extend(parse_layers(range).map_err(&bad)?);
        }
        let mut spec = ModeSpec {
            def,
            arg,
            dense_layers: Vec::new(),
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

/// The argument of `def` from what followed `NAME:` (`None`: no colon).
fn parse_arg(def: &ModeDef, arg: Option<&str>) -> std::result::Result<ModeArg, String> {
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

/// A mode, its argument, and the layers that stay exact under it.
#[derive(Clone, Debug)]
pub struct ModeSpec {
    def: &'static ModeDef,
    /// The mode's argument.
    pub arg: ModeArg,
    /// Layers computed by exact dense attention whatever the mode (`+dense0-1`, `--dense-layers`);
    /// sorted, no duplicates. Modes that keep K/V in private memory ignore them.
    pub dense_layers: Vec<usize>,
}

impl PartialEq for ModeSpec {
    fn eq(&self, other: &ModeSpec) -> bool {
        self.def.name == other.def.name
            && self.arg == other.arg
            && self.dense_layers == other.dense_layers
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
            def: &crate::registry::DENSE,
            arg: ModeArg::None,
            dense_layers: Vec::new(),
        }
    }

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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            assert_eq!(ModeSpec::parse(s).unwrap().to_string(), s);
        }
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
}
