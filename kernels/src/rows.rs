//! Validated views of the kernels' inputs: typed key/value rows and query groups.
//!
//! Shapes are checked once, when a view is built; the kernels then index without re-checking
//! more than slice bounds.

use crate::dtype::DType;
use std::fmt;

/// Largest supported head dimension.
pub const MAX_DIM: usize = 256;

/// Lanes of the canonical accumulation order; head dimensions are multiples of it.
pub const LANES: usize = 16;

/// A shape that the kernels cannot take, with the offending values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShapeError {
    /// Head dimension not a multiple of 16 in `16..=256`.
    Dim {
        /// The dimension given.
        dim: usize,
    },
    /// Byte length not a whole number of rows.
    RaggedRows {
        /// Bytes given.
        len: usize,
        /// Bytes per row.
        row_bytes: usize,
    },
    /// Query slice length is not `count * dim`, or the group is empty.
    Queries {
        /// Floats given.
        len: usize,
        /// Head dimension.
        dim: usize,
    },
    /// More rows than a `u32` token index can name.
    TooManyRows {
        /// Rows given.
        rows: usize,
    },
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShapeError::Dim { dim } => {
                write!(
                    f,
                    "head dimension {dim} is not a multiple of 16 in 16..=256"
                )
            }
            ShapeError::RaggedRows { len, row_bytes } => {
                write!(
                    f,
                    "{len} bytes is not a whole number of {row_bytes}-byte rows"
                )
            }
            ShapeError::Queries { len, dim } => {
                write!(
                    f,
                    "{len} query floats is not a non-empty multiple of dim {dim}"
                )
            }
            ShapeError::TooManyRows { rows } => write!(f, "{rows} rows exceed u32 token indices"),
        }
    }
}

impl std::error::Error for ShapeError {}

fn check_dim(dim: usize) -> Result<(), ShapeError> {
    if dim == 0 || dim > MAX_DIM || !dim.is_multiple_of(LANES) {
        return Err(ShapeError::Dim { dim });
    }
    Ok(())
}

/// `len()` rows of `dim` elements of `dtype`, little-endian, row-major: one KV head's keys (or
/// values). Row `i` is token `i` of the view.
#[derive(Clone, Copy, Debug)]
pub struct KeyRows<'a> {
    bytes: &'a [u8],
    dtype: DType,
    dim: usize,
}

impl<'a> KeyRows<'a> {
    /// A view of `bytes` as rows of `dim` elements of `dtype`.
    pub fn new(bytes: &'a [u8], dtype: DType, dim: usize) -> Result<Self, ShapeError> {
        check_dim(dim)?;
        let row_bytes = dim * dtype.size();
        if !bytes.len().is_multiple_of(row_bytes) {
            return Err(ShapeError::RaggedRows {
                len: bytes.len(),
                row_bytes,
            });
        }
        let rows = bytes.len() / row_bytes;
        if rows > u32::MAX as usize {
            return Err(ShapeError::TooManyRows { rows });
        }
        Ok(KeyRows { bytes, dtype, dim })
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Elements per row (head dimension).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.dim * self.dtype.size()
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.row_bytes()
    }

    /// True if there are no rows.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The raw bytes of all rows.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Raw bytes of row `i`. Panics if out of range.
    pub fn row(&self, i: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.bytes[i * rb..(i + 1) * rb]
    }

    /// Element `d` of row `i` as f32 (exact). Panics if out of range.
    pub fn get(&self, i: usize, d: usize) -> f32 {
        assert!(d < self.dim, "element {d} out of row of {}", self.dim);
        self.dtype.load(self.row(i), d)
    }

    /// Row `i` as f32 (exact).
    pub fn row_f32(&self, i: usize) -> Vec<f32> {
        let row = self.row(i);
        (0..self.dim).map(|d| self.dtype.load(row, d)).collect()
    }

    /// The rows `start..end` as a view. Panics if out of range.
    pub fn slice(&self, start: usize, end: usize) -> KeyRows<'a> {
        let rb = self.row_bytes();
        KeyRows {
            bytes: &self.bytes[start * rb..end * rb],
            dtype: self.dtype,
            dim: self.dim,
        }
    }
}

/// The `count()` f32 query vectors of one GQA group, `dim` floats each, row-major.
#[derive(Clone, Copy, Debug)]
pub struct QueryGroup<'a> {
    data: &'a [f32],
    dim: usize,
}

impl<'a> QueryGroup<'a> {
    /// A view of `data` as `data.len() / dim` query vectors (at least one).
    pub fn new(data: &'a [f32], dim: usize) -> Result<Self, ShapeError> {
        check_dim(dim)?;
        if data.is_empty() || !data.len().is_multiple_of(dim) {
            return Err(ShapeError::Queries {
                len: data.len(),
                dim,
            });
        }
        Ok(QueryGroup { data, dim })
    }

    /// Number of queries `G`.
    pub fn count(&self) -> usize {
        self.data.len() / self.dim
    }

    /// Head dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// All queries, row-major.
    pub fn data(&self) -> &'a [f32] {
        self.data
    }

    /// Query `g`. Panics if out of range.
    pub fn query(&self, g: usize) -> &'a [f32] {
        &self.data[g * self.dim..(g + 1) * self.dim]
    }

    /// Queries `start..end` as a group. Panics if out of range or empty.
    pub fn subgroup(&self, start: usize, end: usize) -> QueryGroup<'a> {
        assert!(start < end && end <= self.count());
        QueryGroup {
            data: &self.data[start * self.dim..end * self.dim],
            dim: self.dim,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_checked() {
        assert_eq!(
            KeyRows::new(&[0u8; 64], DType::F16, 24).unwrap_err(),
            ShapeError::Dim { dim: 24 }
        );
        assert!(KeyRows::new(&[0u8; 64], DType::F16, 272).is_err());
        assert_eq!(
            KeyRows::new(&[0u8; 65], DType::F16, 16).unwrap_err(),
            ShapeError::RaggedRows {
                len: 65,
                row_bytes: 32
            }
        );
        let k = KeyRows::new(&[0u8; 128], DType::F32, 16).unwrap();
        assert_eq!(k.len(), 2);
        assert!(QueryGroup::new(&[], 16).is_err());
        assert!(QueryGroup::new(&[0.0; 17], 16).is_err());
        assert_eq!(QueryGroup::new(&[0.0; 48], 16).unwrap().count(), 3);
    }
}
