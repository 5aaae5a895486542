//! What the NDP client takes and returns: a SCORE_TOPK request ([`ScoreRequest`] over
//! [`BlockSpec`]s), its answer ([`TopK`]) with what it cost ([`NdpStats`], [`NdpPath`]), and the
//! client's [`NdpOptions`].

use crate::key::Key;
use crate::ndp::abi::*;
use crate::ndp::block::BlockExpect;
use crate::ndp::client::error::{FallbackReason, NdpError, Result};
pub use crate::ndp::select::Select;
pub use crate::ndp::sparse::Sparse;
use cxlkv_kernels::attention::default_scale;
use cxlkv_kernels::{DType, GroupMode, Hit, Partial, ScoreKernel};
use std::time::{Duration, Instant};

/// Which path produced a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NdpPath {
    /// The device.
    Device,
    /// The host, for this reason.
    Host(FallbackReason),
}

/// What a command cost, per path.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NdpStats {
    /// Who computed the result (`None` only in a default value).
    pub path: Option<NdpPath>,
    /// Bytes the host wrote across the link: command descriptor, arguments, ring index and
    /// doorbell stores.
    pub bytes_to_device: u64,
    /// Bytes the host read across the link from the device path: completion, result, ring index.
    pub bytes_from_device: u64,
    /// Bytes a host-side scan pulled across the link (headers, layouts, every key, selected values).
    pub host_scan_bytes: u64,
    /// Key bytes the scanner read (device-local on the device path).
    pub bytes_scanned: u64,
    /// Blocks whose keys were read.
    pub blocks_scanned: u32,
    /// Blocks skipped on their bounds.
    pub blocks_pruned: u32,
    /// Execution time reported by the device.
    pub device_ns: u64,
    /// Softmax mass of list 0's hits per block, in block-list order.
    pub block_mass: Vec<f32>,
    /// Wall time from submit to result.
    pub elapsed: Duration,
}

impl NdpStats {
    /// The stats of a command the host computed itself (`NdpPath::Host(Forced)`): `pulled` bytes
    /// read across the link, `scanned` bytes the device would have read, over `blocks` blocks,
    /// since `start`.
    pub(super) fn on_host(pulled: u64, scanned: u64, blocks: usize, start: Instant) -> NdpStats {
        NdpStats {
            path: Some(NdpPath::Host(FallbackReason::Forced)),
            host_scan_bytes: pulled,
            bytes_scanned: scanned,
            blocks_scanned: blocks as u32,
            elapsed: start.elapsed(),
            ..Default::default()
        }
    }

    /// All bytes that crossed the link for this command, either path.
    pub fn link_bytes(&self) -> u64 {
        self.bytes_to_device + self.bytes_from_device + self.host_scan_bytes
    }
}

/// A SCORE_TOPK answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopK {
    /// Token indices per list (one list per query, or one for the group), best first.
    pub indices: Vec<Vec<u32>>,
    /// Scores `q·k` (unscaled), same shape.
    pub scores: Vec<Vec<f32>>,
    /// Value rows of the hits, `[lists][hits][dim]` raw elements, when asked for.
    pub values: Vec<u8>,
    /// Per list, with a selection ([`Select::is_active`]): the softmax mass (of `scale · score`
    /// over every scored stored token, the excluded range left out of the normalization) of the
    /// tokens *not* returned. Empty for plain top-k.
    pub left_out_mass: Vec<f32>,
    /// Costs and path.
    pub stats: NdpStats,
}

impl TopK {
    /// The hits of list `l`.
    pub fn hits(&self, l: usize) -> Vec<Hit> {
        self.indices[l]
            .iter()
            .zip(&self.scores[l])
            .map(|(&index, &score)| Hit { index, score })
            .collect()
    }

    /// The attention mass of list 0 per block of `blocks` (the request's block list): `(key,
    /// mass)` pairs for [`crate::hotness::Hotness::record_attention_mass`], so the blocks attention actually uses
    /// count as hot.
    pub fn attention_mass(&self, blocks: &[BlockSpec]) -> Vec<(Key, f32)> {
        blocks
            .iter()
            .zip(&self.stats.block_mass)
            .map(|(b, &m)| (b.key, m))
            .collect()
    }
}

/// A typed KV block named in a command: its key and the position of its first token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSpec {
    /// Key of the block.
    pub key: Key,
    /// Token offset its layout must carry.
    pub token_offset: u64,
}

