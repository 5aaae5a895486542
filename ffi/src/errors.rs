//! The error rule of the C ABI: the numbered `cxlkv_result`, the thread-local last-error message,
//! the panic boundary (`guard`) that every entry point returning a `cxlkv_result` runs in, and the
//! one mapping from library errors to result codes.
//!
//! The message belongs to the last call on this thread that returned a `cxlkv_result`: `guard`
//! clears it before the call's body runs, so a success leaves it empty and a failure leaves the
//! failure's own text (its detail, or the code's description when the failing path gave none).

use cxlkv_runtime::api::{Code, Failure};
use std::cell::RefCell;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Result codes. The numbers are stable: they are the runtime's table (`cxlkv_runtime::api::Code`),
/// from which every code here is made (`From<Code>`; the build checks them number for number).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum cxlkv_result {
    /// Success.
    CXLKV_OK = 0,
    /// A required pointer argument was NULL.
    CXLKV_ERR_NULL = 1,
    /// A handle is NULL, released, or of the wrong type.
    CXLKV_ERR_INVALID_HANDLE = 2,
    /// An argument is out of range (zero length, bad UTF-8, bad backend spec, bad size...).
    CXLKV_ERR_INVALID_ARG = 3,
    /// The key is not in the pool.
    CXLKV_ERR_NOT_FOUND = 4,
    /// The caller's buffer is too small; the needed size was stored.
    CXLKV_ERR_BUFFER_TOO_SMALL = 5,
    /// The payload is larger than a block.
    CXLKV_ERR_PAYLOAD_TOO_LARGE = 6,
    /// An operating-system call failed (open, mmap...).
    CXLKV_ERR_IO = 7,
    /// The memory is not a valid pool (truncated, another format or version, corrupt superblock).
    CXLKV_ERR_BAD_POOL = 8,
    /// Every participant slot is held by a live participant.
    CXLKV_ERR_NO_PARTICIPANT_SLOT = 9,
    /// The participant owns no partition, so it cannot write.
    CXLKV_ERR_NO_PARTITION = 10,
    /// The participant's partition was taken over; it must detach.
    CXLKV_ERR_FENCED = 11,
    /// The key lives in another participant's partition.
    CXLKV_ERR_NOT_OWNER = 12,
    /// The participant holds the maximum number of pins.
    CXLKV_ERR_PIN_TABLE_FULL = 13,
    /// The partition is full and every block is pinned.
    CXLKV_ERR_FULL = 14,
    /// Rust code panicked (a bug in cxlkv); the call had no effect that can be relied on.
    CXLKV_ERR_PANIC = 15,
    /// The backend is not available on this machine (no such NUMA node, no DAX device...).
    CXLKV_ERR_UNAVAILABLE = 16,
}

use cxlkv_result::*;

impl From<Code> for cxlkv_result {
    fn from(c: Code) -> cxlkv_result {
        c_name(c)
    }
}

/// The C name of a code (exhaustive: a new code does not compile until it has one).
const fn c_name(c: Code) -> cxlkv_result {
    match c {
        Code::Ok => CXLKV_OK,
        Code::Null => CXLKV_ERR_NULL,
        Code::InvalidHandle => CXLKV_ERR_INVALID_HANDLE,
        Code::InvalidArg => CXLKV_ERR_INVALID_ARG,
        Code::NotFound => CXLKV_ERR_NOT_FOUND,
        Code::BufferTooSmall => CXLKV_ERR_BUFFER_TOO_SMALL,
        Code::PayloadTooLarge => CXLKV_ERR_PAYLOAD_TOO_LARGE,
        Code::Io => CXLKV_ERR_IO,
        Code::BadPool => CXLKV_ERR_BAD_POOL,
        Code::NoParticipantSlot => CXLKV_ERR_NO_PARTICIPANT_SLOT,
        Code::NoPartition => CXLKV_ERR_NO_PARTITION,
        Code::Fenced => CXLKV_ERR_FENCED,
        Code::NotOwner => CXLKV_ERR_NOT_OWNER,
        Code::PinTableFull => CXLKV_ERR_PIN_TABLE_FULL,
        Code::Full => CXLKV_ERR_FULL,
        Code::Panic => CXLKV_ERR_PANIC,
        Code::Unavailable => CXLKV_ERR_UNAVAILABLE,
    }
}

