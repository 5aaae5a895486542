//! Helpers shared by the device tests: pools, typed blocks with known contents, references, the
//! tenant words of a slot and of blocks (test setup), an HTTP GET.
#![allow(dead_code)]

use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::{scan_topk, DType, GroupMode, Hit, KeyRows, QueryGroup, ScoreKernel, TopK};
use cxlkv_runtime::format::{self, BlockHeader};
use cxlkv_runtime::kv::chunk_kv;
use cxlkv_runtime::ndp::{BlockSpec, ScoreRequest};
use cxlkv_runtime::{Backend, Key, KvShape, Participant, Pool, PoolConfig, RegionOptions};
use std::mem::offset_of;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

pub use cxlkv_test_support::TempBackend;

/// A unique /dev/shm backend for one test, removed when dropped.
pub fn shm_backend(tag: &str) -> TempBackend {
    TempBackend::unique_shm(&format!("cxlkv-ndp-test-{tag}"))
}

/// Creates a pool of `size` bytes on `backend` with `block_size` blocks.
pub fn create_pool(backend: &Backend, size: u64, block_size: u64) -> Pool {
    let cfg = PoolConfig {
        block_size,
        participants: 4,
        ..PoolConfig::default()
    };
    Pool::create_on(backend, size, &cfg, &RegionOptions::default()).expect("create pool")
}

/// One sequence of one layer stored as typed blocks, with its keys and values per head kept for
/// reference (`[head][token][dim]`).
pub struct Stored {
    pub blocks: Vec<BlockSpec>,
    pub keys: Vec<Vec<u8>>,
    pub values: Vec<Vec<u8>>,
    pub dim: usize,
    pub dtype: DType,
    pub sequence: u64,
    pub layer: u32,
    pub tokens: usize,
}

impl Stored {
    pub fn key_rows(&self, h: usize) -> KeyRows<'_> {
        KeyRows::new(&self.keys[h], self.dtype, self.dim).unwrap()
    }
    pub fn value_rows(&self, h: usize) -> KeyRows<'_> {
        KeyRows::new(&self.values[h], self.dtype, self.dim).unwrap()
    }
}

/// Stores `k` and `v` (`[heads][tokens][dim]` raw) as blocks of `per_block` tokens.
#[allow(clippy::too_many_arguments)]
pub fn store(
    p: &Participant,
    k: &[u8],
    v: &[u8],
    heads: usize,
    tokens: usize,
    dim: usize,
    dtype: DType,
    per_block: usize,
    sequence: u64,
    layer: u32,
) -> Stored {
    store_with(
        p,
        k,
        v,
        heads,
        tokens,
        dim,
        dtype,
        per_block,
        sequence,
        layer,
        cxlkv_runtime::kv::Sketch::None,
    )
}

/// [`store`], each block with key sketch `sketch`.
#[allow(clippy::too_many_arguments, dead_code)]
pub fn store_with(
    p: &Participant,
    k: &[u8],
    v: &[u8],
    heads: usize,
    tokens: usize,
    dim: usize,
    dtype: DType,
    per_block: usize,
    sequence: u64,
    layer: u32,
    sketch: cxlkv_runtime::kv::Sketch,
) -> Stored {
    let row = dtype.bytes(dim);
    let mut blocks = Vec::new();
    for (range, bk, bv) in chunk_kv(k, v, heads, row, 0..tokens, per_block) {
        let (start, end) = (range.start, range.end);
        let shape = KvShape {
            dtype,
            layer,
            kv_heads: heads as u32,
            head_dim: dim as u32,
            tokens: (end - start) as u32,
            sequence,
            token_offset: start as u64,
        };
        let key = Key::from_bytes(format!("seq{sequence}/layer{layer}/tok{start}").as_bytes());
        p.put_kv_with(key, &shape, &bk, &bv, sketch)
            .expect("put_kv");
        blocks.push(BlockSpec {
            key,
            token_offset: start as u64,
        });
    }
    let split = |x: &[u8]| {
        (0..heads)
            .map(|h| x[h * tokens * row..(h + 1) * tokens * row].to_vec())
            .collect()
    };
    Stored {
        blocks,
        keys: split(k),
        values: split(v),
        dim,
        dtype,
        sequence,
        layer,
        tokens,
    }
}

