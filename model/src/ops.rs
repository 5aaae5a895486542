//! Row operations shared by the forwards (`model.rs`, `gemma3.rs`).

/// RMSNorm of each row of `x` (rows as wide as `w`) times `w`, into `out`. The mean square sums
/// in f64, as ggml does.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    for (row, dst) in x.chunks_exact(w.len()).zip(out.chunks_exact_mut(w.len())) {
        let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / w.len() as f64;
        let scale = (1.0 / (ms + eps as f64).sqrt()) as f32;
        for ((d, &v), &g) in dst.iter_mut().zip(row).zip(w) {
            *d = v * scale * g;
        }
    }
}

pub(crate) fn add(x: &mut [f32], y: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `[t][heads][d]` to `[heads][t][d]`.
pub(crate) fn head_major(x: &[f32], t: usize, heads: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for i in 0..t {
        for h in 0..heads {
            let src = (i * heads + h) * d;
            let dst = (h * t + i) * d;
            out[dst..dst + d].copy_from_slice(&x[src..src + d]);
        }
    }
    out
}
