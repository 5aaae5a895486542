//! The sparse ATTEND over rows picked one by one (ABI 1.3): with a key sketch
//! (`CXLKV_NDP_SEL_SKETCH`), and over quantized blocks. One implementation for the device and the
//! host fallback, which differ only in how they read a block ([`BlockRows`]: in place under a pin,
//! or pulled across the link), so their answers are bit-identical.
//!
//! **With a sketch** ([`crate::kv::Sketch`]), for a group of `G` queries and `c` candidates:
//! 1. every stored token is scored on its block's sketch, with the queries folded by the
//!    sketch's per-channel scales (int4 codes: [`crate::ndp::quant::score`]; sign bits:
//!    [`cxlkv_kernels::sign::score`]), in block-list order;
//! 2. per query, the candidates are the forced tokens (sinks, window) and the `c` best others by
//!    sketch score; `C` is their union over the group, sorted by token;
//! 3. `C`'s key rows are read and scored exactly, and fed to the [`Selection`] in token order; every
//!    other stored token adds its sketch term to the mass only (block-list order), so a top-p
//!    selection reaches its mass over an estimate of the whole softmax;
//! 4. the union `U ⊂ C` of the lists is attended exactly: `U`'s key rows come from step 3, its
//!    value rows are read.
//!
//! The device reads the sketch, `|C|` key rows and `|U|` value rows instead of every key: on f32
//! keys an int4 sketch is an eighth of them.
//!
//! **Without a sketch** (quantized blocks): every key scored exactly in block-list order, then
//! `U`'s key and value rows read, as [`crate::ndp::sparse`] does for other dtypes.
//!
//! **The partial over `U`:** one fused pass over `U`'s rows in token order
//! ([`cxlkv_kernels::attend_block`]); for quantized blocks one pass per block's run of `U`, each
//! with the queries folded by that block's key scales and the run's value scales
//! ([`crate::ndp::quant::attend`]), the partials merged in token order.

use crate::kv::Sketch;
use crate::ndp::abi::*;
use crate::ndp::block::{locate_token, ResolvedBlock};
use crate::ndp::layout::DeviceStatus;
use crate::ndp::quant;
use crate::ndp::result::ScanStats;
use crate::ndp::select::Selection;
use crate::ndp::sparse::{check_candidates, left_out, union, Sparse};
use cxlkv_kernels::{
    attend_block, sign, DType, KeyRows, Partial, QueryGroup, ScoreKernel, TopKSelector,
};

/// Which of a block's tensors [`BlockRows::copy_rows`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// Key rows (codes, for a quantized block).
    Keys,
    /// Value rows (codes, for a quantized block).
    Values,
}

impl Section {
    /// Pool offset of the section's rows of the command's head in block `b`.
    pub fn offset(self, b: &ResolvedBlock) -> u64 {
        match self {
            Section::Keys => b.k_off,
            Section::Values => b.v_off,
        }
    }
}

