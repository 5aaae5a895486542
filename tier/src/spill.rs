//! Tier 3: SSD spill files, one per partition, written and read with io_uring.
//!
//! A spill file is a sequence of page-aligned records (format 1.2, docs/FORMAT.md). Each record
//! is a 64-byte [`SpillHeader`] followed by the stored payload, padded to whole 4 KiB pages, so
//! every read and write is a multiple of the page at an aligned offset (`O_DIRECT`). A payload is
//! LZ4-compressed (lz4_flex block format) when that saves at least one page, and stored raw
//! otherwise; the codec is in the header. The in-memory index (key → extent) is rebuilt at open
//! by a recovery scan: a page whose header has the magic, a current version (1.2 on), a valid
//! header CRC and a payload whose CRC matches starts a record; any other page (a torn write of a
//! crashed process, a retired record's leftovers, preallocated zeros) is skipped, never misread.
//! When several valid records name one key, the highest sequence number wins.
//!
//! Invariant: apart from the records of a write call in progress, the only records on the file
//! that validate are the indexed ones. A record that leaves the index (removed, superseded, found
//! invalid by a read, or written by a call that failed) is *retired*: its first page is
//! overwritten with zeros, and only then are its pages free for reuse. A superseded record is
//! retired after its successor is on the file, so a crash in between leaves both, and the scan
//! picks the successor by sequence number; `open` retires the loser. Without this, a removed
//! key's record would validate again at the next open. Against a crash of the process, a write or
//! remove is final when its call returns; against a crash of the system, when its call returns
//! under the [`SyncPolicy`] `on-batch` or `always`, else once [`SpillFile::sync`] has returned
//! ([`crate::durability`] gives the order of writes and syncs and what each policy promises;
//! docs/FORMAT.md, "Crashes"). Records of formats 1.0 and 1.1, whose writers did not retire, are
//! not recovered.
//!
//! I/O is a pipeline over a [`Ring`] of `queue_depth` registered buffers: while up to
//! `queue_depth` reads or writes are in flight, the next record is encoded (copy or LZ4, CRC)
//! into an idle buffer and submitted as soon as it is ready, and each completion is validated
//! and decoded while the others are still in flight. Before a write call submits anything, the
//! file is grown (`fallocate`) to cover every page the call may write: on ext4 an `O_DIRECT`
//! write past the end of the file takes the inode lock exclusively and completes synchronously,
//! which would serialize the whole queue. Retiring a record is an overwrite of one page it
//! already holds, so it neither extends the file nor changes its allocation (a punched hole would
//! make the next write there an allocating one, serialized the same way).

use super::uring::{self, Completion, Op, Ring, ALIGN};
use crate::durability::SyncPolicy;
use crate::error::{Result, TierError};
use crate::record::{decode, RecordVersion};
pub use crate::record::{
    lz4_compress, lz4_decompress, SpillCodec, SpillHeader, SPILL_HEADER_SIZE, SPILL_MAGIC,
    SPILL_MIN_MINOR, SPILL_VERSION,
};
use cxlkv_runtime::format::{as_bytes, crc32c, from_bytes};
use cxlkv_runtime::key::Key;
use cxlkv_runtime::participant::crash_point;
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

const PAGE: u64 = ALIGN as u64;
/// Granularity of file growth (pages): a write call grows the file to a multiple of 16 MiB.
const GROW_PAGES: u64 = (16 << 20) / PAGE;

/// Where a record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extent {
    page: u64,
    pages: u32,
    seq: u64,
}

