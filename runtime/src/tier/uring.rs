//! The `unsafe` corner of the SSD tier: page-aligned buffers for `O_DIRECT` and an io_uring ring
//! that reads and writes them, with the buffers registered as fixed buffers where the kernel
//! allows it.
//!
//! Invariant: a buffer handed to the kernel stays allocated and untouched until its completion
//! has been reaped. [`Ring::run`] reaps every completion of the operations it submitted before it
//! returns; if the ring fails mid-batch, the buffers are leaked instead of freed.

use io_uring::{opcode, types, IoUring};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::os::fd::RawFd;
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

/// An io_uring instance with its own pool of aligned buffers.
pub struct Ring {
    // Declared first so it is dropped (closing the ring) before the buffers it may point into.
    ring: IoUring,
    bufs: Vec<AlignedBuf>,
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
            registered,
            poisoned: false,
        })
    }

    /// True when the buffers are registered (fixed-buffer reads and writes).
    pub fn registered(&self) -> bool {
        self.registered
    }

    /// Number of buffers (and the most operations one submission holds).
    pub fn buffers(&self) -> usize {
        self.bufs.len()
    }

    /// Bytes of each buffer.
    pub fn buffer_len(&self) -> usize {
        self.bufs[0].len()
    }

    /// Buffer `i`.
    pub fn buf(&self, i: usize) -> &[u8] {
        self.bufs[i].as_slice()
    }

    /// Buffer `i`, mutably.
    pub fn buf_mut(&mut self, i: usize) -> &mut [u8] {
        self.bufs[i].as_mut_slice()
    }

    /// Runs `ops` on `fd` in submissions of up to [`Self::buffers`] operations, waiting for each
    /// submission's completions; returns each operation's result (bytes, or `-errno`).
    pub fn run(&mut self, fd: RawFd, ops: &[Op]) -> std::io::Result<Vec<i32>> {
        if self.poisoned {
            return Err(std::io::Error::other(
                "io_uring ring failed earlier; buffers were leaked",
            ));
        }
        let mut results = vec![0i32; ops.len()];
        for (c, chunk) in ops.chunks(self.bufs.len()).enumerate() {
            let base = c * self.bufs.len();
            for (i, op) in chunk.iter().enumerate() {
                assert!(
                    op.buf < self.bufs.len() && op.len <= self.bufs[op.buf].len,
                    "op outside its buffer"
                );
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
                let entry = entry.user_data((base + i) as u64);
                // SAFETY: the buffer (owned by self) stays alive and is not touched by us until
                // this operation's completion is reaped below, before `run` returns.
                unsafe { self.ring.submission().push(&entry) }
                    .expect("submission queue sized for a chunk");
            }
            let mut done = 0;
            while done < chunk.len() {
                match self.ring.submit_and_wait(chunk.len() - done) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => {
                        // Operations may still be in flight: never free their buffers.
                        self.poisoned = true;
                        std::mem::forget(std::mem::take(&mut self.bufs));
                        return Err(e);
                    }
                }
                for cqe in self.ring.completion() {
                    results[cqe.user_data() as usize] = cqe.result();
                    done += 1;
                }
            }
        }
        Ok(results)
    }
}
