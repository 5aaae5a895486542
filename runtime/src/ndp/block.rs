//! The checks both the device and the host fallback apply to the blocks and buffers a command
//! names: [`resolve_block`] (header CRC and index sequence via [`Pool::block_ref`], the block's
//! tenant against the reader's ([`Pool::reads_tenant`], the reader's from its participant slot:
//! [`slot_tenant`]), then the typed layout against the command, scales of a quantized block
//! included), overlap and lookup of token
//! ranges ([`sorted_ranges`], [`locate_token`]), the stored key bounds ([`read_bounds`]), a
//! quantized block's scales ([`read_scales`]) and value rows as GATHER returns them
//! ([`read_value_row`]), and [`check_owned_range`] for argument and result buffers.

use crate::coherence::{self, Site};
use crate::format::{self, Codec, KvLayout};
use crate::key::Key;
use crate::kv::{layout_matches, KvShape, Sketch, LAYOUT_SIZE};
use crate::ndp::abi::*;
use crate::ndp::layout::DeviceStatus;
use crate::pool::{BlockRef, Pool};
use cxlkv_kernels::DType;
use cxlkv_shm::mem::SharedMemory;

/// What every block of a command must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockExpect {
    /// Sequence id.
    pub sequence: u64,
    /// Layer.
    pub layer: u32,
    /// KV head to read (must be below the block's head count).
    pub kv_head: u32,
    /// Element type.
    pub dtype: DType,
    /// Head dimension.
    pub dim: u32,
    /// The tenant the reader attached as (its participant slot's `tenant` word, [`slot_tenant`];
    /// 0 = none). A block of another tenant is refused ([`Pool::reads_tenant`]).
    pub tenant: u64,
}

/// A validated typed block: where the selected head's K, V and bounds are.
#[derive(Clone, Copy, Debug)]
pub struct ResolvedBlock {
    /// The header snapshot and slot version ([`Pool::still_valid`] re-checks it).
    pub block: BlockRef,
    /// Tokens in the block.
    pub tokens: u32,
    /// Token index of row 0 (checked to fit with every row in `u32`).
    pub base: u32,
    /// Pool offset of the head's keys (`tokens × dim` elements).
    pub k_off: u64,
    /// Pool offset of the head's values.
    pub v_off: u64,
    /// Pool offset of the head's bounds (`2 × dim` f32: min then max).
    pub bounds_off: u64,
    /// Bytes of the head's keys (and of its values).
    pub head_bytes: u64,
    /// Pool offset of the head's key scales (`dim` f32, per channel) in a quantized block; 0
    /// otherwise.
    pub k_scales_off: u64,
    /// Pool offset of the head's value scales (`tokens` f32, per token) in a quantized block; 0
    /// otherwise.
    pub v_scales_off: u64,
    /// The block's key sketch ([`Sketch::None`] without one).
    pub sketch: Sketch,
    /// Pool offset of the head's sketch codes (`tokens` rows of the sketch's type), its `dim` f32
    /// scales right after; 0 without a sketch.
    pub sketch_off: u64,
}

impl ResolvedBlock {
    /// True for a block of quantized codes (its scales are at `k_scales_off` and `v_scales_off`).
    pub fn quantized(&self) -> bool {
        self.k_scales_off != 0
    }

    /// Bytes of the head's sketch codes (0 without a sketch).
    pub fn sketch_code_bytes(&self, dim: usize) -> u64 {
        (self.sketch.row_bytes(dim) * self.tokens as usize) as u64
    }

    /// Bytes of the head's scales (K's and V's; 0 for an unquantized block).
    pub fn scale_bytes(&self, dim: usize) -> u64 {
        if self.quantized() {
            4 * (dim as u64 + u64::from(self.tokens))
        } else {
            0
        }
    }
}

/// The tenant participant slot `participant` attached as (its `tenant` word, format 3.2; 0 =
/// none). The device reads it for queue pair `participant` when a command runs; the host fallback
/// for its client's own slot.
pub fn slot_tenant(pool: &Pool, participant: u32) -> cxlkv_shm::mem::Result<u64> {
    let off = pool.slot_off(participant) + format::slot::TENANT;
    let mem = pool.memory();
    // The holder writes the word before its first heartbeat; the device reads it as part of the
    // command's context, like the command's arguments.
    coherence::acquire(&**mem, Site::NdpSubmitRead, off, 8);
    mem.load_u64(off, std::sync::atomic::Ordering::Acquire)
}

