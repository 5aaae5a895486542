//! What every front end of the runtime shares: the one table of result codes ([`Code`], whose
//! numbers the C ABI's `cxlkv_result` and Python's `cxlkv.ERR_*` carry) and the one mapping from
//! the runtime's errors to it ([`Failure`], built from a [`PoolError`] or an [`NdpError`]).
//!
//! A front end only marshals: it turns its arguments into runtime calls and a [`Failure`] into its
//! own form of an error (a returned `cxlkv_result` and the thread's message in C, an exception
//! with `.code` and `.message` in Python). The mapping is one exhaustive match per error type, so
//! a new variant does not compile until it has a code.

use crate::mem::MemError;
use crate::ndp::NdpError;
use crate::region::RegionError;
use crate::PoolError;

/// The result codes. The numbers are stable: they are the C ABI's (`cxlkv_result` in
/// `ffi/include/cxlkv.h`, which a test ties to this table) and Python's `cxlkv.ERR_*`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    /// Success.
    Ok = 0,
    /// A required pointer argument was NULL.
    Null = 1,
    /// A handle is NULL, released, or of the wrong type.
    InvalidHandle = 2,
    /// An argument is out of range (zero length, bad UTF-8, bad backend spec, bad size...).
    InvalidArg = 3,
    /// The key is not in the pool.
    NotFound = 4,
    /// The caller's buffer is too small; the needed size was stored.
    BufferTooSmall = 5,
    /// The payload is larger than a block.
    PayloadTooLarge = 6,
    /// An operating-system call failed (open, mmap...).
    Io = 7,
    /// The memory is not a valid pool (truncated, another format or version, corrupt superblock).
    BadPool = 8,
    /// Every participant slot is held by a live participant.
    NoParticipantSlot = 9,
    /// The participant owns no partition, so it cannot write.
    NoPartition = 10,
    /// The participant's partition was taken over; it must detach.
    Fenced = 11,
    /// The key lives in another participant's partition.
    NotOwner = 12,
    /// The participant holds the maximum number of pins.
    PinTableFull = 13,
    /// The partition is full and every block is pinned.
    Full = 14,
    /// Rust code panicked (a bug in cxlkv); the call had no effect that can be relied on.
    Panic = 15,
    /// The backend or the device is not available on this machine (no such NUMA node, no DAX
    /// device...).
    Unavailable = 16,
}

impl Code {
    /// Every code, in number order (`ALL[n]` is the code numbered `n`).
    pub const ALL: [Code; 17] = [
        Code::Ok,
        Code::Null,
        Code::InvalidHandle,
        Code::InvalidArg,
        Code::NotFound,
        Code::BufferTooSmall,
        Code::PayloadTooLarge,
        Code::Io,
        Code::BadPool,
        Code::NoParticipantSlot,
        Code::NoPartition,
        Code::Fenced,
        Code::NotOwner,
        Code::PinTableFull,
        Code::Full,
        Code::Panic,
        Code::Unavailable,
    ];

    /// The code numbered `n`, if there is one.
    pub fn from_u32(n: u32) -> Option<Code> {
        Code::ALL.get(n as usize).copied()
    }

    /// Its name in the front ends: `OK`, `ERR_NULL`, ... (`CXLKV_` in front in C; `cxlkv.ERR_*`
    /// in Python).
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Null => "ERR_NULL",
            Code::InvalidHandle => "ERR_INVALID_HANDLE",
            Code::InvalidArg => "ERR_INVALID_ARG",
            Code::NotFound => "ERR_NOT_FOUND",
            Code::BufferTooSmall => "ERR_BUFFER_TOO_SMALL",
            Code::PayloadTooLarge => "ERR_PAYLOAD_TOO_LARGE",
            Code::Io => "ERR_IO",
            Code::BadPool => "ERR_BAD_POOL",
            Code::NoParticipantSlot => "ERR_NO_PARTICIPANT_SLOT",
            Code::NoPartition => "ERR_NO_PARTITION",
            Code::Fenced => "ERR_FENCED",
            Code::NotOwner => "ERR_NOT_OWNER",
            Code::PinTableFull => "ERR_PIN_TABLE_FULL",
            Code::Full => "ERR_FULL",
            Code::Panic => "ERR_PANIC",
            Code::Unavailable => "ERR_UNAVAILABLE",
        }
    }

    /// Its fixed description (`cxlkv_result_message`; the message of a failure that gave none).
    pub fn text(self) -> &'static str {
        match self {
            Code::Ok => "success",
            Code::Null => "a required pointer argument was NULL",
            Code::InvalidHandle => "handle is NULL, released, or of the wrong type",
            Code::InvalidArg => "argument out of range",
            Code::NotFound => "key not found",
            Code::BufferTooSmall => "buffer too small (needed size stored)",
            Code::PayloadTooLarge => "payload larger than a block",
            Code::Io => "operating-system call failed",
            Code::BadPool => "not a valid cxlkv pool",
            Code::NoParticipantSlot => "all participant slots are in use",
            Code::NoPartition => "participant owns no partition",
            Code::Fenced => "partition was taken over; participant fenced",
            Code::NotOwner => "key lives in another participant's partition",
            Code::PinTableFull => "pin table full",
            Code::Full => "partition full and every block pinned",
            Code::Panic => "internal panic (bug in cxlkv)",
            Code::Unavailable => "backend not available on this machine",
        }
    }
}

