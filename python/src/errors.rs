//! Errors: one Python exception hierarchy under `cxlkv.Error`, whose instances carry `.code` (the
//! C ABI's stable result numbers, `ffi/src/errors.rs`) and `.message` (the library's text), and the
//! one mapping from library errors to codes and classes.
//!
//! Work that runs with the GIL released returns a [`Fail`] (plain data, `Send`); it becomes a
//! Python exception when the call returns to Python.

use cxlkv_runtime::mem::MemError;
use cxlkv_runtime::ndp::NdpError;
use cxlkv_runtime::region::RegionError;
use cxlkv_runtime::PoolError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    cxlkv,
    Error,
    PyException,
    "A cxlkv call failed: `code` is the library's result code (the numbers of the C ABI), \
     `message` the detail."
);
create_exception!(
    cxlkv,
    BadInputError,
    Error,
    "An argument is wrong: a bad spec, size, key chain, shape, dtype, a buffer that is too small, \
     read-only or not contiguous, a payload larger than a block (codes 1, 3, 5, 6)."
);
create_exception!(
    cxlkv,
    NotFoundError,
    Error,
    "The key is not in the pool (code 4)."
);
create_exception!(
    cxlkv,
    IoError,
    Error,
    "An operating-system call failed: open, mmap... (code 7)."
);
create_exception!(
    cxlkv,
    BadPoolError,
    Error,
    "The memory is not a valid pool: truncated, another format or version, corrupt (code 8)."
);
create_exception!(
    cxlkv,
    FullError,
    Error,
    "No room: every participant slot is live (9), the pin table is full (13), or the partition is \
     full and every block pinned (14)."
);
create_exception!(
    cxlkv,
    NotOwnerError,
    Error,
    "The participant owns no partition (10), or the key lives in another participant's (12)."
);
create_exception!(
    cxlkv,
    FencedError,
    Error,
    "The participant's partition was taken over; it must detach (code 11)."
);
create_exception!(
    cxlkv,
    ClosedError,
    Error,
    "The pool, participant, pin or device was closed, detached or released (code 2)."
);
create_exception!(
    cxlkv,
    UnavailableError,
    Error,
    "The backend or the device is not available on this machine (code 16)."
);

/// The result codes (the C ABI's `cxlkv_result`; the numbers are stable).
pub mod code {
    /// A required argument was missing.
    pub const NULL: u32 = 1;
    /// A handle is closed, detached or released.
    pub const INVALID_HANDLE: u32 = 2;
    /// An argument is out of range.
    pub const INVALID_ARG: u32 = 3;
    /// The key is not in the pool.
    pub const NOT_FOUND: u32 = 4;
    /// The caller's buffer is too small.
    pub const BUFFER_TOO_SMALL: u32 = 5;
    /// The payload is larger than a block.
    pub const PAYLOAD_TOO_LARGE: u32 = 6;
    /// An operating-system call failed.
    pub const IO: u32 = 7;
    /// Not a valid pool.
    pub const BAD_POOL: u32 = 8;
    /// Every participant slot is live.
    pub const NO_PARTICIPANT_SLOT: u32 = 9;
    /// The participant owns no partition.
    pub const NO_PARTITION: u32 = 10;
    /// The participant was fenced.
    pub const FENCED: u32 = 11;
    /// Another participant owns the key.
    pub const NOT_OWNER: u32 = 12;
    /// The pin table is full.
    pub const PIN_TABLE_FULL: u32 = 13;
    /// The partition is full and every block pinned.
    pub const FULL: u32 = 14;
    /// A bug in cxlkv.
    pub const PANIC: u32 = 15;
    /// The backend or device is not available.
    pub const UNAVAILABLE: u32 = 16;

    /// Every code with its name, for the module's constants.
    pub const ALL: [(&str, u32); 16] = [
        ("ERR_NULL", NULL),
        ("ERR_INVALID_HANDLE", INVALID_HANDLE),
        ("ERR_INVALID_ARG", INVALID_ARG),
        ("ERR_NOT_FOUND", NOT_FOUND),
        ("ERR_BUFFER_TOO_SMALL", BUFFER_TOO_SMALL),
        ("ERR_PAYLOAD_TOO_LARGE", PAYLOAD_TOO_LARGE),
        ("ERR_IO", IO),
        ("ERR_BAD_POOL", BAD_POOL),
        ("ERR_NO_PARTICIPANT_SLOT", NO_PARTICIPANT_SLOT),
        ("ERR_NO_PARTITION", NO_PARTITION),
        ("ERR_FENCED", FENCED),
        ("ERR_NOT_OWNER", NOT_OWNER),
        ("ERR_PIN_TABLE_FULL", PIN_TABLE_FULL),
        ("ERR_FULL", FULL),
        ("ERR_PANIC", PANIC),
        ("ERR_UNAVAILABLE", UNAVAILABLE),
    ];
}

/// A failure with its code and message, made without the GIL; `?` turns it into the exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fail {
    /// One of [`code`].
    pub code: u32,
    /// The detail.
    pub message: String,
}

