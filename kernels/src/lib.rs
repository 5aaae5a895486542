//! # cxlkv-kernels
//!
//! CPU kernels of the near-data attention path. They are the reference that every other
//! implementation (the device emulator, the HLS kernel, the CUDA kernels) is tested against, and
//! the code the device emulator runs.
//!
//! This crate knows nothing of pools or devices: it works on plain slices of keys, values and
//! queries. Element types are described by [`DType`]; half-precision values travel as raw
//! little-endian bytes so that callers never need a float16 crate. It has no dependencies.
//!
//! ## Main types
//!
//! - [`KeyRows`]: `N` rows of `dim` elements of one [`DType`], little-endian bytes, row-major (one
//!   KV head's keys or values), held as a pointer and a length so that it may describe shared
//!   memory without a Rust reference into it ([`KeyRows::from_raw`]). [`QueryGroup`]: the `G` f32
//!   query vectors of one GQA group.
//! - [`ScoreKernel`] ([`score`]): Q·K scoring with an implementation ([`Isa`]) chosen at run time:
//!   AVX-512 (F16C conversion, bf16 by shift), AVX2+F16C+FMA, or the portable scalar oracle.
//!   A `ScoreKernel` for a SIMD [`Isa`] can only be obtained after the CPU reported the features,
//!   which is what makes calling the `#[target_feature]` functions sound.
//! - [`TopKSelector`] / [`Hit`] ([`topk`]): streaming selection of the `k` best `(index, score)`
//!   pairs with a running threshold; [`scan::scan_topk`] fuses scoring and selection in one pass
//!   over the keys, per query or over the group's maximum ([`GroupMode`]).
//! - [`BlockBounds`] ([`bounds`]) and [`pruned::pruned_topk`]: per-block element-wise key min/max,
//!   Quest-style upper bounds and an *exact* pruned top-k that skips blocks. The block-wise scan
//!   behind it ([`PrunedScan`]: visiting order, skip rule, [`BlockScorer`] engines) is the one the
//!   NDP device and its host fallback run over a pool's blocks.
//! - [`attention`]: softmax attention over selected rows and the dense reference; [`partial`]:
//!   unnormalized partial attention ([`Partial`]) and its exact merge; [`attend`]: the fused
//!   kernel ([`attend_block`]: scores, online maximum, exponentials and weighted value sum in one
//!   pass, bit-identical across ISAs) that the NDP `ATTEND` command and its host fallback run.
//! - [`quant`]: int8 and int4 codes ([`DType::I8`], [`DType::I4`]) with per-channel key scales
//!   and per-token value scales (KIVI's split), and [`quant::fold_key_scales`], which moves the
//!   key scales into the queries so that the kernels score and attend on the codes directly;
//!   [`attend_block_scaled`] applies the value scales.
//! - [`sign`]: sign-bit key sketches (one bit a channel, per-channel scales) and their
//!   table-driven score, for selecting candidates before exact scoring.
//! - [`bitplane`]: lossless f16 bit-plane layout and an approximate scorer that reads the high
//!   planes only.
//! - [`parallel`]: the same scans split across threads; [`rng`]: the seeded generator that the
//!   simulator's schedules, the synthetic data of the demo and evaluations, and every test draw
//!   from (it stays here, beside [`DType`], because the kernels' own unit tests fill rows with it).
//!   The bench tooling (the `cxlkv bench qk` harness, cache eviction, the `.npy` reader) is in
//!   `cxlkv-bench-support`.
//!
//! ## Invariants
//!
//! - **One summation order.** Every implementation computes `q·k` in the same *canonical order*:
//!   element `d` goes to lane `d % 16` of 16 f32 accumulators, each lane accumulates its elements
//!   in increasing `d` with fused multiply-add, then the lanes are added pairwise (`j + j+8`, then
//!   `j + j+4`, `j + j+2`, `j + j+1`). Conversions from f16/bf16 are exact. Scores are therefore
//!   bit-identical across AVX-512, AVX2 and scalar, and so are top-k results. Integer codes
//!   ([`DType::I8`], [`DType::I4`]) widen to f32 exactly too, in registers in the SIMD paths.
//! - **One definition of a quantized score.** The score of query `q` against a key row quantized
//!   per channel (codes `c`, scales `s`) is `score(q', c)` with `q'_d = q_d · s_d` (one f32
//!   multiply, [`quant::fold_key_scales`]) and `score` the canonical dot product above. Every
//!   engine (kernels, device, host fallback) computes exactly this, never `q · (c · s)`. In
//!   attention the value scale `v_i` of row `i` multiplies the row's weight once
//!   (`w · v_i`, [`attend_block_scaled`]); the sum of weights stays unscaled.
//! - **One ranking.** A hit is better than another if its score is higher, or equal and its token
//!   index lower (`-0.0 == +0.0`). Inputs are NaN-free; with NaN the order is unspecified but the
//!   kernels stay memory safe.
//! - **Bounds are upper bounds of the computed score**, rounding included (see [`bounds`]), so
//!   pruning never changes a top-k result. Over quantized rows the bounds are the codes' minima
//!   and maxima, and bound the score of the folded queries.
//! - Head dimension is a multiple of 16 in `16..=256` ([`MAX_DIM`]).

// Items are `pub` only where a user of the crate can reach them.
#![warn(unreachable_pub)]

pub mod attend;
#[cfg(target_arch = "x86_64")]
mod attend_avx2;
#[cfg(target_arch = "x86_64")]
mod attend_simd;
pub mod attention;
pub mod bitplane;
pub mod bounds;
pub mod dtype;
pub mod parallel;
pub mod partial;
pub mod pruned;
pub mod quant;
pub mod rng;
pub mod rows;
pub mod scan;
pub mod score;
pub mod sign;
pub mod topk;
#[cfg(target_arch = "x86_64")]
mod widen;

pub use attend::{attend_block, attend_block_scaled};
pub use bounds::{block_bounds, upper_bound, BlockBounds};
pub use dtype::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, DType};
pub use partial::Partial;
pub use pruned::{
    can_skip, pruned_topk, BlockScorer, KernelScorer, PruneStats, PrunedScan, VisitOrder,
};
pub use rows::{KeyRows, QueryGroup, ShapeError, MAX_DIM, MAX_ROW_BYTES};
pub use scan::scan_topk;
pub use score::{score_group, Isa, ScoreKernel};
pub use topk::{GroupMode, Hit, TopK, TopKSelector};