/// Finds and validates block `entry` for a command expecting `want`; `index` is its position in
/// the block list (reported in errors). Both the device and the host fallback call this. A block
/// of another tenant than `want.tenant` is refused with `CXLKV_NDP_ERR_ACCESS` before any byte of
/// its payload is read.
pub fn resolve_block(
    pool: &Pool,
    entry: &cxlkv_ndp_block,
    want: &BlockExpect,
    index: usize,
) -> Result<ResolvedBlock, DeviceStatus> {
    let block_err = DeviceStatus::at(CXLKV_NDP_ERR_BLOCK, index);
    let layout_err = DeviceStatus::at(CXLKV_NDP_ERR_LAYOUT, index);
    let key = Key::from_parts(entry.key_lo, entry.key_hi);
    // Located as the reader's tenant: the partitions of other tenants are never probed, so their
    // blocks are not found (`ERR_BLOCK`, as a miss, which tells nothing of what they hold); a
    // block of another tenant in a partition the reader may read (one the runtime never writes)
    // is found and refused below.
    let reader = pool.scoped(u32::try_from(want.tenant).unwrap_or(u32::MAX));
    let r = match reader.block_ref_any_tenant(key) {
        Ok(Some(r)) => r,
        _ => return Err(block_err),
    };
    if !reader.reads_tenant(r.header.tenant) {
        return Err(DeviceStatus::at(CXLKV_NDP_ERR_ACCESS, index));
    }
    if Codec::from_code(r.header.codec) != Some(Codec::KvV1) || r.header.len < LAYOUT_SIZE as u64 {
        return Err(layout_err);
    }
    let mem = pool.memory();
    coherence::acquire(&**mem, Site::PayloadRead, r.payload_off, LAYOUT_SIZE as u64);
    let l: KvLayout = cxlkv_shm::mem::read_obj(&**mem, r.payload_off).map_err(|_| block_err)?;
    let shape = KvShape {
        dtype: want.dtype,
        layer: l.layer,
        kv_heads: l.kv_heads,
        head_dim: l.head_dim,
        tokens: l.tokens,
        sequence: l.sequence,
        token_offset: l.token_offset,
    };
    // The one layout a block of this shape may have (sizes and offsets, scales and sketch
    // included).
    let Some(sketch) = Sketch::from_code(l.sketch) else {
        return Err(layout_err);
    };
    let Some(at) = shape.offsets_with(sketch) else {
        return Err(layout_err);
    };
    let ok = l.dtype == want.dtype as u32
        && l.sequence == want.sequence
        && l.layer == want.layer
        && l.head_dim == want.dim
        && want.kv_head < l.kv_heads
        && l.tokens > 0
        && l.token_offset == entry.token_offset
        && l.token_offset
            .checked_add(u64::from(l.tokens))
            .is_some_and(|e| e <= u64::from(u32::MAX))
        && (want.dtype != DType::I4 || l.head_dim.is_multiple_of(2))
        && layout_matches(&l, &at)
        && at.len as u64 == r.header.len
        && at.len as u64 <= pool.block_size();
    if !ok {
        return Err(layout_err);
    }
    let head_bytes = u64::from(l.tokens) * shape.row_bytes() as u64;
    let h = u64::from(want.kv_head);
    let (d, t) = (u64::from(l.head_dim), u64::from(l.tokens));
    let (k_scales_off, v_scales_off) = if want.dtype.is_quantized() {
        let s = r.payload_off + at.scales_off as u64;
        (s + 4 * h * d, s + 4 * (u64::from(l.kv_heads) * d + h * t))
    } else {
        (0, 0)
    };
    Ok(ResolvedBlock {
        block: r,
        tokens: l.tokens,
        base: l.token_offset as u32,
        k_off: r.payload_off + u64::from(l.k_off) + h * head_bytes,
        v_off: r.payload_off + u64::from(l.v_off) + h * head_bytes,
        bounds_off: r.payload_off + u64::from(l.bounds_off) + h * d * 8,
        head_bytes,
        k_scales_off,
        v_scales_off,
        sketch,
        sketch_off: match sketch.head_bytes(l.tokens as usize, l.head_dim as usize) {
            Some(per) if sketch != Sketch::None => {
                r.payload_off + u64::from(l.sketch_off) + h * per as u64
            }
            _ => 0,
        },
    })
}

/// Reads the `dim` f32 scales of a resolved block's key sketch (empty without one).
pub fn read_sketch_scales(
    mem: &dyn SharedMemory,
    b: &ResolvedBlock,
    dim: usize,
) -> cxlkv_shm::mem::Result<Vec<f32>> {
    if b.sketch == Sketch::None {
        return Ok(Vec::new());
    }
    read_f32s(mem, b.sketch_off + b.sketch_code_bytes(dim), dim)
}

