//! The `unsafe` corner of the SSD tier: page-aligned buffers for `O_DIRECT`, an io_uring ring that
//! keeps reads and writes of them in flight, and the two file system calls the spill file needs
//! beyond `std` (`statx` for the `O_DIRECT` alignment, `fallocate`).
//!
//! A [`Ring`] owns a pool of buffers, registered as fixed buffers where the kernel allows it. Each
//! buffer is in one of three states: idle (in the pool), held (lent to the caller, who fills it
//! or reads a completed operation's bytes) or in flight (the kernel owns it). Only a held buffer
//! can be borrowed as a slice, so no Rust reference ever points into memory the kernel is
//! writing. The caller keeps the ring fed: [`Ring::start`] submits one operation at once, and
//! [`Ring::reap`] waits for at least one completion and hands back every one that is ready.
//!
//! Invariant: a buffer in flight stays allocated until its completion has been reaped. Dropping
//! the ring first waits for every operation in flight; if the ring fails so that completions can
//! no longer be reaped, the buffers are leaked instead of freed.

use io_uring::{opcode, types, IoUring};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;

/// Alignment of `O_DIRECT` buffers, offsets and lengths.
pub const ALIGN: usize = 4096;

/// A zeroed, [`ALIGN`]-aligned heap buffer.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is uniquely owned heap memory, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of `len` bytes (rounded up to a multiple of [`ALIGN`], at least one page).
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.max(1).div_ceil(ALIGN) * ALIGN;
        let layout = Layout::from_size_align(len, ALIGN).expect("aligned buffer layout");
        // SAFETY: the layout has non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a buffer has at least one page).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len` initialized (zeroed at allocation) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout.
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len, ALIGN),
            )
        };
    }
}

/// One read or write of `len` bytes of buffer `buf` at file offset `offset`.
#[derive(Clone, Copy, Debug)]
pub struct Op {
    /// Buffer index in the ring's pool.
    pub buf: usize,
    /// Bytes (a multiple of [`ALIGN`] for `O_DIRECT` files).
    pub len: usize,
    /// File offset.
    pub offset: u64,
    /// Write (true) or read.
    pub write: bool,
}

/// The completion of the operation on buffer `buf`, which is held by the caller again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// Buffer index.
    pub buf: usize,
    /// Bytes transferred, or `-errno`.
    pub result: i32,
}

/// Who owns a buffer of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BufState {
    Idle,
    Held,
    InFlight,
}

/// An io_uring instance with its own pool of aligned buffers (module docs).
pub struct Ring {
    // Declared first so it is dropped (closing the ring) before the buffers it may point into.
    ring: IoUring,
    bufs: Vec<AlignedBuf>,
    state: Vec<BufState>,
    idle: Vec<usize>,
    in_flight: usize,
    registered: bool,
    poisoned: bool,
}

