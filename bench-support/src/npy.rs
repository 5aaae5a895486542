//! A small reader (and writer) of NumPy `.npy` files: format versions 1.0, 2.0 and 3.0,
//! little-endian `<f2`, `<f4` and `<i4`, C order. Enough for the real tensors under `data/` and
//! for handing benchmark data to and from numpy, with clear errors on anything else.
//!
//! Format: magic `\x93NUMPY`, major and minor version bytes, header length (u16 little-endian for
//! version 1, u32 for 2 and 3), then a Python dict literal such as
//! `{'descr': '<f2', 'fortran_order': False, 'shape': (3, 2048, 64), }` padded with spaces and a
//! newline, then the raw array bytes.

use std::fmt;
use std::path::Path;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Element type of an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpyDType {
    /// `<f2`: IEEE binary16.
    F16,
    /// `<f4`: IEEE binary32.
    F32,
    /// `<i4`: signed 32-bit integer.
    I32,
}

impl NpyDType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            NpyDType::F16 => 2,
            NpyDType::F32 | NpyDType::I32 => 4,
        }
    }

    /// The `descr` string.
    pub fn descr(self) -> &'static str {
        match self {
            NpyDType::F16 => "<f2",
            NpyDType::F32 => "<f4",
            NpyDType::I32 => "<i4",
        }
    }
}

/// A malformed or unsupported `.npy` file.
#[derive(Debug)]
pub enum NpyError {
    /// The file could not be read.
    Io(std::io::Error),
    /// The file does not start with `\x93NUMPY`.
    BadMagic,
    /// A format version this reader does not know.
    UnsupportedVersion {
        /// Major version byte.
        major: u8,
        /// Minor version byte.
        minor: u8,
    },
    /// The file ends before the header or the data it announces.
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        len: usize,
    },
    /// The header dict could not be parsed.
    BadHeader(String),
    /// An element type other than `<f2`, `<f4`, `<i4`.
    UnsupportedDtype(String),
    /// Fortran (column-major) order.
    FortranOrder,
    /// The data size does not match the shape.
    SizeMismatch {
        /// Bytes the shape implies.
        expected: usize,
        /// Bytes present after the header.
        actual: usize,
    },
    /// The caller asked for another element type.
    WrongDtype {
        /// Type wanted.
        wanted: NpyDType,
        /// Type of the file.
        found: NpyDType,
    },
}

impl fmt::Display for NpyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NpyError::Io(e) => write!(f, "cannot read .npy file: {e}"),
            NpyError::BadMagic => write!(f, "not a .npy file (bad magic)"),
            NpyError::UnsupportedVersion { major, minor } => {
                write!(f, "unsupported .npy version {major}.{minor}")
            }
            NpyError::Truncated { needed, len } => {
                write!(f, ".npy file truncated: needs {needed} bytes, has {len}")
            }
            NpyError::BadHeader(why) => write!(f, "bad .npy header: {why}"),
            NpyError::UnsupportedDtype(d) => {
                write!(f, "unsupported .npy dtype {d:?} (expected <f2, <f4 or <i4)")
            }
            NpyError::FortranOrder => write!(f, "Fortran-order .npy arrays are not supported"),
            NpyError::SizeMismatch { expected, actual } => {
                write!(f, ".npy data is {actual} bytes, shape implies {expected}")
            }
            NpyError::WrongDtype { wanted, found } => {
                write!(
                    f,
                    ".npy array is {}, wanted {}",
                    found.descr(),
                    wanted.descr()
                )
            }
        }
    }
}

impl std::error::Error for NpyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NpyError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for NpyError {
    fn from(e: std::io::Error) -> Self {
        NpyError::Io(e)
    }
}

/// An array read from a `.npy` file: its element type, shape and raw little-endian bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyArray {
    /// Element type.
    pub dtype: NpyDType,
    /// Shape, outermost axis first (C order). Empty for a scalar.
    pub shape: Vec<usize>,
    /// Raw little-endian element bytes, C order.
    pub data: Vec<u8>,
}

