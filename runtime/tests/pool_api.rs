//! The pool's safe API on anonymous memory: puts, gets, replacement, eviction, pins, deletes,
//! prefix lookups, takeover of a dead participant, and typed errors for misuse.

use cxlkv_runtime::clock::{system_monotonic_ns, system_now_ns, Clock};
use cxlkv_runtime::participant::{participant_dead, participant_liveness};
use cxlkv_runtime::watch::Liveness;
use cxlkv_runtime::{
    AttachOptions, Key, KeyChain, Participant, Pool, PoolConfig, PoolError, Region,
};
use std::sync::Arc;
use std::time::Duration;

fn pool(size: u64, block: u64, participants: u32, lease_ms: u64) -> Pool {
    let cfg = PoolConfig {
        block_size: block,
        participants,
        lease: Duration::from_millis(lease_ms),
        ..Default::default()
    };
    Pool::create(Arc::new(Region::anonymous(size).unwrap()), &cfg).unwrap()
}

fn payload(key: Key, len: usize) -> Vec<u8> {
    let mut x = key.lo() | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn put_get_replace_delete() {
    let pool = pool(8 << 20, 4096, 2, 1000);
    let a = pool.attach().unwrap();
    let b = pool.attach().unwrap();
    let k = Key::from_bytes(b"k1");
    a.put(k, b"hello").unwrap();
    assert_eq!(b.get(k).unwrap().unwrap().0, b"hello");
    a.put(k, b"world!").unwrap();
    let (v, info) = b.get(k).unwrap().unwrap();
    assert_eq!(v, b"world!");
    assert_eq!(info.len, 6);
    assert!(matches!(b.delete(k), Err(PoolError::NotOwner { .. })));
    assert!(a.delete(k).unwrap());
    assert!(b.get(k).unwrap().is_none());
    assert!(!a.delete(k).unwrap());
    assert_eq!(a.live_blocks(), 0);
}

#[test]
fn get_into_reports_needed_size() {
    let pool = pool(8 << 20, 4096, 1, 1000);
    let a = pool.attach().unwrap();
    let k = Key::from_bytes(b"x");
    a.put(k, &[7u8; 3000]).unwrap();
    let mut small = [0u8; 100];
    match a.get_into(k, &mut small) {
        Err(PoolError::BufferTooSmall { needed, capacity }) => {
            assert_eq!((needed, capacity), (3000, 100))
        }
        other => panic!("expected BufferTooSmall, got {other:?}"),
    }
    let mut big = [0u8; 4096];
    assert_eq!(a.get_into(k, &mut big).unwrap().unwrap().len, 3000);
    assert!(big[..3000].iter().all(|&b| b == 7));
}

#[test]
fn full_partition_evicts_lru_but_never_pinned() {
    let pool = pool(4 << 20, 4096, 1, 1000);
    let a = pool.attach().unwrap();
    let cap = pool.superblock().blocks_per_partition as usize;
    let keys: Vec<Key> = (0..cap as u64)
        .map(|i| Key::from_bytes(&i.to_le_bytes()))
        .collect();
    for &k in &keys {
        a.put(k, &payload(k, 100)).unwrap();
    }
    // Touch key 0 so key 1 is the LRU; pin key 1 so key 2 must go instead.
    assert!(a.get(keys[0]).unwrap().is_some());
    let pinned = a.pin(keys[1]).unwrap().unwrap();
    let extra = Key::from_bytes(b"extra");
    a.put(extra, &payload(extra, 100)).unwrap();
    assert!(a.get(keys[0]).unwrap().is_some(), "recently used survives");
    assert!(a.get(keys[1]).unwrap().is_some(), "pinned survives");
    assert!(
        a.get(keys[2]).unwrap().is_none(),
        "LRU unpinned block evicted"
    );
    let mut buf = vec![0u8; 100];
    pinned.read(0, &mut buf).unwrap();
    assert_eq!(buf, payload(keys[1], 100));
    assert_eq!(a.stats().evictions, 1);
}

#[test]
fn pinned_block_survives_delete_until_unpinned() {
    let pool = pool(4 << 20, 4096, 1, 1000);
    let a = pool.attach().unwrap();
    let k = Key::from_bytes(b"pinned");
    a.put(k, &payload(k, 500)).unwrap();
    let pin = a.pin(k).unwrap().unwrap();
    assert!(a.delete(k).unwrap());
    // Fill the partition: the pinned block must not be reused.
    let cap = pool.superblock().blocks_per_partition as u64;
    for i in 0..cap * 2 {
        let key = Key::from_bytes(&i.to_le_bytes());
        a.put(key, &payload(key, 500)).unwrap();
    }
    let mut buf = vec![0u8; 500];
    pin.read(0, &mut buf).unwrap();
    assert_eq!(buf, payload(k, 500), "pinned bytes unchanged");
    drop(pin);
}

#[test]
fn lookup_prefix_counts_leading_keys() {
    let pool = pool(8 << 20, 4096, 2, 1000);
    let a = pool.attach().unwrap();
    let tokens: Vec<u32> = (0..64).collect();
    let chain = KeyChain::new("ns", "model", 0, 29).keys(&tokens, 16);
    for &k in &chain[..3] {
        a.put(k, b"kv").unwrap();
    }
    assert_eq!(pool.lookup_prefix(&chain).unwrap(), 3);
    assert_eq!(pool.lookup_prefix(&chain[..2]).unwrap(), 2);
    assert!(matches!(
        pool.lookup_prefix(&[]),
        Err(PoolError::EmptyKeyChain)
    ));
}

#[test]
fn misuse_returns_typed_errors() {
    let pool = pool(4 << 20, 4096, 1, 1000);
    let a = pool.attach().unwrap();
    let k = Key::from_bytes(b"big");
    // Over one block is an object (runtime/tests/objects.rs); over what a partition holds is not.
    let max = a.max_object_len();
    assert!(matches!(
        a.put(k, &vec![0u8; max as usize + 1]),
        Err(PoolError::PayloadTooLarge { len, capacity }) if len == max + 1 && capacity == max
    ));
    assert!(matches!(
        pool.attach(),
        Err(PoolError::NoFreeParticipant(1))
    ));
    let cfg = PoolConfig {
        block_size: 1000,
        ..Default::default()
    };
    assert!(matches!(
        Pool::create(Arc::new(Region::anonymous(1 << 20).unwrap()), &cfg),
        Err(PoolError::BadConfig(_))
    ));
    let reader = pool.clone();
    drop(a);
    let r = Participant::attach(
        &reader,
        AttachOptions {
            own_partition: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(r.put(k, b"x"), Err(PoolError::NoPartition { .. })));
}

#[test]
fn reserve_commit_and_abandon() {
    let pool = pool(4 << 20, 8192, 1, 1000);
    let a = pool.attach().unwrap();
    let k = Key::from_bytes(b"res");
    let mut r = a.reserve(k, 6000, cxlkv_runtime::Codec::Raw).unwrap();
    r.write(0, &[1u8; 3000]).unwrap();
    r.write(3000, &[2u8; 3000]).unwrap();
    assert!(
        r.write(5999, &[0u8; 2]).is_err(),
        "write past the reservation"
    );
    assert!(a.get(k).unwrap().is_none(), "not visible before commit");
    r.commit().unwrap();
    let (v, _) = a.get(k).unwrap().unwrap();
    assert_eq!(&v[..3000], &[1u8; 3000][..]);
    assert_eq!(&v[3000..], &[2u8; 3000][..]);
    let before = a.live_blocks();
    drop(
        a.reserve(Key::from_bytes(b"abandoned"), 10, cxlkv_runtime::Codec::Raw)
            .unwrap(),
    );
    assert_eq!(a.live_blocks(), before);
}

#[test]
fn a_prefix_commit_publishes_its_bytes_only_and_only_with_their_crc() {
    let pool = pool(4 << 20, 8192, 1, 1000);
    let a = pool.attach().unwrap();
    let body = [5u8; 100];
    let crc = cxlkv_runtime::format::crc32c(&body);
    // A payload and a 16-byte trailer read in one piece: the block is the payload alone.
    let k = Key::from_bytes(b"prefix");
    let mut r = a.reserve(k, 116, cxlkv_runtime::Codec::Raw).unwrap();
    r.write(0, &body).unwrap();
    r.write(100, &[9u8; 16]).unwrap();
    r.commit_prefix(100, Some(crc)).unwrap();
    assert_eq!(a.get(k).unwrap().unwrap().0, body.to_vec());
    // A wrong checksum publishes nothing and frees the block.
    let before = a.live_blocks();
    let bad = Key::from_bytes(b"bad");
    let mut r = a.reserve(bad, 100, cxlkv_runtime::Codec::Raw).unwrap();
    r.write(0, &body).unwrap();
    let e = r.commit_prefix(100, Some(crc ^ 1)).unwrap_err();
    assert!(
        matches!(e, PoolError::PayloadCrc(x, y) if x == crc ^ 1 && y == crc),
        "{e}"
    );
    assert!(a.get(bad).unwrap().is_none());
    assert_eq!(a.live_blocks(), before);
    // Longer than reserved: refused.
    let r = a.reserve(bad, 10, cxlkv_runtime::Codec::Raw).unwrap();
    assert!(matches!(
        r.commit_prefix(11, None),
        Err(PoolError::PayloadTooLarge {
            len: 11,
            capacity: 10
        })
    ));
    assert!(a.get(bad).unwrap().is_none());
}

#[test]
fn dead_participant_is_taken_over_and_its_blocks_stay() {
    let pool = pool(8 << 20, 4096, 2, 20);
    let no_hb = AttachOptions {
        heartbeat: false,
        ..Default::default()
    };
    let a = Participant::attach(&pool, no_hb.clone()).unwrap();
    let b = pool.attach().unwrap();
    let keys: Vec<Key> = (0..10u64)
        .map(|i| Key::from_bytes(&i.to_le_bytes()))
        .collect();
    for &k in &keys {
        a.put(k, &payload(k, 1000)).unwrap();
    }
    let pa = a.partition().unwrap();
    let ida = a.id();
    std::mem::forget(a); // dies without detaching
                         // Dead once this handle watched its heartbeat stand still for the lease (20 ms): the first
                         // look starts the watch, and never finds it dead.
    assert!(!participant_dead(&pool, ida).unwrap());
    std::thread::sleep(Duration::from_millis(60));
    let c = pool.attach().unwrap();
    assert_eq!(
        c.partition(),
        Some(pa),
        "takes over the dead participant's partition"
    );
    assert_eq!(c.recovery.blocks, 10);
    for &k in &keys {
        assert_eq!(b.get(k).unwrap().unwrap().0, payload(k, 1000));
    }
    // The new owner can replace and delete them.
    assert!(c.delete(keys[0]).unwrap());
    c.put(keys[1], b"new").unwrap();
    assert_eq!(b.get(keys[1]).unwrap().unwrap().0, b"new");
}

/// A host whose wall clock is `offset_ns` off (either way) of this one's; its monotonic clock is
/// the host's own.
struct SkewedClock {
    offset_ns: i64,
}

impl Clock for SkewedClock {
    fn now_ns(&self) -> u64 {
        system_now_ns().saturating_add_signed(self.offset_ns)
    }
    fn monotonic_ns(&self) -> u64 {
        system_monotonic_ns()
    }
}

#[test]
fn liveness_needs_no_shared_wall_clock() {
    let region = Arc::new(Region::anonymous(8 << 20).unwrap());
    let cfg = PoolConfig {
        block_size: 4096,
        participants: 3,
        lease: Duration::from_millis(40),
        ..Default::default()
    };
    Pool::create(region.clone(), &cfg).unwrap();
    // Two "hosts" an hour apart on their wall clocks, either way of this one.
    let open = |offset_ns| {
        Pool::open_with_clock(region.clone(), Arc::new(SkewedClock { offset_ns })).unwrap()
    };
    let (ahead, behind) = (open(3_600_000_000_000), open(-3_600_000_000_000));
    let live = ahead.attach().unwrap(); // beats every 5 ms
    let hung = Participant::attach(
        &ahead,
        AttachOptions {
            heartbeat: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        participant_liveness(&behind, live.id()).unwrap().liveness,
        Liveness::Unknown,
        "a first look tells nothing"
    );
    participant_liveness(&behind, hung.id()).unwrap();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(120) {
        assert!(
            !participant_dead(&behind, live.id()).unwrap(),
            "a beating holder looked dead"
        );
        std::thread::sleep(Duration::from_millis(3));
    }
    assert_eq!(
        participant_liveness(&behind, live.id()).unwrap().liveness,
        Liveness::Live
    );
    let v = participant_liveness(&behind, hung.id()).unwrap();
    assert_eq!(v.liveness, Liveness::Dead, "{v:?}");
    assert!(v.still_ns > 40_000_000, "{v:?}");
    // The observer behind takes the hung holder's slot and partition over.
    let p = hung.partition();
    std::mem::forget(hung);
    let heir = behind.attach().unwrap();
    assert_eq!(heir.partition(), p);
    assert!(heir.recovery.took_over_from.is_some());
}

/// A host clock that moves only when the test says so.
#[derive(Default)]
struct ManualClock(std::sync::atomic::AtomicU64);

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        system_now_ns()
    }
    fn monotonic_ns(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl ManualClock {
    fn advance(&self, ns: u64) {
        self.0.fetch_add(ns, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_holder_fences_itself_before_an_observer_may_declare_it_dead() {
    let region = Arc::new(Region::anonymous(8 << 20).unwrap());
    let lease = 1_000_000_000u64;
    let cfg = PoolConfig {
        block_size: 4096,
        participants: 2,
        lease: Duration::from_nanos(lease),
        coherence: cxlkv_runtime::CoherenceMode::Software,
        ..Default::default()
    };
    Pool::create(region.clone(), &cfg).unwrap();
    let (hc, oc) = (
        Arc::new(ManualClock::default()),
        Arc::new(ManualClock::default()),
    );
    let holder_pool = Pool::open_with_clock(region.clone(), hc.clone()).unwrap();
    let observer = Pool::open_with_clock(region, oc.clone()).unwrap();
    let holder = Participant::attach_slot(
        &holder_pool,
        0,
        AttachOptions {
            heartbeat: false,
            ..Default::default()
        },
    )
    .unwrap();
    let k = Key::from_bytes(b"k");
    holder.put(k, b"v").unwrap();
    assert_eq!(
        participant_liveness(&observer, 0).unwrap().liveness,
        Liveness::Unknown
    );
    // Three quarters of a lease after its last beat the holder stops writing; the observer, whose
    // watch started after that beat, cannot declare it dead before a full lease of its own.
    hc.advance(lease / 4 * 3);
    oc.advance(lease / 4 * 3);
    holder.put(k, b"v2").unwrap();
    hc.advance(1);
    oc.advance(1);
    assert!(matches!(
        holder.put(k, b"v3"),
        Err(PoolError::Fenced { .. })
    ));
    assert!(holder.presumed_dead());
    assert!(!participant_dead(&observer, 0).unwrap());
    oc.advance(lease / 4);
    assert_eq!(
        participant_liveness(&observer, 0).unwrap().liveness,
        Liveness::Dead
    );
    let heir = Participant::attach_slot(
        &observer,
        0,
        AttachOptions {
            heartbeat: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(heir.recovery.took_over_from, Some(0));
    assert_eq!(heir.partition(), Some(0));
    assert_eq!(observer.get(k).unwrap().unwrap().0, b"v2");
    drop(holder); // a fenced zombie's detach writes nothing
    heir.put(k, b"v4").unwrap();
    assert_eq!(observer.get(k).unwrap().unwrap().0, b"v4");
}

#[test]
fn open_sees_what_create_wrote() {
    let region = Arc::new(Region::anonymous(8 << 20).unwrap());
    let pool = Pool::create(
        region.clone(),
        &PoolConfig {
            block_size: 4096,
            participants: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let a = pool.attach().unwrap();
    a.put(Key(5), b"persisted").unwrap();
    drop(a);
    let again = Pool::open(region).unwrap();
    assert_eq!(again.get(Key(5)).unwrap().unwrap().0, b"persisted");
    let b = again.attach().unwrap();
    assert_eq!(
        b.recovery.blocks, 1,
        "a new owner adopts a released partition"
    );
}

#[test]
fn eviction_churn_leaves_no_tombstones_and_every_key_findable() {
    let pool = pool(4 << 20, 4096, 1, 1000);
    let a = pool.attach().unwrap();
    let cap = pool.superblock().blocks_per_partition as u64;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..cap * 20 {
        let key = Key::from_bytes(&i.to_le_bytes());
        a.put(key, &payload(key, 64)).unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if rng.is_multiple_of(5) {
            // Deletes mixed in: holes anywhere in the clusters.
            let victim = Key::from_bytes(&(rng % (i + 1)).to_le_bytes());
            let _ = a.delete(victim).unwrap();
        }
    }
    let st = cxlkv_runtime::pool_stats(&pool).unwrap();
    assert_eq!(
        st.partitions[0].tombstones, 0,
        "backward-shift deletion leaves no tombstones"
    );
    let live = st.partitions[0].blocks;
    assert_eq!(live as usize, a.live_blocks());
    // Every indexed key is findable (the checker verifies reachability from its home slot).
    let report = cxlkv_runtime::check(&pool).unwrap();
    assert!(report.ok(), "{report}");
    assert_eq!(report.blocks_checked, live);
}