impl Extent {
    fn end(&self) -> u64 {
        self.page + u64::from(self.pages)
    }
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
    /// Records with a valid header of a format major version this code does not read: skipped.
    pub other_version: u64,
    /// Valid records of formats 1.0 and 1.1, whose writers did not retire removed or superseded
    /// records (so any of them may be a version its key no longer has): not recovered.
    pub older_format: u64,
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
    /// Records retired: their first page overwritten with zeros (removed, superseded, found
    /// invalid by a read, written by a failed call, or superseded ones the scan at open found).
    pub retired: u64,
    /// Nanoseconds the caller spent in io_uring calls (submitting and waiting for completions;
    /// encoding and decoding overlap the I/O and are not counted).
    pub io_ns: u64,
    /// `fdatasync` calls made: by the policy `on-batch` (one per write call and removal) and by
    /// [`SpillFile::sync`]. Writes under `always` are `O_DSYNC` instead ([`SpillFile::dsync`]).
    pub syncs: u64,
}

/// Options of [`SpillFile::open`].
#[derive(Clone, Copy, Debug)]
pub struct SpillOptions {
    /// Largest payload a record holds.
    pub max_payload: usize,
    /// Buffers, and so the most reads or writes in flight at once.
    pub queue_depth: usize,
    /// Try LZ4 on each payload.
    pub compress: bool,
    /// Open with `O_DIRECT` (falls back to buffered I/O if the file system cannot do it; see
    /// [`SpillFile::buffered_reason`]).
    pub direct: bool,
    /// When written data is flushed to stable storage ([`crate::durability`]; default `none`).
    pub sync: SyncPolicy,
}

impl Default for SpillOptions {
    fn default() -> Self {
        SpillOptions {
            max_payload: 256 << 10,
            queue_depth: 32,
            compress: true,
            direct: true,
            sync: SyncPolicy::None,
        }
    }
}

/// A spill file (module docs).
pub struct SpillFile {
    path: PathBuf,
    file: File,
    direct: bool,
    buffered_reason: Option<String>,
    ring: Ring,
    opts: SpillOptions,
    index: HashMap<Key, Extent>,
    /// Records out of the index whose first page has not been zeroed yet (module docs): their
    /// pages are not free until it has.
    retiring: Vec<Extent>,
    /// Free runs below `end_page`, by length.
    free: BTreeMap<u32, Vec<u64>>,
    /// Pages below this are records or free runs; above it, the file's unused tail.
    end_page: u64,
    /// Pages the file covers (its length; more than `end_page` after growth).
    file_pages: u64,
    /// False once `fallocate` was refused: the file is then grown with `set_len`.
    fallocate: bool,
    next_seq: u64,
    /// Scratch for LZ4 decoding.
    decoded: Vec<u8>,
    stats: SpillStats,
    /// The error of a removal's `fdatasync` (`remove` returns no error): [`Self::sync`] reports it.
    sync_failed: Option<std::io::Error>,
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

/// The largest stored payload of a record: LZ4 may expand incompressible input a little.
fn max_stored(max_payload: usize) -> usize {
    lz4_flex::block::get_maximum_output_size(max_payload).max(max_payload)
}

/// A record written by a write call, indexed when the whole call has succeeded.
#[derive(Clone, Copy)]
struct Written {
    ext: Extent,
    codec: SpillCodec,
    file_len: usize,
}

/// Opens `path` read-write (`O_DSYNC` under the policy `always`), with `O_DIRECT` if asked and
/// the file system can do it; returns the file and, if it is buffered though `O_DIRECT` was
/// asked, why. A file it creates is private to its owner (mode 0600).
fn open_file(
    path: &Path,
    direct: bool,
    sync: SyncPolicy,
) -> std::io::Result<(File, Option<String>)> {
    let dsync = if sync == SyncPolicy::Always {
        libc::O_DSYNC
    } else {
        0
    };
    let open = |flags: i32| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(flags | dsync)
            .open(path)
    };
    if !direct {
        return Ok((open(0)?, None));
    }
    let file = match open(libc::O_DIRECT) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let why = "the file system refused O_DIRECT at open (EINVAL)".to_string();
            return Ok((open(0)?, Some(why)));
        }
        Err(e) => return Err(e),
    };
    // Kernels that do not report the alignment accepted 4 KiB-aligned O_DIRECT before: keep it.
    let why = match uring::dio_alignment(&file) {
        Ok(Some((0, _) | (_, 0))) => {
            Some("the file system reports no O_DIRECT support (statx DIOALIGN 0)".to_string())
        }
        Ok(Some((mem, off))) if mem as usize > ALIGN || off as usize > ALIGN => Some(format!(
            "O_DIRECT needs {mem}-byte memory and {off}-byte offset alignment, more than the \
             {ALIGN}-byte pages of spill records"
        )),
        _ => None,
    };
    match why {
        Some(why) => Ok((open(0)?, Some(why))),
        None => Ok((file, None)),
    }
}

