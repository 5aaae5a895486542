//! # cxlkv-decode
//!
//! Where the reference decoder's KV cache goes into the cxlkv pool and its attention next to the
//! memory, and the one registry of attention modes: every mode, `dense` included, is named,
//! parsed and built here, and nowhere else.
//!
//! | mode            | K/V                 | attention                                                     |
//! |-----------------|---------------------|---------------------------------------------------------------|
//! | `dense`         | private, f32        | exact, on the host (the reference)                            |
//! | `dense-f16`     | private, f16        | exact over f16 rows, on the host                              |
//! | `pool`          | pool, typed blocks  | every row read back, exact, on the host                       |
//! | `ndp-exact`     | pool                | the device's exact partials over stored blocks + the host's   |
//! | `ndp-topk:K`    | pool                | the device selects per query, attends the GQA union: partials |
//! | `ndp-topp:P[:KMAX]` | pool            | the same by softmax mass `P`: only partials cross the link    |
//! | `topk:K`        | pool                | sinks, window and the `K` best stored tokens (device-chosen)  |
//! | `pull-topk:K`   | pool                | baseline: the host selects on its key copy, pulls the rows    |
//! | `topp:P[:KMAX]` | pool                | the fewest stored tokens holding softmax mass `P`             |
//!
//! Any of them `+denseL` / `+denseA-B` keeps layers exact in private memory.
//!
//! ## Main types
//!
//! - [`ModeDef`]: one mode (name, argument, what it needs, constructor); [`MODES`] the built-in
//!   ones; [`Modes`] a set of them and the one parser (`parse`, `parse_list`).
//! - [`ModeSpec`]: a parsed mode. [`ModeSpec::backend`] is the one factory: the spec carries its
//!   definition, so building needs no second table.
//! - [`Env`]: what the pool modes run in (the pool, this process's participant, the near-data
//!   device: a thread, a `cxlkv-ndpd` process or none). [`Env::backend`] builds on it.
//! - [`Phased`]: tells a generation's prefill traffic from its decode steps'.
//!
//! A run: parse, open an `Env` if a mode needs one, build, decode.
//!
//! ```
//! use cxlkv_decode::{DeviceChoice, Env, EnvOptions, ModeSpec};
//! use cxlkv_kernels::attention::default_scale;
//! use cxlkv_model::{Attention, AttentionShape};
//!
//! let (layers, heads, kv_heads, head_dim) = (1, 2, 1, 16);
//! let scale = default_scale(head_dim);
//! let shape = AttentionShape { layers, heads, kv_heads, head_dim, scale };
//! let specs = ModeSpec::parse_list("dense,pool")?;
//! let opts = EnvOptions { device: DeviceChoice::Host, block_tokens: 4, ..EnvOptions::default() };
//! let env = Env::open_for(&specs, &opts, shape, 64)?; // a private pool, removed on drop
//! let (k, v, q) = (vec![0.5f32; 3 * 16], vec![1.0f32; 3 * 16], vec![0.1f32; 3 * 2 * 16]);
//! let mut outs = Vec::new();
//! for (seq, spec) in specs.iter().enumerate() {
//!     let mut attn = spec.backend(shape, env.as_ref(), seq as u64 + 1)?;
//!     attn.append(0, &k, &v)?;
//!     let mut out = vec![0.0; q.len()];
//!     attn.attend(0, &q, &mut out)?;
//!     outs.push(out);
//! }
//! assert_eq!(outs[0], outs[1]); // pool == dense, bit for bit
//! # Ok::<(), cxlkv_decode::Error>(())
//! ```
//!
//! ## Invariants
//!
//! - One attention loop: every attention the host computes goes through
//!   [`cxlkv_model::HostAttention`], the loop [`cxlkv_model::Dense`] runs, so `pool` gives
//!   `dense`'s outputs bit for bit by construction (`tests/backends.rs`), and `ndp-exact` differs
//!   only by the order of the log-sum-exp merge of the device's and the host's partials.
//! - The selection modes are exact at a budget over every position (`topk` ≥ positions,
//!   `topp:1.0`) and approximate below it; a prefill (several queries) is always exact.
//! - Backends alive at once on one [`Env`] hold different sequence ids; a private pool is removed
//!   when its `Env` drops, after the device and the participant.
//! - Bad input is an error, not a panic: an unknown mode, a layer that does not exist, a model
//!   shape the device cannot take, a pool too small for the run.
//! - The statistics ([`cxlkv_model::AttentionStats`]) count every byte the host reads from or
//!   writes to pool memory: what crosses the link on CXL hardware.
//!
//! ## Adding a mode
//!
//! `tests/new_mode.rs` follows these steps for a toy `window:N` mode and runs it through the same
//! parser and factory as the built-in ones.
//!
//! 1. **Write the backend**: a type implementing [`cxlkv_model::Attention`]. Keep K/V where the
//!    mode keeps them; compute the host's share with [`cxlkv_model::HostAttention`] (`causal`
//!    over every visible row, `group` over a subset) and merge partials from elsewhere with
//!    [`cxlkv_model::Partial::merge`]. Never copy the attention loop.
//! 2. **Write its [`ModeDef`]**: `name` (before any `:`), `syntax` and `help` for help texts,
//!    `takes` (the argument after `NAME:`, parsed by the registry into [`ModeArg`]), `needs`
//!    (private memory, the pool or the device) and `build`, a function from the [`ModeSpec`] and
//!    the [`Site`] (shape, sequence, `site.env(spec)?` for the pool) to the boxed backend.
//! 3. **Register it**: a mode of this crate goes into [`MODES`] (the built-in definitions live in
//!    `registry.rs`), and the command line (`cxlkv generate --attention`, `cxlkv eval --modes`)
//!    takes it from there; a mode defined elsewhere is added to a set,
//!    `Modes::builtin().with(&MY_MODE)`.
//! 4. **Parse and build through the one path**: `modes.parse("name:arg+dense0")` gives a
//!    [`ModeSpec`], and [`ModeSpec::backend`] (or [`Env::backend`]) builds it, with the `+dense`
//!    layers and the layer checks every mode gets.
//! 5. **Test it against `dense`** on the same keys, values and queries (the harness of
//!    `tests/backends.rs`): outputs equal bit for bit where it reads every row through
//!    `HostAttention`, to float rounding where it merges partials, within a stated error where
//!    it selects; then greedy tokens on the real model (`tests/greedy.rs`).

mod env;
mod error;
mod exact;
mod layered;
mod mode;
mod phases;
mod pool_attn;
mod pull;
mod registry;
mod select;
mod sparse;
mod store;

pub use cxlkv_ndp::daemon::find_ndpd;
pub use env::{DeviceChoice, Env, EnvOptions, SketchOption};
pub use error::{Error, Result};
pub use mode::{
    parse_layers, Build, ModeArg, ModeDef, ModeSpec, Needs, Site, Takes, DEFAULT_TOPP_K_MAX,
};
pub use phases::Phased;
pub use registry::{Modes, MODES};
