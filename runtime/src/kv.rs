//! Typed KV blocks: the payload codec [`Codec::KvV1`](crate::format::Codec::KvV1).
//!
//! A typed block holds the keys and values of `tokens` consecutive tokens of one layer for
//! `kv_heads` KV heads, head-major (`[head][token][dim]`), followed by per-head element-wise key
//! bounds (min and max over the block's tokens, as f32). The bounds let a scorer skip a whole block
//! when `Σ_d max(q_d·min_d, q_d·max_d)` is below the current k-th best score, exactly.
//!
//! A quantized block (dtype int8 or int4, [`DType::is_quantized`]) stores integer codes in K and V
//! and its scales after the bounds (at `scales_off`): K per channel (`[kv_heads][head_dim]` f32,
//! over the block's tokens) and V per token (`[kv_heads][tokens]` f32), as KIVI does. Its bounds
//! are those of the key codes. [`encode`] takes f32 K and V for such a block and quantizes each
//! head with [`cxlkv_kernels::quant`]; [`KvBlock::head_f32`] reads a head back dequantized.
//!
//! A block may also carry a **key sketch** ([`Sketch`], at `sketch_off`): a low-bit copy of its
//! keys made for scoring only, so that a selection can read it instead of the keys and re-score
//! only its best candidates on the exact keys ([`crate::ndp::sketch`]). [`encode_with`] writes it
//! from the same K; the keys themselves are unchanged.

use crate::format::{self, KvLayout};
use crate::pool::{PoolError, Result};
use cxlkv_kernels::{quant, DType};

/// Size of the layout descriptor at the start of a typed payload.
pub const LAYOUT_SIZE: usize = std::mem::size_of::<KvLayout>();

/// What a typed block holds, besides its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    /// Element type of K and V.
    pub dtype: DType,
    /// Model layer.
    pub layer: u32,
    /// KV heads in the block.
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

/// A block's key sketch: a low-bit copy of its keys for scoring only (`KvLayout::sketch`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Sketch {
    /// No sketch (code 0): a selection scores the keys themselves.
    #[default]
    None,
    /// 4-bit codes per channel (code 1), as an int4 block's keys: per head, the codes
    /// `[tokens][head_dim / 2]` (two a byte, low nibble first) and `head_dim` f32 scales
    /// (`max |k| / 7` per channel over the block's tokens). An eighth of f32 keys, a quarter of f16.
    Int4,
    /// Sign bits per channel with per-channel scales (code 2), as LongSight filters keys: per
    /// head, the bits `[tokens][head_dim / 8]` (bit `c % 8` of byte `c / 8` set when `k[c] >= 0`)
    /// and `head_dim` f32 scales (the mean `|k[c]|` over the block's tokens), so a key reads as
    /// `±scale[c]` per channel. A 32nd of f32 keys, an eighth of int8 ones
    /// ([`cxlkv_kernels::sign`]).
    Sign,
}

impl Sketch {
    /// The layout code.
    pub fn code(self) -> u32 {
        match self {
            Sketch::None => 0,
            Sketch::Int4 => 1,
            Sketch::Sign => 2,
        }
    }

    /// The sketch of a layout code (`None` for an unknown code).
    pub fn from_code(code: u32) -> Option<Sketch> {
        match code {
            0 => Some(Sketch::None),
            1 => Some(Sketch::Int4),
            2 => Some(Sketch::Sign),
            _ => None,
        }
    }

