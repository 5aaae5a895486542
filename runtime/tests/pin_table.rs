//! The configurable pin table (format 3.1): a pool created with N pins per participant holds N
//! pins in one participant and refuses the next with an error that names the table and the
//! option; a format 3.0 pool (superblock field 0) still opens with the 64 pins of its 4 KiB slots;
//! the per-participant byte counters of the second counter line.

use cxlkv_runtime::format::{Superblock, DEFAULT_PINS, MAX_PINS, PAGE, SUPERBLOCK_SIZE};
use cxlkv_runtime::hotness::{read_hotlist, Hotness};
use cxlkv_runtime::mem::{read_obj, write_obj};
use cxlkv_runtime::{
    check, pool_stats, Key, Participant, Pool, PoolConfig, PoolError, Region, SharedMemory,
};
use std::sync::Arc;

fn config(pins: u32, participants: u32) -> PoolConfig {
    PoolConfig {
        block_size: 4096,
        participants,
        pins_per_participant: pins,
        ..Default::default()
    }
}

fn pins_of(p: &Participant, k: Key, n: u32) -> Vec<cxlkv_runtime::participant::PinnedBlock<'_>> {
    (0..n)
        .map(|i| {
            p.pin(k)
                .unwrap_or_else(|e| panic!("pin {i} of {n}: {e}"))
                .expect("key present")
        })
        .collect()
}

#[test]
fn a_pool_of_200_pins_holds_200_and_refuses_the_201st() {
    let mem: Arc<dyn SharedMemory> = Arc::new(Region::anonymous(8 << 20).unwrap());
    let pool = Pool::create(mem.clone(), &config(200, 3)).unwrap();
    assert_eq!(pool.superblock().pins(), 200);
    assert_eq!(pool.superblock().pins_per_participant, 200);
    let layout = *pool.slot_layout();
    assert_eq!(layout.pins, 200);
    assert!(layout.size > PAGE && layout.size.is_multiple_of(PAGE));
    // The table of three grown slots lies between the superblock and the device area.
    assert_eq!(
        pool.superblock().device_area_off,
        SUPERBLOCK_SIZE + 3 * layout.size
    );

    let w = pool.attach().unwrap();
    let r = pool.attach().unwrap();
    let k = Key::from_bytes(b"pinned");
    w.put(k, &[5u8; 1000]).unwrap();
    let held = pins_of(&r, k, 200);
    let err = r.pin(k).err().expect("the 201st pin is refused");
    assert!(matches!(err, PoolError::PinTableFull(200)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("200") && msg.contains("--pins"), "{msg}");
    assert_eq!(r.stats().pin_full, 1);
    assert_eq!(r.stats().pins, 200);
    // A second participant's table is its own (its slot does not overlap the first's).
    let other = pins_of(&w, k, 200);
    // The checker reads every pin entry of the grown slots and finds them sound.
    let report = check(&pool).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    drop(held);
    assert!(r.pin(k).unwrap().is_some());
    drop(other);

    // The hotlist after the grown pin table round-trips, and a second handle opened on the same
    // memory sees the same layout.
    let h = Hotness::default();
    h.record(k, cxlkv_runtime::hotness::Access::Get);
    h.publish(&r).unwrap();
    let again = Pool::open(mem).unwrap();
    assert_eq!(*again.slot_layout(), layout);
    let (_, list) = read_hotlist(&again, r.id()).unwrap().expect("hotlist");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].key, k);
}

#[test]
fn pin_table_bounds_are_checked() {
    let mem: Arc<dyn SharedMemory> = Arc::new(Region::anonymous(8 << 20).unwrap());
    let err = Pool::create(mem.clone(), &config(MAX_PINS + 1, 2)).unwrap_err();
    assert!(matches!(err, PoolError::BadConfig(_)), "{err}");
    assert!(err.to_string().contains(&MAX_PINS.to_string()), "{err}");
    // The default (0) is written as the number it means.
    let pool = Pool::create(mem, &config(0, 2)).unwrap();
    assert_eq!(pool.superblock().pins_per_participant, DEFAULT_PINS);
    assert_eq!(pool.slot_layout().size, PAGE);
}

/// Rewrites the pool's superblock as format 3.0 wrote it: minor 0, no pin-table field.
fn as_format_3_0(mem: &dyn SharedMemory) -> Superblock {
    let mut sb: Superblock = read_obj(mem, 0).unwrap();
    sb.version_minor = 0;
    sb.pins_per_participant = 0;
    sb.crc = sb.compute_crc();
    write_obj(mem, 0, &sb).unwrap();
    sb
}

#[test]
fn a_format_3_0_pool_opens_with_64_pins() {
    let mem: Arc<dyn SharedMemory> = Arc::new(Region::anonymous(8 << 20).unwrap());
    let k = Key::from_bytes(b"old");
    {
        let pool = Pool::create(mem.clone(), &config(0, 2)).unwrap();
        let w = pool.attach().unwrap();
        w.put(k, b"written by a 3.0 pool").unwrap();
        // Its slot layout is 3.0's: 4 KiB slots right after the superblock.
        assert_eq!(
            pool.superblock().device_area_off,
            SUPERBLOCK_SIZE + 2 * PAGE
        );
    }
    let sb = as_format_3_0(&*mem);
    assert_eq!((sb.version_major, sb.version_minor), (3, 0));
    let pool = Pool::open(mem).unwrap();
    assert_eq!(pool.superblock().pins(), DEFAULT_PINS);
    assert_eq!(pool.slot_layout().size, PAGE);
    let r = pool.attach().unwrap();
    assert_eq!(
        r.get(k).unwrap().expect("stored block").0,
        b"written by a 3.0 pool"
    );
    let held = pins_of(&r, k, DEFAULT_PINS);
    assert!(matches!(r.pin(k), Err(PoolError::PinTableFull(64))));
    drop(held);
    let report = check(&pool).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

#[test]
fn byte_counters_move_by_the_payload_bytes() {
    let mem: Arc<dyn SharedMemory> = Arc::new(Region::anonymous(8 << 20).unwrap());
    let pool = Pool::create(mem.clone(), &config(0, 2)).unwrap();
    let w = pool.attach().unwrap();
    let (a, b) = (Key::from_bytes(b"a"), Key::from_bytes(b"b"));
    w.put(a, &[1u8; 1000]).unwrap();
    w.put(b, &[2u8; 333]).unwrap();
    assert_eq!(w.get(a).unwrap().unwrap().0.len(), 1000);
    let mut buf = [0u8; 4096];
    assert!(w.get_into(b, &mut buf).unwrap().is_some());
    assert!(w.get(Key::from_bytes(b"absent")).unwrap().is_none());
    let s = w.stats();
    assert_eq!((s.bytes_in, s.bytes_out, s.misses), (1333, 1333, 1));
    // Read from shared memory by a second handle, as `cxlkv pool stat` does.
    let other = Pool::open(mem).unwrap();
    let st = pool_stats(&other).unwrap();
    let me = st.participants.iter().find(|p| p.id == w.id()).unwrap();
    assert_eq!(me.counters, s);
    assert_eq!(me.counters.bytes_in, 1333);
    assert_eq!(me.counters.bytes_out, 1333);
}