impl NpyArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True if the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn expect(&self, wanted: NpyDType) -> Result<(), NpyError> {
        if self.dtype == wanted {
            Ok(())
        } else {
            Err(NpyError::WrongDtype {
                wanted,
                found: self.dtype,
            })
        }
    }

    /// The elements of an `<f2` array as binary16 bit patterns.
    pub fn to_f16_bits(&self) -> Result<Vec<u16>, NpyError> {
        self.expect(NpyDType::F16)?;
        Ok(self
            .data
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect())
    }

    /// The elements of an `<f2` or `<f4` array as f32 (exact).
    pub fn to_f32(&self) -> Result<Vec<f32>, NpyError> {
        match self.dtype {
            NpyDType::F16 => Ok(self
                .to_f16_bits()?
                .into_iter()
                .map(cxlkv_kernels::dtype::f16_to_f32)
                .collect()),
            NpyDType::F32 => Ok(self
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()),
            NpyDType::I32 => Err(NpyError::WrongDtype {
                wanted: NpyDType::F32,
                found: NpyDType::I32,
            }),
        }
    }

    /// The elements of an `<i4` array.
    pub fn to_i32(&self) -> Result<Vec<i32>, NpyError> {
        self.expect(NpyDType::I32)?;
        Ok(self
            .data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

/// Reads the `.npy` file at `path`.
pub fn read_npy(path: impl AsRef<Path>) -> Result<NpyArray, NpyError> {
    parse_npy(&std::fs::read(path)?)
}

/// Parses the bytes of a `.npy` file.
pub fn parse_npy(bytes: &[u8]) -> Result<NpyArray, NpyError> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(NpyError::BadMagic);
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (header_len, header_start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(NpyError::Truncated {
                    needed: 12,
                    len: bytes.len(),
                });
            }
            let len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
            (len, 12)
        }
        _ => return Err(NpyError::UnsupportedVersion { major, minor }),
    };
    let data_start = header_start + header_len;
    if bytes.len() < data_start {
        return Err(NpyError::Truncated {
            needed: data_start,
            len: bytes.len(),
        });
    }
    let header = std::str::from_utf8(&bytes[header_start..data_start])
        .map_err(|_| NpyError::BadHeader("header is not text".into()))?;
    let descr = dict_value(header, "descr")?;
    let descr = parse_quoted(descr)?;
    let dtype = match descr.as_str() {
        "<f2" => NpyDType::F16,
        "<f4" => NpyDType::F32,
        "<i4" => NpyDType::I32,
        _ => return Err(NpyError::UnsupportedDtype(descr)),
    };
    let fortran = dict_value(header, "fortran_order")?;
    if fortran.starts_with("True") {
        return Err(NpyError::FortranOrder);
    } else if !fortran.starts_with("False") {
        return Err(NpyError::BadHeader(
            "fortran_order is not True or False".into(),
        ));
    }
    let shape = parse_shape(dict_value(header, "shape")?)?;
    let expected = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| NpyError::BadHeader("shape overflows".into()))?;
    let actual = bytes.len() - data_start;
    if actual != expected {
        return Err(NpyError::SizeMismatch { expected, actual });
    }
    Ok(NpyArray {
        dtype,
        shape,
        data: bytes[data_start..].to_vec(),
    })
}

/// The text after `'key':` in a header dict, with leading spaces removed.
fn dict_value<'h>(header: &'h str, key: &str) -> Result<&'h str, NpyError> {
    let quoted = format!("'{key}'");
    let at = header
        .find(&quoted)
        .ok_or_else(|| NpyError::BadHeader(format!("no {quoted} key")))?;
    let rest = header[at + quoted.len()..].trim_start();
    let rest = rest
        .strip_prefix(':')
        .ok_or_else(|| NpyError::BadHeader(format!("no ':' after {quoted}")))?;
    Ok(rest.trim_start())
}