impl Ring {
    /// A ring of `nbufs` entries with `nbufs` buffers of `buf_len` bytes, registered as fixed
    /// buffers if the kernel accepts them (else plain reads and writes are used).
    pub fn new(nbufs: usize, buf_len: usize) -> std::io::Result<Ring> {
        let nbufs = nbufs.clamp(1, 4096);
        let ring = IoUring::new(nbufs.next_power_of_two() as u32)?;
        let bufs: Vec<AlignedBuf> = (0..nbufs).map(|_| AlignedBuf::new(buf_len)).collect();
        let iovecs: Vec<libc::iovec> = bufs
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.ptr.as_ptr().cast(),
                iov_len: b.len,
            })
            .collect();
        // SAFETY: the iovecs describe buffers owned by this Ring, which outlive the registration
        // (the ring is closed, dropping the registration, before the buffers are freed).
        let registered = unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        Ok(Ring {
            ring,
            bufs,
            state: vec![BufState::Idle; nbufs],
            // Popped from the back: buffer 0 is lent first.
            idle: (0..nbufs).rev().collect(),
            in_flight: 0,
            registered,
            poisoned: false,
        })
    }

    /// True when the buffers are registered (fixed-buffer reads and writes).
    pub fn registered(&self) -> bool {
        self.registered
    }

    /// Number of buffers (and the most operations in flight).
    pub fn buffers(&self) -> usize {
        self.state.len()
    }

    /// Bytes of each buffer.
    pub fn buffer_len(&self) -> usize {
        self.bufs.first().map_or(0, AlignedBuf::len)
    }

    /// Operations submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// An error if an earlier failure left operations that can no longer be reaped.
    pub fn usable(&self) -> std::io::Result<()> {
        if self.poisoned {
            return Err(std::io::Error::other(
                "io_uring ring failed earlier; its buffers were leaked",
            ));
        }
        Ok(())
    }

    /// Lends an idle buffer to the caller (`None` when every buffer is held or in flight).
    pub fn take(&mut self) -> Option<usize> {
        if self.poisoned {
            return None;
        }
        let i = self.idle.pop()?;
        self.state[i] = BufState::Held;
        Some(i)
    }

    /// Returns held buffer `i` to the pool.
    pub fn give_back(&mut self, i: usize) {
        assert_eq!(self.state[i], BufState::Held, "buffer {i} is not held");
        self.state[i] = BufState::Idle;
        self.idle.push(i);
    }

    /// Held buffer `i`.
    pub fn buf(&self, i: usize) -> &[u8] {
        assert_eq!(self.state[i], BufState::Held, "buffer {i} is not held");
        self.bufs[i].as_slice()
    }

    /// Held buffer `i`, mutably.
    pub fn buf_mut(&mut self, i: usize) -> &mut [u8] {
        assert_eq!(self.state[i], BufState::Held, "buffer {i} is not held");
        self.bufs[i].as_mut_slice()
    }

    /// Submits `op` on `fd` now; its held buffer is in flight until [`Self::reap`] returns it.
    pub fn start(&mut self, fd: RawFd, op: Op) -> std::io::Result<()> {
        self.usable()?;
        assert_eq!(
            self.state[op.buf],
            BufState::Held,
            "buffer {} is not held",
            op.buf
        );
        assert!(op.len <= self.bufs[op.buf].len, "op outside its buffer");
        let ptr = self.bufs[op.buf].ptr.as_ptr();
        let len = op.len as u32;
        let fd = types::Fd(fd);
        let entry = match (op.write, self.registered) {
            (true, true) => opcode::WriteFixed::new(fd, ptr, len, op.buf as u16)
                .offset(op.offset)
                .build(),
            (true, false) => opcode::Write::new(fd, ptr, len).offset(op.offset).build(),
            (false, true) => opcode::ReadFixed::new(fd, ptr, len, op.buf as u16)
                .offset(op.offset)
                .build(),
            (false, false) => opcode::Read::new(fd, ptr, len).offset(op.offset).build(),
        };
        let entry = entry.user_data(op.buf as u64);
        // SAFETY: the buffer is owned by self and marked in flight below, so nothing borrows it
        // (buf/buf_mut refuse) and it is not freed (Drop drains, or leaks on failure) until the
        // completion carrying this user_data has been reaped.
        unsafe { self.ring.submission().push(&entry) }
            .expect("at most one entry per buffer, and the queue has a slot per buffer");
        self.state[op.buf] = BufState::InFlight;
        self.in_flight += 1;
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(self.poison(e)),
            }
        }
    }

    /// Waits until at least one operation has completed (unless none is in flight) and appends
    /// every completion that is ready to `out`; their buffers are held by the caller again.
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> std::io::Result<()> {
        self.usable()?;
        if self.in_flight == 0 {
            return Ok(());
        }
        loop {
            let before = out.len();
            let mut unknown = None;
            for cqe in self.ring.completion() {
                let buf = cqe.user_data() as usize;
                // The kernel echoes our user_data; anything else is a broken ring, not an index
                // to trust.
                if self.state.get(buf) != Some(&BufState::InFlight) {
                    unknown = Some(buf);
                    break;
                }
                self.state[buf] = BufState::Held;
                self.in_flight -= 1;
                out.push(Completion {
                    buf,
                    result: cqe.result(),
                });
            }
            if let Some(buf) = unknown {
                return Err(self.poison(std::io::Error::other(format!(
                    "io_uring completion for buffer {buf}, which is not in flight"
                ))));
            }
            if out.len() > before {
                return Ok(());
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(self.poison(e)),
            }
        }
    }

    /// Marks the ring failed: operations may still be in flight and can no longer be reaped, so
    /// their buffers must never be freed.
    fn poison(&mut self, e: std::io::Error) -> std::io::Error {
        self.poisoned = true;
        if self.in_flight > 0 {
            std::mem::forget(std::mem::take(&mut self.bufs));
        }
        e
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Closing the ring does not wait for operations in flight: wait here, before the buffers
        // are freed.
        let mut done = Vec::new();
        while self.in_flight > 0 && self.reap(&mut done).is_ok() {
            done.clear();
        }
    }
}

