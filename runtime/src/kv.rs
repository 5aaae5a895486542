//! Typed KV blocks: the payload codec [`Codec::KvV1`](crate::format::Codec::KvV1).
//!
//! A typed block holds the keys and values of `tokens` consecutive tokens of one layer for
//! `kv_heads` KV heads, head-major (`[head][token][dim]`), followed by per-head element-wise key
//! bounds (min and max over the block's tokens, as f32). The bounds let a scorer skip a whole block
//! when `Σ_d max(q_d·min_d, q_d·max_d)` is below the current k-th best score, exactly.

use crate::format::{self, KvLayout};
use crate::pool::{PoolError, Result};
use cxlkv_kernels::DType;

/// Size of the layout descriptor at the start of a typed payload.
pub const LAYOUT_SIZE: usize = std::mem::size_of::<KvLayout>();

/// What a typed block holds, besides its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    /// Element type of K and V.
    pub dtype: DType,
    /// Model layer.
    pub layer: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Elements per head vector.
    pub head_dim: u32,
    /// Tokens.
    pub tokens: u32,
    /// Sequence id (engine-chosen).
    pub sequence: u64,
    /// Position of the first token in the sequence.
    pub token_offset: u64,
}

impl KvShape {
    /// Bytes of K (and of V).
    pub fn tensor_bytes(&self) -> Option<usize> {
        (self.kv_heads as usize)
            .checked_mul(self.tokens as usize)?
            .checked_mul(self.head_dim as usize)
            .map(|elems| self.dtype.bytes(elems))
    }

    /// Bytes of the whole typed payload.
    pub fn payload_bytes(&self) -> Option<usize> {
        let t = self.tensor_bytes()?;
        let bounds = (self.kv_heads as usize)
            .checked_mul(self.head_dim as usize)?
            .checked_mul(8)?;
        LAYOUT_SIZE
            .checked_add(t)?
            .checked_add(t)?
            .checked_add(bounds)
    }
}