impl SpillFile {
    /// The spill file of `partition` in `dir`.
    pub fn path_for(dir: &Path, partition: u32) -> PathBuf {
        dir.join(format!("partition-{partition}.spill"))
    }

    /// Opens (creating if absent) the spill file at `path`, recovers its index and retires the
    /// superseded records the scan found (so that none can outlive its successor).
    pub fn open(path: &Path, opts: SpillOptions) -> Result<(SpillFile, SpillRecovery)> {
        let io = |e: std::io::Error| TierError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let (file, buffered_reason) = open_file(path, opts.direct, opts.sync).map_err(io)?;
        let max_pages = pages_for(max_stored(opts.max_payload));
        let ring = Ring::new(opts.queue_depth, max_pages as usize * ALIGN).map_err(io)?;
        let mut sf = SpillFile {
            path: path.to_path_buf(),
            file,
            direct: opts.direct && buffered_reason.is_none(),
            buffered_reason,
            ring,
            opts,
            index: HashMap::new(),
            retiring: Vec::new(),
            free: BTreeMap::new(),
            end_page: 0,
            file_pages: 0,
            fallocate: true,
            next_seq: 1,
            decoded: Vec::new(),
            stats: SpillStats::default(),
            sync_failed: None,
        };
        let rec = sf.recover().map_err(io)?;
        sf.retire()?;
        Ok((sf, rec))
    }

