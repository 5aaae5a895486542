//! Fused attention over one block: the scores of the `G` queries of a GQA group against the
//! block's keys (the crate's [`ScoreKernel`], canonical order), their maximum, the exponentials and
//! the weighted sum of the value rows, as one [`Partial`] per query — the computation of the NDP
//! `ATTEND` command, equal to [`Partial::over_group`] over the same scores.

use crate::partial::Partial;
use crate::rows::{KeyRows, QueryGroup};
use crate::score::ScoreKernel;

/// The partials of the `G` queries over `keys` / `values` (same rows), scaled by `scale` before
/// `exp`.
pub fn attend_block(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    values: &KeyRows<'_>,
    scale: f32,
) -> Vec<Partial> {
    let g = queries.count();
    let mut scores = vec![0f32; keys.len() * g];
    kernel.score(queries, keys, &mut scores);
    Partial::over_group(values, &scores, g, scale)
}