/// A SCORE_TOPK request.
#[derive(Clone, Debug)]
pub struct ScoreRequest<'a> {
    /// `G × dim` f32 query vectors of one GQA group.
    pub queries: &'a [f32],
    /// Head dimension.
    pub dim: usize,
    /// Blocks of one sequence.
    pub blocks: &'a [BlockSpec],
    /// Sequence id the blocks must carry.
    pub sequence: u64,
    /// Layer.
    pub layer: u32,
    /// KV head.
    pub kv_head: u32,
    /// Element type of K and V.
    pub dtype: DType,
    /// Hits per list.
    pub k: usize,
    /// Per query or group maximum.
    pub mode: GroupMode,
    /// Skip blocks on their bounds (exact).
    pub prune: bool,
    /// Return the value rows of the hits.
    pub gather_values: bool,
    /// Applied to `q·k` before `exp` in every softmax mass (block mass, top-p, left-out mass);
    /// `None`: [`default_scale`] of `dim` ([`ScoreRequest::scale`] resolves it).
    pub scale: Option<f32>,
    /// Forced and excluded tokens, top-p ([`Select::default`]: plain top-k). An active selection
    /// scores every stored token (no pruning) and ranks with `k` as the cap.
    pub select: Select,
}

impl ScoreRequest<'_> {
    /// The scale applied to `q·k`: the request's, or [`default_scale`] of `dim`.
    pub fn scale(&self) -> f32 {
        self.scale.unwrap_or_else(|| default_scale(self.dim))
    }

    pub(super) fn group(&self) -> usize {
        self.queries.len().checked_div(self.dim).unwrap_or(0)
    }

    /// What every block must be, for a reader attached as `tenant`.
    pub(super) fn expect(&self, tenant: u64) -> BlockExpect {
        BlockExpect {
            tenant,
            sequence: self.sequence,
            layer: self.layer,
            kv_head: self.kv_head,
            dtype: self.dtype,
            dim: self.dim as u32,
        }
    }

    pub(super) fn check(&self) -> Result<()> {
        let g = self.group();
        let bad = |m: String| Err(NdpError::BadRequest(m));
        if self.dim == 0 || self.dim & 15 != 0 || self.dim > CXLKV_NDP_MAX_DIM as usize {
            return bad(format!(
                "head dimension {} is not a multiple of 16 in 16..=256",
                self.dim
            ));
        }
        if g == 0 || g > CXLKV_NDP_MAX_GROUP as usize || g * self.dim != self.queries.len() {
            return bad(format!(
                "{} query floats are not 1..=16 queries of {}",
                self.queries.len(),
                self.dim
            ));
        }
        if self.k == 0 || self.k > CXLKV_NDP_MAX_K as usize {
            return bad(format!("k = {} is outside 1..={CXLKV_NDP_MAX_K}", self.k));
        }
        if self.blocks.is_empty()
            || self.blocks.len() > CXLKV_NDP_MAX_BLOCKS as usize
            || self.kv_head > u32::from(u16::MAX)
        {
            return bad(format!(
                "{} blocks (1..={CXLKV_NDP_MAX_BLOCKS}) or KV head {}",
                self.blocks.len(),
                self.kv_head
            ));
        }
        if !self.scale().is_finite() {
            return bad(format!("scale {} is not finite", self.scale()));
        }
        self.select
            .check()
            .map_err(|e| NdpError::BadRequest(e.message))
    }

    pub(super) fn owned(&self) -> OwnedRequest {
        OwnedRequest {
            queries: self.queries.to_vec(),
            dim: self.dim,
            blocks: self.blocks.to_vec(),
            sequence: self.sequence,
            layer: self.layer,
            kv_head: self.kv_head,
            dtype: self.dtype,
            k: self.k,
            mode: self.mode,
            prune: self.prune,
            gather_values: self.gather_values,
            scale: self.scale,
            select: self.select,
            attend: false,
            sparse: None,
        }
    }
}

/// An ATTEND request: the `G` queries of one GQA group over every token of a list of typed blocks.
#[derive(Clone, Debug)]
pub struct AttendRequest<'a> {
    /// `G × dim` f32 query vectors of one GQA group.
    pub queries: &'a [f32],
    /// Head dimension.
    pub dim: usize,
    /// Typed blocks of one sequence.
    pub blocks: &'a [BlockSpec],
    /// Sequence id the blocks must carry.
    pub sequence: u64,
    /// Layer.
    pub layer: u32,
    /// KV head.
    pub kv_head: u32,
    /// Element type of K and V.
    pub dtype: DType,
    /// Applied to `q·k` before `exp`; `None`: [`default_scale`] of `dim` ([`AttendRequest::scale`]).
    pub scale: Option<f32>,
    /// `Some`: a sparse ATTEND (ABI 1.2): each query's partial over the union of the group's
    /// selections only ([`crate::ndp::sparse`]); `None`: over every token.
    pub sparse: Option<Sparse>,
}