    /// Its name on command lines (`none`, `int4`).
    pub fn name(self) -> &'static str {
        match self {
            Sketch::None => "none",
            Sketch::Int4 => "int4",
            Sketch::Sign => "sign",
        }
    }

    /// The element type of its codes when they are a [`DType`] (int4), `None` otherwise.
    pub fn dtype(self) -> Option<DType> {
        match self {
            Sketch::Int4 => Some(DType::I4),
            Sketch::None | Sketch::Sign => None,
        }
    }

    /// What the head dimension must be a multiple of (two elements an int4 byte, eight a sign
    /// byte).
    pub fn dim_multiple(self) -> usize {
        match self {
            Sketch::None => 1,
            Sketch::Int4 => 2,
            Sketch::Sign => 8,
        }
    }

    /// Bytes of one sketch row of `dim` elements (0 for no sketch).
    pub fn row_bytes(self, dim: usize) -> usize {
        match self {
            Sketch::None => 0,
            Sketch::Int4 => DType::I4.bytes(dim),
            Sketch::Sign => dim.div_ceil(8),
        }
    }

    /// One head's sketch of `keys` (`[tokens][dim]` f32): its codes, then its scales.
    fn encode(self, keys: &[f32], dim: usize) -> (Vec<u8>, Vec<f32>) {
        match self {
            Sketch::None => (Vec::new(), Vec::new()),
            Sketch::Int4 => quant::quantize_keys(keys, dim, DType::I4),
            Sketch::Sign => cxlkv_kernels::sign::encode(keys, dim),
        }
    }

    /// Bytes of one head's sketch of `tokens` keys of `dim` elements: its codes, then its `dim`
    /// f32 scales (0 for no sketch).
    pub fn head_bytes(self, tokens: usize, dim: usize) -> Option<usize> {
        match self {
            Sketch::None => Some(0),
            _ => self
                .row_bytes(dim)
                .checked_mul(tokens)?
                .checked_add(dim.checked_mul(4)?),
        }
    }
}

impl std::str::FromStr for Sketch {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Sketch, String> {
        match s {
            "none" => Ok(Sketch::None),
            "int4" => Ok(Sketch::Int4),
            "sign" => Ok(Sketch::Sign),
            _ => Err(format!("unknown key sketch {s:?} (none, int4, sign)")),
        }
    }
}

/// Where the sections of a typed payload lie (payload offsets) and its length: the only layout a
/// parser or the device accepts for a shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvOffsets {
    /// K (codes, for a quantized block).
    pub k_off: usize,
    /// V.
    pub v_off: usize,
    /// Key bounds, `[kv_heads][2][head_dim]` f32.
    pub bounds_off: usize,
    /// Scales of a quantized block (K's `[kv_heads][head_dim]`, then V's `[kv_heads][tokens]`,
    /// f32); 0 for other dtypes.
    pub scales_off: usize,
    /// The key sketch, per head (`[kv_heads]` of [`Sketch::head_bytes`]: codes, then scales); 0
    /// without one.
    pub sketch_off: usize,
    /// Payload length.
    pub len: usize,
}

impl KvShape {
    /// Bytes of one head vector (a row) as stored.
    pub fn row_bytes(&self) -> usize {
        self.dtype.bytes(self.head_dim as usize)
    }

    /// Bytes of K (and of V) as stored.
    pub fn tensor_bytes(&self) -> Option<usize> {
        (self.kv_heads as usize)
            .checked_mul(self.tokens as usize)?
            .checked_mul(self.row_bytes())
    }

    /// Bytes of K (and of V) as [`encode`] takes them: the stored bytes, or f32 elements for a
    /// quantized dtype.
    pub fn input_bytes(&self) -> Option<usize> {
        if !self.dtype.is_quantized() {
            return self.tensor_bytes();
        }
        (self.kv_heads as usize)
            .checked_mul(self.tokens as usize)?
            .checked_mul(self.head_dim as usize)?
            .checked_mul(4)
    }

    /// The sections of this shape's payload without a key sketch (`None` if its size overflows).
    pub fn offsets(&self) -> Option<KvOffsets> {
        self.offsets_with(Sketch::None)
    }

    /// The sections of this shape's payload with key sketch `sketch` after everything else
    /// (`None` if its size overflows, or for an int4 sketch of an odd head dimension).
    pub fn offsets_with(&self, sketch: Sketch) -> Option<KvOffsets> {
        let mut at = self.offsets_bare()?;
        if sketch != Sketch::None {
            if !(self.head_dim as usize).is_multiple_of(sketch.dim_multiple()) {
                return None;
            }
            let per_head = sketch.head_bytes(self.tokens as usize, self.head_dim as usize)?;
            at.sketch_off = at.len;
            at.len = at
                .len
                .checked_add(per_head.checked_mul(self.kv_heads as usize)?)?;
        }
        Some(at)
    }

