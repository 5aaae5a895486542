//! One sequence's keys and values, split between the pool and the host.
//!
//! Per layer, positions are cut into blocks of `block_tokens`. Every full block is written to the
//! pool as one typed block (all KV heads of the layer, head-major) as soon as it fills; the last,
//! not yet full block (the *open* block) lives in host memory. The rows appended by the latest
//! `append` also stay in host memory until the next `append` (the *tail*): the host produced them
//! and a prefill attends to them at once, so it never pulls back what it has just written.
//!
//! Rows are kept as little-endian elements of the store's dtype, so the host's share and the
//! pool's share of an attention read the very same numbers. With a quantized dtype (int8, int4)
//! the host keeps f32 rows and a block is quantized when it is sealed (written to the pool): the
//! open block stays exact, and the pool's share is read back dequantized by host paths
//! ([`Store::all_rows`]) or attended on its codes by the device.

use crate::env::Env;
use crate::mode::ModeSpec;
use cxlkv_kernels::DType;
use cxlkv_model::{AttentionShape, AttentionStats, Error as ModelError, HeadRows, HostAttention};
use cxlkv_runtime::format::{BLOCK_HEADER_SIZE, INDEX_SLOT_SIZE};
use cxlkv_runtime::ndp::client::{BlockSpec, HOST_META_BYTES_PER_BLOCK};
use cxlkv_runtime::ndp::gathered_dtype;
use cxlkv_runtime::{Key, KvBlock, KvShape};

/// Rows of one layer held on the host: positions `start ..` of every KV head.
#[derive(Default)]
struct Tail {
    start: usize,
    /// `[kv_head]` rows of `head_dim` elements.
    k: Vec<Vec<u8>>,
    v: Vec<Vec<u8>>,
}

#[derive(Default)]
struct Layer {
    held: usize,
    /// The pool blocks, in position order: block `i` holds `i·bt .. (i+1)·bt`.
    stored: Vec<BlockSpec>,
    tail: Tail,
}

/// The keys and values of one sequence: full blocks in the pool, the rest on the host.
pub(crate) struct Store<'e> {
    env: &'e Env,
    name: String,
    shape: AttentionShape,
    /// Element type of the pool's blocks.
    dtype: DType,
    /// Element type of the rows held on the host (f32 for a quantized `dtype`).
    host_dtype: DType,
    block_tokens: usize,
    sequence: u64,
    layers: Vec<Layer>,
    /// Scratch for a block read back.
    buf: Vec<u8>,
    /// Link bytes of writes and read-backs.
    pub(crate) stats: AttentionStats,
}

/// A layer's rows `0 .. held` as contiguous per-head arrays (what a host attention reads).
pub(crate) struct Rows {
    /// `[kv_head]` keys, `held` rows each.
    k: Vec<Vec<u8>>,
    /// `[kv_head]` values.
    v: Vec<Vec<u8>>,
    dtype: DType,
    dim: usize,
}

impl Rows {
    /// Every KV head's rows, as the host attention loop reads them.
    pub(crate) fn heads(&self) -> Vec<HeadRows<'_>> {
        self.k
            .iter()
            .zip(&self.v)
            .map(|(k, v)| HeadRows::new(k, v, self.dtype, self.dim).expect("whole rows"))
            .collect()
    }
}

