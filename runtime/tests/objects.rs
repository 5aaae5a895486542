//! Multi-block objects through the safe API: round trips at part boundaries and of 64 MiB,
//! replacement, delete, a missing part, eviction as a unit, too-large objects, pins, and
//! put-if-absent across partitions.

use cxlkv_runtime::{check, Key, Pool, PoolConfig, PoolError, PutOutcome, Region};
use std::sync::Arc;
use std::time::Duration;

fn pool(size: u64, block: u64, participants: u32) -> Pool {
    let cfg = PoolConfig {
        block_size: block,
        participants,
        lease: Duration::from_millis(1000),
        ..Default::default()
    };
    Pool::create(Arc::new(Region::anonymous(size).unwrap()), &cfg).unwrap()
}

fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn assert_clean(pool: &Pool) {
    let r = check(pool).unwrap();
    assert!(r.ok(), "pool check: {:?}", r.errors);
}

#[test]
fn sizes_around_part_boundaries_round_trip() {
    const B: usize = 4096;
    let pool = pool(8 << 20, B as u64, 2);
    let a = pool.attach().unwrap();
    let reader = pool.attach().unwrap();
    for (i, len) in [
        1,
        B - 1,
        B,
        B + 1,
        2 * B - 1,
        2 * B,
        2 * B + 1,
        5 * B,
        7 * B + 13,
    ]
    .into_iter()
    .enumerate()
    {
        let k = Key::from_bytes(format!("obj-{len}").as_bytes());
        let v = payload(i as u64 + 7, len);
        a.put(k, &v).unwrap();
        // Through another participant (a plain reader), Vec and caller buffer.
        let (got, info) = reader.get(k).unwrap().unwrap();
        assert_eq!(got, v, "len {len}");
        assert_eq!(info.len, len as u64);
        let mut buf = vec![0u8; len + 5];
        let info = reader.get_into(k, &mut buf).unwrap().unwrap();
        assert_eq!(&buf[..len], &v[..]);
        assert_eq!(info.len, len as u64);
        assert_eq!(pool.length(k).unwrap(), Some(len as u64));
        assert!(pool.contains(k).unwrap());
        // A buffer one byte short says how much is needed.
        let mut short = vec![0u8; len - 1];
        match reader.get_into(k, &mut short) {
            Err(PoolError::BufferTooSmall { needed, .. }) => assert_eq!(needed, len as u64),
            other => panic!("len {len}: expected BufferTooSmall, got {other:?}"),
        }
        // Only payloads over one block are objects.
        assert_eq!(pool.object_manifest(k).unwrap().is_some(), len > B, "{len}");
        if let Some(m) = pool.object_manifest(k).unwrap() {
            assert_eq!(m.parts.len(), len.div_ceil(B));
        }
    }
    assert_clean(&pool);
}

#[test]
fn a_64_mib_object_round_trips() {
    let pool = pool(80 << 20, 256 << 10, 1);
    let a = pool.attach().unwrap();
    let k = Key::from_bytes(b"64MiB");
    let v = payload(64, 64 << 20);
    let loc = a.put(k, &v).unwrap();
    let mut buf = vec![0u8; 64 << 20];
    let info = a.get_into(k, &mut buf).unwrap().unwrap();
    assert_eq!(info.len, 64 << 20);
    assert_eq!(
        (info.location.partition, info.location.block),
        (loc.partition, loc.block)
    );
    assert!(buf == v, "64 MiB object differs");
    assert_eq!(pool.object_manifest(k).unwrap().unwrap().parts.len(), 256);
    assert_clean(&pool);
}

