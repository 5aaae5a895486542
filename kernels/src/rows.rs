//! Validated views of the kernels' inputs: typed key/value rows and query groups.
//!
//! Shapes are checked once, when a view is built; the kernels then index without re-checking
//! more than slice bounds. A key view never holds a reference to its bytes ([`KeyRows`]), so it
//! may describe shared memory.

use crate::dtype::DType;
use std::fmt;
use std::marker::PhantomData;

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

/// Bytes of the longest row a view can hold (`MAX_DIM` f32 elements): a stack buffer of this size
/// takes any row ([`KeyRows::copy_row`]).
pub const MAX_ROW_BYTES: usize = MAX_DIM * 4;

/// `len()` rows of `dim` elements of `dtype`, little-endian, row-major: one KV head's keys (or
/// values). Row `i` is token `i` of the view.
///
/// The view holds a pointer and a length, never a Rust reference to the bytes, so it can describe
/// shared memory that another party writes outside the window in which the kernels read it (a
/// pinned pool block, [`KeyRows::from_raw`]) as well as private memory ([`KeyRows::new`]). Every
/// read goes through the pointer: SIMD loads in the kernels, copies into the caller's buffers
/// ([`KeyRows::copy_row`], [`KeyRows::to_vec`]).
#[derive(Clone, Copy, Debug)]
pub struct KeyRows<'a> {
    ptr: *const u8,
    len: usize,
    dtype: DType,
    dim: usize,
    /// The bytes are borrowed for `'a` (by a slice, or by the contract of `from_raw`).
    _bytes: PhantomData<&'a [u8]>,
}

// SAFETY: a `KeyRows` is a read-only view, like `&[u8]`: `new` borrows a slice (which is Sync),
// and `from_raw`'s contract makes the bytes readable from any thread for `'a`. No method writes
// through the pointer.
unsafe impl Send for KeyRows<'_> {}
// SAFETY: see Send above; shared use only reads.
unsafe impl Sync for KeyRows<'_> {}

impl<'a> KeyRows<'a> {
    /// A view of `bytes` as rows of `dim` elements of `dtype`.
    pub fn new(bytes: &'a [u8], dtype: DType, dim: usize) -> Result<Self, ShapeError> {
        // SAFETY: a slice is valid for reads of its length for its lifetime `'a`, and nobody
        // writes it while the shared borrow lasts.
        unsafe { Self::from_raw(bytes.as_ptr(), bytes.len(), dtype, dim) }
    }

    /// A view of the `len` bytes at `ptr` as rows of `dim` elements of `dtype`, without creating a
    /// reference to them: for memory that another party may write outside the read window, such
    /// as a pinned block of a shared pool.
    ///
    /// # Safety
    /// For all of `'a`, `ptr` must be non-null and valid for reads of `len` bytes (inside one
    /// allocation or mapping), from any thread, and no party may write those bytes while the view
    /// or a copy of it is used (for pool memory: the block stays pinned until the view is dropped).
    pub unsafe fn from_raw(
        ptr: *const u8,
        len: usize,
        dtype: DType,
        dim: usize,
    ) -> Result<Self, ShapeError> {
        debug_assert!(!ptr.is_null(), "a key view of a null pointer");
        check_dim(dim)?;
        let row_bytes = dtype.bytes(dim);
        if !len.is_multiple_of(row_bytes) {
            return Err(ShapeError::RaggedRows { len, row_bytes });
        }
        let rows = len / row_bytes;
        if rows > u32::MAX as usize {
            return Err(ShapeError::TooManyRows { rows });
        }
        Ok(KeyRows {
            ptr,
            len,
            dtype,
            dim,
            _bytes: PhantomData,
        })
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
        self.dtype.bytes(self.dim)
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.len / self.row_bytes()
    }

    /// True if there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of all rows.
    pub fn byte_len(&self) -> usize {
        self.len
    }

    /// Address of row 0, for the kernels' loads: `byte_len()` bytes are readable there for `'a`
    /// (the view's invariant). Reads only; never make a reference of it.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Copies `len` bytes at byte `offset` of the view into `dst[..len]`. Panics if out of range.
    fn copy_bytes(&self, offset: usize, len: usize, dst: &mut [u8]) {
        let end = offset.checked_add(len).expect("range overflows");
        assert!(
            end <= self.len,
            "bytes {offset}..{end} outside a view of {}",
            self.len
        );
        let dst = &mut dst[..len];
        // SAFETY: `offset + len <= self.len` (asserted), and the view's invariant makes `self.len`
        // bytes at `ptr` readable; `dst` is private memory of `len` bytes, so the ranges cannot
        // overlap. The copy reads through the pointer without making a reference to the source.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), dst.as_mut_ptr(), len) }
    }