fn parse_quoted(s: &str) -> Result<String, NpyError> {
    let q = s
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"')
        .ok_or_else(|| NpyError::BadHeader("descr is not a string".into()))?;
    let body = &s[1..];
    let end = body
        .find(q)
        .ok_or_else(|| NpyError::BadHeader("unterminated descr string".into()))?;
    Ok(body[..end].to_string())
}

fn parse_shape(s: &str) -> Result<Vec<usize>, NpyError> {
    let body = s
        .strip_prefix('(')
        .and_then(|b| b.find(')').map(|end| &b[..end]))
        .ok_or_else(|| NpyError::BadHeader("shape is not a tuple".into()))?;
    body.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| NpyError::BadHeader(format!("bad shape entry {t:?}")))
        })
        .collect()
}

/// Encodes an array as a version 1.0 `.npy` file (header padded to 64 bytes).
pub fn encode_npy(dtype: NpyDType, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        dtype.descr(),
        shape_text
    );
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Writes an array to `path` as a version 1.0 `.npy` file.
pub fn write_npy(
    path: impl AsRef<Path>,
    dtype: NpyDType,
    shape: &[usize],
    data: &[u8],
) -> Result<(), NpyError> {
    std::fs::write(path, encode_npy(dtype, shape, data))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_encode() {
        let data: Vec<u8> = (1..=6i32).flat_map(|x| x.to_le_bytes()).collect();
        let bytes = encode_npy(NpyDType::I32, &[2, 3], &data);
        assert_eq!((bytes.len() - data.len()) % 64, 0);
        let a = parse_npy(&bytes).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.to_i32().unwrap(), vec![1, 2, 3, 4, 5, 6]);
        let one = parse_npy(&encode_npy(NpyDType::F32, &[1], &1.5f32.to_le_bytes())).unwrap();
        assert_eq!(one.to_f32().unwrap(), vec![1.5]);
        assert!(matches!(
            a.to_f32(),
            Err(NpyError::WrongDtype {
                wanted: NpyDType::F32,
                found: NpyDType::I32
            })
        ));
    }

    #[test]
    fn reads_version_2_and_scalars() {
        let header = "{'descr': '<f2', 'fortran_order': False, 'shape': (), }\n";
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[2, 0]);
        bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&0x3c00u16.to_le_bytes());
        let a = parse_npy(&bytes).unwrap();
        assert!(a.shape.is_empty());
        assert_eq!(a.to_f32().unwrap(), vec![1.0]);
    }

    #[test]
    fn rejects_malformed_files_clearly() {
        let good = encode_npy(NpyDType::F16, &[2], &[0, 0, 0, 0]);
        assert!(matches!(parse_npy(b"hello world"), Err(NpyError::BadMagic)));
        let mut v9 = good.clone();
        v9[6] = 9;
        assert!(matches!(
            parse_npy(&v9),
            Err(NpyError::UnsupportedVersion { major: 9, .. })
        ));
        assert!(matches!(
            parse_npy(&good[..good.len() - 1]),
            Err(NpyError::SizeMismatch {
                expected: 4,
                actual: 3
            })
        ));
        assert!(matches!(
            parse_npy(&good[..20]),
            Err(NpyError::Truncated { .. })
        ));
        let replace = |from: &str, to: &str| {
            let at = good
                .windows(from.len())
                .position(|w| w == from.as_bytes())
                .unwrap();
            let mut v = good.clone();
            v[at..at + from.len()].copy_from_slice(to.as_bytes());
            v
        };
        let big = replace("<f2", ">f2");
        assert!(matches!(parse_npy(&big), Err(NpyError::UnsupportedDtype(d)) if d == ">f2"));
        let fortran = replace("False", "True ");
        assert!(matches!(parse_npy(&fortran), Err(NpyError::FortranOrder)));
        let noshape = replace("'shape'", "'shope'");
        let err = parse_npy(&noshape).unwrap_err();
        assert!(err.to_string().contains("shape"), "{err}");
    }
}
