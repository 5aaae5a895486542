//! Tier 3: SSD spill files, one per partition, written and read with io_uring.
//!
//! A spill file is a sequence of page-aligned records. Each record is a 64-byte [`SpillHeader`]
//! followed by the stored payload, padded to whole 4 KiB pages, so every read and write is a
//! multiple of the page at an aligned offset (`O_DIRECT`). A payload is LZ4-compressed (lz4_flex
//! block format) when that saves at least one page, and stored raw otherwise; the codec is in the
//! header. The in-memory index (key → extent) is rebuilt at open by a recovery scan: a page whose
//! header has the magic, a valid header CRC and a payload whose CRC matches starts a record; any
//! other page (a torn write of a crashed process, a freed record's leftovers) is skipped, never
//! misread. When several valid records name one key, the highest sequence number wins. Freed
//! extents are reused by records of the same page count; the file only grows otherwise.

use super::uring::{Op, Ring, ALIGN};
use super::{Result, TierError};
use crate::format::{as_bytes, crc32c, from_bytes, Plain};
use crate::key::Key;
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Magic of a spill record header.
pub const SPILL_MAGIC: [u8; 8] = *b"CXLKVSP1";
/// Bytes of a record header.
pub const SPILL_HEADER_SIZE: usize = 64;
const PAGE: u64 = ALIGN as u64;

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
    /// Zero.
    pub reserved: [u32; 3],
    /// CRC-32C of the 60 bytes before this field.
    pub header_crc: u32,
}
// SAFETY: repr(C), integers and a byte array laid out without padding (layout test), every bit
// pattern valid.
unsafe impl Plain for SpillHeader {}

impl SpillHeader {
    fn compute_crc(&self) -> u32 {
        crc32c(&as_bytes(self)[..60])
    }
}

/// Where a record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extent {
    page: u64,
    pages: u32,
    seq: u64,
}

/// What the recovery scan at open found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpillRecovery {
    /// Valid records kept.
    pub records: u64,
    /// Older valid records of a key superseded by a newer one.
    pub superseded: u64,
    /// Pages that carried a record magic but failed validation (torn or corrupt): discarded.
    pub discarded: u64,
}

/// Counters of a spill file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Records written.
    pub writes: u64,
    /// Records read.
    pub reads: u64,
    /// Payload bytes before compression, written.
    pub raw_bytes_written: u64,
    /// Bytes written to the file (headers, payloads, padding).
    pub file_bytes_written: u64,
    /// Bytes read from the file.
    pub file_bytes_read: u64,
    /// Records stored LZ4-compressed.
    pub compressed: u64,
    /// Nanoseconds spent in io_uring submissions.
    pub io_ns: u64,
}

/// Options of [`SpillFile::open`].
#[derive(Clone, Copy, Debug)]
pub struct SpillOptions {
    /// Largest payload a record holds.
    pub max_payload: usize,
    /// Buffers (and ring entries) for batched submissions.
    pub queue_depth: usize,
    /// Try LZ4 on each payload.
    pub compress: bool,
    /// Open with `O_DIRECT` (falls back to buffered I/O if the file system refuses it).
    pub direct: bool,
}

impl Default for SpillOptions {
    fn default() -> Self {
        SpillOptions {
            max_payload: 256 << 10,
            queue_depth: 32,
            compress: true,
            direct: true,
        }
    }
}

/// A spill file (module docs).
pub struct SpillFile {
    path: PathBuf,
    file: File,
    direct: bool,
    ring: Ring,
    opts: SpillOptions,
    index: HashMap<Key, Extent>,
    free: BTreeMap<u32, Vec<u64>>,
    end_page: u64,
    next_seq: u64,
    stats: SpillStats,
}

impl std::fmt::Debug for SpillFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillFile")
            .field("path", &self.path)
            .field("records", &self.index.len())
            .field("direct", &self.direct)
            .finish()
    }
}

fn pages_for(stored: usize) -> u32 {
    (SPILL_HEADER_SIZE + stored).div_ceil(ALIGN) as u32
}

impl SpillFile {
    /// The spill file of `partition` in `dir`.
    pub fn path_for(dir: &Path, partition: u32) -> PathBuf {
        dir.join(format!("partition-{partition}.spill"))
    }

