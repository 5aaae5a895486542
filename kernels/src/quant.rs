//! Stand-in of the quantizers (scalar), until the kernels' own module lands: per-channel key
//! scales, per-token value scales, symmetric, round half to even.

use crate::dtype::DType;

fn qmax(dtype: DType) -> f32 {
    match dtype {
        DType::I8 => 127.0,
        DType::I4 => 7.0,
        other => panic!("{other:?} is not a quantized type"),
    }
}

fn put(codes: &mut [u8], dtype: DType, i: usize, c: i32) {
    match dtype {
        DType::I8 => codes[i] = c as i8 as u8,
        _ => {
            let nib = (c as u8) & 0x0f;
            if i.is_multiple_of(2) {
                codes[i / 2] = (codes[i / 2] & 0xf0) | nib;
            } else {
                codes[i / 2] = (codes[i / 2] & 0x0f) | (nib << 4);
            }
        }
    }
}

fn quantize(
    x: &[f32],
    dim: usize,
    dtype: DType,
    scale_of: impl Fn(usize, usize) -> usize,
    scales: &[f32],
) -> Vec<u8> {
    let rows = x.len() / dim;
    let q = qmax(dtype);
    let mut codes = vec![0u8; rows * dtype.bytes(dim)];
    let rb = dtype.bytes(dim);
    for r in 0..rows {
        for d in 0..dim {
            let s = scales[scale_of(r, d)];
            let c = if s == 0.0 {
                0.0
            } else {
                (x[r * dim + d] / s).round_ties_even().clamp(-q, q)
            };
            let row = &mut codes[r * rb..(r + 1) * rb];
            put(row, dtype, d, c as i32);
        }
    }
    codes
}

/// Per-channel symmetric quantization of rows of `dim`: (codes, `dim` scales).
pub fn quantize_keys(x: &[f32], dim: usize, dtype: DType) -> (Vec<u8>, Vec<f32>) {
    let q = qmax(dtype);
    let mut s = vec![0f32; dim];
    for row in x.chunks_exact(dim) {
        for (m, v) in s.iter_mut().zip(row) {
            *m = m.max(v.abs());
        }
    }
    for m in &mut s {
        *m /= q;
    }
    (quantize(x, dim, dtype, |_, d| d, &s), s)
}

/// Per-token symmetric quantization: (codes, one scale per row).
pub fn quantize_values(x: &[f32], dim: usize, dtype: DType) -> (Vec<u8>, Vec<f32>) {
    let q = qmax(dtype);
    let s: Vec<f32> = x
        .chunks_exact(dim)
        .map(|row| row.iter().fold(0f32, |m, v| m.max(v.abs())) / q)
        .collect();
    (quantize(x, dim, dtype, |r, _| r, &s), s)
}

/// `code × scales[d]`.
pub fn dequantize_keys(codes: &[u8], dim: usize, dtype: DType, scales: &[f32]) -> Vec<f32> {
    let rb = dtype.bytes(dim);
    codes
        .chunks_exact(rb)
        .flat_map(|row| (0..dim).map(move |d| dtype.load(row, d) * scales[d]))
        .collect()
}

/// `code × scales[row]`.
pub fn dequantize_values(codes: &[u8], dim: usize, dtype: DType, scales: &[f32]) -> Vec<f32> {
    let rb = dtype.bytes(dim);
    codes
        .chunks_exact(rb)
        .zip(scales)
        .flat_map(|(row, &s)| (0..dim).map(move |d| dtype.load(row, d) * s))
        .collect()
}

/// `q[g][d] × scales[d]`.
pub fn fold_key_scales(queries: &[f32], dim: usize, scales: &[f32]) -> Vec<f32> {
    queries
        .chunks_exact(dim)
        .flat_map(|q| q.iter().zip(scales).map(|(a, b)| a * b))
        .collect()
}