/// `n` little-endian f32 at `off`, read under the coherence protocol's payload acquire.
fn read_f32s(mem: &dyn SharedMemory, off: u64, n: usize) -> cxlkv_shm::mem::Result<Vec<f32>> {
    let mut raw = vec![0u8; 4 * n];
    coherence::acquire(mem, Site::PayloadRead, off, raw.len() as u64);
    mem.read(off, &mut raw)?;
    Ok(raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Reads a resolved quantized block's scales of its head: K's (`dim` f32) and V's (`tokens` f32).
/// Both empty for an unquantized block.
pub fn read_scales(
    mem: &dyn SharedMemory,
    b: &ResolvedBlock,
    dim: usize,
) -> cxlkv_shm::mem::Result<(Vec<f32>, Vec<f32>)> {
    if !b.quantized() {
        return Ok((Vec::new(), Vec::new()));
    }
    Ok((
        read_f32s(mem, b.k_scales_off, dim)?,
        read_f32s(mem, b.v_scales_off, b.tokens as usize)?,
    ))
}

/// Value row `row` of resolved block `b`, as GATHER returns it: the stored bytes (`dim` elements
/// of `dtype`), or, for a quantized block, the codes dequantized with the token's scale (`dim`
/// little-endian f32). Returns the row and the bytes read from the block.
pub fn read_value_row(
    mem: &dyn SharedMemory,
    b: &ResolvedBlock,
    row: usize,
    dim: usize,
    dtype: DType,
) -> cxlkv_shm::mem::Result<(Vec<u8>, u64)> {
    let rb = dtype.bytes(dim);
    let off = b.v_off + (row * rb) as u64;
    let mut r = vec![0u8; rb];
    coherence::acquire(mem, Site::PayloadRead, off, rb as u64);
    mem.read(off, &mut r)?;
    if !b.quantized() {
        return Ok((r, rb as u64));
    }
    let mut s = [0u8; 4];
    let s_off = b.v_scales_off + 4 * row as u64;
    coherence::acquire(mem, Site::PayloadRead, s_off, 4);
    mem.read(s_off, &mut s)?;
    let f = crate::ndp::quant::dequantize_row(&r, dim, dtype, f32::from_le_bytes(s));
    Ok((f, rb as u64 + 4))
}

/// The element type of value rows that GATHER (and SCORE_TOPK with `FLAG_GATHER_V`) returns for
/// blocks of `dtype`: the stored type, or f32 for a quantized one (its rows come back dequantized,
/// so a host needs no scales).
pub fn gathered_dtype(dtype: DType) -> DType {
    if dtype.is_quantized() {
        DType::F32
    } else {
        dtype
    }
}

/// Reads the `2 × dim` f32 bounds of a resolved block (min, max).
pub fn read_bounds(
    mem: &dyn SharedMemory,
    b: &ResolvedBlock,
    dim: usize,
) -> cxlkv_shm::mem::Result<(Vec<f32>, Vec<f32>)> {
    let mut raw = vec![0u8; dim * 8];
    coherence::acquire(mem, Site::PayloadRead, b.bounds_off, raw.len() as u64);
    mem.read(b.bounds_off, &mut raw)?;
    let f: Vec<f32> = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((f[..dim].to_vec(), f[dim..].to_vec()))
}

/// Checks that a block list's token ranges do not overlap; returns block indices sorted by base.
pub fn sorted_ranges(blocks: &[ResolvedBlock]) -> Result<Vec<usize>, DeviceStatus> {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&i| blocks[i].base);
    for w in order.windows(2) {
        let (a, b) = (&blocks[w[0]], &blocks[w[1]]);
        if u64::from(a.base) + u64::from(a.tokens) > u64::from(b.base) {
            return Err(DeviceStatus::at(CXLKV_NDP_ERR_LAYOUT, w[1]));
        }
    }
    Ok(order)
}

/// The block (index into `blocks`) and row holding `token`, given `order` from [`sorted_ranges`].
pub fn locate_token(
    blocks: &[ResolvedBlock],
    order: &[usize],
    token: u32,
) -> Option<(usize, usize)> {
    let pos = order.partition_point(|&i| blocks[i].base <= token);
    let i = *order.get(pos.checked_sub(1)?)?;
    let row = (token - blocks[i].base) as usize;
    (row < blocks[i].tokens as usize).then_some((i, row))
}

/// True if `[off, off + len)` lies inside one payload block of a partition owned by participant
/// `qp` (the only places a command's buffers may be). Returns the error status otherwise.
pub fn check_owned_range(pool: &Pool, qp: u32, off: u64, len: u64) -> Result<(), DeviceStatus> {
    let bad = DeviceStatus::new(CXLKV_NDP_ERR_RANGE);
    let sb = pool.superblock();
    let rel = off.checked_sub(sb.partition_off).ok_or(bad)?;
    let p = rel / sb.partition_stride;
    if p >= u64::from(sb.partitions) {
        return Err(bad);
    }
    let in_part = rel % sb.partition_stride;
    let in_payloads = in_part.checked_sub(sb.payloads_off).ok_or(bad)?;
    let block = in_payloads / sb.block_size;
    if block >= u64::from(sb.blocks_per_partition) {
        return Err(bad);
    }
    let block_end = sb.payloads_off + (block + 1) * sb.block_size;
    if in_part.checked_add(len).is_none_or(|e| e > block_end) {
        return Err(bad);
    }
    let owner_off = pool.partition_offset(p as u32).ok_or(bad)? + format::partition::OWNER;
    let owner = pool
        .memory()
        .load_u64(owner_off, std::sync::atomic::Ordering::Acquire)
        .map_err(|_| bad)?;
    if owner & 0xffff_ffff != u64::from(qp) + 1 {
        return Err(bad);
    }
    Ok(())
}
