//! Tiers: the epoch-reclaimed DRAM cache under concurrent stress, SSD spill files (io_uring, LZ4,
//! crash recovery), and randomized properties of the whole DRAM ↔ pool ↔ SSD stack, including
//! crashes of the tiering thread.

use cxlkv_runtime::policy::PolicyKind;
use cxlkv_runtime::tier::spill::{SpillFile, SpillOptions};
use cxlkv_runtime::tier::{DramCache, FaultPoint, Tier, TierConfig, Tiers};
use cxlkv_runtime::{Key, Pool, PoolConfig, Region};
use std::collections::HashMap;
use std::sync::Arc;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Bytes that identify their key and version: any mix-up or torn copy shows.
fn payload(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version ^ 1);
    let mut v: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
    // Half of the blocks are compressible (runs), half are not.
    if key.is_multiple_of(2) {
        for (i, b) in v.iter_mut().enumerate() {
            if i % 64 >= 8 {
                *b = 0;
            }
        }
    }
    v
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cxlkv-tiers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn dram_cache_stress_readers_never_see_freed_or_foreign_bytes() {
    let cache = Arc::new(DramCache::new(64));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let c = cache.clone();
            std::thread::spawn(move || {
                let mut r = Rng(t + 7);
                let mut out = Vec::new();
                let mut hits = 0u64;
                for _ in 0..40_000 {
                    let k = r.below(256);
                    match r.below(10) {
                        0..=3 => {
                            let len = 16 + (k as usize % 7) * 100;
                            c.insert(Key(u128::from(k)), &payload(k, 0, len));
                        }
                        4 => {
                            c.remove(Key(u128::from(k)));
                        }
                        _ => {
                            if c.get(Key(u128::from(k)), &mut out) {
                                hits += 1;
                                let len = 16 + (k as usize % 7) * 100;
                                assert_eq!(out, payload(k, 0, len), "key {k}");
                            }
                        }
                    }
                }
                hits
            })
        })
        .collect();
    let hits: u64 = threads.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(hits > 1000, "the stress must exercise hits ({hits})");
    assert!(cache.len() <= cache.capacity());
}

