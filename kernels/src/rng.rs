//! A small seeded generator (SplitMix64) for tests, property tests and benchmarks, so that the
//! crate needs no `rand` dependency and every generated case can be replayed from its seed.

use crate::dtype::{f32_to_bf16, f32_to_f16, DType};

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, full period, good enough mixing for test
/// data. Not for cryptography.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant for test data).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Approximately standard normal (sum of four uniforms, rescaled): cheap and bounded.
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.unit()).sum();
        (s - 2.0) * 1.732_050_8
    }

    /// `n` approximately normal floats.
    pub fn normal_vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal()).collect()
    }

    /// `n` rows of `dim` approximately normal elements of `dtype`, little-endian bytes; for a
    /// quantized `dtype`, uniform codes in `-qmax..=qmax` (two a byte for `I4`, low nibble first).
    pub fn key_bytes(&mut self, n: usize, dim: usize, dtype: DType) -> Vec<u8> {
        if let Some(qmax) = dtype.qmax() {
            let span = (2 * qmax + 1) as u64;
            let codes: Vec<u8> = (0..n * dim)
                .map(|_| (self.below(span) as i32 - qmax) as u8)
                .collect();
            return match dtype {
                DType::I4 => codes
                    .chunks(2)
                    .map(|p| (p[0] & 0x0f) | (p.get(1).map_or(0, |c| c & 0x0f) << 4))
                    .collect(),
                _ => codes,
            };
        }
        let mut out = Vec::with_capacity(dtype.bytes(n * dim));
        for _ in 0..n * dim {
            push_elem(&mut out, dtype, self.normal());
        }
        out
    }
}

/// Appends `x` rounded to the float type `dtype` to `out` (little-endian). Panics for a
/// quantized `dtype`: its elements need scales, made by [`crate::quant`] over whole rows.
pub fn push_elem(out: &mut Vec<u8>, dtype: DType, x: f32) {
    match dtype {
        DType::F16 => out.extend_from_slice(&f32_to_f16(x).to_le_bytes()),
        DType::Bf16 => out.extend_from_slice(&f32_to_bf16(x).to_le_bytes()),
        DType::F32 => out.extend_from_slice(&x.to_le_bytes()),
        DType::I8 | DType::I4 => panic!(
            "push_elem: {} elements need scales; quantize rows with cxlkv_kernels::quant",
            dtype.name()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn replays_from_seed_and_spreads() {
        let a: Vec<u64> = {
            let mut r = SplitMix64::new(42);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let mut r = SplitMix64::new(42);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        let xs = r.normal_vec(10_000);
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.1, "{mean} {var}");
    }
}
