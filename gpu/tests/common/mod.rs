//! What the GPU tests (device.rs) and the emulated kernel tests (emulated.rs) share: workloads,
//! the CPU reference and the tolerance.
//!
//! Tolerance: the kernels sum in another order and use the GPU's `exp`, so partials are compared
//! after normalizing (`out / sum`, the attention output): each element within
//! `1e-3 · max|output| + 1e-5` of the CPU's (f16 K/V are widened exactly on both sides, so the
//! difference is f32 rounding only), the maximum score within `1e-4 · (1 + |max|)`.

#![allow(dead_code)] // each test binary uses part of it

use cxlkv_gpu::KvShape;
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::{attend_block, DType, KeyRows, Partial, QueryGroup, ScoreKernel};

/// Random K, V (`heads × rows × dim`) and queries (`heads × g × dim`).
pub fn workload(
    heads: usize,
    rows: usize,
    dim: usize,
    g: usize,
    dtype: DType,
    seed: u64,
) -> (Vec<u8>, Vec<u8>, Vec<f32>) {
    let mut r = SplitMix64::new(seed);
    let k = r.key_bytes(heads * rows, dim, dtype);
    let v = r.key_bytes(heads * rows, dim, dtype);
    let q = r.normal_vec(heads * g * dim);
    (k, v, q)
}

/// The CPU ATTEND (`attend_block`) of each head over rows `sel` (all when `None`).
pub fn cpu(
    k: &[u8],
    v: &[u8],
    q: &[f32],
    s: KvShape,
    g: usize,
    scale: f32,
    sel: Option<&[u32]>,
) -> Vec<Partial> {
    let kernel = ScoreKernel::detect();
    let row = s.dtype.bytes(s.dim);
    let mut out = Vec::new();
    for h in 0..s.heads {
        let head = |b: &[u8]| b[h * s.rows * row..(h + 1) * s.rows * row].to_vec();
        let (mut kh, mut vh) = (head(k), head(v));
        if let Some(sel) = sel {
            let n = sel.len() / s.heads;
            let pick = |b: &[u8]| -> Vec<u8> {
                sel[h * n..(h + 1) * n]
                    .iter()
                    .flat_map(|&i| b[i as usize * row..(i as usize + 1) * row].to_vec())
                    .collect()
            };
            (kh, vh) = (pick(&kh), pick(&vh));
        }
        let keys = KeyRows::new(&kh, s.dtype, s.dim).unwrap();
        let values = KeyRows::new(&vh, s.dtype, s.dim).unwrap();
        let qs = QueryGroup::new(&q[h * g * s.dim..(h + 1) * g * s.dim], s.dim).unwrap();
        out.extend(attend_block(kernel, &qs, &keys, &values, scale));
    }
    out
}

/// Asserts the tolerance above, partial by partial.
pub fn assert_close(what: &str, gpu: &[Partial], cpu: &[Partial]) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: partial count");
    for (i, (a, b)) in gpu.iter().zip(cpu).enumerate() {
        let (fa, fb) = (a.finish(), b.finish());
        let scale = fb.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = fa
            .iter()
            .zip(&fb)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            err <= 1e-3 * scale + 1e-5,
            "{what}: partial {i}: output off by {err} (scale {scale})"
        );
        assert!(
            (a.max - b.max).abs() <= 1e-4 * (1.0 + b.max.abs()),
            "{what}: partial {i}: max {} vs {}",
            a.max,
            b.max
        );
    }
}