    /// Scans the file (buffered, sequentially) and rebuilds index and free list; superseded
    /// records are left retiring.
    fn recover(&mut self) -> std::io::Result<SpillRecovery> {
        let scan = File::open(&self.path)?;
        let total = scan.metadata()?.len() / PAGE;
        let max_stored = max_stored(self.opts.max_payload);
        let mut rec = SpillRecovery::default();
        let mut valid: Vec<(Extent, Key)> = Vec::new();
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
            let header_ok = h.header_crc == h.compute_crc();
            let version = h.version();
            if header_ok && version == RecordVersion::Other {
                // Its lengths may mean something else: walk on page by page.
                rec.other_version += 1;
                page += 1;
                continue;
            }
            let pages = pages_for(h.stored_len as usize);
            let ok = header_ok
                && (h.stored_len as usize) <= max_stored
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
            if version == RecordVersion::Older {
                // Valid, but possibly a removed version: free space, walked page by page.
                rec.older_format += 1;
                page += 1;
                continue;
            }
            let ext = Extent {
                page,
                pages,
                seq: h.seq,
            };
            valid.push((ext, Key::from_parts(h.key_lo, h.key_hi)));
            page = ext.end();
        }
        valid.sort_by_key(|v| v.0.seq);
        for (ext, key) in valid {
            self.next_seq = self.next_seq.max(ext.seq + 1);
            if let Some(old) = self.index.insert(key, ext) {
                // Left by a crash between a write and the retirement of the record it replaced
                // (or by a writer before 1.2): retired by `open`, before its pages are reused.
                self.retiring.push(old);
                rec.superseded += 1;
            }
        }
        rec.records = self.index.len() as u64;
        // Live and retiring records, in file order; the gaps between them are free runs, and
        // everything after the last one (leftovers, preallocated zeros) is the unused tail.
        let mut held: Vec<Extent> = self.index.values().chain(&self.retiring).copied().collect();
        held.sort_by_key(|e| e.page);
        let mut at = 0;
        for ext in &held {
            if ext.page > at {
                self.release_run(at, ext.page - at);
            }
            at = ext.end();
        }
        self.end_page = at;
        self.file_pages = total;
        Ok(rec)
    }

    /// True when the file is open with `O_DIRECT`.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Why the file uses buffered I/O though [`SpillOptions::direct`] asked for `O_DIRECT`.
    pub fn buffered_reason(&self) -> Option<&str> {
        self.buffered_reason.as_deref()
    }

    /// The sync policy the file was opened with.
    pub fn sync_policy(&self) -> SyncPolicy {
        self.opts.sync
    }

    /// True when the file descriptor has `O_DSYNC` (as the kernel reports it): every write is
    /// durable on completion. Set under the policy `always`.
    pub fn dsync(&self) -> bool {
        // SAFETY: F_GETFL on a descriptor this file owns only reads its status flags.
        let flags = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_GETFL) };
        flags >= 0 && flags & libc::O_DSYNC == libc::O_DSYNC
    }

    /// `fdatasync`, counted.
    fn fdatasync(&mut self) -> std::io::Result<()> {
        self.stats.syncs += 1;
        self.file.sync_data()
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

    fn io_error(&self, source: std::io::Error) -> TierError {
        TierError::Io {
            path: self.path.clone(),
            source,
        }
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

    /// Frees a retired record's pages (only [`Self::retire`] calls this).
    fn release(&mut self, ext: Extent) {
        self.free.entry(ext.pages).or_default().push(ext.page);
    }

    /// Zeroes the first page of every record in `retiring` (module docs), up to `queue_depth`
    /// writes in flight, and frees the pages of each one done. A record whose write fails stays
    /// in `retiring`, its pages not reused, to be tried again by the next call; the first error
    /// is returned.
    fn retire(&mut self) -> Result<()> {
        if self.retiring.is_empty() {
            return Ok(());
        }
        self.ring.usable().map_err(|e| self.io_error(e))?;
        let mut todo = std::mem::take(&mut self.retiring);
        let mut on_buf: Vec<Option<Extent>> = vec![None; self.ring.buffers()];
        let mut done = Vec::with_capacity(self.ring.buffers());
        let mut failed = None;
        let ring_failed = 'io: loop {
            while let Some(&ext) = todo.last() {
                let Some(buf) = self.ring.take() else { break };
                todo.pop();
                // Not only the header: the rest of the buffer is another record's bytes.
                self.ring.buf_mut(buf)[..ALIGN].fill(0);
                on_buf[buf] = Some(ext);
                let op = Op {
                    buf,
                    len: ALIGN,
                    offset: ext.page * PAGE,
                    write: true,
                };
                if let Err(e) = self.start(op) {
                    break 'io Some(e);
                }
            }
            if self.ring.in_flight() == 0 {
                break None;
            }
            if let Err(e) = self.reap(&mut done) {
                break Some(e);
            }
            for c in done.drain(..) {
                let ext = on_buf[c.buf]
                    .take()
                    .expect("a retirement on every buffer in flight");
                self.ring.give_back(c.buf);
                if c.result == ALIGN as i32 {
                    self.release(ext);
                    self.stats.retired += 1;
                } else {
                    self.retiring.push(ext);
                    failed.get_or_insert(TierError::ShortIo {
                        path: self.path.clone(),
                        offset: ext.page * PAGE,
                        expected: ALIGN,
                        result: c.result,
                    });
                }
            }
        };
        if let Some(e) = ring_failed {
            // Nothing more completes: whatever was not seen zeroed stays retiring.
            self.retiring.extend(todo);
            self.retiring.extend(on_buf.into_iter().flatten());
            return Err(e);
        }
        failed.map_or(Ok(()), Err)
    }

    /// [`Self::retire`] where the caller's own operation has already succeeded or failed: an
    /// error leaves the records retiring, for the next call and [`Self::sync`] to report.
    fn retire_or_defer(&mut self) {
        let _ = self.retire();
    }

    /// Frees `pages` pages from `page` on, in runs a record extent can describe.
    fn release_run(&mut self, mut page: u64, mut pages: u64) {
        while pages > 0 {
            let n = pages.min(u64::from(u32::MAX)) as u32;
            self.free.entry(n).or_default().push(page);
            page += u64::from(n);
            pages -= u64::from(n);
        }
    }

    /// Grows the file so that `pages` more pages past `end_page` lie inside it, before any write
    /// that could need them is submitted (module docs: writes must not extend the file).
    fn reserve(&mut self, pages: u64) -> Result<()> {
        let need = self.end_page + pages;
        if need <= self.file_pages {
            return Ok(());
        }
        let target = need.next_multiple_of(GROW_PAGES);
        if self.fallocate {
            let (from, len) = (self.file_pages * PAGE, (target - self.file_pages) * PAGE);
            match uring::fallocate(&self.file, from, len) {
                Ok(()) => {
                    self.file_pages = target;
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => self.fallocate = false,
                Err(e) => return Err(self.io_error(e)),
            }
        }
        // A sparse extension still keeps writes inside the file.
        self.file
            .set_len(target * PAGE)
            .map_err(|e| self.io_error(e))?;
        self.file_pages = target;
        Ok(())
    }

    fn start(&mut self, op: Op) -> Result<()> {
        let t = Instant::now();
        let r = self.ring.start(self.file.as_raw_fd(), op);
        self.stats.io_ns += t.elapsed().as_nanos() as u64;
        r.map_err(|e| self.io_error(e))
    }

    fn reap(&mut self, done: &mut Vec<Completion>) -> Result<()> {
        let t = Instant::now();
        let r = self.ring.reap(done);
        self.stats.io_ns += t.elapsed().as_nanos() as u64;
        r.map_err(|e| self.io_error(e))
    }

    /// Encodes `bytes` as the record of `key` into held buffer `buf` and places it in the file.
    fn encode(&mut self, buf: usize, key: Key, bytes: &[u8]) -> Written {
        let seq = self.next_seq;
        self.next_seq += 1;
        let compress = self.opts.compress;
        let b = self.ring.buf_mut(buf);
        let raw_pages = pages_for(bytes.len());
        let mut codec = SpillCodec::Raw;
        let mut stored = bytes.len();
        if compress {
            if let Ok(n) = lz4_flex::block::compress_into(bytes, &mut b[SPILL_HEADER_SIZE..]) {
                if pages_for(n) < raw_pages {
                    codec = SpillCodec::Lz4;
                    stored = n;
                }
            }
        }
        if codec == SpillCodec::Raw {
            b[SPILL_HEADER_SIZE..SPILL_HEADER_SIZE + stored].copy_from_slice(bytes);
        }
        let pages = pages_for(stored);
        let file_len = pages as usize * ALIGN;
        b[SPILL_HEADER_SIZE + stored..file_len].fill(0);
        let mut h = SpillHeader {
            magic: SPILL_MAGIC,
            key_lo: key.lo(),
            key_hi: key.hi(),
            seq,
            raw_len: bytes.len() as u32,
            stored_len: stored as u32,
            codec: codec as u32,
            payload_crc: crc32c(&b[SPILL_HEADER_SIZE..SPILL_HEADER_SIZE + stored]),
            version_major: SPILL_VERSION.0,
            version_minor: SPILL_VERSION.1,
            ..Default::default()
        };
        h.header_crc = h.compute_crc();
        b[..SPILL_HEADER_SIZE].copy_from_slice(as_bytes(&h));
        let page = self.allocate(pages);
        Written {
            ext: Extent { page, pages, seq },
            codec,
            file_len,
        }
    }

    /// Writes `items` as records, keeping up to `queue_depth` writes in flight. All or nothing
    /// for the index: when every write succeeded, each key's new record replaces its previous
    /// one (if any), which is then retired (module docs; a retirement that fails is left to later
    /// calls and [`Self::sync`]); after a failure no key changes, the records the call wrote are
    /// retired, and the error of the first failed write is returned. A key's bytes are on the
    /// file when this returns `Ok`.
    pub fn write_batch(&mut self, items: &[(Key, &[u8])]) -> Result<()> {
        if let Some(&(_, b)) = items.iter().find(|(_, b)| b.len() > self.opts.max_payload) {
            return Err(TierError::TooLarge {
                len: b.len(),
                max: self.opts.max_payload,
            });
        }
        crash_point("spill:begin");
        self.ring.usable().map_err(|e| self.io_error(e))?;
        // Compression only shrinks a record, so raw sizes bound the pages this call appends.
        self.reserve(
            items
                .iter()
                .map(|(_, b)| u64::from(pages_for(b.len())))
                .sum(),
        )?;
        let mut written: Vec<Option<Written>> = vec![None; items.len()];
        let mut on_buf: Vec<Option<usize>> = vec![None; self.ring.buffers()];
        let mut done = Vec::with_capacity(self.ring.buffers());
        let mut failed = None;
        let mut next = 0;
        loop {
            while failed.is_none() && next < items.len() {
                let Some(buf) = self.ring.take() else { break };
                let (key, bytes) = items[next];
                let w = self.encode(buf, key, bytes);
                written[next] = Some(w);
                on_buf[buf] = Some(next);
                self.start(Op {
                    buf,
                    len: w.file_len,
                    offset: w.ext.page * PAGE,
                    write: true,
                })?;
                next += 1;
            }
            if self.ring.in_flight() == 0 {
                break;
            }
            self.reap(&mut done)?;
            for c in done.drain(..) {
                let item = on_buf[c.buf]
                    .take()
                    .expect("a write on every buffer in flight");
                self.ring.give_back(c.buf);
                let w = written[item].expect("encoded");
                if c.result != w.file_len as i32 && failed.is_none() {
                    failed = Some(TierError::ShortIo {
                        path: self.path.clone(),
                        offset: w.ext.page * PAGE,
                        expected: w.file_len,
                        result: c.result,
                    });
                }
                crash_point("spill:record");
            }
        }
        if failed.is_none() {
            crash_point("spill:written");
            // Durable before the index takes the records, before what they supersede is retired,
            // and before the caller is told (crate::durability, rules 1 and 2).
            if self.opts.sync == SyncPolicy::OnBatch {
                if let Err(e) = self.fdatasync() {
                    failed = Some(self.io_error(e));
                }
            }
            crash_point("spill:synced");
        }
        if let Some(e) = failed {
            // Some of them may be on the file, newer than the records the index keeps.
            self.retiring
                .extend(written.into_iter().flatten().map(|w| w.ext));
            self.retire_or_defer();
            return Err(e);
        }
        for (&(key, bytes), w) in items.iter().zip(written) {
            let w = w.expect("every item written");
            // Only now that its successor is on the file (module docs).
            if let Some(old) = self.index.insert(key, w.ext) {
                self.retiring.push(old);
            }
            self.stats.writes += 1;
            self.stats.raw_bytes_written += bytes.len() as u64;
            self.stats.file_bytes_written += w.file_len as u64;
            self.stats.compressed += u64::from(w.codec == SpillCodec::Lz4);
        }
        self.retire_or_defer();
        crash_point("spill:retired");
        Ok(())
    }

    /// Reads the records of `keys`, keeping up to `queue_depth` reads in flight, and calls
    /// `found(i, payload)` for each `keys[i]` whose record is present and valid, in completion
    /// order. A record that fails validation is never handed out: it is dropped from the index
    /// and retired.
    /// On an I/O error the calls made so far stand and the first error is returned.
    pub fn read_with(&mut self, keys: &[Key], mut found: impl FnMut(usize, &[u8])) -> Result<()> {
        self.ring.usable().map_err(|e| self.io_error(e))?;
        let mut on_buf: Vec<Option<(usize, Extent)>> = vec![None; self.ring.buffers()];
        let mut done = Vec::with_capacity(self.ring.buffers());
        let mut failed = None;
        let mut next = 0;
        loop {
            while failed.is_none() && next < keys.len() {
                let Some(&ext) = self.index.get(&keys[next]) else {
                    next += 1;
                    continue;
                };
                let Some(buf) = self.ring.take() else { break };
                on_buf[buf] = Some((next, ext));
                self.start(Op {
                    buf,
                    len: ext.pages as usize * ALIGN,
                    offset: ext.page * PAGE,
                    write: false,
                })?;
                next += 1;
            }
            if self.ring.in_flight() == 0 {
                break;
            }
            self.reap(&mut done)?;
            for c in done.drain(..) {
                let (slot, ext) = on_buf[c.buf]
                    .take()
                    .expect("a read on every buffer in flight");
                let len = ext.pages as usize * ALIGN;
                if c.result != len as i32 {
                    self.ring.give_back(c.buf);
                    failed.get_or_insert(TierError::ShortIo {
                        path: self.path.clone(),
                        offset: ext.page * PAGE,
                        expected: len,
                        result: c.result,
                    });
                    continue;
                }
                self.stats.file_bytes_read += len as u64;
                let key = keys[slot];
                let record = &self.ring.buf(c.buf)[..len];
                match decode(
                    record,
                    key,
                    ext.seq,
                    self.opts.max_payload,
                    &mut self.decoded,
                ) {
                    Some(payload) => {
                        found(slot, payload);
                        self.stats.reads += 1;
                    }
                    // Never hand out bytes that do not validate; forget the record (once, if the
                    // key was asked for twice).
                    None if self.index.get(&key) == Some(&ext) => {
                        self.index.remove(&key);
                        self.retiring.push(ext);
                    }
                    None => {}
                }
                self.ring.give_back(c.buf);
            }
        }
        self.retire_or_defer();
        failed.map_or(Ok(()), Err)
    }

    /// Reads the records of `keys` ([`Self::read_with`]); `out[i]` is `Some(bytes)` for a key
    /// that has a valid record and `None` otherwise.
    pub fn read_batch(&mut self, keys: &[Key]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut out: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        self.read_with(keys, |i, bytes| out[i] = Some(bytes.to_vec()))?;
        Ok(out)
    }

    /// Reads one record; `None` if `key` has no valid record.
    pub fn read(&mut self, key: Key) -> Result<Option<Vec<u8>>> {
        Ok(self.read_batch(&[key])?.pop().flatten())
    }

    /// Forgets `key`'s record and retires it (module docs): when this returns, a reopen after a
    /// crash of the process does not find the key, nor after a crash of the system under the
    /// policies `on-batch` (which syncs here) and `always` (unless zeroing the page or the sync
    /// failed: zeroing is tried again by later calls, and [`Self::sync`] reports the error).
    /// True if it had one.
    pub fn remove(&mut self, key: Key) -> bool {
        match self.index.remove(&key) {
            Some(ext) => {
                self.retiring.push(ext);
                self.retire_or_defer();
                crash_point("remove:zeroed");
                if self.opts.sync == SyncPolicy::OnBatch {
                    if let Err(e) = self.fdatasync() {
                        self.sync_failed.get_or_insert(e);
                    }
                }
                true
            }
            None => false,
        }
    }

    /// Bytes of the file holding records or free runs (the file itself may be longer: it grows
    /// ahead of the writes).
    pub fn file_bytes(&self) -> u64 {
        self.end_page * PAGE
    }

    /// Retires what earlier calls could not, then flushes written data to stable storage
    /// (fdatasync): records written and removed before this call stay so across a crash of the
    /// system. Returns the first error of either, or of a removal's sync since the last call.
    pub fn sync(&mut self) -> Result<()> {
        let retired = self.retire();
        self.fdatasync().map_err(|e| self.io_error(e))?;
        if let Some(e) = self.sync_failed.take() {
            return Err(self.io_error(e));
        }
        retired
    }
}
