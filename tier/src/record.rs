//! The record of a spill file on disk (format 1.2, docs/FORMAT.md): the 64-byte [`SpillHeader`]
//! (magic, key, sequence, lengths, [`SpillCodec`], payload CRC, version, header CRC), which
//! versions are read, and the check and decoding of a record read back ([`decode`]). A record is
//! self-validating: the header carries the CRC of the payload and its own, so a torn record never
//! passes (crate::durability).

use cxlkv_runtime::format::{as_bytes, crc32c, from_bytes, Plain};
use cxlkv_runtime::key::Key;

/// Magic of a spill record header.
pub const SPILL_MAGIC: [u8; 8] = *b"CXLKVSP1";
/// Format version this code writes (major, minor); it recovers records of major 1 from minor
/// [`SPILL_MIN_MINOR`] on.
pub const SPILL_VERSION: (u16, u16) = (1, 2);
/// Oldest minor of major 1 whose records are recovered: writers of 1.0 and 1.1 left removed and
/// superseded records valid on the file, so such a record may be a version its key no longer has.
pub const SPILL_MIN_MINOR: u16 = 2;
/// Bytes of a record header.
pub const SPILL_HEADER_SIZE: usize = 64;

/// Payload codec of a spill record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpillCodec {
    /// Stored as is.
    Raw = 0,
    /// LZ4 block format (lz4_flex), decompressing to `raw_len` bytes.
    Lz4 = 1,
}

/// Header of one spill record (64 bytes, little-endian).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpillHeader {
    /// [`SPILL_MAGIC`].
    pub magic: [u8; 8],
    /// Low 64 bits of the key.
    pub key_lo: u64,
    /// High 64 bits of the key.
    pub key_hi: u64,
    /// Sequence number (per file, increasing): the newest record of a key wins.
    pub seq: u64,
    /// Payload bytes after decoding.
    pub raw_len: u32,
    /// Payload bytes stored after the header.
    pub stored_len: u32,
    /// [`SpillCodec`] code.
    pub codec: u32,
    /// CRC-32C of the stored bytes.
    pub payload_crc: u32,
    /// Format major version ([`SPILL_VERSION`]; 0 in records of format 1.0, which had zeros here).
    pub version_major: u16,
    /// Format minor version.
    pub version_minor: u16,
    /// Zero.
    pub reserved: [u32; 2],
    /// CRC-32C of the 60 bytes before this field.
    pub header_crc: u32,
}
// SAFETY: repr(C), integers and a byte array laid out without padding (layout test), every bit
// pattern valid.
unsafe impl Plain for SpillHeader {}

impl SpillHeader {
    pub(crate) fn compute_crc(&self) -> u32 {
        crc32c(&as_bytes(self)[..60])
    }

    /// What this code makes of the header's version.
    pub(crate) fn version(&self) -> RecordVersion {
        match (self.version_major, self.version_minor) {
            (1, m) if m >= SPILL_MIN_MINOR => RecordVersion::Current,
            // 0.0: format 1.0, which left zeros where the version is now.
            (1, _) | (0, 0) => RecordVersion::Older,
            _ => RecordVersion::Other,
        }
    }
}

/// How a record's format version is treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecordVersion {
    /// Major 1 from [`SPILL_MIN_MINOR`] on: read.
    Current,
    /// Formats 1.0 and 1.1: the layout is known, but the record may be one its writer removed.
    Older,
    /// Another major: nothing in it is trusted.
    Other,
}

impl SpillCodec {
    /// Decodes the header field.
    pub fn from_code(c: u32) -> Option<SpillCodec> {
        match c {
            0 => Some(SpillCodec::Raw),
            1 => Some(SpillCodec::Lz4),
            _ => None,
        }
    }
}

/// LZ4-compresses `data` as spill records do (lz4_flex block format).
pub fn lz4_compress(data: &[u8]) -> Vec<u8> {
    lz4_flex::block::compress(data)
}

/// Decompresses what [`lz4_compress`] made of `raw_len` bytes; `None` if it is not that.
pub fn lz4_decompress(stored: &[u8], raw_len: usize) -> Option<Vec<u8>> {
    let mut out = vec![0u8; raw_len];
    let n = lz4_flex::block::decompress_into(stored, &mut out).ok()?;
    (n == raw_len).then_some(out)
}

/// Validates a record read back (header, version, key, sequence, CRC) and decodes its payload:
/// a raw payload is returned in place, an LZ4 one decompressed into `scratch`.
pub(crate) fn decode<'a>(
    record: &'a [u8],
    key: Key,
    seq: u64,
    max_payload: usize,
    scratch: &'a mut Vec<u8>,
) -> Option<&'a [u8]> {
    let h: SpillHeader = from_bytes(record.get(..SPILL_HEADER_SIZE)?);
    if h.magic != SPILL_MAGIC
        || h.header_crc != h.compute_crc()
        || h.version() != RecordVersion::Current
        || Key::from_parts(h.key_lo, h.key_hi) != key
        || h.seq != seq
    {
        return None;
    }
    let stored = record.get(SPILL_HEADER_SIZE..SPILL_HEADER_SIZE + h.stored_len as usize)?;
    if crc32c(stored) != h.payload_crc || h.raw_len as usize > max_payload {
        return None;
    }
    match SpillCodec::from_code(h.codec)? {
        SpillCodec::Raw => (h.stored_len == h.raw_len).then_some(stored),
        SpillCodec::Lz4 => {
            scratch.resize(h.raw_len as usize, 0);
            let n = lz4_flex::block::decompress_into(stored, scratch).ok()?;
            (n == scratch.len()).then_some(&scratch[..])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn header_layout() {
        assert_eq!(size_of::<SpillHeader>(), SPILL_HEADER_SIZE);
        assert_eq!(offset_of!(SpillHeader, key_lo), 8);
        assert_eq!(offset_of!(SpillHeader, key_hi), 16);
        assert_eq!(offset_of!(SpillHeader, seq), 24);
        assert_eq!(offset_of!(SpillHeader, raw_len), 32);
        assert_eq!(offset_of!(SpillHeader, stored_len), 36);
        assert_eq!(offset_of!(SpillHeader, codec), 40);
        assert_eq!(offset_of!(SpillHeader, payload_crc), 44);
        assert_eq!(offset_of!(SpillHeader, version_major), 48);
        assert_eq!(offset_of!(SpillHeader, version_minor), 50);
        assert_eq!(offset_of!(SpillHeader, reserved), 52);
        assert_eq!(offset_of!(SpillHeader, header_crc), 60);
    }

    #[test]
    fn versions_recovered() {
        let v = |major, minor| {
            SpillHeader {
                version_major: major,
                version_minor: minor,
                ..Default::default()
            }
            .version()
        };
        assert_eq!(v(SPILL_VERSION.0, SPILL_VERSION.1), RecordVersion::Current);
        assert_eq!(v(1, 7), RecordVersion::Current, "a later minor is read");
        for (major, minor) in [(1, 1), (1, 0), (0, 0)] {
            assert_eq!(v(major, minor), RecordVersion::Older, "{major}.{minor}");
        }
        for (major, minor) in [(2, 0), (0, 1)] {
            assert_eq!(v(major, minor), RecordVersion::Other, "{major}.{minor}");
        }
    }
}
