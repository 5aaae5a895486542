//! Quantized blocks (dtype int8, int4) as the device and the host fallback compute on them, one
//! implementation for both so their answers stay bit-identical:
//!
//! - **Scores.** A query group is folded with the block's per-channel key scales
//!   ([`cxlkv_kernels::quant::fold_key_scales`]) and scored against the codes: the score of query
//!   `q` against token `i` is `Σ_d (q_d · s_d) · code_id`, in the kernels' canonical order. This is
//!   the score every engine reports for a quantized block ([`FoldedTopK`], [`fold`]).
//! - **ATTEND.** The folded queries attend the codes with the per-token value scales
//!   ([`attend`]: [`cxlkv_kernels::attend::attend_block_scaled`]).
//! - **Gathered rows** come back dequantized to f32 ([`dequantize_row`]), so a host needs no
//!   scales; the result header's dtype says f32 ([`crate::ndp::block::gathered_dtype`]).

use cxlkv_kernels::attend::attend_block_scaled;
use cxlkv_kernels::quant::{dequantize_values, fold_key_scales};
use cxlkv_kernels::scan::{new_selectors, scan_chunks};
use cxlkv_kernels::{
    DType, GroupMode, Hit, KeyRows, Partial, QueryGroup, ScoreKernel, TopK, TopKSelector,
};

/// The queries of `queries` folded with a block's key scales (`dim` f32): `q'[g][d] = q[g][d] ·
/// scales[d]`, `G × dim` f32 to build a [`QueryGroup`] from.
pub fn fold(queries: &QueryGroup<'_>, k_scales: &[f32]) -> Vec<f32> {
    fold_key_scales(queries.data(), queries.dim(), k_scales)
}

/// Scores of `queries` against every row of a quantized block's key codes, key-major
/// (`keys.len() × G`), as [`ScoreKernel::score`] writes them.
pub fn score(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    k_scales: &[f32],
    out: &mut Vec<f32>,
) {
    let folded = fold(queries, k_scales);
    let q = QueryGroup::new(&folded, queries.dim()).expect("folding keeps the group's shape");
    out.resize(keys.len() * queries.count(), 0.0);
    kernel.score(&q, keys, out);
}

/// The partials of `queries` over a quantized block: folded queries over the key codes, value
/// codes weighted by their per-token scales.
pub fn attend(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    values: &KeyRows<'_>,
    scales: (&[f32], &[f32]),
    scale: f32,
) -> Vec<Partial> {
    let folded = fold(queries, scales.0);
    let q = QueryGroup::new(&folded, queries.dim()).expect("folding keeps the group's shape");
    attend_block_scaled(kernel, &q, keys, values, Some(scales.1), scale)
}

/// One value row of codes (`dtype.bytes(dim)` bytes) dequantized with its token's scale, as
/// little-endian f32 bytes (`4 × dim`).
pub fn dequantize_row(codes: &[u8], dim: usize, dtype: DType, scale: f32) -> Vec<u8> {
    dequantize_values(codes, dim, dtype, &[scale])
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
}

/// A plain (unpruned) top-k scan over quantized blocks in list order: each block's keys scored
/// with the queries folded by that block's key scales, through the kernels' chunk loop
/// ([`scan_chunks`]), so the lists equal a [`cxlkv_kernels::PrunedScan`] in order over the same
/// scores.
pub struct FoldedTopK<'q> {
    kernel: ScoreKernel,
    queries: QueryGroup<'q>,
    mode: GroupMode,
    selectors: Vec<TopKSelector>,
    scores: Vec<f32>,
}

impl<'q> FoldedTopK<'q> {
    /// Lists of the `topk.k` best keys for `queries`.
    pub fn new(kernel: ScoreKernel, queries: &QueryGroup<'q>, topk: TopK) -> FoldedTopK<'q> {
        FoldedTopK {
            kernel,
            queries: *queries,
            mode: topk.mode,
            selectors: new_selectors(queries, topk),
            scores: Vec::new(),
        }
    }

    /// Scores one block's key codes (token `base + i` is row `i`) with its key scales.
    pub fn block(&mut self, keys: &KeyRows<'_>, base: u32, k_scales: &[f32]) {
        let folded = fold(&self.queries, k_scales);
        let q = QueryGroup::new(&folded, self.queries.dim()).expect("folding keeps the shape");
        scan_chunks(
            self.kernel,
            &q,
            keys,
            base,
            self.mode,
            &mut self.selectors,
            &mut self.scores,
        );
    }

    /// The lists, best first.
    pub fn finish(self) -> Vec<Vec<Hit>> {
        self.selectors
            .into_iter()
            .map(TopKSelector::into_sorted)
            .collect()
    }
}