/// The `O_DIRECT` alignment `file`'s file system reports: (memory, file offset) in bytes; `None`
/// where the kernel does not say (then [`ALIGN`] is assumed to do), `Some((0, 0))` where the file
/// does not support `O_DIRECT`.
pub fn dio_alignment(file: &File) -> std::io::Result<Option<(u32, u32)>> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the empty path with AT_EMPTY_PATH names the open descriptor itself; the kernel
    // writes at most one `struct statx` into `stx`, which is that large.
    let r = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            stx.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `statx` is plain integers, valid zeroed; the kernel filled what it reports.
    let stx = unsafe { stx.assume_init() };
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return Ok(None);
    }
    Ok(Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align)))
}

/// Allocates `file`'s blocks in `[offset, offset + len)`, growing its size to cover them
/// (`fallocate` mode 0: unwritten extents, read as zeros).
pub fn fallocate(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    };
    loop {
        // SAFETY: a plain system call on a descriptor the borrowed `File` keeps open; no memory
        // is passed.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, offset, len) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn scratch_file(name: &str) -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!("cxlkv-uring-{name}-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        (path, f)
    }

    #[test]
    fn keeps_the_ring_fed_and_lends_only_held_buffers() {
        let (path, f) = scratch_file("fed");
        let mut ring = Ring::new(4, ALIGN).unwrap();
        let fd = f.as_raw_fd();
        let mut done = Vec::new();
        // 64 writes through 4 buffers, refilled as completions arrive.
        let mut next = 0u64;
        while next < 64 || ring.in_flight() > 0 {
            while next < 64 {
                let Some(b) = ring.take() else { break };
                ring.buf_mut(b).fill(next as u8);
                let op = Op {
                    buf: b,
                    len: ALIGN,
                    offset: next * ALIGN as u64,
                    write: true,
                };
                ring.start(fd, op).unwrap();
                next += 1;
            }
            assert!(ring.in_flight() <= 4);
            ring.reap(&mut done).unwrap();
            for c in done.drain(..) {
                assert_eq!(c.result, ALIGN as i32);
                ring.give_back(c.buf);
            }
        }
        let mut page = vec![0u8; ALIGN];
        for i in 0..64u64 {
            f.read_exact_at(&mut page, i * ALIGN as u64).unwrap();
            assert!(page.iter().all(|&b| b == i as u8), "page {i}");
        }
        let _ = std::fs::remove_file(path);
    }

    #[test]
    #[should_panic(expected = "not held")]
    fn a_buffer_in_flight_cannot_be_borrowed() {
        let (path, f) = scratch_file("borrow");
        let mut ring = Ring::new(1, ALIGN).unwrap();
        let b = ring.take().unwrap();
        let op = Op {
            buf: b,
            len: ALIGN,
            offset: 0,
            write: false,
        };
        ring.start(f.as_raw_fd(), op).unwrap();
        let _ = std::fs::remove_file(path);
        let _ = ring.buf(b);
    }

    #[test]
    fn fallocate_grows_the_file_with_zeros() {
        let (path, f) = scratch_file("falloc");
        match fallocate(&f, 0, 1 << 20) {
            Ok(()) => {
                assert_eq!(f.metadata().unwrap().len(), 1 << 20);
                let mut page = vec![1u8; ALIGN];
                f.read_exact_at(&mut page, 4 * ALIGN as u64).unwrap();
                assert!(page.iter().all(|&b| b == 0));
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}"),
        }
        let _ = std::fs::remove_file(path);
    }
}