impl From<&PoolError> for Code {
    /// The code of a pool error. Every variant is named, so a new one does not compile until it
    /// has a code.
    fn from(e: &PoolError) -> Code {
        match e {
            PoolError::Region(r) => match r {
                RegionError::BadSpec(_)
                | RegionError::BadSize { .. }
                | RegionError::BadAccess(_) => Code::InvalidArg,
                RegionError::Unavailable { .. } => Code::Unavailable,
                RegionError::Misaligned { .. }
                | RegionError::OutOfRange { .. }
                | RegionError::Misplaced { .. }
                | RegionError::Os { .. } => Code::Io,
            },
            PoolError::Mem(MemError::ReadOnly { .. }) => Code::InvalidArg,
            PoolError::Mem(MemError::OutOfBounds { .. } | MemError::Misaligned { .. })
            | PoolError::Truncated { .. }
            | PoolError::BadMagic { .. }
            | PoolError::UnsupportedVersion { .. }
            | PoolError::SuperblockCrc { .. }
            | PoolError::Geometry(_)
            | PoolError::UnsupportedCoherence(_) => Code::BadPool,
            PoolError::BadConfig(_)
            | PoolError::EmptyKeyChain
            | PoolError::BadKvBlock(_)
            | PoolError::PayloadCrc(..) => Code::InvalidArg,
            PoolError::PayloadTooLarge { .. } => Code::PayloadTooLarge,
            PoolError::BufferTooSmall { .. } => Code::BufferTooSmall,
            PoolError::NoFreeParticipant(_) => Code::NoParticipantSlot,
            PoolError::NoPartition { .. } => Code::NoPartition,
            PoolError::Fenced { .. } => Code::Fenced,
            PoolError::NotOwner { .. } => Code::NotOwner,
            PoolError::PinTableFull(_) => Code::PinTableFull,
            PoolError::PartitionFull(_)
            | PoolError::QuotaExceeded { .. }
            | PoolError::TenantTableFull(_) => Code::Full,
            PoolError::UnknownTenant(_) => Code::InvalidArg,
        }
    }
}

/// A failed call as every front end reports it: its code and its message (the error's own text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Which failure.
    pub code: Code,
    /// The detail.
    pub message: String,
}

impl Failure {
    /// A failure of `code` with `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code.name())
    }
}

impl From<PoolError> for Failure {
    fn from(e: PoolError) -> Failure {
        Failure::new(Code::from(&e), e.to_string())
    }
}

impl From<NdpError> for Failure {
    /// The code of a near-data client error: a bad request or one the device refused is a bad
    /// argument; a device that cannot answer a command without a host path, or whose answer is
    /// unusable, is unavailable. Every variant is named.
    fn from(e: NdpError) -> Failure {
        match e {
            NdpError::Pool(e) => e.into(),
            NdpError::Mem(e) => PoolError::from(e).into(),
            NdpError::BadRequest(m) => Failure::new(Code::InvalidArg, m),
            NdpError::Device(s) => Failure::new(
                Code::InvalidArg,
                format!("the device rejected the request: {s}"),
            ),
            e @ (NdpError::NoQueuePair { .. }
            | NdpError::Unavailable(_)
            | NdpError::Stale(_)
            | NdpError::BadResult(_)
            | NdpError::UnknownTicket(_)) => Failure::new(Code::Unavailable, e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL[n]` is the code numbered `n`, each name is used once, and numbers round-trip.
    #[test]
    fn the_table_is_dense_and_named_once() {
        for (i, c) in Code::ALL.iter().enumerate() {
            assert_eq!(*c as u32, i as u32, "{c:?}");
            assert_eq!(Code::from_u32(i as u32), Some(*c));
        }
        assert_eq!(Code::from_u32(Code::ALL.len() as u32), None);
        let mut names: Vec<_> = Code::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Code::ALL.len());
    }

    #[test]
    fn errors_map_to_their_codes() {
        let e = PoolError::PayloadTooLarge {
            len: 10,
            capacity: 4,
        };
        let f = Failure::from(e);
        assert_eq!(f.code, Code::PayloadTooLarge);
        assert!(f.message.contains("10 bytes"), "{}", f.message);
        let f = Failure::from(NdpError::BadRequest("k = 0".into()));
        assert_eq!((f.code, f.message.as_str()), (Code::InvalidArg, "k = 0"));
        let f = Failure::from(NdpError::Pool(PoolError::EmptyKeyChain));
        assert_eq!(f.code, Code::InvalidArg);
        let f = Failure::from(NdpError::Stale(3));
        assert_eq!(f.code, Code::Unavailable);
    }
}