/// Random keys clustered per 100 tokens (so block bounds prune), random values.
pub fn random_kv(
    seed: u64,
    heads: usize,
    tokens: usize,
    dim: usize,
    dtype: DType,
) -> (Vec<u8>, Vec<u8>) {
    let mut rng = SplitMix64::new(seed);
    let mut k = Vec::new();
    for _h in 0..heads {
        let mut center = rng.normal_vec(dim);
        for t in 0..tokens {
            if t % 100 == 0 {
                center = rng.normal_vec(dim);
            }
            for c in center.iter() {
                cxlkv_kernels::rng::push_elem(&mut k, dtype, c + 0.05 * rng.normal());
            }
        }
    }
    let v = rng.key_bytes(heads * tokens, dim, dtype);
    (k, v)
}

/// The exact dense reference: the kernels' full scan over the concatenated keys of head `h`.
pub fn reference(
    s: &Stored,
    h: usize,
    queries: &[f32],
    k: usize,
    mode: GroupMode,
) -> Vec<Vec<Hit>> {
    let q = QueryGroup::new(queries, s.dim).unwrap();
    let topk = TopK { k, mode };
    scan_topk(ScoreKernel::scalar(), &q, &s.key_rows(h), topk)
}

/// The value rows of `hits` from the reference tensors.
pub fn reference_values(s: &Stored, h: usize, lists: &[Vec<Hit>]) -> Vec<u8> {
    let rows = s.value_rows(h);
    lists
        .iter()
        .flatten()
        .flat_map(|hit| rows.row_vec(hit.index as usize))
        .collect()
}

pub fn request<'a>(
    s: &'a Stored,
    h: u32,
    queries: &'a [f32],
    k: usize,
    mode: GroupMode,
    prune: bool,
    gather: bool,
) -> ScoreRequest<'a> {
    ScoreRequest {
        queries,
        dim: s.dim,
        blocks: &s.blocks,
        sequence: s.sequence,
        layer: s.layer,
        kv_head: h,
        dtype: s.dtype,
        k,
        mode,
        prune,
        gather_values: gather,
        scale: None,
        select: Default::default(),
    }
}

pub fn hits_of(t: &cxlkv_runtime::ndp::TopK) -> Vec<Vec<Hit>> {
    (0..t.indices.len()).map(|l| t.hits(l)).collect()
}

/// The real SmolLM2 tensors, if present: (q [9][2048][64], k [3][2048][64], v) raw f16.
pub fn smollm2(layer: u32) -> Option<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/kv/smollm2_devil_2048");
    let read = |n: &str| {
        cxlkv_bench_support::npy::read_npy(dir.join(format!("layer{layer:02}_{n}.npy")))
            .ok()
            .map(|a| a.data)
    };
    Some((read("q")?, read("k")?, read("v")?))
}

/// Query vectors `[G][dim]` f32 of query heads `first..first+g` at token `t` from `[heads][T][dim]` f16.
pub fn queries_at(
    q: &[u8],
    tokens: usize,
    dim: usize,
    first: usize,
    g: usize,
    t: usize,
) -> Vec<f32> {
    let mut out = Vec::new();
    for h in first..first + g {
        let base = (h * tokens + t) * dim;
        for d in 0..dim {
            out.push(DType::F16.load(q, base + d));
        }
    }
    out
}

/// The whole HTTP answer to `GET path` from `addr` (status line, headers, body).
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Test setup: participant `p` attached as `tenant` (its slot's `tenant` word, format 3.2, which
/// the holder writes when it attaches).
pub fn attach_as(pool: &Pool, p: &Participant, tenant: u64) {
    let off = pool.superblock().participant_table_off
        + u64::from(p.id()) * pool.slot_layout().size
        + format::slot::TENANT;
    pool.memory()
        .store_u64(off, tenant, Ordering::Release)
        .unwrap();
}

/// Test setup: `blocks` belong to `tenant` (their header's `tenant` word, offset 56, not covered
/// by `header_crc`, which a put of that tenant writes).
pub fn give(pool: &Pool, blocks: &[BlockSpec], tenant: u32) {
    let sb = pool.superblock();
    for b in blocks {
        // The tests' participants attach tenant-less (partitions tagged 0), so every block is in
        // a partition any reader may probe, whatever tenant its header names.
        let r = pool
            .block_ref_any_tenant(b.key)
            .unwrap()
            .expect("a stored block");
        let off = pool.partition_offset(r.location.partition).unwrap()
            + sb.block_headers_off
            + u64::from(r.location.block) * format::BLOCK_HEADER_SIZE
            + offset_of!(BlockHeader, tenant) as u64;
        pool.memory().write(off, &tenant.to_le_bytes()).unwrap();
        let now = pool
            .block_ref_any_tenant(b.key)
            .unwrap()
            .expect("still valid");
        assert_eq!(now.header.tenant, tenant);
    }
}