    /// Copies row `i` into the start of `buf` (at least [`KeyRows::row_bytes`] long, e.g. a
    /// `[u8; MAX_ROW_BYTES]`) and returns that part of `buf`. Panics if out of range.
    pub fn copy_row<'b>(&self, i: usize, buf: &'b mut [u8]) -> &'b [u8] {
        let rb = self.row_bytes();
        self.copy_bytes(i * rb, rb, buf);
        &buf[..rb]
    }

    /// Row `i` as raw bytes (a copy). Panics if out of range.
    pub fn row_vec(&self, i: usize) -> Vec<u8> {
        let mut out = vec![0u8; self.row_bytes()];
        self.copy_row(i, &mut out);
        out
    }

    /// Copies all rows into `dst` (exactly [`KeyRows::byte_len`] bytes). Panics on another length.
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(
            dst.len(),
            self.len,
            "a copy of all rows takes {} bytes",
            self.len
        );
        self.copy_bytes(0, self.len, dst);
    }

    /// All rows as raw bytes (a copy).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        self.copy_to(&mut out);
        out
    }

    /// Element `d` of row `i` as f32 (exact; the integer code for a quantized dtype). Panics if
    /// out of range.
    pub fn get(&self, i: usize, d: usize) -> f32 {
        assert!(d < self.dim, "element {d} out of row of {}", self.dim);
        // Rows hold a multiple of 16 elements, so element `d` starts at byte `bytes(d)` of its
        // row, in the byte's high nibble for an odd `d` of I4 (which `load(.., d % 2)` reads).
        let (start, lead) = match self.dtype {
            DType::I4 => (d / 2, d % 2),
            dt => (dt.bytes(d), 0),
        };
        let size = self.dtype.bytes(lead + 1);
        let mut elem = [0u8; 4];
        self.copy_bytes(i * self.row_bytes() + start, size, &mut elem);
        self.dtype.load(&elem[..size], lead)
    }

    /// Row `i` as f32 (exact).
    pub fn row_f32(&self, i: usize) -> Vec<f32> {
        let mut buf = [0u8; MAX_ROW_BYTES];
        let row = self.copy_row(i, &mut buf);
        (0..self.dim).map(|d| self.dtype.load(row, d)).collect()
    }

    /// The rows `start..end` as a view. Panics if out of range.
    pub fn slice(&self, start: usize, end: usize) -> KeyRows<'a> {
        let rb = self.row_bytes();
        assert!(
            start <= end && end * rb <= self.len,
            "rows {start}..{end} outside a view of {} rows",
            self.len()
        );
        KeyRows {
            // SAFETY: `start * rb <= end * rb <= self.len` (asserted): the offset stays inside the
            // readable range (or one past its end when the slice is empty).
            ptr: unsafe { self.ptr.add(start * rb) },
            len: (end - start) * rb,
            dtype: self.dtype,
            dim: self.dim,
            _bytes: PhantomData,
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
        let q = KeyRows::new(&[0u8; 24], DType::I4, 16).unwrap();
        assert_eq!((q.len(), q.row_bytes()), (3, 8));
        assert_eq!(
            KeyRows::new(&[0u8; 20], DType::I8, 16).unwrap_err(),
            ShapeError::RaggedRows {
                len: 20,
                row_bytes: 16
            }
        );
    }

    #[test]
    fn quantized_elements_read_back() {
        let bytes: Vec<u8> = (0..32u8).map(|b| b.wrapping_mul(37)).collect();
        let i8s = KeyRows::new(&bytes, DType::I8, 16).unwrap();
        let i4s = KeyRows::new(&bytes, DType::I4, 32).unwrap();
        for d in 0..16 {
            assert_eq!(i8s.get(1, d), bytes[16 + d] as i8 as f32);
        }
        for d in 0..32 {
            let b = bytes[16 + d / 2];
            let nib = if d % 2 == 0 { b & 15 } else { b >> 4 };
            let want = if nib >= 8 {
                nib as f32 - 16.0
            } else {
                nib as f32
            };
            assert_eq!(i4s.get(1, d), want, "element {d}");
            assert_eq!(i4s.row_f32(1)[d], want);
        }
    }

    #[test]
    fn raw_views_read_what_slice_views_read() {
        let bytes: Vec<u8> = (0..96u8).collect();
        let a = KeyRows::new(&bytes, DType::F16, 16).unwrap();
        // SAFETY: `bytes` outlives the view and nothing writes it while the view lives.
        let b = unsafe { KeyRows::from_raw(bytes.as_ptr(), bytes.len(), DType::F16, 16) }.unwrap();
        assert_eq!((b.len(), b.byte_len(), b.row_bytes()), (3, 96, 32));
        assert_eq!(b.to_vec(), bytes);
        assert_eq!(b.slice(1, 3).row_vec(0), bytes[32..64].to_vec());
        assert!(b.slice(3, 3).is_empty());
        let mut buf = [0u8; MAX_ROW_BYTES];
        assert_eq!(b.copy_row(2, &mut buf), &bytes[64..]);
        assert_eq!(a.get(2, 3).to_bits(), b.get(2, 3).to_bits());
        assert_eq!(a.row_f32(1), b.row_f32(1));
        // SAFETY: as above.
        let ragged = unsafe { KeyRows::from_raw(bytes.as_ptr(), 95, DType::F16, 16) };
        assert_eq!(
            ragged.unwrap_err(),
            ShapeError::RaggedRows {
                len: 95,
                row_bytes: 32
            }
        );
    }
}
