//! Tiers: the epoch-reclaimed DRAM cache under concurrent stress, SSD spill files (io_uring, LZ4,
//! crash recovery), and randomized properties of the whole DRAM ↔ pool ↔ SSD stack, including
//! crashes of the tiering thread.

use cxlkv_kernels::rng::SplitMix64;
use cxlkv_runtime::policy::PolicyKind;
use cxlkv_runtime::{Key, Pool, PoolConfig, Region};
use cxlkv_tier::spill::{SpillFile, SpillOptions};
use cxlkv_tier::{DramCache, FaultPoint, Tier, TierConfig, Tiers};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes that identify their key and version: any mix-up or torn copy shows.
fn payload(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut r = SplitMix64::new((key << 32) ^ version);
    let mut v: Vec<u8> = (0..len).map(|_| r.next_u64() as u8).collect();
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

/// A fresh, empty directory for one test.
fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cxlkv-tiers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A fresh directory for one test's spill file, the file's path, and spill options for payloads
/// of up to `max_payload` bytes through `queue_depth` buffers.
fn spill_setup(
    name: &str,
    max_payload: usize,
    queue_depth: usize,
) -> (PathBuf, PathBuf, SpillOptions) {
    let dir = tempdir(name);
    let path = SpillFile::path_for(&dir, 0);
    let opts = SpillOptions {
        max_payload,
        queue_depth,
        ..Default::default()
    };
    (dir, path, opts)
}

/// The spill file at `path`, opened for reading and writing behind the spill file's back.
fn open_rw(path: &Path) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// `(key, bytes)` pairs as `write_batch` takes them.
fn batch(items: &[(Key, Vec<u8>)]) -> Vec<(Key, &[u8])> {
    items.iter().map(|(k, b)| (*k, b.as_slice())).collect()
}

#[test]
fn dram_cache_stress_readers_never_see_freed_or_foreign_bytes() {
    let cache = Arc::new(DramCache::new(64));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let c = cache.clone();
            std::thread::spawn(move || {
                let mut r = SplitMix64::new(t + 7);
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

/// File offset of the valid-looking record header of `key` in a spill file (first page-aligned
/// magic that names it).
fn find_record(f: &File, key: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let len = f.metadata().unwrap().len();
    let mut page = [0u8; 64];
    let mut off = 0;
    while off < len {
        f.read_exact_at(&mut page, off).unwrap();
        if &page[..8] == b"CXLKVSP1" && u64::from_le_bytes(page[8..16].try_into().unwrap()) == key {
            return off;
        }
        off += 4096;
    }
    panic!("no record of key {key}");
}

#[test]
fn spill_round_trip_compression_and_crash_recovery() {
    let (dir, path, opts) = spill_setup("spill", 64 << 10, 8);
    let blocks: Vec<(Key, Vec<u8>)> = (0..40u64)
        .map(|k| (Key(u128::from(k)), payload(k, 1, 3000 + k as usize * 1500)))
        .collect();
    {
        let (mut sf, rec) = SpillFile::open(&path, opts).unwrap();
        assert_eq!(rec.records, 0);
        sf.write_batch(&batch(&blocks)).unwrap();
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
    // Crash debris: a torn record (key 99, of which only the header page made it to the disk;
    // the file grows ahead of the writes, so the rest reads as zeros) and a flipped byte in key
    // 5's payload.
    {
        use std::os::unix::fs::FileExt;
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
        let f = open_rw(&path);
        let torn = find_record(&f, 99);
        f.write_all_at(&[0u8; 4096], torn + 4096).unwrap();
        f.write_all_at(&[0xff], find_record(&f, 5) + 100).unwrap();
    }
    let (mut sf, rec) = SpillFile::open(&path, opts).unwrap();
    assert_eq!(
        rec.records, 39,
        "key 5 and the torn key 99 are gone: {rec:?}"
    );
    // Key 3's first record was retired (zeroed) once its successor was written: nothing left to
    // supersede.
    assert!(rec.discarded >= 2 && rec.superseded == 0, "{rec:?}");
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
        sf.write_batch(&batch(&items)).unwrap();
    }
    assert!(
        sf.file_bytes() <= 2 * before + (1 << 20),
        "{} vs {before}",
        sf.file_bytes()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn spill_pipeline_growth_and_versions() {
    use cxlkv_runtime::format::{as_bytes, crc32c, from_bytes};
    use cxlkv_tier::spill::{SpillHeader, SPILL_HEADER_SIZE};
    use std::os::unix::fs::FileExt;
    let (dir, path, opts) = spill_setup("pipeline", 16 << 10, 4);
    let (mut sf, _) = SpillFile::open(&path, opts).unwrap();
    // Far more records than buffers in one call, key 7 twice: the later one wins.
    let blocks: Vec<(Key, Vec<u8>)> = (0..100u64)
        .map(|k| {
            (
                Key(u128::from(k)),
                payload(k, 1, 1000 + (k as usize * 997) % 15000),
            )
        })
        .collect();
    let seven = payload(7, 2, 12_345);
    let mut items = batch(&blocks);
    items.push((Key(7), &seven));
    sf.write_batch(&items).unwrap();
    assert_eq!(sf.len(), 100);
    // The file grew ahead of the writes, in whole steps, so no write extended it.
    let file_len = std::fs::metadata(&path).unwrap().len();
    assert!(
        file_len >= sf.file_bytes() && file_len.is_multiple_of(16 << 20),
        "{file_len}"
    );
    // Missing and repeated keys; every found payload is the model's.
    let keys: Vec<Key> = [3u64, 1000, 7, 3, 42]
        .iter()
        .map(|&k| Key(u128::from(k)))
        .collect();
    let mut seen = vec![0; keys.len()];
    sf.read_with(&keys, |i, bytes| {
        seen[i] += 1;
        let k = keys[i].0 as u64;
        let want = if k == 7 {
            &seven
        } else {
            &blocks[k as usize].1
        };
        assert_eq!(bytes, want.as_slice(), "key {k}");
    })
    .unwrap();
    assert_eq!(seen, [1, 0, 1, 1, 1]);
    drop(sf);
    // Key 3's record claims a future major version; key 4's is of format 1.0 (zeros there) and
    // key 5's of 1.1, written by code that left removed records valid: neither is recovered.
    let f = open_rw(&path);
    for (key, major, minor) in [(3u64, 2u16, 0u16), (4, 0, 0), (5, 1, 1)] {
        let off = find_record(&f, key);
        let mut hdr = [0u8; SPILL_HEADER_SIZE];
        f.read_exact_at(&mut hdr, off).unwrap();
        let mut h: SpillHeader = from_bytes(&hdr);
        h.version_major = major;
        h.version_minor = minor;
        h.header_crc = crc32c(&as_bytes(&h)[..60]);
        f.write_all_at(as_bytes(&h), off).unwrap();
    }
    let (mut sf, rec) = SpillFile::open(&path, opts).unwrap();
    assert_eq!(
        (
            rec.records,
            rec.other_version,
            rec.older_format,
            rec.superseded
        ),
        (97, 1, 2, 0),
        "{rec:?}"
    );
    for k in [3, 4, 5] {
        assert_eq!(sf.read(Key(k)).unwrap(), None, "key {k}");
    }
    assert_eq!(sf.read(Key(6)).unwrap().as_ref(), Some(&blocks[6].1));
    assert_eq!(sf.read(Key(7)).unwrap().as_ref(), Some(&seven));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A payload as assertion messages show it: its length and CRC.
fn digest(bytes: Option<&Vec<u8>>) -> Option<(usize, u32)> {
    bytes.map(|b| (b.len(), cxlkv_runtime::format::crc32c(b)))
}

/// A crash of the process: the spill file is neither closed nor dropped, and nothing it has not
/// already handed to the kernel reaches the file.
fn crash(sf: SpillFile) {
    std::mem::forget(sf);
}

#[test]
fn spill_reopen_after_crash_returns_no_removed_or_superseded_record() {
    let (dir, path, opts) = spill_setup("retire", 64 << 10, 4);
    // Odd keys: incompressible payloads, so a payload's length decides its record's pages.
    let (k, r, d, s, y) = (1u64, 3, 5, 7, 9);
    let key = |k: u64| Key(u128::from(k));
    let (mut sf, _) = SpillFile::open(&path, opts).unwrap();
    sf.write_batch(&[
        (key(k), &payload(k, 1, 9000)),
        (key(r), &payload(r, 1, 5000)),
        (key(d), &payload(d, 1, 7000)),
        (key(s), &payload(s, 1, 30_000)),
    ])
    .unwrap();
    // K and D superseded, S superseded by a record of another size.
    let k2 = payload(k, 2, 12_000);
    sf.write_batch(&[
        (key(k), &k2),
        (key(d), &payload(d, 2, 7000)),
        (key(s), &payload(s, 2, 20_000)),
    ])
    .unwrap();
    // R removed; D and S removed after being superseded, and S's newest pages reused by Y (a
    // record of the same size takes exactly them), which leaves only S's first record to find.
    for gone in [r, d, s] {
        assert!(sf.remove(key(gone)));
    }
    let yb = payload(y, 1, 20_000);
    sf.write_batch(&[(key(y), &yb)]).unwrap();
    let retired = sf.stats().retired;
    crash(sf);
    let (mut sf, rec) = SpillFile::open(&path, opts).unwrap();
    assert_eq!(digest(sf.read(key(k)).unwrap().as_ref()), digest(Some(&k2)));
    assert_eq!(digest(sf.read(key(y)).unwrap().as_ref()), digest(Some(&yb)));
    for gone in [r, d, s] {
        let got = sf.read(key(gone)).unwrap();
        assert_eq!(digest(got.as_ref()), None, "key {gone} came back");
    }
    assert_eq!(
        (rec.records, rec.superseded, rec.discarded),
        (2, 0, 0),
        "{rec:?}"
    );
    assert_eq!(retired, 6, "K1, D1, S1, R, D2, S2");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn spill_crash_between_write_and_retire_keeps_the_newer_record() {
    use std::os::unix::fs::FileExt;
    let (dir, path, opts) = spill_setup("between", 64 << 10, 4);
    let (mut sf, _) = SpillFile::open(&path, opts).unwrap();
    sf.write_batch(&[(Key(1), &payload(1, 1, 9000))]).unwrap();
    let f = open_rw(&path);
    let old = find_record(&f, 1);
    let mut first_page = vec![0u8; 4096];
    f.read_exact_at(&mut first_page, old).unwrap();
    let v2 = payload(1, 2, 9000);
    sf.write_batch(&[(Key(1), &v2)]).unwrap();
    // The crash came after the new record was written and before the old one was retired.
    crash(sf);
    f.write_all_at(&first_page, old).unwrap();
    let (mut sf, rec) = SpillFile::open(&path, opts).unwrap();
    let got = sf.read(Key(1)).unwrap();
    assert_eq!(
        digest(got.as_ref()),
        digest(Some(&v2)),
        "the higher sequence wins"
    );
    assert_eq!((rec.records, rec.superseded), (1, 1), "{rec:?}");
    // Open retired the old record: removing the key now leaves nothing to come back.
    assert!(sf.remove(Key(1)));
    crash(sf);
    let (mut sf, rec) = SpillFile::open(&path, opts).unwrap();
    let got = sf.read(Key(1)).unwrap();
    assert_eq!(digest(got.as_ref()), None, "the removed key came back");
    assert_eq!((rec.records, rec.superseded), (0, 0), "{rec:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn spill_randomized_writes_removes_and_crashes_match_a_model() {
    const KEYS: u64 = 48;
    const SIZES: [usize; 6] = [300, 3000, 5000, 9000, 20_000, 60_000];
    for seed in [1u64, 2, 3] {
        let (dir, path, mut opts) = spill_setup(&format!("model{seed}"), 64 << 10, 4);
        // Odd seeds buffered: both I/O paths.
        opts.direct = seed % 2 == 0;
        let (mut sf, _) = SpillFile::open(&path, opts).unwrap();
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut r = SplitMix64::new(seed);
        let mut reopens = 0;
        for step in 0..600u64 {
            match r.below(16) {
                0..=6 => {
                    let n = 1 + r.below(6) as usize;
                    let items: Vec<(Key, Vec<u8>)> = (0..n)
                        .map(|_| {
                            let k = r.below(KEYS);
                            let len = SIZES[r.below(SIZES.len() as u64) as usize];
                            (Key(u128::from(k)), payload(k, step, len))
                        })
                        .collect();
                    sf.write_batch(&batch(&items)).unwrap();
                    for (k, b) in items {
                        model.insert(k.0 as u64, b);
                    }
                }
                7..=11 => {
                    let k = r.below(KEYS);
                    let had = sf.remove(Key(u128::from(k)));
                    assert_eq!(had, model.remove(&k).is_some(), "key {k}");
                }
                12..=13 => {
                    let keys: Vec<Key> = (0..8).map(|_| Key(u128::from(r.below(KEYS)))).collect();
                    let got = sf.read_batch(&keys).unwrap();
                    for (key, got) in keys.iter().zip(got) {
                        assert_eq!(
                            digest(got.as_ref()),
                            digest(model.get(&(key.0 as u64))),
                            "{key:?}"
                        );
                    }
                }
                _ => {
                    // A crash or a plain drop: the same to the file, which has no clean close.
                    if r.below(2) == 0 {
                        crash(sf);
                    } else {
                        drop(sf);
                    }
                    let rec;
                    (sf, rec) = SpillFile::open(&path, opts).unwrap();
                    reopens += 1;
                    for k in 0..KEYS {
                        let got = sf.read(Key(u128::from(k))).unwrap();
                        assert_eq!(
                            digest(got.as_ref()),
                            digest(model.get(&k)),
                            "seed {seed} step {step} key {k}"
                        );
                    }
                    assert_eq!(
                        (rec.records, rec.superseded, rec.discarded),
                        (model.len() as u64, 0, 0),
                        "seed {seed} step {step}: {rec:?}"
                    );
                    // Retiring rewrites pages the file holds: it never grows the file.
                    let len = std::fs::metadata(&path).unwrap().len();
                    assert!(len.is_multiple_of(16 << 20), "{len}");
                }
            }
        }
        assert!(reopens >= 40, "seed {seed}: {reopens} reopens");
        let _ = std::fs::remove_dir_all(&dir);
    }
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

fn tier_cfg(dir: &Path, policy: PolicyKind) -> TierConfig {
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
        let mut r = SplitMix64::new(seed);
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