impl<'e> Store<'e> {
    /// The store of mode `spec` (its blocks of `spec.dtype`, else the environment's).
    pub(crate) fn new(env: &'e Env, spec: &ModeSpec, sequence: u64) -> Store<'e> {
        let shape = env.shape();
        let dtype = spec.dtype.unwrap_or(env.options().dtype);
        Store {
            env,
            name: spec.to_string(),
            shape,
            dtype,
            host_dtype: gathered_dtype(dtype),
            block_tokens: env.options().block_tokens,
            sequence,
            layers: (0..shape.layers)
                .map(|_| Layer {
                    tail: Tail {
                        start: 0,
                        k: vec![Vec::new(); shape.kv_heads],
                        v: vec![Vec::new(); shape.kv_heads],
                    },
                    ..Layer::default()
                })
                .collect(),
            buf: Vec::new(),
            stats: AttentionStats::default(),
        }
    }

    /// A backend's own `stats` with the link bytes this store moved (appends, pulls) added.
    pub(crate) fn with_link(&self, stats: &AttentionStats) -> AttentionStats {
        AttentionStats {
            link_read_bytes: stats.link_read_bytes + self.stats.link_read_bytes,
            link_write_bytes: stats.link_write_bytes + self.stats.link_write_bytes,
            ..*stats
        }
    }

    /// Exact attention of `q` over every row of `layer`, stored blocks pulled back over the link
    /// (counted in this store's stats) and the open rows, on the host.
    pub(crate) fn attend_on_host(
        &mut self,
        host: &mut HostAttention,
        layer: usize,
        q: &[f32],
        out: &mut [f32],
        stats: &mut AttentionStats,
    ) -> Result<(), ModelError> {
        let rows = self.all_rows(layer)?;
        host.causal(&self.shape, &rows.heads(), q, out, stats);
        Ok(())
    }

    pub(crate) fn err(&self, reason: String) -> ModelError {
        ModelError::Attention {
            backend: self.name.clone(),
            reason,
        }
    }

    /// Checks an `attend` call of backend `name` (the layer exists, the queries fit what the
    /// layer holds); returns `(held, t)`: positions held and queries given.
    pub(crate) fn check_attend(
        &self,
        name: &str,
        layer: usize,
        q: &[f32],
        out: &[f32],
    ) -> Result<(usize, usize), ModelError> {
        let shape = self.shape();
        if layer >= shape.layers {
            return Err(self.err(format!("layer {layer} of {}", shape.layers)));
        }
        let held = self.len(layer);
        let t = cxlkv_model::attention::check_attend(&shape, name, held, q, out)?;
        Ok((held, t))
    }

    pub(crate) fn shape(&self) -> AttentionShape {
        self.shape
    }

    pub(crate) fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// First position of `layer` kept in host memory.
    pub(crate) fn tail_start(&self, layer: usize) -> usize {
        self.layers[layer].tail.start
    }

    /// Element type of the pool's blocks (what device commands name).
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    /// Element type of the rows on the host and of the value rows the device gathers: the
    /// blocks' type, or f32 for quantized blocks.
    pub(crate) fn row_dtype(&self) -> DType {
        self.host_dtype
    }

    pub(crate) fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Bytes of a row held on the host.
    fn row_bytes(&self) -> usize {
        self.host_dtype.bytes(self.shape.head_dim)
    }

    /// Positions held for `layer`.
    pub(crate) fn len(&self, layer: usize) -> usize {
        self.layers.get(layer).map_or(0, |l| l.held)
    }

    /// The blocks of `layer` in the pool.
    pub(crate) fn stored(&self, layer: usize) -> &[BlockSpec] {
        &self.layers[layer].stored
    }

    /// Positions of `layer` in the pool (`0 .. stored_len`).
    pub(crate) fn stored_len(&self, layer: usize) -> usize {
        self.layers[layer].stored.len() * self.block_tokens
    }

    /// Rows `from .. held` of `layer`, KV head `h`, held on the host; `from` must be at least
    /// the tail's start.
    pub(crate) fn host_head(&self, layer: usize, h: usize, from: usize) -> HeadRows<'_> {
        let t = &self.layers[layer].tail;
        let at = (from - t.start) * self.row_bytes();
        HeadRows::new(
            &t.k[h][at..],
            &t.v[h][at..],
            self.host_dtype,
            self.shape.head_dim,
        )
        .expect("whole rows")
    }

