//! # cxlkv-decode
//!
//! The attention backends that put the reference decoder's KV cache into the cxlkv pool and its
//! attention next to the memory: `pool` (K/V stored as typed blocks, pulled back by the host),
//! `ndp-exact` (the device's exact partials merged with the host's), `topk:K` and `topp:P`
//! (selections made by the device, value rows gathered), with layers kept exact on request.
//! [`ModeSpec`] is how users name them.

mod backend;
mod env;
mod error;
mod exact;
mod host;
mod layered;
mod mode;
mod phases;
mod pool_attn;
mod select;
mod store;

pub use cxlkv_ndp::daemon::find_ndpd;
pub use env::{DeviceChoice, Env, EnvOptions};
pub use error::{Error, Result};
pub use mode::{parse_layers, Mode, ModeSpec, DEFAULT_TOPP_K_MAX, MODES};
pub use phases::Phased;