impl cxlkv_result {
    /// The runtime's code of the same number.
    fn code(self) -> Code {
        Code::from_u32(self as u32).expect("every cxlkv_result is a Code's number")
    }
}

// Each C name carries the number of the code it is made from (the build fails otherwise), and
// `Code::ALL[n]` is numbered `n`: the numbers have one source, the runtime's table.
const _: () = {
    let mut i = 0;
    while i < Code::ALL.len() {
        assert!(c_name(Code::ALL[i]) as u32 == Code::ALL[i] as u32);
        i += 1;
    }
};

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last(msg: String) {
    LAST_ERROR.with(|l| *l.borrow_mut() = msg);
}

/// This thread's current error message (batches collect the message of their first failure).
pub(crate) fn last_message() -> String {
    LAST_ERROR.with(|l| l.borrow().clone())
}

/// Records `msg` as this call's error message and returns `code`.
pub(crate) fn fail(code: cxlkv_result, msg: impl Into<String>) -> cxlkv_result {
    set_last(msg.into());
    code
}

/// Runs the body of an entry point: clears the last error, then runs `f` inside the panic
/// boundary. Every C function that returns a `cxlkv_result` is `guard(|| ...)` and nothing else,
/// so the message `cxlkv_last_error_message` reads always belongs to the call that failed.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), cxlkv_result>) -> cxlkv_result {
    LAST_ERROR.with(|l| l.borrow_mut().clear());
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CXLKV_OK,
        Ok(Err(code)) => {
            if code != CXLKV_OK && LAST_ERROR.with(|l| l.borrow().is_empty()) {
                set_last(code.code().text().to_string());
            }
            code
        }
        Err(_) => fail(CXLKV_ERR_PANIC, "internal panic (bug in cxlkv)"),
    }
}

/// Records a runtime failure's message and returns its code (the runtime's one mapping,
/// `cxlkv_runtime::api::Failure`).
pub(crate) fn fail_with(f: Failure) -> cxlkv_result {
    fail(f.code.into(), f.message)
}

/// The code of a pool error; its text becomes the message.
pub(crate) fn map_err(e: cxlkv_runtime::PoolError) -> cxlkv_result {
    fail_with(e.into())
}

/// The code of a near-data client error, with the same rule as `map_err`.
pub(crate) fn map_ndp(e: cxlkv_runtime::ndp::NdpError) -> cxlkv_result {
    fail_with(e.into())
}

fn write_text(text: &str, buf: *mut c_char, len: usize) -> usize {
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: the caller promises `len` writable bytes at `buf`; we write n + 1 ≤ len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    text.len() + 1
}

/// Writes the description of `result` into `buf` (at most `len` bytes, always NUL-terminated when
/// `len > 0`, truncated if needed). Returns the size needed including the NUL. `buf` may be NULL
/// to ask for the size. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_result_message(result: u32, buf: *mut c_char, len: usize) -> usize {
    let text = catch_unwind(|| Code::from_u32(result).map_or("unknown result code", Code::text))
        .unwrap_or("unknown result code");
    write_text(text, buf, len)
}

/// Writes the message of the last call on this thread that returned a `cxlkv_result` into `buf`
/// (as `cxlkv_result_message`): the detail of its failure, or the empty string if it succeeded
/// (every such call clears the message when it starts). Returns the size needed including the NUL
/// (1 for the empty string). Thread-safe (per thread).
#[no_mangle]
pub extern "C" fn cxlkv_last_error_message(buf: *mut c_char, len: usize) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        LAST_ERROR.with(|l| write_text(&l.borrow(), buf, len))
    }))
    .unwrap_or(0)
}