#[test]
fn replacement_delete_and_small_over_large() {
    const B: usize = 4096;
    let pool = pool(8 << 20, B as u64, 1);
    let a = pool.attach().unwrap();
    let k = Key::from_bytes(b"replaced");
    let v1 = payload(1, 3 * B + 5);
    a.put(k, &v1).unwrap();
    let m1 = pool.object_manifest(k).unwrap().unwrap();
    let live = a.live_blocks();
    let v2 = payload(2, 2 * B + 9);
    a.put(k, &v2).unwrap();
    let m2 = pool.object_manifest(k).unwrap().unwrap();
    assert_ne!(m1.head.nonce, m2.head.nonce, "a new put uses a new nonce");
    assert_eq!(a.get(k).unwrap().unwrap().0, v2);
    // The old parts are gone: one part fewer than before.
    for pk in m1.part_keys() {
        assert!(!pool.contains(pk).unwrap(), "old part left behind");
    }
    assert_eq!(a.live_blocks(), live - 1);
    // A small value over an object drops its parts too.
    a.put(k, b"small").unwrap();
    assert_eq!(a.get(k).unwrap().unwrap().0, b"small");
    for pk in m2.part_keys() {
        assert!(
            !pool.contains(pk).unwrap(),
            "parts left behind by a small put"
        );
    }
    assert_eq!(a.live_blocks(), 1);
    // And an object over a small value.
    a.put(k, &v1).unwrap();
    assert_eq!(a.get(k).unwrap().unwrap().0, v1);
    assert_eq!(a.live_blocks(), 5);
    // Delete: the manifest and every part.
    let m3 = pool.object_manifest(k).unwrap().unwrap();
    assert!(a.delete(k).unwrap());
    assert!(a.get(k).unwrap().is_none());
    assert!(!pool.contains(k).unwrap());
    for pk in m3.part_keys() {
        assert!(!pool.contains(pk).unwrap());
    }
    assert_eq!(a.live_blocks(), 0);
    assert!(!a.delete(k).unwrap());
    assert_clean(&pool);
}

#[test]
fn a_missing_part_makes_the_object_a_miss() {
    const B: usize = 4096;
    let pool = pool(8 << 20, B as u64, 1);
    let a = pool.attach().unwrap();
    let k = Key::from_bytes(b"holed");
    a.put(k, &payload(3, 4 * B)).unwrap();
    let m = pool.object_manifest(k).unwrap().unwrap();
    assert!(a.delete(m.part_keys()[2]).unwrap());
    let misses = a.stats().misses;
    assert!(a.get(k).unwrap().is_none());
    assert!(a.get_into(k, &mut vec![0; 4 * B]).unwrap().is_none());
    assert_eq!(a.stats().misses, misses + 2);
    assert_clean(&pool);
    // A new put of the key works.
    let v = payload(4, 3 * B);
    a.put(k, &v).unwrap();
    assert_eq!(a.get(k).unwrap().unwrap().0, v);
}

#[test]
fn objects_are_evicted_as_a_unit_and_never_evict_their_own_parts() {
    const B: usize = 8192;
    let pool = pool(2 << 20, B as u64, 1);
    let a = pool.attach().unwrap();
    let blocks = pool.superblock().blocks_per_partition as usize;
    assert!(
        blocks >= 20 && a.max_object_len() >= ((blocks - 3) * B) as u64,
        "{blocks}"
    );
    // Fill the partition with small blocks, then store an object of all but two blocks: its
    // parts evict small blocks, never each other.
    for i in 0..blocks {
        a.put(Key(i as u128 + 1), &payload(i as u64, 100)).unwrap();
    }
    let big = Key::from_bytes(b"big");
    let v = payload(9, (blocks - 3) * B);
    a.put(big, &v).unwrap();
    assert_eq!(a.live_blocks(), blocks);
    let parts = pool.object_manifest(big).unwrap().unwrap().part_keys();
    // Reading the object keeps it recent as a whole: older small blocks go first.
    for n in 0..2u128 {
        assert_eq!(a.get(big).unwrap().unwrap().0, v, "the object lost a part");
        a.put(Key(1000 + n), b"n").unwrap();
    }
    // LRU order now: 1000, the object, 1001. One put evicts 1000 (`contains` touches nothing)...
    a.put(Key(2000), b"x").unwrap();
    assert!(!pool.contains(Key(1000)).unwrap() && pool.contains(big).unwrap());
    assert!(parts.iter().all(|&pk| pool.contains(pk).unwrap()));
    // ...and the next all of the object at once.
    a.put(Key(2001), b"y").unwrap();
    assert!(
        a.get(big).unwrap().is_none(),
        "the object should be evicted"
    );
    assert!(parts.iter().all(|&pk| !pool.contains(pk).unwrap()));
    assert_eq!(a.live_blocks(), 3, "every part left with the manifest");
    assert_clean(&pool);
}