impl Fail {
    /// A failure of `code`.
    pub fn new(code: u32, message: impl Into<String>) -> Fail {
        Fail {
            code,
            message: message.into(),
        }
    }

    /// A bad argument (code 3).
    pub fn bad(message: impl Into<String>) -> Fail {
        Fail::new(code::INVALID_ARG, message)
    }

    /// The same failure with `what` in front of its message.
    pub fn context(self, what: impl std::fmt::Display) -> Fail {
        Fail {
            code: self.code,
            message: format!("{what}: {}", self.message),
        }
    }
}

impl From<PoolError> for Fail {
    fn from(e: PoolError) -> Fail {
        Fail::new(pool_code(&e), e.to_string())
    }
}

impl From<NdpError> for Fail {
    fn from(e: NdpError) -> Fail {
        match e {
            NdpError::Pool(e) => e.into(),
            NdpError::Mem(e) => PoolError::from(e).into(),
            NdpError::BadRequest(m) => Fail::bad(m),
            NdpError::Device(s) => Fail::bad(format!("the device rejected the request: {s}")),
            e @ (NdpError::NoQueuePair { .. }
            | NdpError::Unavailable(_)
            | NdpError::Stale(_)
            | NdpError::BadResult(_)
            | NdpError::UnknownTicket(_)) => Fail::new(code::UNAVAILABLE, e.to_string()),
        }
    }
}

impl From<Fail> for PyErr {
    fn from(f: Fail) -> PyErr {
        let text = format!("{} (cxlkv code {})", f.message, f.code);
        let err = match f.code {
            code::NULL | code::INVALID_ARG | code::BUFFER_TOO_SMALL | code::PAYLOAD_TOO_LARGE => {
                BadInputError::new_err(text)
            }
            code::NOT_FOUND => NotFoundError::new_err(text),
            code::IO => IoError::new_err(text),
            code::BAD_POOL => BadPoolError::new_err(text),
            code::NO_PARTICIPANT_SLOT | code::PIN_TABLE_FULL | code::FULL => {
                FullError::new_err(text)
            }
            code::NO_PARTITION | code::NOT_OWNER => NotOwnerError::new_err(text),
            code::FENCED => FencedError::new_err(text),
            code::INVALID_HANDLE => ClosedError::new_err(text),
            code::UNAVAILABLE => UnavailableError::new_err(text),
            _ => Error::new_err(text),
        };
        Python::attach(|py| {
            let v = err.value(py);
            // Exception instances take attributes; a failure here would only lose the two fields.
            let _ = v.setattr("code", f.code);
            let _ = v.setattr("message", f.message);
        });
        err
    }
}

/// The code of a pool error. Every variant is named, so a new one does not compile until it has a
/// code (the same table as the C ABI's `map_err`).
pub fn pool_code(e: &PoolError) -> u32 {
    match e {
        PoolError::Region(r) => match r {
            RegionError::BadSpec(_) | RegionError::BadSize { .. } => code::INVALID_ARG,
            RegionError::Unavailable { .. } => code::UNAVAILABLE,
            RegionError::Misaligned { .. }
            | RegionError::OutOfRange { .. }
            | RegionError::Misplaced { .. }
            | RegionError::Os { .. } => code::IO,
        },
        PoolError::Mem(MemError::OutOfBounds { .. } | MemError::Misaligned { .. })
        | PoolError::Truncated { .. }
        | PoolError::BadMagic { .. }
        | PoolError::UnsupportedVersion { .. }
        | PoolError::SuperblockCrc { .. }
        | PoolError::Geometry(_)
        | PoolError::UnsupportedCoherence(_) => code::BAD_POOL,
        PoolError::BadConfig(_) | PoolError::EmptyKeyChain | PoolError::BadKvBlock(_) => {
            code::INVALID_ARG
        }
        PoolError::PayloadTooLarge { .. } => code::PAYLOAD_TOO_LARGE,
        PoolError::BufferTooSmall { .. } => code::BUFFER_TOO_SMALL,
        PoolError::NoFreeParticipant(_) => code::NO_PARTICIPANT_SLOT,
        PoolError::NoPartition { .. } => code::NO_PARTITION,
        PoolError::Fenced { .. } => code::FENCED,
        PoolError::NotOwner { .. } => code::NOT_OWNER,
        PoolError::PinTableFull(_) => code::PIN_TABLE_FULL,
        PoolError::PartitionFull(_) => code::FULL,
    }
}

/// Registers the exception classes and the code constants in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("BadInputError", py.get_type::<BadInputError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("IoError", py.get_type::<IoError>())?;
    m.add("BadPoolError", py.get_type::<BadPoolError>())?;
    m.add("FullError", py.get_type::<FullError>())?;
    m.add("NotOwnerError", py.get_type::<NotOwnerError>())?;
    m.add("FencedError", py.get_type::<FencedError>())?;
    m.add("ClosedError", py.get_type::<ClosedError>())?;
    m.add("UnavailableError", py.get_type::<UnavailableError>())?;
    for (name, c) in code::ALL {
        m.add(name, c)?;
    }
    Ok(())
}
