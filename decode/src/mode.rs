//! Attention modes as users name them on the command line (`dense`, `pool`, `ndp-exact`,
//! `topk:256`, `topp:0.95`, each optionally `+dense0-2` to keep layers exact), parsed into
//! [`ModeSpec`]s.

use crate::error::{Error, Result};
use std::fmt;

/// Where K/V live and how a query's attention is computed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Private memory, f32 K/V (the reference).
    Dense,
    /// Private memory, f16 K/V.
    DenseF16,
    /// K/V written to the pool as typed blocks; the host reads every key and value back.
    Pool,
    /// K/V in the pool; the device computes each query's exact partial attention over the stored
    /// blocks, merged on the host with the open block's.
    NdpExact,
    /// Sinks + local window + the `k` best-scoring stored tokens, their value rows gathered by
    /// the device.
    TopK {
        /// Tokens selected by score, per query head.
        k: usize,
    },
    /// The smallest set of stored tokens whose exact softmax mass reaches `p`, at most `k_max`.
    TopP {
        /// Softmax mass to reach, in (0, 1].
        p: f32,
        /// Cap on the tokens selected, per query head.
        k_max: usize,
    },
}

/// Default cap of a `topp:P` mode without an explicit `:KMAX`.
pub const DEFAULT_TOPP_K_MAX: usize = 2048;

/// A mode and the layers that stay exact under it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeSpec {
    /// The mode.
    pub mode: Mode,
    /// Layers computed by exact dense attention whatever the mode (`+dense0-1`, `--dense-layers`);
    /// sorted, no duplicates.
    pub dense_layers: Vec<usize>,
}

/// The mode names with a line each, for help texts and errors.
pub const MODES: &[(&str, &str)] = &[
    ("dense", "private memory, f32 K/V: the reference"),
    ("dense-f16", "private memory, f16 K/V"),
    ("pool", "K/V in the pool as typed blocks, every key and value pulled back by the host"),
    (
        "ndp-exact",
        "K/V in the pool, exact partial attention computed by the device, merged on the host",
    ),
    (
        "topk:K",
        "sinks + local window + the K best stored tokens per query head, values gathered by the device",
    ),
    (
        "topp:P[:KMAX]",
        "the fewest stored tokens holding softmax mass P (0 < P <= 1), at most KMAX (default 2048)",
    ),
];

fn known() -> String {
    let names: Vec<&str> = MODES.iter().map(|(n, _)| *n).collect();
    format!(
        "{} (any of them + `+denseL` or `+denseA-B` to keep layers exact)",
        names.join(", ")
    )
}

impl ModeSpec {
    /// Parses one mode: `NAME[+denseL|+denseA-B]...`.
    pub fn parse(s: &str) -> Result<ModeSpec> {
        let bad = |why: String| Error::Mode {
            found: s.to_string(),
            why,
        };
        let mut parts = s.trim().split('+');
        let head = parts.next().unwrap_or_default();
        let mode = match head.split_once(':') {
            None => match head {
                "dense" => Mode::Dense,
                "dense-f16" => Mode::DenseF16,
                "pool" => Mode::Pool,
                "ndp-exact" => Mode::NdpExact,
                "topk" | "topp" => {
                    return Err(bad(format!("{head} needs a budget, e.g. {head}:…")))
                }
                _ => return Err(bad(format!("unknown mode; known: {}", known()))),
            },
            Some(("topk", k)) => {
                let k: usize = k
                    .parse()
                    .map_err(|_| bad(format!("topk budget {k:?} is not a count")))?;
                if k == 0 {
                    return Err(bad("topk needs k ≥ 1".into()));
                }
                Mode::TopK { k }
            }
            Some(("topp", rest)) => {
                let (p, k_max) = match rest.split_once(':') {
                    Some((p, m)) => (
                        p,
                        m.parse::<usize>()
                            .ok()
                            .filter(|&m| m > 0)
                            .ok_or_else(|| bad(format!("top-p cap {m:?} is not a count ≥ 1")))?,
                    ),
                    None => (rest, DEFAULT_TOPP_K_MAX),
                };
                let p: f32 = p
                    .parse()
                    .map_err(|_| bad(format!("top-p mass {p:?} is not a number")))?;
                if !(p > 0.0 && p <= 1.0) {
                    return Err(bad(format!("top-p mass {p} is outside (0, 1]")));
                }
                Mode::TopP { p, k_max }
            }
            Some(_) => return Err(bad(format!("unknown mode; known: {}", known()))),
        };
        let mut dense_layers = Vec::new();
        for part in parts {
            let Some(range) = part.strip_prefix("dense") else {
                return Err(bad(format!(
                    "unknown modifier +{part}; the modifier is +denseL or +denseA-B"
                )));
            };
            dense_layers.extend(parse_layers(range).map_err(bad)?);
        }
        let mut spec = ModeSpec {
            mode,
            dense_layers: Vec::new(),
        };
        spec.add_dense_layers(&dense_layers);
        Ok(spec)
    }

    /// Parses a comma-separated list of modes (`--modes dense,pool,topk:256`).
    pub fn parse_list(s: &str) -> Result<Vec<ModeSpec>> {
        let specs: Vec<ModeSpec> = s
            .split(',')
            .filter(|m| !m.trim().is_empty())
            .map(ModeSpec::parse)
            .collect::<Result<_>>()?;
        if specs.is_empty() {
            return Err(Error::Mode {
                found: s.to_string(),
                why: format!("no mode given; known: {}", known()),
            });
        }
        Ok(specs)
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

    /// True if the mode keeps K/V in the pool (and so needs one).
    pub fn uses_pool(&self) -> bool {
        !matches!(self.mode, Mode::Dense | Mode::DenseF16)
    }

    /// True if the mode sends commands to the near-data device.
    pub fn uses_device(&self) -> bool {
        matches!(
            self.mode,
            Mode::NdpExact | Mode::TopK { .. } | Mode::TopP { .. }
        )
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
        match self.mode {
            Mode::Dense => write!(f, "dense")?,
            Mode::DenseF16 => write!(f, "dense-f16")?,
            Mode::Pool => write!(f, "pool")?,
            Mode::NdpExact => write!(f, "ndp-exact")?,
            Mode::TopK { k } => write!(f, "topk:{k}")?,
            Mode::TopP { p, k_max } if k_max == DEFAULT_TOPP_K_MAX => write!(f, "topp:{p}")?,
            Mode::TopP { p, k_max } => write!(f, "topp:{p}:{k_max}")?,
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
        assert_eq!(
            ModeSpec::parse("topp:0.5").unwrap().mode,
            Mode::TopP {
                p: 0.5,
                k_max: DEFAULT_TOPP_K_MAX
            }
        );
        let list = ModeSpec::parse_list("dense, pool,topk:4").unwrap();
        assert_eq!(list.len(), 3);
        assert!(!list[0].uses_pool() && list[1].uses_pool() && !list[1].uses_device());
        assert!(list[2].uses_device());
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
        ] {
            let e = ModeSpec::parse(s).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(s), "{s}: {e}");
        }
        assert!(ModeSpec::parse_list(" , ").is_err());
    }
}