impl AttendRequest<'_> {
    /// The scale applied to `q·k`: the request's, or [`default_scale`] of `dim`.
    pub fn scale(&self) -> f32 {
        self.as_score().scale()
    }

    /// The SCORE_TOPK shape of this request (checks and the owned copy share its code).
    pub(super) fn as_score(&self) -> ScoreRequest<'_> {
        ScoreRequest {
            queries: self.queries,
            dim: self.dim,
            blocks: self.blocks,
            sequence: self.sequence,
            layer: self.layer,
            kv_head: self.kv_head,
            dtype: self.dtype,
            k: 1,
            mode: GroupMode::PerQuery,
            prune: false,
            gather_values: false,
            scale: self.scale,
            select: Select::default(),
        }
    }

    pub(super) fn check(&self) -> Result<()> {
        self.as_score().check()?;
        if let Some(sp) = &self.sparse {
            if let Some(c) = sp.candidates {
                if c == 0 || c > CXLKV_NDP_MAX_CANDIDATES as usize {
                    return Err(NdpError::BadRequest(format!(
                        "sparse ATTEND re-scoring {c} sketch candidates a query \
                         (1..={CXLKV_NDP_MAX_CANDIDATES})"
                    )));
                }
            }
            if sp.k == 0 || sp.k > CXLKV_NDP_MAX_K as usize {
                return Err(NdpError::BadRequest(format!(
                    "sparse ATTEND with k = {} (1..={CXLKV_NDP_MAX_K})",
                    sp.k
                )));
            }
            sp.select
                .check()
                .map_err(|e| NdpError::BadRequest(e.message))?;
        }
        Ok(())
    }

    pub(super) fn owned(&self) -> OwnedRequest {
        OwnedRequest {
            attend: true,
            sparse: self.sparse,
            ..self.as_score().owned()
        }
    }
}

/// An ATTEND answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attended {
    /// One per query: unnormalized output (`dim`), maximum scaled score, sum of exponentials.
    pub partials: Vec<Partial>,
    /// A sparse ATTEND's per-query `(|U|, left-out mass)`: the union's size and the softmax mass
    /// of the query it leaves out; empty for a plain ATTEND.
    pub selection: Vec<(u32, f32)>,
    /// A sparse ATTEND on key sketches: the key rows re-scored exactly (`|C|`); `None` otherwise.
    pub rescored: Option<usize>,
    /// Costs and path; `bytes_scanned` counts key and value bytes.
    pub stats: NdpStats,
}

/// A [`ScoreRequest`] that owns its queries and blocks: kept while a command is in flight, for the
/// host fallback.
#[derive(Clone, Debug)]
pub(super) struct OwnedRequest {
    queries: Vec<f32>,
    dim: usize,
    blocks: Vec<BlockSpec>,
    sequence: u64,
    layer: u32,
    kv_head: u32,
    pub(super) dtype: DType,
    k: usize,
    mode: GroupMode,
    prune: bool,
    gather_values: bool,
    scale: Option<f32>,
    select: Select,
    /// An ATTEND (the other fields are its [`AttendRequest::as_score`] shape).
    pub(super) attend: bool,
    /// The ATTEND's selection, when sparse.
    pub(super) sparse: Option<Sparse>,
}

impl OwnedRequest {
    /// No request: a command that has no host fallback.
    pub(super) fn empty() -> OwnedRequest {
        OwnedRequest {
            queries: Vec::new(),
            dim: 0,
            blocks: Vec::new(),
            sequence: 0,
            layer: 0,
            kv_head: 0,
            dtype: DType::F16,
            k: 0,
            mode: GroupMode::PerQuery,
            prune: false,
            gather_values: false,
            scale: None,
            select: Select::default(),
            attend: false,
            sparse: None,
        }
    }

    /// The ATTEND request this holds (when `attend`).
    pub(super) fn borrow_attend(&self) -> AttendRequest<'_> {
        AttendRequest {
            queries: &self.queries,
            dim: self.dim,
            blocks: &self.blocks,
            sequence: self.sequence,
            layer: self.layer,
            kv_head: self.kv_head,
            dtype: self.dtype,
            scale: self.scale,
            sparse: self.sparse,
        }
    }

    pub(super) fn borrow(&self) -> ScoreRequest<'_> {
        ScoreRequest {
            queries: &self.queries,
            dim: self.dim,
            blocks: &self.blocks,
            sequence: self.sequence,
            layer: self.layer,
            kv_head: self.kv_head,
            dtype: self.dtype,
            k: self.k,
            mode: self.mode,
            prune: self.prune,
            gather_values: self.gather_values,
            scale: self.scale,
            select: self.select,
        }
    }
}

/// Options of [`crate::ndp::client::ring::NdpDevice::open`].
#[derive(Clone, Debug)]
pub struct NdpOptions {
    /// How long to wait for a completion before computing on the host.
    pub timeout: Duration,
    /// A device whose heartbeat value stood still this long, watched on the client's own
    /// monotonic clock, is dead (the two clocks are never compared).
    pub stale_after: Duration,
    /// How long to spin on the completion index before sleeping on the futex.
    pub spin: Duration,
    /// Staging blocks (commands with buffers in flight at once).
    pub staging: usize,
    /// Kernel of the host fallback.
    pub kernel: ScoreKernel,
}

impl Default for NdpOptions {
    fn default() -> Self {
        NdpOptions {
            timeout: Duration::from_secs(2),
            stale_after: Duration::from_millis(500),
            spin: Duration::from_micros(50),
            staging: 2,
            kernel: ScoreKernel::detect(),
        }
    }
}
