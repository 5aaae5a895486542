//! Errors: one Python exception hierarchy under `cxlkv.Error`, whose instances carry `.code` (the
//! runtime's stable result numbers, `cxlkv_runtime::api::Code`, which the C ABI carries too) and
//! `.message` (the library's text). Library errors become codes in the runtime
//! (`cxlkv_runtime::api::Failure`); this module only maps a code to its exception class.
//!
//! Work that runs with the GIL released returns a [`Fail`] (plain data, `Send`); it becomes a
//! Python exception when the call returns to Python.

use cxlkv_runtime::api::{Code, Failure};
use cxlkv_runtime::ndp::NdpError;
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

/// A failure with its code and message, made without the GIL; `?` turns it into the exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fail {
    /// Which failure.
    pub code: Code,
    /// The detail.
    pub message: String,
}

impl Fail {
    /// A failure of `code`.
    pub fn new(code: Code, message: impl Into<String>) -> Fail {
        Fail {
            code,
            message: message.into(),
        }
    }

    /// A bad argument (code 3).
    pub fn bad(message: impl Into<String>) -> Fail {
        Fail::new(Code::InvalidArg, message)
    }

    /// The same failure with `what` in front of its message.
    pub fn context(self, what: impl std::fmt::Display) -> Fail {
        Fail {
            code: self.code,
            message: format!("{what}: {}", self.message),
        }
    }
}

impl From<Failure> for Fail {
    fn from(f: Failure) -> Fail {
        Fail::new(f.code, f.message)
    }
}

impl From<PoolError> for Fail {
    fn from(e: PoolError) -> Fail {
        Failure::from(e).into()
    }
}

impl From<NdpError> for Fail {
    fn from(e: NdpError) -> Fail {
        Failure::from(e).into()
    }
}

impl From<Fail> for PyErr {
    fn from(f: Fail) -> PyErr {
        let number = f.code as u32;
        let text = format!("{} (cxlkv code {number})", f.message);
        let err = match f.code {
            Code::Null | Code::InvalidArg | Code::BufferTooSmall | Code::PayloadTooLarge => {
                BadInputError::new_err(text)
            }
            Code::NotFound => NotFoundError::new_err(text),
            Code::Io => IoError::new_err(text),
            Code::BadPool => BadPoolError::new_err(text),
            Code::NoParticipantSlot | Code::PinTableFull | Code::Full => FullError::new_err(text),
            Code::NoPartition | Code::NotOwner => NotOwnerError::new_err(text),
            Code::Fenced => FencedError::new_err(text),
            Code::InvalidHandle => ClosedError::new_err(text),
            Code::Unavailable => UnavailableError::new_err(text),
            Code::Ok | Code::Panic => Error::new_err(text),
        };
        Python::attach(|py| {
            let v = err.value(py);
            // Exception instances take attributes; a failure here would only lose the two fields.
            let _ = v.setattr("code", number);
            let _ = v.setattr("message", f.message);
        });
        err
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
    // `cxlkv.ERR_*`: every code but success, under its name in the runtime's table.
    for c in Code::ALL.into_iter().filter(|&c| c != Code::Ok) {
        m.add(c.name(), c as u32)?;
    }
    Ok(())
}
