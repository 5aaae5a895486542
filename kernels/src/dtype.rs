//! Element types of stored keys and values, and exact conversions between them and `f32`.

/// Element type of a stored key or value tensor. The discriminants are the on-memory codes
/// (docs/FORMAT.md) and must never change.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary16.
    F16 = 1,
    /// bfloat16: the upper half of an IEEE binary32.
    Bf16 = 2,
    /// IEEE 754 binary32.
    F32 = 3,
    /// Signed 8-bit integer codes (two's complement, one byte per element) of a quantized tensor;
    /// the scales live beside the codes ([`crate::quant`]).
    I8 = 4,
    /// Signed 4-bit integer codes, two per byte: element `2j` in the low nibble of byte `j`,
    /// element `2j + 1` in the high nibble, each two's complement. The quantizers produce only
    /// `-7..=7`; `-8` decodes as `-8`.
    I4 = 5,
}

impl DType {
    /// Bytes of `elems` elements (for [`DType::I4`], half a byte each, rounded up).
    pub const fn bytes(self, elems: usize) -> usize {
        match self {
            DType::F16 | DType::Bf16 => 2 * elems,
            DType::F32 => 4 * elems,
            DType::I8 => elems,
            DType::I4 => elems.div_ceil(2),
        }
    }

    /// Whether elements are integer codes that need scales ([`DType::I8`], [`DType::I4`]).
    pub const fn is_quantized(self) -> bool {
        matches!(self, DType::I8 | DType::I4)
    }

    /// Largest code magnitude the quantizers produce: 127 for `I8`, 7 for `I4`; `None` for the
    /// float types.
    pub const fn qmax(self) -> Option<i32> {
        match self {
            DType::I8 => Some(127),
            DType::I4 => Some(7),
            DType::F16 | DType::Bf16 | DType::F32 => None,
        }
    }

    /// The dtype with on-memory code `code`, if there is one.
    pub const fn from_code(code: u8) -> Option<DType> {
        match code {
            1 => Some(DType::F16),
            2 => Some(DType::Bf16),
            3 => Some(DType::F32),
            4 => Some(DType::I8),
            5 => Some(DType::I4),
            _ => None,
        }
    }

    /// Short lowercase name (`f16`, `bf16`, `f32`, `int8`, `int4`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::I8 => "int8",
            DType::I4 => "int4",
        }
    }

    /// Decodes element `i` of `bytes` (little-endian) to f32: the value of a float type, the
    /// integer code of a quantized one (exact in every case). Panics if out of range.
    #[inline]
    pub fn load(self, bytes: &[u8], i: usize) -> f32 {
        match self {
            DType::F16 => f16_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])),
            DType::Bf16 => bf16_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])),
            DType::F32 => f32::from_le_bytes([
                bytes[4 * i],
                bytes[4 * i + 1],
                bytes[4 * i + 2],
                bytes[4 * i + 3],
            ]),
            DType::I8 => bytes[i] as i8 as f32,
            DType::I4 => i4_code(bytes[i / 2], i % 2 == 1) as f32,
        }
    }
}

/// The 4-bit two's complement code in the low (`high == false`) or high nibble of `byte`.
#[inline]
pub const fn i4_code(byte: u8, high: bool) -> i8 {
    let nibble = if high { byte >> 4 } else { byte & 0x0f };
    // Shift the nibble to the top of an i8 and back: the arithmetic shift extends the sign.
    ((nibble << 4) as i8) >> 4
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f16" | "float16" => Ok(DType::F16),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "f32" | "float32" => Ok(DType::F32),
            "int8" | "i8" => Ok(DType::I8),
            "int4" | "i4" | "q4" => Ok(DType::I4),
            other => Err(format!(
                "unknown dtype {other:?} (expected f16, bf16, f32, int8 or int4)"
            )),
        }
    }
}

/// Exact conversion of an IEEE binary16 bit pattern to f32 (subnormals, infinities and NaN
/// included). This is the scalar reference the SIMD paths (`vcvtph2ps`) must match.
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: value = m * 2^-24, exactly representable in f32.
            let v = m as f32 * f32::from_bits(0x3380_0000); // 2^-24
            return if sign != 0 { -v } else { v };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// bfloat16 bit pattern to f32 (exact: a shift).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 to bfloat16, rounding to nearest even (NaN stays NaN).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// f32 to IEEE binary16, rounding to nearest even, overflow to infinity.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && (r & 1) == 1) {
        r += 1;
    }
    sign | r as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn f16_roundtrips_every_finite_pattern() {
        for h in 0u16..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                assert!(f32_to_f16(x) & 0x7c00 == 0x7c00 && f32_to_f16(x) & 0x3ff != 0);
                continue;
            }
            assert_eq!(f32_to_f16(x), h, "pattern {h:#06x} -> {x}");
        }
    }

    #[test]
    fn known_f16_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        // 2^-24 spelled exactly: Miri's `powi` is deliberately imprecise.
        assert_eq!(f16_to_f32(0x0001), f32::from_bits(0x3380_0000));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
    }

    #[test]
    fn integer_codes_decode_and_size() {
        // Nibble order: element 0 is the low nibble of byte 0, element 1 its high nibble.
        let b = [0x9_7u8, 0x0_f];
        let got: Vec<f32> = (0..4).map(|i| DType::I4.load(&b, i)).collect();
        assert_eq!(got, [7.0, -7.0, -1.0, 0.0]);
        assert_eq!(DType::I4.load(&[0x08], 0), -8.0);
        assert_eq!(DType::I8.load(&[0x81, 0x7f, 0xff], 0), -127.0);
        assert_eq!(DType::I8.load(&[0x81, 0x7f, 0xff], 1), 127.0);
        assert_eq!(DType::I8.load(&[0x81, 0x7f, 0xff], 2), -1.0);
        assert_eq!(
            [DType::F16, DType::Bf16, DType::F32, DType::I8, DType::I4].map(|d| d.bytes(5)),
            [10, 10, 20, 5, 3]
        );
        for d in [DType::F16, DType::Bf16, DType::F32, DType::I8, DType::I4] {
            assert_eq!(DType::from_code(d as u8), Some(d));
            assert_eq!(d.name().parse::<DType>(), Ok(d));
            assert_eq!(d.is_quantized(), d.qmax().is_some());
        }
        assert_eq!("q4".parse::<DType>(), Ok(DType::I4));
        assert_eq!("i8".parse::<DType>(), Ok(DType::I8));
        assert!("int2".parse::<DType>().is_err());
        assert_eq!(DType::from_code(6), None);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(f32_to_bf16(3.140625)), 3.140625);
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
    }
}
