//! The attention backend seam: where a layer's keys and values live and how a query attends to
//! them. The model computes Q, K and V (RoPE applied) and hands them over; the backend stores K
//! and V and returns the attention output. Everything about memory (private, the cxlkv pool, a
//! near-data device) is the backend's business.
//!
//! Layouts, all f32, row-major:
//! - K and V given to [`Attention::append`]: `[kv_heads][t][head_dim]`, head-major, the layout
//!   of a typed pool block (`cxlkv_runtime::kv`), so a pool backend copies each head's rows as
//!   they are.
//! - Q given to [`Attention::attend`] and the output it writes: `[t][heads][head_dim]`,
//!   token-major, as the projections produce and consume them. The queries of one GQA group
//!   (heads `g·G .. (g+1)·G`, `G = heads / kv_heads`) are adjacent, which is what
//!   `cxlkv_kernels::QueryGroup` wants.
//!
//! Causality is positional: after `append` of `t` tokens a layer holds `n` positions, and query
//! `i` of the following `attend` (of the same `t` tokens) sits at position `n − t + i` and sees
//! keys `0 ..= n − t + i`.

mod contract;
mod dense;
mod host;

pub use contract::{check_append, check_attend, Attention, AttentionShape, AttentionStats};
pub use cxlkv_kernels::Partial;
pub use dense::Dense;
pub use host::{HeadRows, HostAttention};