#[test]
fn too_large_objects_and_pins_are_clear_errors() {
    const B: usize = 4096;
    let pool = pool(2 << 20, B as u64, 1);
    let a = pool.attach().unwrap();
    let max = a.max_object_len();
    let blocks = u64::from(pool.superblock().blocks_per_partition);
    // Bounded by the partition (one block for the manifest) and by the part table of one
    // manifest block ((4096 - 64) / 32 = 126 parts).
    assert_eq!(max, (blocks - 1).min(126) * B as u64);
    let k = Key::from_bytes(b"huge");
    a.put(Key::from_bytes(b"bystander"), b"stays").unwrap();
    match a.put(k, &vec![1u8; max as usize + 1]) {
        Err(e @ PoolError::PayloadTooLarge { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("{}", max + 1)) && msg.contains(&max.to_string()),
                "{msg}"
            );
        }
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    // Nothing was written.
    assert_eq!(a.live_blocks(), 1);
    assert_eq!(
        a.get(Key::from_bytes(b"bystander")).unwrap().unwrap().0,
        b"stays"
    );
    // Exactly the maximum fits.
    let v = payload(5, max as usize);
    a.put(k, &v).unwrap();
    assert_eq!(a.get(k).unwrap().unwrap().0, v);
    // Pinning an object is refused with its length; a block still pins.
    match a.pin(k) {
        Err(PoolError::PayloadTooLarge { len, capacity }) => {
            assert_eq!((len, capacity), (max, B as u64))
        }
        other => panic!(
            "expected PayloadTooLarge, got {:?}",
            other.map(|p| p.is_some())
        ),
    }
    assert_clean(&pool);
}

#[test]
fn put_if_absent_across_partitions() {
    const B: usize = 4096;
    let pool = pool(8 << 20, B as u64, 2);
    let a = pool.attach().unwrap();
    let b = pool.attach().unwrap();
    assert_ne!(a.partition(), b.partition());
    let k = Key::from_bytes(b"shared-prefix");
    let out = a.put_if_absent(k, b"from a").unwrap();
    let PutOutcome::Stored(loc) = out else {
        panic!("{out:?}")
    };
    assert_eq!(Some(loc.partition), a.partition());
    // b finds it in a's partition and writes nothing.
    let puts = b.stats().puts;
    match b.put_if_absent(k, b"from b").unwrap() {
        PutOutcome::Present(l) => assert_eq!(l.partition, loc.partition),
        other => panic!("{other:?}"),
    }
    assert_eq!(b.stats().puts, puts);
    assert_eq!(b.live_blocks(), 0);
    assert_eq!(b.get(k).unwrap().unwrap().0, b"from a");
    // Objects too.
    let big = Key::from_bytes(b"big shared");
    let v = payload(8, 3 * B);
    assert!(b.put_if_absent(big, &v).unwrap().stored());
    assert!(!a.put_if_absent(big, &payload(9, 3 * B)).unwrap().stored());
    assert_eq!(a.get(big).unwrap().unwrap().0, v);
    assert_eq!(
        a.contains_batch(&[k, big, Key::from_bytes(b"nope")])
            .unwrap(),
        vec![true, true, false]
    );
    assert_clean(&pool);
}

#[test]
fn a_takeover_keeps_objects_whole_and_evicts_them_as_a_unit() {
    const B: usize = 4096;
    let path = std::env::temp_dir().join(format!("cxlkv-objects-{}", std::process::id()));
    let backend = cxlkv_runtime::Backend::File(path.clone());
    let cfg = PoolConfig {
        block_size: B as u64,
        participants: 1,
        lease: Duration::from_millis(1000),
        ..Default::default()
    };
    let opts = cxlkv_runtime::RegionOptions::default();
    let k = Key::from_bytes(b"survivor");
    let v = payload(11, 6 * B + 1);
    {
        let pool = Pool::create_on(&backend, 2 << 20, &cfg, &opts).unwrap();
        let a = pool.attach().unwrap();
        a.put(k, &v).unwrap();
        a.put(Key::from_bytes(b"small"), b"s").unwrap();
    }
    let pool = Pool::open_on(&backend, &opts).unwrap();
    let a = pool.attach().unwrap();
    assert_eq!(a.get(k).unwrap().unwrap().0, v);
    // The rebuilt owner state knows the object: deleting it drops every part.
    assert!(a.delete(k).unwrap());
    assert_eq!(a.live_blocks(), 1);
    drop(a);
    std::fs::remove_file(&path).unwrap();
}