#[test]
fn spill_round_trip_compression_and_crash_recovery() {
    let dir = tempdir("spill");
    let path = SpillFile::path_for(&dir, 0);
    let opts = SpillOptions {
        max_payload: 64 << 10,
        queue_depth: 8,
        ..Default::default()
    };
    let blocks: Vec<(Key, Vec<u8>)> = (0..40u64)
        .map(|k| (Key(u128::from(k)), payload(k, 1, 3000 + k as usize * 1500)))
        .collect();
    {
        let (mut sf, rec) = SpillFile::open(&path, opts).unwrap();
        assert_eq!(rec.records, 0);
        let items: Vec<(Key, &[u8])> = blocks.iter().map(|(k, b)| (*k, b.as_slice())).collect();
        sf.write_batch(&items).unwrap();
        let st = sf.stats();
        assert_eq!(st.writes, 40);
        assert!(
            st.compressed >= 15 && st.compressed <= 20,
            "compressible half compressed: {}",
            st.compressed
        );
        assert!(
            st.file_bytes_written < st.raw_bytes_written,
            "LZ4 saved space"
        );
        // A newer version of key 3 supersedes the old record.
        let v2 = payload(3, 2, 5000);
        sf.write_batch(&[(Key(3), &v2)]).unwrap();
        let got = sf
            .read_batch(&blocks.iter().map(|b| b.0).collect::<Vec<_>>())
            .unwrap();
        for (i, (k, b)) in blocks.iter().enumerate() {
            let want = if *k == Key(3) { &v2 } else { b };
            assert_eq!(got[i].as_ref(), Some(want), "key {k}");
        }
    }
    // Crash debris: a torn record (header of key 99 whose payload never made it) and a flipped
    // byte in key 5's payload.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let len = f.metadata().unwrap().len();
        let (mut sf, _) = SpillFile::open(
            &path,
            SpillOptions {
                direct: false,
                ..opts
            },
        )
        .unwrap();
        sf.write_batch(&[(Key(99), &payload(99, 1, 9000))]).unwrap();
        drop(sf);
        f.set_len(len + 4096).unwrap(); // keep only the first page of key 99's record
                                        // Find key 5's record and flip a payload byte.
        let mut page = vec![0u8; 64];
        let mut off = 0;
        while off < len {
            f.read_exact_at(&mut page, off).unwrap();
            if &page[..8] == b"CXLKVSP1" && u64::from_le_bytes(page[8..16].try_into().unwrap()) == 5
            {
                f.write_all_at(&[0xff], off + 100).unwrap();
                break;
            }
            off += 4096;
        }
        assert!(off < len, "found key 5");
    }
    let (mut sf, rec) = SpillFile::open(&path, opts).unwrap();
    assert_eq!(
        rec.records, 39,
        "key 5 and the torn key 99 are gone: {rec:?}"
    );
    assert!(rec.discarded >= 2 && rec.superseded == 1, "{rec:?}");
    assert_eq!(
        sf.read(Key(5)).unwrap(),
        None,
        "a corrupt record is never returned"
    );
    assert_eq!(sf.read(Key(99)).unwrap(), None);
    assert_eq!(sf.read(Key(7)).unwrap().as_ref(), Some(&blocks[7].1));
    // Freed space is reused: rewriting everything does not grow the file past twice its size.
    let before = sf.file_bytes();
    for round in 0..3 {
        let items: Vec<(Key, Vec<u8>)> = (0..40u64)
            .map(|k| {
                (
                    Key(u128::from(k)),
                    payload(k, round + 3, 3000 + k as usize * 1500),
                )
            })
            .collect();
        let refs: Vec<(Key, &[u8])> = items.iter().map(|(k, b)| (*k, b.as_slice())).collect();
        sf.write_batch(&refs).unwrap();
    }
    assert!(
        sf.file_bytes() <= 2 * before + (1 << 20),
        "{} vs {before}",
        sf.file_bytes()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn small_pool() -> Pool {
    let cfg = PoolConfig {
        block_size: 4096,
        participants: 4,
        partitions: Some(1),
        ..Default::default()
    };
    Pool::create(Arc::new(Region::anonymous(2 << 20).unwrap()), &cfg).unwrap()
}

fn tier_cfg(dir: &std::path::Path, policy: PolicyKind) -> TierConfig {
    TierConfig {
        pool_blocks: 24,
        dram_blocks: 8,
        policy,
        spill_dir: Some(dir.to_path_buf()),
        spill: SpillOptions {
            max_payload: 4096,
            queue_depth: 4,
            ..Default::default()
        },
        step_budget: 4,
        dram_threshold: 2,
    }
}

/// Every key of the model is in exactly one of pool and SSD, any DRAM replica is of a pool block,
/// and a get returns the model's bytes.
fn check(t: &Tiers, model: &HashMap<u64, Vec<u8>>) {
    let mut out = Vec::new();
    for (k, want) in model {
        let key = Key(u128::from(*k));
        let at = t.locate(key);
        let homes = at.iter().filter(|x| **x != Tier::Dram).count();
        assert_eq!(homes, 1, "key {k} in {at:?}");
        if at.contains(&Tier::Dram) {
            assert!(
                at.contains(&Tier::Pool),
                "DRAM replica of a block not in the pool: {at:?}"
            );
        }
        assert!(t.get(key, &mut out).unwrap().is_some(), "key {k} lost");
        assert_eq!(&out, want, "key {k}");
    }
}

#[test]
fn tiers_never_lose_or_duplicate_blocks() {
    for (seed, policy) in [
        (1u64, PolicyKind::Lru),
        (2, PolicyKind::LfuDecay),
        (3, PolicyKind::PrefixAware),
    ] {
        let dir = tempdir(&format!("prop{seed}"));
        let pool = small_pool();
        let (t, _) = Tiers::open(pool.attach().unwrap(), tier_cfg(&dir, policy)).unwrap();
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut r = Rng(seed * 77 + 1);
        let mut out = Vec::new();
        for i in 0..600u64 {
            let k = r.below(80);
            let key = Key(u128::from(k));
            match r.below(8) {
                0..=2 => {
                    let b = payload(k, i, 512 + (k as usize * 37) % 3000);
                    t.put(key, &b, k.checked_sub(1).map(|p| Key(u128::from(p))))
                        .unwrap();
                    model.insert(k, b);
                }
                3..=5 => {
                    let got = t.get(key, &mut out).unwrap();
                    assert_eq!(got.is_some(), model.contains_key(&k), "key {k}");
                    if got.is_some() {
                        assert_eq!(&out, &model[&k]);
                    }
                }
                _ => {
                    t.step().unwrap();
                }
            }
            assert!(
                t.pool_len() <= 24 + 4 + 4,
                "backpressure bounds the pool tier: {}",
                t.pool_len()
            );
            if i % 100 == 99 {
                check(&t, &model);
            }
        }
        for _ in 0..50 {
            t.step().unwrap();
        }
        assert!(t.pool_len() <= 24);
        check(&t, &model);
        let s = t.stats();
        assert!(
            s.demoted_to_ssd > 0 && s.promoted_to_pool > 0 && s.promoted_to_dram > 0,
            "{s:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn tiering_thread_crashes_lose_nothing() {
    for fault in [FaultPoint::AfterSpillWrite, FaultPoint::AfterPoolPut] {
        let dir = tempdir(&format!("crash{}", fault as u8));
        let pool = small_pool();
        let cfg = tier_cfg(&dir, PolicyKind::Lru);
        let (t, _) = Tiers::open(pool.attach().unwrap(), cfg.clone()).unwrap();
        let t = Arc::new(t);
        let mut model = HashMap::new();
        for k in 0..60u64 {
            let b = payload(k, 0, 2000);
            t.put(Key(u128::from(k)), &b, None).unwrap();
            model.insert(k, b);
            t.step().unwrap();
        }
        // SSD hits queue promotions (for the promotion fault), then a background thread crashes.
        let mut out = Vec::new();
        for k in 0..10u64 {
            t.get(Key(u128::from(k)), &mut out).unwrap();
        }
        for k in 60..70u64 {
            let b = payload(k, 0, 2000);
            t.put(Key(u128::from(k)), &b, None).unwrap();
            model.insert(k, b);
        }
        t.inject_fault(fault);
        let bg = t.spawn(std::time::Duration::from_millis(1));
        let crashed = bg.stop();
        assert!(
            crashed.is_err(),
            "the tiering thread must have crashed at {fault:?}"
        );
        // The process goes on: reopen the tiers over the same pool partition and spill file.
        let t = Arc::into_inner(t).expect("thread gone");
        drop(t);
        let (t, rec) = Tiers::open(pool.attach().unwrap(), cfg).unwrap();
        assert!(
            rec.duplicates_resolved >= 1,
            "the interrupted move left a duplicate: {rec:?}"
        );
        check(&t, &model);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