    fn key(&self, layer: usize, block: usize) -> Key {
        let mut b = Vec::with_capacity(48);
        b.extend_from_slice(b"cxlkv-decode/v1");
        b.extend_from_slice(&self.env.nonce().to_le_bytes());
        b.extend_from_slice(&self.sequence.to_le_bytes());
        b.extend_from_slice(&(layer as u64).to_le_bytes());
        b.extend_from_slice(&(block as u64).to_le_bytes());
        Key::from_bytes(&b)
    }

    /// Appends `t` positions (`[kv_heads][t][head_dim]` f32 each) and writes every block that
    /// fills to the pool.
    pub(crate) fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), ModelError> {
        let t = cxlkv_model::attention::check_append(&self.shape, &self.name, k, v)?;
        if layer >= self.layers.len() {
            return Err(self.err(format!("layer {layer} of {}", self.layers.len())));
        }
        let (d, rb, bt, dtype) = (
            self.shape.head_dim,
            self.row_bytes(),
            self.block_tokens,
            self.host_dtype,
        );
        let stored_len = self.stored_len(layer);
        let l = &mut self.layers[layer];
        // Rows already in the pool leave the host now.
        let drop_rows = stored_len - l.tail.start;
        for rows in l.tail.k.iter_mut().chain(l.tail.v.iter_mut()) {
            rows.drain(..drop_rows * rb);
        }
        l.tail.start = stored_len;
        for h in 0..self.shape.kv_heads {
            push_rows(&mut l.tail.k[h], &k[h * t * d..(h + 1) * t * d], dtype);
            push_rows(&mut l.tail.v[h], &v[h * t * d..(h + 1) * t * d], dtype);
        }
        l.held += t;
        while self.layers[layer].held - self.stored_len(layer) >= bt {
            self.flush(layer)?;
        }
        Ok(())
    }

    /// Writes the next full block of `layer` to the pool (a quantized block is quantized here,
    /// from the host's f32 rows).
    fn flush(&mut self, layer: usize) -> Result<(), ModelError> {
        let (rb, bt) = (self.row_bytes(), self.block_tokens);
        let block = self.layers[layer].stored.len();
        let start = block * bt;
        let l = &self.layers[layer];
        let at = (start - l.tail.start) * rb;
        let mut k = Vec::with_capacity(self.shape.kv_heads * bt * rb);
        let mut v = Vec::with_capacity(k.capacity());
        for h in 0..self.shape.kv_heads {
            k.extend_from_slice(&l.tail.k[h][at..at + bt * rb]);
            v.extend_from_slice(&l.tail.v[h][at..at + bt * rb]);
        }
        let shape = KvShape {
            dtype: self.dtype,
            layer: layer as u32,
            kv_heads: self.shape.kv_heads as u32,
            head_dim: self.shape.head_dim as u32,
            tokens: bt as u32,
            sequence: self.sequence,
            token_offset: start as u64,
        };
        let key = self.key(layer, block);
        let p = self.env.participant();
        let capacity = self.env.kv_capacity();
        if p.live_blocks() >= capacity {
            return Err(self.err(format!(
                "the pool is full: its partition holds {capacity} KV blocks beside the device's \
                 staging blocks and all are in use (a bigger --pool, larger --block-tokens or a \
                 shorter run)"
            )));
        }
        let sketch = self.env.options().sketch.kind;
        p.put_kv_with(key, &shape, &k, &v, sketch)
            .map_err(|e| self.err(format!("writing block {block} of layer {layer}: {e}")))?;
        let payload = shape.offsets_with(sketch).map_or(0, |at| at.len) as u64;
        self.stats.link_write_bytes += payload + BLOCK_HEADER_SIZE + INDEX_SLOT_SIZE;
        self.layers[layer].stored.push(BlockSpec {
            key,
            token_offset: start as u64,
        });
        Ok(())
    }

    /// Every row of `layer` (`0 .. held`) as per-head arrays: blocks below the tail are read back
    /// from the pool (counted as link reads; quantized blocks dequantized), the rest comes from
    /// the host.
    pub(crate) fn all_rows(&mut self, layer: usize) -> Result<Rows, ModelError> {
        let rb = self.row_bytes();
        let held = self.layers[layer].held;
        let kvh = self.shape.kv_heads;
        let mut rows = Rows {
            k: (0..kvh).map(|_| Vec::with_capacity(held * rb)).collect(),
            v: (0..kvh).map(|_| Vec::with_capacity(held * rb)).collect(),
            dtype: self.host_dtype,
            dim: self.shape.head_dim,
        };
        let from_pool = self.layers[layer].tail.start / self.block_tokens;
        let p = self.env.participant();
        for b in 0..from_pool {
            let key = self.layers[layer].stored[b].key;
            self.buf.resize(self.env.block_size() as usize, 0);
            let info = p
                .get_into(key, &mut self.buf)
                .map_err(|e| self.err(format!("reading block {b} of layer {layer}: {e}")))?
                .ok_or_else(|| {
                    self.err(format!(
                        "block {b} of layer {layer} is gone from the pool (evicted: the pool is \
                         too small for this run)"
                    ))
                })?;
            let payload = &self.buf[..info.len as usize];
            self.stats.link_read_bytes += payload.len() as u64 + HOST_META_BYTES_PER_BLOCK;
            let blk = KvBlock::parse(payload)
                .map_err(|e| self.err(format!("block {b} of layer {layer}: {e}")))?;
            let bt = blk.shape.tokens as usize;
            if blk.shape.sequence != self.sequence
                || blk.shape.token_offset != (b * self.block_tokens) as u64
                || bt != self.block_tokens
                || blk.shape.dtype != self.dtype
            {
                return Err(self.err(format!(
                    "block {b} of layer {layer} holds {:?}, not this sequence's",
                    blk.shape
                )));
            }
            for h in 0..kvh {
                if self.dtype.is_quantized() {
                    let (k, v) = blk.head_f32(h);
                    push_rows(&mut rows.k[h], &k, DType::F32);
                    push_rows(&mut rows.v[h], &v, DType::F32);
                } else {
                    rows.k[h].extend_from_slice(&blk.k[h * bt * rb..(h + 1) * bt * rb]);
                    rows.v[h].extend_from_slice(&blk.v[h * bt * rb..(h + 1) * bt * rb]);
                }
            }
        }
        let t = &self.layers[layer].tail;
        for h in 0..kvh {
            rows.k[h].extend_from_slice(&t.k[h]);
            rows.v[h].extend_from_slice(&t.v[h]);
        }
        Ok(rows)
    }

    /// Forgets every position and deletes the sequence's blocks from the pool.
    pub(crate) fn clear(&mut self) {
        let p = self.env.participant();
        for l in &mut self.layers {
            for b in l.stored.drain(..) {
                let _ = p.delete(b.key);
            }
            l.held = 0;
            l.tail.start = 0;
            for rows in l.tail.k.iter_mut().chain(l.tail.v.iter_mut()) {
                rows.clear();
            }
        }
    }
}

impl Drop for Store<'_> {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Appends f32 elements as little-endian `dtype` elements (a float type: quantized blocks are
/// quantized whole, by `put_kv`, never row by row).
pub(crate) fn push_rows(dst: &mut Vec<u8>, src: &[f32], dtype: DType) {
    for &x in src {
        match dtype {
            DType::F32 => dst.extend_from_slice(&x.to_le_bytes()),
            DType::F16 => dst.extend_from_slice(&cxlkv_kernels::f32_to_f16(x).to_le_bytes()),
            DType::Bf16 => dst.extend_from_slice(&cxlkv_kernels::f32_to_bf16(x).to_le_bytes()),
            DType::I8 | DType::I4 => unreachable!("host rows of a quantized store are f32"),
        }
    }
}