/// How an engine reads the blocks of a command (indices into its resolved block list).
pub trait BlockRows {
    /// Calls `f` with every key row of block `b`.
    fn keys(&mut self, b: usize, f: &mut dyn FnMut(&KeyRows<'_>)) -> Result<(), DeviceStatus>;
    /// Calls `f` with every row of block `b`'s key sketch (its codes) when they are a dtype's
    /// elements (int4).
    fn sketch(&mut self, b: usize, f: &mut dyn FnMut(&KeyRows<'_>)) -> Result<(), DeviceStatus>;
    /// Block `b`'s key sketch codes copied out (sign bits).
    fn sketch_copy(&mut self, b: usize) -> Result<Vec<u8>, DeviceStatus>;
    /// Copies rows `rows` (block-local, ascending) of block `b`'s keys or values into `out`
    /// (`rows.len()` rows as stored, in order).
    fn copy_rows(
        &mut self,
        b: usize,
        section: Section,
        rows: &[usize],
        out: &mut [u8],
    ) -> Result<(), DeviceStatus>;
    /// Block `b`'s key scales (`dim`) and value scales (`tokens`); both empty unless quantized.
    fn scales(&mut self, b: usize) -> Result<(Vec<f32>, Vec<f32>), DeviceStatus>;
    /// The `dim` scales of block `b`'s key sketch.
    fn sketch_scales(&mut self, b: usize) -> Result<Vec<f32>, DeviceStatus>;
    /// Told after block `b`'s sketch or keys were scanned, with the bytes read (the device marks
    /// the block touched and paces itself).
    fn scanned(&mut self, _b: usize, _bytes: u64) {}
}

/// The answer of [`sparse_rows`].
#[derive(Clone, Debug)]
pub struct SparseRows {
    /// Per query, the partial over `U`.
    pub parts: Vec<Partial>,
    /// `|U|`.
    pub union_len: usize,
    /// Per query, the mass `U` leaves out (with a sketch: of the estimated softmax).
    pub left_out: Vec<f32>,
    /// `|C|`, the key rows re-scored exactly (`None` without a sketch).
    pub rescored: Option<usize>,
    /// Bytes read next to the memory, blocks scanned.
    pub stats: ScanStats,
}

/// Scores `keys` for `queries` into `out` (key-major), folding the queries with `k_scales` when
/// there are any (quantized codes, sketch codes).
fn score(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    k_scales: &[f32],
    out: &mut Vec<f32>,
) {
    if k_scales.is_empty() {
        out.resize(keys.len() * queries.count(), 0.0);
        kernel.score(queries, keys, out);
    } else {
        quant::score(kernel, queries, keys, k_scales, out);
    }
}

/// Calls `f(block, range of tokens, block-local rows)` for each run of the sorted `tokens` that
/// lies in one block, in token order (`ERR_TOKEN` for a token in no block).
fn for_runs(
    blocks: &[ResolvedBlock],
    order: &[usize],
    tokens: &[u32],
    mut f: impl FnMut(usize, std::ops::Range<usize>, &[usize]) -> Result<(), DeviceStatus>,
) -> Result<(), DeviceStatus> {
    let mut i = 0;
    let mut rows = Vec::new();
    while i < tokens.len() {
        let (bi, _) = locate_token(blocks, order, tokens[i])
            .ok_or(DeviceStatus::at(CXLKV_NDP_ERR_TOKEN, tokens[i] as usize))?;
        let b = &blocks[bi];
        let end = u64::from(b.base) + u64::from(b.tokens);
        let j = i + tokens[i..].partition_point(|&t| u64::from(t) < end);
        rows.clear();
        rows.extend(tokens[i..j].iter().map(|&t| (t - b.base) as usize));
        f(bi, i..j, &rows)?;
        i = j;
    }
    Ok(())
}

/// Scales of each block, read once.
struct ScaleCache(Vec<Option<(Vec<f32>, Vec<f32>)>>);

impl ScaleCache {
    fn get(
        &mut self,
        src: &mut dyn BlockRows,
        b: usize,
    ) -> Result<&(Vec<f32>, Vec<f32>), DeviceStatus> {
        if self.0[b].is_none() {
            self.0[b] = Some(src.scales(b)?);
        }
        Ok(self.0[b].as_ref().expect("filled above"))
    }
}

/// The sparse ATTEND of `queries` over `blocks` (resolved, `order` from
/// [`crate::ndp::sorted_ranges`]) for selection `sp`: with `sp.candidates`, on the blocks' key
/// sketches (each must carry one, else `ERR_LAYOUT` at its index). See the module docs.
#[allow(clippy::too_many_arguments)]
pub fn sparse_rows(
    src: &mut dyn BlockRows,
    blocks: &[ResolvedBlock],
    order: &[usize],
    queries: &QueryGroup<'_>,
    sp: &Sparse,
    scale: f32,
    kernel: ScoreKernel,
    dtype: DType,
) -> Result<SparseRows, DeviceStatus> {
    let (g, dim) = (queries.count(), queries.dim());
    let row = dtype.bytes(dim);
    let ranges: Vec<(u64, u64)> = blocks
        .iter()
        .map(|b| (u64::from(b.base), u64::from(b.base) + u64::from(b.tokens)))
        .collect();
    let mut sel = Selection::new(sp.select, sp.k, scale, g, &ranges)?;
    let mut scales = ScaleCache(vec![None; blocks.len()]);
    let mut scanned = 0u64;
    let mut scores = Vec::new();
    // With a sketch: C and its exact key rows (`U`'s come from here).
    let mut rescored: Option<(Vec<u32>, Vec<u8>)> = None;
    match sp.candidates {
        None => {
            for (bi, b) in blocks.iter().enumerate() {
                let ks = &scales.get(src, bi)?.0;
                src.keys(bi, &mut |keys| {
                    score(kernel, queries, keys, ks, &mut scores)
                })?;
                sel.feed(b.base, &scores, g, false);
                let bytes = b.head_bytes + 4 * ks.len() as u64;
                scanned += bytes;
                src.scanned(bi, bytes);
            }
        }
        Some(c) => {
            check_candidates(c)?;
            let rules = sp.select;
            let mut best: Vec<TopKSelector> = (0..g).map(|_| TopKSelector::new(c)).collect();
            let mut cu: Vec<u32> = Vec::new();
            let mut sketch_scores = Vec::with_capacity(blocks.len());
            for (bi, b) in blocks.iter().enumerate() {
                let ss = src.sketch_scales(bi)?;
                match b.sketch {
                    Sketch::None => return Err(DeviceStatus::at(CXLKV_NDP_ERR_LAYOUT, bi)),
                    Sketch::Int4 => src.sketch(bi, &mut |codes| {
                        score(kernel, queries, codes, &ss, &mut scores)
                    })?,
                    Sketch::Sign => {
                        let bits = src.sketch_copy(bi)?;
                        let folded = quant::fold(queries, &ss);
                        sign::score(&folded, g, dim, &bits, &mut scores);
                    }
                }
                for i in 0..b.tokens as usize {
                    let t = b.base + i as u32;
                    if rules.excluded(u64::from(t)) {
                        continue;
                    }
                    if rules.forced(u64::from(t)) {
                        cu.push(t);
                    } else {
                        for (j, s) in best.iter_mut().enumerate() {
                            s.push(t, scores[i * g + j]);
                        }
                    }
                }
                sketch_scores.push(std::mem::take(&mut scores));
                let bytes = b.sketch_code_bytes(dim) + 4 * dim as u64;
                scanned += bytes;
                src.scanned(bi, bytes);
            }
            for s in best {
                cu.extend(s.into_sorted().iter().map(|h| h.index));
            }
            cu.sort_unstable();
            cu.dedup();
            // C's key rows, scored exactly (a quantized block's with its own folded queries).
            let mut kc = vec![0u8; cu.len() * row];
            let mut exact = vec![0f32; cu.len() * g];
            for_runs(blocks, order, &cu, |bi, r, rows| {
                src.copy_rows(bi, Section::Keys, rows, &mut kc[r.start * row..r.end * row])?;
                let ks = &scales.get(src, bi)?.0;
                let keys = KeyRows::new(&kc[r.start * row..r.end * row], dtype, dim)
                    .map_err(|_| DeviceStatus::new(CXLKV_NDP_ERR_LAYOUT))?;
                score(kernel, queries, &keys, ks, &mut scores);
                exact[r.start * g..r.end * g].copy_from_slice(&scores);
                scanned += (r.len() * row) as u64 + 4 * ks.len() as u64;
                Ok(())
            })?;
            sel.feed_tokens(&cu, &exact, g);
            // Every other stored token's sketch term, to the mass only.
            for (b, s) in blocks.iter().zip(&sketch_scores) {
                sel.feed_mass(b.base, s, g, &cu);
            }
            rescored = Some((cu, kc));
        }
    }
    let picked = sel.finish();
    let u = union(&picked.lists);
    let (mut ku, mut vu) = (vec![0u8; u.len() * row], vec![0u8; u.len() * row]);
    let mut runs = Vec::new();
    for_runs(blocks, order, &u, |bi, r, rows| {
        let dst = r.start * row..r.end * row;
        match &rescored {
            Some((cu, kc)) => {
                for (x, t) in u[r.clone()].iter().enumerate() {
                    let at = cu.binary_search(t).expect("U is a subset of C");
                    let to = (r.start + x) * row;
                    ku[to..to + row].copy_from_slice(&kc[at * row..(at + 1) * row]);
                }
            }
            None => {
                src.copy_rows(bi, Section::Keys, rows, &mut ku[dst.clone()])?;
                scanned += dst.len() as u64;
            }
        }
        src.copy_rows(bi, Section::Values, rows, &mut vu[dst.clone()])?;
        scanned += dst.len() as u64;
        runs.push((bi, r, rows.to_vec()));
        Ok(())
    })?;
    let view = |bytes| {
        KeyRows::new(bytes, dtype, dim).map_err(|_| DeviceStatus::new(CXLKV_NDP_ERR_LAYOUT))
    };
    let mut parts: Vec<Partial> = (0..g).map(|_| Partial::empty(dim)).collect();
    if !u.is_empty() && !dtype.is_quantized() {
        parts = attend_block(kernel, queries, &view(&ku)?, &view(&vu)?, scale);
    } else {
        for (bi, r, rows) in runs {
            let (ks, vs) = scales.get(src, bi)?;
            let vsel: Vec<f32> = rows.iter().map(|&i| vs[i]).collect();
            let (k, v) = (
                view(&ku[r.start * row..r.end * row])?,
                view(&vu[r.start * row..r.end * row])?,
            );
            let x = quant::attend(kernel, queries, &k, &v, (ks, &vsel), scale);
            for (p, x) in parts.iter_mut().zip(&x) {
                p.merge(x);
            }
            scanned += 4 * rows.len() as u64;
        }
    }
    let left = left_out(&parts, &picked.log_sum_exp);
    Ok(SparseRows {
        parts,
        union_len: u.len(),
        left_out: left,
        rescored: rescored.map(|(cu, _)| cu.len()),
        stats: ScanStats {
            bytes_scanned: scanned,
            blocks_scanned: blocks.len() as u32,
            blocks_pruned: 0,
        },
    })
}
