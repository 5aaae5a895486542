//! Capacity a user can use (issue #24): one participant fills most of a pool of 8 partitions,
//! claiming further partitions as the ones it holds fill (before evicting its own blocks), stores
//! an object larger than a partition across them, and gives partitions back as it deletes, which
//! other participants then get. `tests/stress.rs` and `tests/pause.rs` (root crate) kill and stop
//! a holder of several partitions.

use cxlkv_runtime::region::Region;
use cxlkv_runtime::{check, Key, Pool, PoolConfig};
use std::sync::Arc;

const BLOCK: u64 = 4 << 20;

fn key(i: u64) -> Key {
    Key::from_bytes(&[b"capacity".as_slice(), &i.to_le_bytes()].concat())
}

fn payload(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn pool(size: u64) -> Pool {
    let mem = Region::anonymous(size).unwrap();
    let cfg = PoolConfig {
        block_size: BLOCK,
        participants: 16,
        partitions: Some(8),
        ..PoolConfig::default()
    };
    Pool::create(Arc::new(mem), &cfg).unwrap()
}

/// Every live index entry of the pool: (partition, key).
fn live_entries(pool: &Pool) -> Vec<(u32, Key)> {
    let sb = pool.superblock();
    let mut v = Vec::new();
    for p in 0..sb.partitions {
        for s in 0..sb.index_slots {
            if let Some((_, k, entry)) = pool.read_slot(p, s).unwrap() {
                if entry != 0 && entry != u64::MAX {
                    v.push((p, k));
                }
            }
        }
    }
    v
}

#[test]
fn one_participant_fills_most_of_the_pool_and_gives_partitions_back() {
    let pool = pool(1 << 30);
    let sb = *pool.superblock();
    let total = u64::from(sb.partitions) * u64::from(sb.blocks_per_partition);
    let filler = pool.attach().unwrap();

    // An object of 300 MB: more blocks than one partition holds, so it spans several.
    let big_len = 300_000_000usize;
    assert!(big_len as u64 / BLOCK > u64::from(sb.blocks_per_partition));
    let big = payload(u64::MAX, big_len);
    let big_key = Key::from_bytes(b"the 300 MB object");
    filler.put(big_key, &big).unwrap();
    assert!(filler.partitions().len() >= 3, "{:?}", filler.partitions());
    assert_eq!(pool.get(big_key).unwrap().unwrap().0, big);

    // Then single blocks until 90 % of every block in the pool is live, with no eviction.
    let used = big_len as u64 / BLOCK + 2;
    let want = (total * 9).div_ceil(10) - used;
    let small = |i: u64| payload(i, (BLOCK as usize) / 2 + i as usize);
    for i in 0..want {
        filler.put(key(i), &small(i)).unwrap();
    }
    assert_eq!(filler.stats().evictions, 0, "claimed before evicting");
    let held = filler.partitions();
    assert_eq!(held.len(), sb.partitions as usize, "{held:?}");
    let mut sorted = held.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), held.len(), "a partition held twice: {held:?}");
    assert_eq!(filler.extra_slots().len(), held.len() - 1);
    let live = live_entries(&pool).len() as u64;
    assert!(live * 10 >= total * 9, "{live} of {total} blocks live");

    // Every partition is held: another participant attaches without one.
    let other = pool.attach().unwrap();
    assert_eq!(other.partition(), None);
    drop(other);

    // Replacing a key held in another partition leaves one copy, the new one.
    filler.put(key(0), b"replaced").unwrap();
    assert_eq!(pool.get(key(0)).unwrap().unwrap().0, b"replaced");
    let copies = live_entries(&pool)
        .iter()
        .filter(|(_, k)| *k == key(0))
        .count();
    assert_eq!(copies, 1);

    // Every committed block reads back; the pool checks clean.
    assert_eq!(pool.get(big_key).unwrap().unwrap().0, big);
    for i in 1..want {
        assert_eq!(pool.get(key(i)).unwrap().unwrap().0, small(i), "key {i}");
    }
    let report = check(&pool).unwrap();
    assert!(report.ok(), "{report}");

    // Deleting gives the emptied further partitions back; others then get them.
    assert!(filler.delete(big_key).unwrap());
    for i in 0..want {
        assert!(filler.delete(key(i)).unwrap(), "key {i}");
    }
    assert_eq!(pool.get(big_key).unwrap(), None);
    assert_eq!(filler.partitions().len(), 1, "{:?}", filler.partitions());
    let mut others = Vec::new();
    for _ in 1..sb.partitions {
        let p = pool.attach().unwrap();
        assert!(
            p.partition().is_some(),
            "a given-back partition is claimable"
        );
        others.push(p);
    }
    let report = check(&pool).unwrap();
    assert!(report.ok(), "{report}");
}

#[test]
fn a_detach_gives_every_partition_back_and_keeps_the_blocks() {
    let pool = pool(256 << 20);
    let sb = *pool.superblock();
    let per = u64::from(sb.blocks_per_partition);
    let filler = pool.attach().unwrap();
    for i in 0..3 * per {
        filler.put(key(i), &payload(i, 4096)).unwrap();
    }
    let held = filler.partitions();
    assert!(held.len() >= 3, "{held:?}");
    drop(filler);
    for i in 0..3 * per {
        assert_eq!(pool.get(key(i)).unwrap().unwrap().0, payload(i, 4096));
    }
    // Each held partition was handed back: new participants adopt them with their blocks.
    let mut adopted = 0;
    let mut parts = Vec::new();
    for _ in 0..sb.partitions {
        let p = pool.attach().unwrap();
        assert_eq!(p.recovery.took_over_from, None, "handed back, not orphaned");
        adopted += p.recovery.blocks;
        parts.push(p);
    }
    assert_eq!(adopted, 3 * per);
}
