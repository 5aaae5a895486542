//! Element widening in registers for the SIMD kernels: 8 (AVX2) or 16 (AVX-512) elements of any
//! [`DType`] at a byte address, to f32 lanes, exactly (the scalar oracle is [`DType::load`]).
//! The score and attention kernels are generic over the dtype's code (`const DT: u8`); these
//! functions are their only element loads, so a new dtype is added here once.
//!
//! Integer codes never go through a private copy: `I8` sign-extends bytes (`vpmovsxbd`); `I4`
//! puts the 32-bit word that holds lane `k`'s nibble in lane `k` (a broadcast of the 4 bytes for
//! 8 lanes; a broadcast of the 8 bytes and one `vpermd` for 16), moves nibble `k % 8` of it to
//! the top of the lane with a per-lane shift (`vpsllvd` by `28 − 4·(k % 8)`) and shifts it back
//! arithmetically (`vpsrad` by 28), which extends the sign; then `vcvtdq2ps`. Element `k` is at
//! bits `4k..4k + 4` of the little-endian word because element `2j` is the low nibble of byte
//! `j`.

use crate::dtype::DType;
use std::arch::x86_64::*;

pub(crate) const F16: u8 = DType::F16 as u8;
pub(crate) const BF16: u8 = DType::Bf16 as u8;
pub(crate) const F32: u8 = DType::F32 as u8;
pub(crate) const I8: u8 = DType::I8 as u8;
pub(crate) const I4: u8 = DType::I4 as u8;

/// Bytes of `elems` elements of the dtype with code `DT` (`elems` even).
#[inline(always)]
pub(crate) const fn span<const DT: u8>(elems: usize) -> usize {
    match DT {
        F32 => 4 * elems,
        I8 => elems,
        I4 => elems / 2,
        _ => 2 * elems,
    }
}

/// Eight elements of code `DT` at `p`, as f32.
///
/// # Safety
/// AVX2, F16C and FMA present; `span::<DT>(8)` bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
pub(crate) unsafe fn load8<const DT: u8>(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees `span::<DT>(8)` readable bytes at `p` (32, 16, 8 or 4), and
    // each branch reads exactly that many; loads are unaligned.
    unsafe {
        if DT == F16 {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        } else if DT == BF16 {
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
        } else if DT == I8 {
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
        } else if DT == I4 {
            let word = _mm256_set1_epi32((p as *const i32).read_unaligned());
            let up = _mm256_sllv_epi32(word, _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0));
            _mm256_cvtepi32_ps(_mm256_srai_epi32::<28>(up))
        } else {
            _mm256_loadu_ps(p as *const f32)
        }
    }
}

/// Sixteen elements of code `DT` at `p`, as f32.
///
/// # Safety
/// AVX-512F, AVX2, F16C and FMA present; `span::<DT>(16)` bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
pub(crate) unsafe fn load16<const DT: u8>(p: *const u8) -> __m512 {
    // SAFETY: the caller guarantees `span::<DT>(16)` readable bytes at `p` (64, 32, 16 or 8),
    // and each branch reads exactly that many; loads are unaligned.
    unsafe {
        if DT == F16 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
        } else if DT == BF16 {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        } else if DT == I8 {
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)))
        } else if DT == I4 {
            let words = _mm512_castsi128_si512(_mm_loadl_epi64(p as *const __m128i));
            let which = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
            let lanes = _mm512_permutexvar_epi32(which, words);
            let shifts =
                _mm512_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0);
            let up = _mm512_sllv_epi32(lanes, shifts);
            _mm512_cvtepi32_ps(_mm512_srai_epi32::<28>(up))
        } else {
            _mm512_loadu_ps(p as *const f32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte pattern widens as the scalar `DType::load` decodes it.
    #[test]
    fn registers_widen_as_the_oracle_decodes() {
        let bytes: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
        macro_rules! check {
            ($dt:expr, $dtype:expr) => {
                let dtype = $dtype;
                for off in (0..bytes.len() - 64).step_by(3) {
                    let p = bytes[off..].as_ptr();
                    let want: Vec<f32> = (0..16).map(|i| dtype.load(&bytes[off..], i)).collect();
                    if crate::score::Isa::Avx2.is_available() {
                        let mut got = [0f32; 8];
                        // SAFETY: AVX2, F16C and FMA were detected; 64 bytes are readable at `p`.
                        unsafe { _mm256_storeu_ps(got.as_mut_ptr(), load8::<{ $dt }>(p)) };
                        let got = got.map(f32::to_bits);
                        let want: Vec<u32> = want[..8].iter().map(|x| x.to_bits()).collect();
                        assert_eq!(got[..], want[..], "{dtype:?} avx2 at {off}");
                    }
                    if crate::score::Isa::Avx512.is_available() {
                        let mut got = [0f32; 16];
                        // SAFETY: AVX-512F, AVX2, F16C and FMA were detected; 64 bytes are
                        // readable at `p`.
                        unsafe { _mm512_storeu_ps(got.as_mut_ptr(), load16::<{ $dt }>(p)) };
                        let got = got.map(f32::to_bits);
                        let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
                        assert_eq!(got[..], want[..], "{dtype:?} avx512 at {off}");
                    }
                }
            };
        }
        check!(I8, DType::I8);
        check!(I4, DType::I4);
        check!(BF16, DType::Bf16);
    }
}