    fn offsets_bare(&self) -> Option<KvOffsets> {
        let t = self.tensor_bytes()?;
        let (h, d) = (self.kv_heads as usize, self.head_dim as usize);
        let bounds = h.checked_mul(d)?.checked_mul(8)?;
        let v_off = LAYOUT_SIZE.checked_add(t)?;
        let bounds_off = v_off.checked_add(t)?;
        let end = bounds_off.checked_add(bounds)?;
        if !self.dtype.is_quantized() {
            return Some(KvOffsets {
                k_off: LAYOUT_SIZE,
                v_off,
                bounds_off,
                scales_off: 0,
                sketch_off: 0,
                len: end,
            });
        }
        let scales = h
            .checked_mul(d.checked_add(self.tokens as usize)?)?
            .checked_mul(4)?;
        Some(KvOffsets {
            k_off: LAYOUT_SIZE,
            v_off,
            bounds_off,
            scales_off: end,
            sketch_off: 0,
            len: end.checked_add(scales)?,
        })
    }

    /// Bytes of the whole typed payload.
    pub fn payload_bytes(&self) -> Option<usize> {
        Some(self.offsets()?.len)
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn push_f32s(out: &mut Vec<u8>, xs: &[f32]) {
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Encodes a typed payload from K and V (`[kv_heads][tokens][head_dim]` each), computing the key
/// bounds. Elements are little-endian `shape.dtype`, or f32 for a quantized dtype: each head is
/// then quantized (K per channel, V per token) and its scales stored in the block.
pub fn encode(shape: &KvShape, k: &[u8], v: &[u8]) -> Result<Vec<u8>> {
    encode_with(shape, k, v, Sketch::None)
}

/// [`encode`], with key sketch `sketch` made from the same K (before any quantization of the
/// block's own keys).
pub fn encode_with(shape: &KvShape, k: &[u8], v: &[u8], sketch: Sketch) -> Result<Vec<u8>> {
    let bad = |m: String| PoolError::BadKvBlock(m);
    if shape.kv_heads == 0 || shape.head_dim == 0 || shape.tokens == 0 {
        return Err(bad(format!("empty shape {shape:?}")));
    }
    let quantized = shape.dtype.is_quantized();
    if shape.dtype == DType::I4 && !shape.head_dim.is_multiple_of(2) {
        return Err(bad(format!(
            "an int4 block packs two elements a byte: head dimension {} is odd",
            shape.head_dim
        )));
    }
    if !(shape.head_dim as usize).is_multiple_of(sketch.dim_multiple()) {
        return Err(bad(format!(
            "a {} key sketch packs {} elements a byte: head dimension {} is not a multiple",
            sketch.name(),
            sketch.dim_multiple(),
            shape.head_dim
        )));
    }
    let (t, at) = match (
        shape.tensor_bytes(),
        shape.offsets_with(sketch),
        shape.input_bytes(),
    ) {
        (Some(_), Some(at), Some(input)) => (input, at),
        _ => return Err(bad("shape overflows".into())),
    };
    if k.len() != t || v.len() != t {
        return Err(bad(format!(
            "K has {} bytes and V {}, the shape needs {t} each{}",
            k.len(),
            v.len(),
            if quantized { " (f32 elements)" } else { "" }
        )));
    }
    if at.len > u32::MAX as usize {
        return Err(bad("block larger than 4 GiB".into()));
    }
    let layout = KvLayout {
        dtype: shape.dtype as u32,
        layer: shape.layer,
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
        tokens: shape.tokens,
        sequence: shape.sequence,
        token_offset: shape.token_offset,
        k_off: at.k_off as u32,
        v_off: at.v_off as u32,
        bounds_off: at.bounds_off as u32,
        scales_off: at.scales_off as u32,
        sketch: sketch.code(),
        sketch_off: at.sketch_off as u32,
        ..Default::default()
    };
    let (heads, d) = (shape.kv_heads as usize, shape.head_dim as usize);
    let mut out = Vec::with_capacity(at.len);
    out.extend_from_slice(format::as_bytes(&layout));
    let k_in = k;
    // What the block stores per head: K and V as stored, and the scales (quantized only).
    let (k, v, k_scales, v_scales) = if quantized {
        let (kf, vf) = (f32s(k), f32s(v));
        if !kf.iter().chain(&vf).all(|x| x.is_finite()) {
            return Err(bad(format!(
                "a {} block quantizes finite K and V only",
                shape.dtype.name()
            )));
        }
        let per_head = shape.tokens as usize * d;
        let (mut kc, mut vc, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for h in 0..heads {
            let (c, s) =
                quant::quantize_keys(&kf[h * per_head..(h + 1) * per_head], d, shape.dtype);
            kc.extend_from_slice(&c);
            ks.extend_from_slice(&s);
            let (c, s) =
                quant::quantize_values(&vf[h * per_head..(h + 1) * per_head], d, shape.dtype);
            vc.extend_from_slice(&c);
            vs.extend_from_slice(&s);
        }
        (kc, vc, ks, vs)
    } else {
        (k.to_vec(), v.to_vec(), Vec::new(), Vec::new())
    };
    out.extend_from_slice(&k);
    out.extend_from_slice(&v);
    let per_head = shape.tokens as usize * d;
    for h in 0..heads {
        let mut lo = vec![f32::INFINITY; d];
        let mut hi = vec![f32::NEG_INFINITY; d];
        for i in 0..per_head {
            let x = shape.dtype.load(&k, h * per_head + i);
            lo[i % d] = lo[i % d].min(x);
            hi[i % d] = hi[i % d].max(x);
        }
        push_f32s(&mut out, &lo);
        push_f32s(&mut out, &hi);
    }
    push_f32s(&mut out, &k_scales);
    push_f32s(&mut out, &v_scales);
    if sketch != Sketch::None {
        // The sketch of the keys as given (f32 for a quantized block, else the stored elements).
        let kf: Vec<f32> = if quantized {
            f32s(k_in)
        } else {
            (0..heads * per_head)
                .map(|i| shape.dtype.load(&k, i))
                .collect()
        };
        if !kf.iter().all(|x| x.is_finite()) {
            return Err(bad(format!(
                "an {} key sketch needs finite keys",
                sketch.name()
            )));
        }
        for h in 0..heads {
            let (c, s) = sketch.encode(&kf[h * per_head..(h + 1) * per_head], d);
            out.extend_from_slice(&c);
            push_f32s(&mut out, &s);
        }
    }
    debug_assert_eq!(out.len(), at.len);
    Ok(out)
}

/// A parsed, validated typed payload (borrowing the bytes).
#[derive(Clone, Copy, Debug)]
pub struct KvBlock<'a> {
    /// Shape from the layout descriptor.
    pub shape: KvShape,
    /// K bytes, `[kv_heads][tokens][head_dim]` (codes, for a quantized block).
    pub k: &'a [u8],
    /// V bytes, same layout.
    pub v: &'a [u8],
    /// Bounds as f32 bytes, `[kv_heads][2][head_dim]`.
    pub bounds: &'a [u8],
    /// Scales of a quantized block as f32 bytes: K's `[kv_heads][head_dim]`, then V's
    /// `[kv_heads][tokens]`; empty for other dtypes.
    pub scales: &'a [u8],
    /// The key sketch's kind.
    pub sketch: Sketch,
    /// The key sketch, `[kv_heads]` of codes then scales ([`Sketch::head_bytes`]); empty without
    /// one.
    pub sketch_bytes: &'a [u8],
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
        if dtype == DType::I4 && !shape.head_dim.is_multiple_of(2) {
            return Err(bad(format!(
                "int4 block of odd head dimension {}",
                shape.head_dim
            )));
        }
        let sketch = Sketch::from_code(l.sketch)
            .ok_or_else(|| bad(format!("unknown key sketch code {}", l.sketch)))?;
        let at = shape
            .offsets_with(sketch)
            .ok_or_else(|| bad("shape overflows".into()))?;
        if !layout_matches(&l, &at) || at.len != payload.len() || at.v_off == at.k_off {
            return Err(bad(format!(
                "layout {l:?} does not match a payload of {} bytes",
                payload.len()
            )));
        }
        // Sections end where the next present one starts.
        let sketch_start = if sketch == Sketch::None {
            at.len
        } else {
            at.sketch_off
        };
        let (bounds_end, scales) = if dtype.is_quantized() {
            (at.scales_off, &payload[at.scales_off..sketch_start])
        } else {
            (sketch_start, &payload[sketch_start..sketch_start])
        };
        Ok(KvBlock {
            shape,
            k: &payload[at.k_off..at.v_off],
            v: &payload[at.v_off..at.bounds_off],
            bounds: &payload[at.bounds_off..bounds_end],
            scales,
            sketch,
            sketch_bytes: &payload[sketch_start..],
        })
    }

    /// Key bounds of head `h`: (min, max) per dimension (of the codes, for a quantized block).
    pub fn head_bounds(&self, h: usize) -> (Vec<f32>, Vec<f32>) {
        let d = self.shape.head_dim as usize;
        let f = f32s(&self.bounds[h * 8 * d..(h + 1) * 8 * d]);
        (f[..d].to_vec(), f[d..].to_vec())
    }

    /// Scales of head `h` of a quantized block: K's (`head_dim`, per channel) and V's (`tokens`,
    /// per token). Both empty for other dtypes.
    pub fn head_scales(&self, h: usize) -> (Vec<f32>, Vec<f32>) {
        if self.scales.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let (heads, d, t) = (
            self.shape.kv_heads as usize,
            self.shape.head_dim as usize,
            self.shape.tokens as usize,
        );
        let v0 = heads * d * 4;
        (
            f32s(&self.scales[h * d * 4..(h + 1) * d * 4]),
            f32s(&self.scales[v0 + h * t * 4..v0 + (h + 1) * t * 4]),
        )
    }

    /// The key sketch of head `h`: its codes (`tokens` rows of [`Sketch::row_bytes`]) and its
    /// `head_dim` scales. `None` without a sketch.
    pub fn head_sketch(&self, h: usize) -> Option<(&'a [u8], Vec<f32>)> {
        if self.sketch == Sketch::None {
            return None;
        }
        let (d, n) = (self.shape.head_dim as usize, self.shape.tokens as usize);
        let per = self.sketch.head_bytes(n, d)?;
        let head = &self.sketch_bytes[h * per..(h + 1) * per];
        let codes = self.sketch.row_bytes(d) * n;
        Some((&head[..codes], f32s(&head[codes..])))
    }

    /// K and V of head `h` as f32 (`[tokens][head_dim]` each): converted from f16 or bf16, or
    /// dequantized (`code × scale`) for a quantized block.
    pub fn head_f32(&self, h: usize) -> (Vec<f32>, Vec<f32>) {
        let (d, t) = (self.shape.head_dim as usize, self.shape.tokens as usize);
        let rb = self.shape.row_bytes();
        let (k, v) = (
            &self.k[h * t * rb..(h + 1) * t * rb],
            &self.v[h * t * rb..(h + 1) * t * rb],
        );
        let dtype = self.shape.dtype;
        if dtype.is_quantized() {
            let (ks, vs) = self.head_scales(h);
            return (
                quant::dequantize_keys(k, d, dtype, &ks),
                quant::dequantize_values(v, d, dtype, &vs),
            );
        }
        let widen = |x: &[u8]| (0..t * d).map(|i| dtype.load(x, i)).collect();
        (widen(k), widen(v))
    }
}

/// True if a stored layout names exactly the sections `at` of its shape (`scales_off` zero for
/// an unquantized block, `sketch_off` zero without a sketch) and its reserved word is zero.
pub fn layout_matches(l: &KvLayout, at: &KvOffsets) -> bool {
    (
        l.k_off as usize,
        l.v_off as usize,
        l.bounds_off as usize,
        l.scales_off as usize,
        l.sketch_off as usize,
    ) == (
        at.k_off,
        at.v_off,
        at.bounds_off,
        at.scales_off,
        at.sketch_off,
    ) && l.reserved1 == 0
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
