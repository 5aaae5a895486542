//! ATTEND golden sets (`NAME.gatt`): the partials of the Rust reference over typed K/V blocks.
//!
//! Format, little-endian: `b"CXLKVGA1"`, `u32 dtype, dim, tokens, block_tokens, nblocks, ncases`,
//! the keys then the values (`tokens * dim` raw elements each), then per case `u32 g`, `f32 scale`,
//! `f32 queries[g][dim]`, then the expected partials: `f32 out[g][dim]`, `f32 max[g]`,
//! `f32 sum[g]`.
//!
//! The reference is the device's: per block (of `block_tokens` rows, the last one shorter), the
//! partials of [`attend_block`] (the fused kernel: canonical scores, chunks of 64 rows folded
//! online with the polynomial `exp_neg`), merged in block order with [`Partial::merge`].

use cxlkv_kernels::{attend_block, DType, KeyRows, Partial, QueryGroup, ScoreKernel};
use std::io::Write;
use std::path::Path;

/// One ATTEND set: keys and values of one KV head, split into blocks, and query groups.
pub struct AttendSet {
    pub name: String,
    pub dtype: DType,
    pub dim: usize,
    pub keys: Vec<u8>,
    pub values: Vec<u8>,
    pub block_tokens: usize,
    /// `(g, queries g * dim, scale)`.
    pub cases: Vec<(usize, Vec<f32>, f32)>,
}

fn put_u32(out: &mut Vec<u8>, x: u32) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn put_f32s(out: &mut Vec<u8>, xs: &[f32]) {
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// The reference partials of `queries` over the blocks of `keys` / `values`.
pub fn reference(
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    values: &KeyRows<'_>,
    block_tokens: usize,
    scale: f32,
) -> Vec<Partial> {
    let (g, dim) = (queries.count(), queries.dim());
    let mut acc: Vec<Partial> = (0..g).map(|_| Partial::empty(dim)).collect();
    let mut start = 0;
    while start < keys.len() {
        let end = (start + block_tokens).min(keys.len());
        let (k, v) = (keys.slice(start, end), values.slice(start, end));
        for (a, p) in
            acc.iter_mut()
                .zip(attend_block(ScoreKernel::scalar(), queries, &k, &v, scale))
        {
            a.merge(&p);
        }
        start = end;
    }
    acc
}

/// Writes `dir/NAME.gatt`; returns the number of cases.
pub fn write(dir: &Path, s: &AttendSet) -> std::io::Result<usize> {
    let keys = KeyRows::new(&s.keys, s.dtype, s.dim).expect("key shape");
    let values = KeyRows::new(&s.values, s.dtype, s.dim).expect("value shape");
    assert_eq!(keys.len(), values.len());
    let nblocks = keys.len().div_ceil(s.block_tokens);
    let mut out = b"CXLKVGA1".to_vec();
    for x in [
        s.dtype as u32,
        s.dim as u32,
        keys.len() as u32,
        s.block_tokens as u32,
        nblocks as u32,
        s.cases.len() as u32,
    ] {
        put_u32(&mut out, x);
    }
    out.extend_from_slice(&s.keys);
    out.extend_from_slice(&s.values);
    for (g, qv, scale) in &s.cases {
        let q = QueryGroup::new(qv, s.dim).expect("query shape");
        let parts = reference(&q, &keys, &values, s.block_tokens, *scale);
        put_u32(&mut out, *g as u32);
        put_f32s(&mut out, &[*scale]);
        put_f32s(&mut out, qv);
        for p in &parts {
            put_f32s(&mut out, &p.out);
        }
        for p in &parts {
            put_f32s(&mut out, &[p.max]);
        }
        for p in &parts {
            put_f32s(&mut out, &[p.sum]);
        }
    }
    std::fs::File::create(dir.join(format!("{}.gatt", s.name)))?.write_all(&out)?;
    Ok(s.cases.len())
}