/// Encodes a typed payload from K and V (`[kv_heads][tokens][head_dim]`, little-endian elements of
/// `shape.dtype`), computing the key bounds.
pub fn encode(shape: &KvShape, k: &[u8], v: &[u8]) -> Result<Vec<u8>> {
    let bad = |m: String| PoolError::BadKvBlock(m);
    if shape.kv_heads == 0 || shape.head_dim == 0 || shape.tokens == 0 {
        return Err(bad(format!("empty shape {shape:?}")));
    }
    let t = shape
        .tensor_bytes()
        .ok_or_else(|| bad("shape overflows".into()))?;
    if k.len() != t || v.len() != t {
        return Err(bad(format!(
            "K has {} bytes and V {}, the shape needs {t} each",
            k.len(),
            v.len()
        )));
    }
    let total = shape
        .payload_bytes()
        .ok_or_else(|| bad("shape overflows".into()))?;
    let layout = KvLayout {
        dtype: shape.dtype as u32,
        layer: shape.layer,
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
        tokens: shape.tokens,
        sequence: shape.sequence,
        token_offset: shape.token_offset,
        k_off: LAYOUT_SIZE as u32,
        v_off: (LAYOUT_SIZE + t) as u32,
        bounds_off: (LAYOUT_SIZE + 2 * t) as u32,
        ..Default::default()
    };
    if total > u32::MAX as usize {
        return Err(bad("block larger than 4 GiB".into()));
    }
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(format::as_bytes(&layout));
    out.extend_from_slice(k);
    out.extend_from_slice(v);
    let d = shape.head_dim as usize;
    let per_head = shape.tokens as usize * d;
    for h in 0..shape.kv_heads as usize {
        let mut lo = vec![f32::INFINITY; d];
        let mut hi = vec![f32::NEG_INFINITY; d];
        for i in 0..per_head {
            let x = shape.dtype.load(k, h * per_head + i);
            lo[i % d] = lo[i % d].min(x);
            hi[i % d] = hi[i % d].max(x);
        }
        for x in lo.iter().chain(&hi) {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    debug_assert_eq!(out.len(), total);
    Ok(out)
}

/// A parsed, validated typed payload (borrowing the bytes).
#[derive(Clone, Copy, Debug)]
pub struct KvBlock<'a> {
    /// Shape from the layout descriptor.
    pub shape: KvShape,
    /// K bytes, `[kv_heads][tokens][head_dim]`.
    pub k: &'a [u8],
    /// V bytes, same layout.
    pub v: &'a [u8],
    /// Bounds as f32 bytes, `[kv_heads][2][head_dim]`.
    pub bounds: &'a [u8],
}

impl<'a> KvBlock<'a> {
    /// Parses and validates a typed payload: every offset and size is checked against the bytes.
    pub fn parse(payload: &'a [u8]) -> Result<KvBlock<'a>> {
        let bad = |m: String| PoolError::BadKvBlock(m);
        if payload.len() < LAYOUT_SIZE {
            return Err(bad(format!(
                "payload of {} bytes is shorter than its layout",
                payload.len()
            )));
        }
        let l: KvLayout = format::from_bytes(payload);
        let dtype = u8::try_from(l.dtype)
            .ok()
            .and_then(DType::from_code)
            .ok_or_else(|| bad(format!("unknown dtype code {}", l.dtype)))?;
        let shape = KvShape {
            dtype,
            layer: l.layer,
            kv_heads: l.kv_heads,
            head_dim: l.head_dim,
            tokens: l.tokens,
            sequence: l.sequence,
            token_offset: l.token_offset,
        };
        let t = shape
            .tensor_bytes()
            .ok_or_else(|| bad("shape overflows".into()))?;
        let total = shape
            .payload_bytes()
            .ok_or_else(|| bad("shape overflows".into()))?;
        let expect = (LAYOUT_SIZE, LAYOUT_SIZE + t, LAYOUT_SIZE + 2 * t);
        if (l.k_off as usize, l.v_off as usize, l.bounds_off as usize) != expect
            || total != payload.len()
            || t == 0
        {
            return Err(bad(format!(
                "layout {l:?} does not match a payload of {} bytes",
                payload.len()
            )));
        }
        Ok(KvBlock {
            shape,
            k: &payload[expect.0..expect.1],
            v: &payload[expect.1..expect.2],
            bounds: &payload[expect.2..],
        })
    }

    /// Key bounds of head `h`: (min, max) per dimension.
    pub fn head_bounds(&self, h: usize) -> (Vec<f32>, Vec<f32>) {
        let d = self.shape.head_dim as usize;
        let f = |i: usize| {
            f32::from_le_bytes(self.bounds[4 * i..4 * i + 4].try_into().expect("4 bytes"))
        };
        let base = h * 2 * d;
        (
            (0..d).map(|i| f(base + i)).collect(),
            (0..d).map(|i| f(base + d + i)).collect(),
        )
    }
}

/// Cuts a sequence's head-major K and V (`[heads][tokens][row_bytes]` bytes each, `tokens` the
/// sequence's length) into typed blocks of `per_block` tokens covering `span` (the last block may
/// hold fewer): per block, its token range and its K and V bytes, `[heads][range][row_bytes]` each,
/// as [`encode`] and `Participant::put_kv` take them. Panics if K and V differ in length or are not
/// whole rows of `heads` heads, if `span` ends past the sequence, or if `per_block` is 0.
pub fn chunk_kv<'a>(
    k: &'a [u8],
    v: &'a [u8],
    heads: usize,
    row_bytes: usize,
    span: std::ops::Range<usize>,
    per_block: usize,
) -> impl Iterator<Item = (std::ops::Range<usize>, Vec<u8>, Vec<u8>)> + 'a {
    let token_bytes = heads * row_bytes;
    assert!(
        token_bytes > 0 && k.len() == v.len() && k.len().is_multiple_of(token_bytes),
        "K and V of {} and {} bytes are not whole [{heads}][tokens][{row_bytes}] arrays",
        k.len(),
        v.len()
    );
    assert!(per_block > 0, "blocks hold at least one token");
    let tokens = k.len() / token_bytes;
    assert!(
        span.end <= tokens,
        "tokens {span:?} outside a sequence of {tokens}"
    );
    let take = move |x: &[u8], r: &std::ops::Range<usize>| {
        let mut out = Vec::with_capacity(heads * r.len() * row_bytes);
        for h in 0..heads {
            let head = h * tokens;
            out.extend_from_slice(&x[(head + r.start) * row_bytes..(head + r.end) * row_bytes]);
        }
        out
    };
    let end = span.end;
    span.step_by(per_block).map(move |start| {
        let r = start..(start + per_block).min(end);
        let (bk, bv) = (take(k, &r), take(v, &r));
        (r, bk, bv)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cxlkv_kernels::f32_to_f16;

    #[test]
    fn encode_parse_round_trip_with_bounds() {
        let shape = KvShape {
            dtype: DType::F16,
            layer: 3,
            kv_heads: 2,
            head_dim: 4,
            tokens: 3,
            sequence: 9,
            token_offset: 48,
        };
        let vals: Vec<f32> = (0..24).map(|i| (i as f32 - 10.0) * 0.5).collect();
        let k: Vec<u8> = vals
            .iter()
            .flat_map(|&x| f32_to_f16(x).to_le_bytes())
            .collect();
        let v: Vec<u8> = vals
            .iter()
            .rev()
            .flat_map(|&x| f32_to_f16(x).to_le_bytes())
            .collect();
        let p = encode(&shape, &k, &v).unwrap();
        let b = KvBlock::parse(&p).unwrap();
        assert_eq!(b.shape, shape);
        assert_eq!(b.k, &k[..]);
        assert_eq!(b.v, &v[..]);
        // Head 1 holds elements 12..24; dim 0 takes 12, 16, 20 → (i - 10) / 2 = 1, 3, 5.
        let (lo, hi) = b.head_bounds(1);
        assert_eq!((lo[0], hi[0]), (1.0, 5.0));
        let mut bad = p.clone();
        bad[16] = 200; // tokens field
        assert!(KvBlock::parse(&bad).is_err());
        assert!(KvBlock::parse(&p[..p.len() - 1]).is_err());
    }

    #[test]
    fn chunks_cut_every_head_at_the_same_tokens() {
        // 2 heads x 5 tokens of 1-byte rows: K byte = 10 * head + token, V = K + 100.
        let k: Vec<u8> = (0..2u8)
            .flat_map(|h| (0..5u8).map(move |t| 10 * h + t))
            .collect();
        let v: Vec<u8> = k.iter().map(|x| x + 100).collect();
        let got: Vec<_> = chunk_kv(&k, &v, 2, 1, 0..5, 2).collect();
        assert_eq!(
            got,
            vec![
                (0..2, vec![0, 1, 10, 11], vec![100, 101, 110, 111]),
                (2..4, vec![2, 3, 12, 13], vec![102, 103, 112, 113]),
                (4..5, vec![4, 14], vec![104, 114]),
            ]
        );
        let part: Vec<_> = chunk_kv(&k, &v, 2, 1, 1..4, 2).map(|c| c.0).collect();
        assert_eq!(part, vec![1..3, 3..4]);
        assert_eq!(chunk_kv(&k, &v, 2, 1, 5..5, 2).count(), 0);
    }
}
