//! The crate docs' recipe for a new mode, followed step by step for a toy `window:N` mode
//! (sliding-window attention: each query sees only the last `N` positions up to its own), which
//! then runs through the same parser and factory as the built-in modes.

use cxlkv_decode::{ModeArg, ModeDef, ModeSpec, Modes, Needs, Site, Takes};
use cxlkv_kernels::DType;
use cxlkv_model::attention::check_attend;
use cxlkv_model::{Attention, AttentionShape, AttentionStats, Dense, HeadRows, HostAttention};

// Step 1: the backend. K/V in private memory (a `Dense` holds them), attention computed by the
// one host loop over each query's window: no copy of the loop.
struct Window {
    name: String,
    window: usize,
    shape: AttentionShape,
    rows: Dense,
    host: HostAttention,
    stats: AttentionStats,
}

impl Attention for Window {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self, layer: usize) -> usize {
        self.rows.len(layer)
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> cxlkv_model::Result<()> {
        self.rows.append(layer, k, v)
    }

    fn attend(&mut self, layer: usize, q: &[f32], out: &mut [f32]) -> cxlkv_model::Result<()> {
        let held = self.rows.len(layer);
        let t = check_attend(&self.shape, &self.name, held, q, out)?;
        let (d, g) = (self.shape.head_dim, self.shape.group());
        let row = self.shape.heads * d;
        for kv in 0..self.shape.kv_heads {
            let all = HeadRows {
                keys: self.rows.rows(layer, kv, false).expect("layer checked"),
                values: self.rows.rows(layer, kv, true).expect("layer checked"),
            };
            for i in 0..t {
                let visible = held - t + i + 1;
                let from = visible.saturating_sub(self.window);
                let group = &q[i * row + kv * g * d..i * row + (kv + 1) * g * d];
                let parts = self
                    .host
                    .group(&self.shape, all.slice(from, visible), group);
                for (j, p) in parts.iter().enumerate() {
                    let at = i * row + (kv * g + j) * d;
                    p.finish_into(&mut out[at..at + d]);
                }
                self.stats.query_heads += g as u64;
                self.stats.value_rows += (g * (visible - from)) as u64;
            }
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.rows.clear();
    }

    fn stats(&self) -> AttentionStats {
        self.stats
    }
}

// Step 2: its definition. Step 3: registered below, with `Modes::builtin().with(&WINDOW)`.
static WINDOW: ModeDef = ModeDef {
    name: "window",
    syntax: "window:N",
    help: "private memory, each query attends to the last N positions (sliding window)",
    takes: Takes::Budget,
    needs: Needs::Private,
    build: build_window,
};

fn build_window<'e>(
    spec: &ModeSpec,
    site: &Site<'e>,
) -> cxlkv_decode::Result<Box<dyn Attention + 'e>> {
    let ModeArg::Budget(window) = spec.arg else {
        unreachable!("the registry parsed a budget");
    };
    Ok(Box::new(Window {
        name: spec.to_string(),
        window,
        shape: site.shape(),
        rows: Dense::new(site.shape(), DType::F32)?,
        host: HostAttention::new(),
        stats: AttentionStats::default(),
    }))
}

fn shape() -> AttentionShape {
    AttentionShape {
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        scale: cxlkv_kernels::attention::default_scale(16),
    }
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.5 - 1.0)
        .collect()
}

/// A prefill of 5 positions then 6 single ones, through `a`; every output.
fn run(a: &mut dyn Attention, s: &AttentionShape) -> Vec<Vec<f32>> {
    let mut outs = Vec::new();
    for (step, t) in [5usize, 1, 1, 1, 1, 1, 1].into_iter().enumerate() {
        let k = values(s.kv_heads * t * s.head_dim, 3 * step);
        let v = values(s.kv_heads * t * s.head_dim, 3 * step + 1);
        let q = values(t * s.heads * s.head_dim, 3 * step + 2);
        for layer in 0..s.layers {
            a.append(layer, &k, &v).unwrap();
            let mut out = vec![0.0; q.len()];
            a.attend(layer, &q, &mut out).unwrap();
            outs.push(out);
        }
    }
    outs
}

#[test]
fn a_registered_mode_parses_and_builds_like_the_built_in_ones() {
    // Unregistered, the name is unknown.
    let e = ModeSpec::parse("window:4").unwrap_err().to_string();
    assert!(e.contains("unknown mode"), "{e}");

    // Step 3: registered; step 4: parsed and built through the one path.
    let modes = Modes::builtin().with(&WINDOW);
    assert!(modes.help().contains("window:N: private memory"));
    let spec = modes.parse("window:4").unwrap();
    assert_eq!(spec.to_string(), "window:4");
    assert_eq!(spec.arg, ModeArg::Budget(4));
    assert!(!spec.uses_pool() && !spec.uses_device());
    for (bad, why) in [("window", "needs a budget"), ("window:0", "k ≥ 1")] {
        let e = modes.parse(bad).unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
    let e = modes.parse("flash").unwrap_err().to_string();
    assert!(e.contains("window:N"), "the known modes list it: {e}");
    let list = modes.parse_list("dense,window:2").unwrap();
    assert_eq!(list[0], ModeSpec::dense());
    let e = modes
        .parse("window:2+dense7")
        .unwrap()
        .backend(shape(), None, 1)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("layer 7"),
        "the factory's layer check applies: {e}"
    );

    // Step 5: against dense. A window over every position is dense, bit for bit (one loop).
    let s = shape();
    let dense = run(ModeSpec::dense().backend(s, None, 1).unwrap().as_mut(), &s);
    let mut wide = modes
        .parse("window:64")
        .unwrap()
        .backend(s, None, 2)
        .unwrap();
    assert_eq!(wide.name(), "window:64");
    assert_eq!(run(wide.as_mut(), &s), dense);
    // A window of one position returns that position's value row.
    let mut one = modes
        .parse("window:1")
        .unwrap()
        .backend(s, None, 3)
        .unwrap();
    let outs = run(one.as_mut(), &s);
    assert_ne!(outs, dense);
    let last = outs.last().unwrap();
    let v = values(s.kv_heads * s.head_dim, 3 * 6 + 1);
    for h in 0..s.heads {
        let kv = h / s.group();
        let want = &v[kv * s.head_dim..(kv + 1) * s.head_dim];
        let got = &last[h * s.head_dim..(h + 1) * s.head_dim];
        for (a, b) in got.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "head {h}: {got:?} against {want:?}");
        }
    }
    let st = one.stats();
    assert_eq!(st.value_rows, st.query_heads, "one row per query head");
}