    /// Opens (creating if absent) the spill file at `path` and recovers its index.
    pub fn open(path: &Path, opts: SpillOptions) -> Result<(SpillFile, SpillRecovery)> {
        let io = |e: std::io::Error| TierError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let mut direct = opts.direct;
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .custom_flags(flags)
                .open(path)
        };
        let file = match open(if direct { libc::O_DIRECT } else { 0 }) {
            Ok(f) => f,
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                direct = false;
                open(0).map_err(io)?
            }
            Err(e) => return Err(io(e)),
        };
        let max_pages = pages_for(
            lz4_flex::block::get_maximum_output_size(opts.max_payload).max(opts.max_payload),
        );
        let ring = Ring::new(opts.queue_depth, max_pages as usize * ALIGN).map_err(io)?;
        let mut sf = SpillFile {
            path: path.to_path_buf(),
            file,
            direct,
            ring,
            opts,
            index: HashMap::new(),
            free: BTreeMap::new(),
            end_page: 0,
            next_seq: 1,
            stats: SpillStats::default(),
        };
        let rec = sf.recover().map_err(io)?;
        Ok((sf, rec))
    }

    /// Scans the file (buffered, sequentially) and rebuilds index and free list.
    fn recover(&mut self) -> std::io::Result<SpillRecovery> {
        let scan = File::open(&self.path)?;
        let len = scan.metadata()?.len();
        let total = len / PAGE;
        let mut rec = SpillRecovery::default();
        let mut valid: Vec<(u64, Extent, Key)> = Vec::new();
        let mut hdr = [0u8; SPILL_HEADER_SIZE];
        let mut payload = Vec::new();
        let mut page = 0;
        while page < total {
            scan.read_exact_at(&mut hdr, page * PAGE)?;
            let h: SpillHeader = from_bytes(&hdr);
            if h.magic != SPILL_MAGIC {
                page += 1;
                continue;
            }
            let pages = pages_for(h.stored_len as usize);
            let ok = h.header_crc == h.compute_crc()
                && (h.stored_len as usize)
                    <= lz4_flex::block::get_maximum_output_size(self.opts.max_payload)
                        .max(self.opts.max_payload)
                && (h.raw_len as usize) <= self.opts.max_payload
                && SpillCodec::from_code(h.codec).is_some()
                && page + u64::from(pages) <= total
                && {
                    payload.resize(h.stored_len as usize, 0);
                    scan.read_exact_at(&mut payload, page * PAGE + SPILL_HEADER_SIZE as u64)?;
                    crc32c(&payload) == h.payload_crc
                };
            if !ok {
                rec.discarded += 1;
                page += 1;
                continue;
            }
            valid.push((
                h.seq,
                Extent {
                    page,
                    pages,
                    seq: h.seq,
                },
                Key::from_parts(h.key_lo, h.key_hi),
            ));
            page += u64::from(pages);
        }
        let mut used = vec![false; total as usize];
        valid.sort_by_key(|v| v.0);
        for (seq, ext, key) in valid {
            self.next_seq = self.next_seq.max(seq + 1);
            if let Some(old) = self.index.insert(key, ext) {
                rec.superseded += 1;
                used[old.page as usize..(old.page + u64::from(old.pages)) as usize].fill(false);
            }
            used[ext.page as usize..(ext.page + u64::from(ext.pages)) as usize].fill(true);
        }
        rec.records = self.index.len() as u64;
        // Everything not covered by a live record is free, in maximal runs.
        self.end_page = total;
        let mut p = 0usize;
        while p < used.len() {
            if used[p] {
                p += 1;
                continue;
            }
            let start = p;
            while p < used.len() && !used[p] {
                p += 1;
            }
            self.free
                .entry((p - start) as u32)
                .or_default()
                .push(start as u64);
        }
        Ok(rec)
    }

    /// True when the file is open with `O_DIRECT`.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// True when the ring's buffers are registered with the kernel.
    pub fn registered_buffers(&self) -> bool {
        self.ring.registered()
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when no record is held.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// True when `key` has a record.
    pub fn contains(&self, key: Key) -> bool {
        self.index.contains_key(&key)
    }

    /// Keys held.
    pub fn keys(&self) -> Vec<Key> {
        self.index.keys().copied().collect()
    }

    /// Counters.
    pub fn stats(&self) -> SpillStats {
        self.stats
    }

    fn allocate(&mut self, pages: u32) -> u64 {
        // Exact-size reuse first, else split the smallest larger free run, else append.
        if let Some((&size, _)) = self.free.range(pages..).next() {
            let list = self.free.get_mut(&size).expect("present");
            let page = list.pop().expect("non-empty");
            if list.is_empty() {
                self.free.remove(&size);
            }
            if size > pages {
                self.free
                    .entry(size - pages)
                    .or_default()
                    .push(page + u64::from(pages));
            }
            return page;
        }
        let page = self.end_page;
        self.end_page += u64::from(pages);
        page
    }

    fn release(&mut self, ext: Extent) {
        self.free.entry(ext.pages).or_default().push(ext.page);
    }

    /// Writes `items` as records in batched io_uring submissions; on success each key's previous
    /// record (if any) is freed. A key's bytes are on the file when this returns.
    pub fn write_batch(&mut self, items: &[(Key, &[u8])]) -> Result<()> {
        let depth = self.ring.buffers();
        for chunk in items.chunks(depth) {
            let mut ops = Vec::with_capacity(chunk.len());
            let mut placed = Vec::with_capacity(chunk.len());
            for (i, &(key, bytes)) in chunk.iter().enumerate() {
                if bytes.len() > self.opts.max_payload {
                    return Err(TierError::TooLarge {
                        len: bytes.len(),
                        max: self.opts.max_payload,
                    });
                }
                let buf_len = self.ring.buffer_len();
                let (codec, stored_len) = {
                    let buf = self.ring.buf_mut(i);
                    let raw_pages = pages_for(bytes.len());
                    let mut codec = SpillCodec::Raw;
                    let mut stored = bytes.len();
                    if self.opts.compress {
                        if let Ok(n) = lz4_flex::block::compress_into(
                            bytes,
                            &mut buf[SPILL_HEADER_SIZE..buf_len],
                        ) {
                            if pages_for(n) < raw_pages {
                                codec = SpillCodec::Lz4;
                                stored = n;
                            }
                        }
                    }
                    if codec == SpillCodec::Raw {
                        buf[SPILL_HEADER_SIZE..SPILL_HEADER_SIZE + bytes.len()]
                            .copy_from_slice(bytes);
                    }
                    (codec, stored)
                };
                let pages = pages_for(stored_len);
                let seq = self.next_seq;
                self.next_seq += 1;
                let buf = self.ring.buf_mut(i);
                let end = pages as usize * ALIGN;
                buf[SPILL_HEADER_SIZE + stored_len..end].fill(0);
                let mut h = SpillHeader {
                    magic: SPILL_MAGIC,
                    key_lo: key.lo(),
                    key_hi: key.hi(),
                    seq,
                    raw_len: bytes.len() as u32,
                    stored_len: stored_len as u32,
                    codec: codec as u32,
                    payload_crc: crc32c(&buf[SPILL_HEADER_SIZE..SPILL_HEADER_SIZE + stored_len]),
                    ..Default::default()
                };
                h.header_crc = h.compute_crc();
                buf[..SPILL_HEADER_SIZE].copy_from_slice(as_bytes(&h));
                let page = self.allocate(pages);
                ops.push(Op {
                    buf: i,
                    len: end,
                    offset: page * PAGE,
                    write: true,
                });
                placed.push((key, Extent { page, pages, seq }, bytes.len(), codec));
            }
            let t = std::time::Instant::now();
            let res = self.ring.run(self.file.as_raw_fd(), &ops);
            self.stats.io_ns += t.elapsed().as_nanos() as u64;
            let res = res.map_err(|e| TierError::Io {
                path: self.path.clone(),
                source: e,
            })?;
            let mut failed = None;
            for ((op, r), (key, ext, raw, codec)) in ops.iter().zip(&res).zip(placed) {
                if *r != op.len as i32 {
                    self.release(ext);
                    failed.get_or_insert(TierError::ShortIo {
                        path: self.path.clone(),
                        offset: op.offset,
                        expected: op.len,
                        result: *r,
                    });
                    continue;
                }
                if let Some(old) = self.index.insert(key, ext) {
                    self.release(old);
                }
                self.stats.writes += 1;
                self.stats.raw_bytes_written += raw as u64;
                self.stats.file_bytes_written += op.len as u64;
                self.stats.compressed += u64::from(codec == SpillCodec::Lz4);
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Reads the records of `keys` in batched submissions; `out[i]` is `Some(bytes)` for a key
    /// that has a valid record and `None` otherwise (absent, or its record failed validation:
    /// then it is dropped from the index and reported as [`TierError::Corrupt`] only through
    /// the `None`).
    pub fn read_batch(&mut self, keys: &[Key]) -> Result<Vec<Option<Vec<u8>>>> {
        let depth = self.ring.buffers();
        let mut out: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        for (c, chunk) in keys.chunks(depth).enumerate() {
            let mut ops = Vec::new();
            let mut which = Vec::new();
            for (i, key) in chunk.iter().enumerate() {
                if let Some(ext) = self.index.get(key) {
                    ops.push(Op {
                        buf: ops.len(),
                        len: ext.pages as usize * ALIGN,
                        offset: ext.page * PAGE,
                        write: false,
                    });
                    which.push((c * depth + i, *key, *ext));
                }
            }
            let t = std::time::Instant::now();
            let res = self.ring.run(self.file.as_raw_fd(), &ops);
            self.stats.io_ns += t.elapsed().as_nanos() as u64;
            let res = res.map_err(|e| TierError::Io {
                path: self.path.clone(),
                source: e,
            })?;
            for ((op, r), (slot, key, ext)) in ops.iter().zip(&res).zip(which) {
                if *r != op.len as i32 {
                    return Err(TierError::ShortIo {
                        path: self.path.clone(),
                        offset: op.offset,
                        expected: op.len,
                        result: *r,
                    });
                }
                self.stats.file_bytes_read += op.len as u64;
                match decode(self.ring.buf(op.buf), key, ext.seq, self.opts.max_payload) {
                    Some(bytes) => {
                        self.stats.reads += 1;
                        out[slot] = Some(bytes);
                    }
                    None => {
                        // Never return bytes that do not validate; forget the record.
                        self.index.remove(&key);
                        self.release(ext);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Reads one record; `None` if `key` has no valid record.
    pub fn read(&mut self, key: Key) -> Result<Option<Vec<u8>>> {
        Ok(self.read_batch(&[key])?.pop().flatten())
    }

    /// Forgets `key`'s record (its pages are reused later); true if it had one.
    pub fn remove(&mut self, key: Key) -> bool {
        match self.index.remove(&key) {
            Some(ext) => {
                self.release(ext);
                true
            }
            None => false,
        }
    }

    /// Bytes of the file.
    pub fn file_bytes(&self) -> u64 {
        self.end_page * PAGE
    }

    /// Flushes written data to stable storage (fdatasync).
    pub fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| TierError::Io {
            path: self.path.clone(),
            source: e,
        })
    }
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

/// Validates a record read back (header, key, sequence, CRC) and decodes its payload.
fn decode(buf: &[u8], key: Key, seq: u64, max_payload: usize) -> Option<Vec<u8>> {
    let h: SpillHeader = from_bytes(buf.get(..SPILL_HEADER_SIZE)?);
    if h.magic != SPILL_MAGIC
        || h.header_crc != h.compute_crc()
        || Key::from_parts(h.key_lo, h.key_hi) != key
        || h.seq != seq
    {
        return None;
    }
    let stored = buf.get(SPILL_HEADER_SIZE..SPILL_HEADER_SIZE + h.stored_len as usize)?;
    if crc32c(stored) != h.payload_crc || h.raw_len as usize > max_payload {
        return None;
    }
    match SpillCodec::from_code(h.codec)? {
        SpillCodec::Raw => (h.stored_len == h.raw_len).then(|| stored.to_vec()),
        SpillCodec::Lz4 => {
            let mut out = vec![0u8; h.raw_len as usize];
            let n = lz4_flex::block::decompress_into(stored, &mut out).ok()?;
            (n == out.len()).then_some(out)
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
        assert_eq!(offset_of!(SpillHeader, seq), 24);
        assert_eq!(offset_of!(SpillHeader, raw_len), 32);
        assert_eq!(offset_of!(SpillHeader, stored_len), 36);
        assert_eq!(offset_of!(SpillHeader, codec), 40);
        assert_eq!(offset_of!(SpillHeader, payload_crc), 44);
        assert_eq!(offset_of!(SpillHeader, reserved), 48);
        assert_eq!(offset_of!(SpillHeader, header_crc), 60);
    }
}
