//! The plain-data codec beside `SharedMemory`: a `Plain` value written with `write_obj` reads back
//! with `read_obj`, its bytes are exactly `as_bytes` (and decode with `from_bytes`), and an access
//! past the end is an `OutOfBounds` error that carries its values.

use cxlkv_shm::mem::{as_bytes, from_bytes, read_obj, write_obj, MemError, Plain};
use cxlkv_shm::{Backend, Region, RegionOptions, SharedMemory};

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct Pair {
    a: u64,
    b: u32,
    c: u32,
}
// SAFETY: repr(C), a u64 then two u32: 16 bytes, no padding, every bit pattern valid.
unsafe impl Plain for Pair {}

#[test]
fn objects_round_trip_through_shared_memory_and_bytes() {
    assert_eq!(std::mem::size_of::<Pair>(), 16);
    let r = Region::create(&Backend::Anonymous, 4096, &RegionOptions::default()).unwrap();
    let v = Pair {
        a: 1 << 40,
        b: 7,
        c: u32::MAX,
    };
    write_obj(&r, 100, &v).unwrap();
    assert_eq!(read_obj::<Pair>(&r, 100).unwrap(), v);
    let mut raw = [0u8; 16];
    r.read(100, &mut raw).unwrap();
    assert_eq!(raw, as_bytes(&v));
    assert_eq!(from_bytes::<Pair>(&raw), v);
    assert_eq!(
        write_obj(&r, 4090, &v),
        Err(MemError::OutOfBounds {
            offset: 4090,
            len: 16,
            size: 4096
        })
    );
    assert!(read_obj::<Pair>(&r, 4090).is_err());
}
