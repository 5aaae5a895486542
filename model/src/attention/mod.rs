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

pub use contract::{check_append, check_attend, Attention, AttentionShape, AttentionStats};
pub use cxlkv_kernels::Partial;
pub use dense::Dense;

use crate::error::{Error, Result};
use cxlkv_kernels::DType;

/// The backends [`backend`] builds, with a line each.
pub const BACKENDS: &[(&str, &str)] = &[
    (
        "dense",
        "private memory, f32 keys and values (the reference)",
    ),
    ("dense-f16", "private memory, f16 keys and values"),
];

/// The backend called `name`, for a model of `shape`. Unknown names are an error listing the
/// known ones.
pub fn backend(name: &str, shape: AttentionShape) -> Result<Box<dyn Attention>> {
    match name {
        "dense" => Ok(Box::new(Dense::new(shape, DType::F32)?)),
        "dense-f16" => Ok(Box::new(Dense::new(shape, DType::F16)?)),
        other => Err(Error::UnknownBackend {
            found: other.to_string(),
            known: BACKENDS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_backend_lists_the_known() {
        let shape = AttentionShape {
            layers: 1,
            heads: 2,
            kv_heads: 1,
            head_dim: 16,
            scale: 0.25,
        };
        let e = backend("pool", shape).err().unwrap().to_string();
        assert!(
            e.contains("\"pool\"") && e.contains("dense, dense-f16"),
            "{e}"
        );
        assert_eq!(backend("dense-f16", shape).unwrap().name(), "dense-f16");
    }
}
