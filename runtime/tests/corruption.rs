//! Corruption, by the thousand: real pool images with random bytes flipped anywhere past the
//! superblock, and every structure word set to extreme values. `check` reports live damage, no
//! read path (get, get_into, pin, block_ref) ever returns wrong bytes, and taking the damaged
//! partitions over, then writing and reading, never panics. The named damage cases (truncation,
//! other formats and versions, superblock flips, misuse) are in `corruption_cases.rs`.
//!
//! Every case runs on a fresh anonymous region loaded with an image, from a seed of the project's
//! SplitMix64 generator; a failing case prints its seed. `CXLKV_FUZZ_CASES` sets the number of
//! random mutation cases (default 5000; the long run of `scripts/fuzz-long.sh` runs 1,000,000),
//! `CXLKV_FUZZ_SEED` the base seed, `CXLKV_FUZZ_FIRST` the number of the first case (to rerun one
//! case of a long run: `CXLKV_FUZZ_FIRST=N CXLKV_FUZZ_CASES=1`). The random run prints its counts: cases, crashes (panics),
//! wrong reads (a read path returning bytes that were never put) and leaks (file descriptors,
//! memory mappings and resident memory the process holds after the run against before it).

mod image;

use cxlkv_kernels::rng::SplitMix64;
use cxlkv_runtime::format::{
    self, decode_entry, slot_version, IndexSlot, BLOCK_HEADER_SIZE, INDEX_SLOT_SIZE, PIN_SIZE,
};
use cxlkv_runtime::kv::KvBlock;
use cxlkv_runtime::{check, Codec, Key, Participant, Pool, PoolError};
use image::{
    images, no_heartbeat, open_manual, payload, plain, wait_out_lease, Draw, Geometry, Image,
    BLOCK, PARTITIONS, POOL_BYTES,
};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

/// A read result is acceptable when it is a miss or exactly one of the allowed values.
fn acceptable(got: &Option<(Vec<u8>, Codec)>, allowed: &[(Vec<u8>, Codec)]) -> bool {
    match got {
        None => true,
        Some(v) => allowed.contains(v),
    }
}

/// Where a mutation landed, for the report of a failing case.
#[derive(Clone, Debug)]
struct Mutation {
    area: &'static str,
    offset: u64,
}

/// Mutates 1-8 places of `bytes` past the superblock, biased towards the structures.
fn mutate(img: &Image, rng: &mut SplitMix64, bytes: &mut [u8]) -> Vec<Mutation> {
    let geo = Geometry(img.sb);
    let sb = &img.sb;
    let n = 1 + rng.below(8);
    let mut done = Vec::new();
    for _ in 0..n {
        let live = img.live[rng.below(img.live.len() as u64) as usize];
        // The live block's partition and `at` (its slot or block) three times in four, else a
        // random partition and a random one of `count`.
        let near_live = |rng: &mut SplitMix64, at: u32, count: u32| {
            if rng.chance(75) {
                (live.partition, at)
            } else {
                (
                    rng.below(u64::from(sb.partitions)) as u32,
                    rng.below(u64::from(count)) as u32,
                )
            }
        };
        let (area, offset) = match rng.below(100) {
            0..=11 => {
                let base = geo.slot(rng.below(u64::from(sb.participants)) as u32);
                let within = match rng.below(10) {
                    0..=4 => rng.below(64),
                    5..=7 => format::slot::PINS + rng.below(4 * PIN_SIZE),
                    _ => rng.below(sb.slot_layout().size),
                };
                ("participant slot", base + within)
            }
            12..=21 => {
                let base = geo.partition(rng.below(u64::from(sb.partitions)) as u32);
                let within = if rng.chance(80) {
                    rng.below(16)
                } else {
                    rng.below(format::PARTITION_HEADER_SIZE)
                };
                ("partition header", base + within)
            }
            22..=41 => {
                let (p, s) = near_live(rng, live.slot, sb.index_slots);
                (
                    "index slot",
                    geo.index_slot(p, s) + rng.below(INDEX_SLOT_SIZE),
                )
            }
            42..=61 => {
                let (p, b) = near_live(rng, live.block, sb.blocks_per_partition);
                (
                    "block header",
                    geo.header(p, b) + rng.below(BLOCK_HEADER_SIZE),
                )
            }
            62..=84 => {
                let within = if live.len > 0 && rng.chance(90) {
                    rng.below(live.len)
                } else {
                    rng.below(sb.block_size)
                };
                ("payload", geo.payload(live.partition, live.block) + within)
            }
            _ => (
                "anywhere",
                format::SUPERBLOCK_SIZE + rng.below(sb.pool_size - format::SUPERBLOCK_SIZE),
            ),
        };
        let o = offset as usize;
        match rng.below(10) {
            0..=5 => bytes[o] ^= rng.nonzero_byte(),
            6..=7 => bytes[o] = rng.next_u64() as u8,
            _ => {
                // A whole word set to a value that tends to break arithmetic.
                let w = o & !7;
                let old = u64::from_le_bytes(bytes[w..w + 8].try_into().unwrap());
                let new = match rng.below(9) {
                    0 => 0,
                    1 => 1,
                    2 => u64::MAX,
                    3 => 1 << 63,
                    4 => 1 << 40,
                    5 => old.wrapping_add(1),
                    6 => old.wrapping_sub(1),
                    7 => old ^ (1 << rng.below(64)),
                    _ => rng.next_u64(),
                };
                bytes[w..w + 8].copy_from_slice(&new.to_le_bytes());
            }
        }
        done.push(Mutation { area, offset });
    }
    done
}

/// Why `check` must report an error for this mutated image, if it must: a live block whose index
/// slot is intact (even version) and whose header or payload bytes changed, or a live slot that
/// changed into another live-looking entry.
fn damage_expected(img: &Image, bytes: &[u8]) -> Option<String> {
    let geo = Geometry(img.sb);
    for l in &img.live {
        let so = geo.index_slot(l.partition, l.slot);
        let (old, new): (IndexSlot, IndexSlot) = (plain(&img.bytes, so), plain(bytes, so));
        if new.version & 1 == 1 {
            continue; // mid-update: readers skip it and check notes it; no damage claim
        }
        if slot_version::quarantined(new.version) {
            // A flip set the quarantine flag: readers and writers skip the slot like a tombstone
            // (a miss, never wrong bytes) and check counts it; nothing tells it from a real
            // quarantine, so no damage claim.
            continue;
        }
        if (new.key_lo, new.key_hi, new.entry) != (old.key_lo, old.key_hi, old.entry) {
            if decode_entry(new.entry).is_some() {
                return Some(format!(
                    "live index slot {}/{} changed (version {:#x} key {:#x}/{:#x} entry {:#x} -> \
                     version {:#x} key {:#x}/{:#x} entry {:#x})",
                    l.partition,
                    l.slot,
                    old.version,
                    old.key_lo,
                    old.key_hi,
                    old.entry,
                    new.version,
                    new.key_lo,
                    new.key_hi,
                    new.entry
                ));
            }
            continue;
        }
        let h = geo.header(l.partition, l.block) as usize;
        if bytes[h..h + BLOCK_HEADER_SIZE as usize] != img.bytes[h..h + BLOCK_HEADER_SIZE as usize]
        {
            return Some(format!(
                "live block header {}/{} changed",
                l.partition, l.block
            ));
        }
        let p = geo.payload(l.partition, l.block) as usize;
        if bytes[p..p + l.len as usize] != img.bytes[p..p + l.len as usize] {
            return Some(format!("live payload {}/{} changed", l.partition, l.block));
        }
    }
    None
}

/// What one mutation case saw (summed into the run's report).
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    cases: u64,
    damage_expected: u64,
    damage_reported: u64,
    hits: u64,
    misses: u64,
    errors: u64,
    takeovers: u64,
    new_puts: u64,
    new_put_hits: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Tally) {
        self.cases += o.cases;
        self.damage_expected += o.damage_expected;
        self.damage_reported += o.damage_reported;
        self.hits += o.hits;
        self.misses += o.misses;
        self.errors += o.errors;
        self.takeovers += o.takeovers;
        self.new_puts += o.new_puts;
        self.new_put_hits += o.new_put_hits;
    }
}

/// Tallies one read result; an error message if it returned bytes that are not allowed.
fn read_ok(
    r: &Result<Option<(Vec<u8>, Codec)>, PoolError>,
    allowed: &[(Vec<u8>, Codec)],
    t: &mut Tally,
) -> Result<(), String> {
    match r {
        Ok(got) if acceptable(got, allowed) => {
            if got.is_some() {
                t.hits += 1
            } else {
                t.misses += 1
            }
            Ok(())
        }
        Ok(got) => Err(format!(
            "returned wrong bytes ({} bytes)",
            got.as_ref().map_or(0, |g| g.0.len())
        )),
        Err(_) => {
            t.errors += 1;
            Ok(())
        }
    }
}

/// Every read path for `key` returns a miss, an error, or exactly an allowed value.
fn read_all_ways(
    pool: &Pool,
    reader: Option<&Participant>,
    key: Key,
    allowed: &[(Vec<u8>, Codec)],
    t: &mut Tally,
) -> Result<(), String> {
    let mut note = |r: &Result<Option<(Vec<u8>, Codec)>, PoolError>, how: &str| {
        read_ok(r, allowed, t).map_err(|m| format!("{how} of key {key} {m}"))
    };
    let got = pool.get(key).map(|o| o.map(|(v, i)| (v, i.codec)));
    note(&got, "Pool::get")?;
    if let Ok(Some((v, Codec::KvV1))) = &got {
        KvBlock::parse(v)
            .map_err(|e| format!("typed block of key {key} read back but does not parse: {e}"))?;
    }
    let mut buf = vec![0u8; BLOCK as usize];
    let got = pool
        .get_into(key, &mut buf)
        .map(|o| o.map(|i| (buf[..i.len as usize].to_vec(), i.codec)));
    note(&got, "Pool::get_into")?;
    if let Some(r) = reader {
        let got = r.get(key).map(|o| o.map(|(v, i)| (v, i.codec)));
        note(&got, "Participant::get")?;
        let got = r.pin(key).and_then(|o| {
            o.map(|pin| {
                let mut v = vec![0u8; pin.len() as usize];
                pin.read(0, &mut v).map(|()| (v, pin.info().codec))
            })
            .transpose()
        });
        note(&got, "Participant::pin")?;
    }
    // In-place readers: a validated header plus a verified payload must be the right bytes.
    if let Ok(Some(r)) = pool.block_ref(key) {
        if matches!(pool.verify_payload(&r), Ok(true)) {
            let mut v = vec![0u8; r.header.len as usize];
            pool.memory()
                .read(r.payload_off, &mut v)
                .map_err(|e| e.to_string())?;
            let codec = Codec::from_code(r.header.codec).ok_or("block_ref passed a bad codec")?;
            note(&Ok(Some((v, codec))), "block_ref + verify_payload")?;
        }
    }
    Ok(())
}

/// One random mutation case: returns its tally, or a description of the property it broke.
/// `scratch` holds a copy of the image on entry and on return (only mutated words are restored).
fn run_random_case(img: &Image, seed: u64, scratch: &mut [u8]) -> Result<Tally, String> {
    let mut rng = SplitMix64::new(seed);
    let mutations = mutate(img, &mut rng, scratch);
    let result = run_case(img, &mut rng, scratch, &mutations);
    for m in &mutations {
        let w = (m.offset & !7) as usize;
        scratch[w..w + 8].copy_from_slice(&img.bytes[w..w + 8]);
    }
    result
}

/// Runs every check on a mutated image `bytes` of `img`; `rng` picks write sizes.
fn run_case(
    img: &Image,
    rng: &mut SplitMix64,
    bytes: &[u8],
    mutations: &[Mutation],
) -> Result<Tally, String> {
    let seed = rng.next_u64();
    let places: Vec<String> = mutations
        .iter()
        .map(|m| format!("{} @ {:#x}", m.area, m.offset))
        .collect();
    let ctx = |m: String| format!("{m}\n  image {}, mutated {}", img.name, places.join(", "));
    let mut t = Tally {
        cases: 1,
        ..Default::default()
    };
    let (pool, clock) = open_manual(bytes, POOL_BYTES);
    let pool = pool.map_err(|e| ctx(format!("open failed with an intact superblock: {e}")))?;

    let report = check(&pool).map_err(|e| ctx(format!("check failed: {e}")))?;
    if let Some(why) = damage_expected(img, bytes) {
        t.damage_expected += 1;
        if report.ok() {
            return Err(ctx(format!("check reports no damage, but {why}")));
        }
    }
    if !report.ok() {
        t.damage_reported += 1;
    }

    let mut allowed: HashMap<Key, Vec<(Vec<u8>, Codec)>> = img
        .keys
        .iter()
        .map(|s| (s.key, s.value.iter().cloned().collect()))
        .collect();
    let keys: Vec<Key> = img.keys.iter().map(|s| s.key).collect();
    let mut buf = vec![0u8; BLOCK as usize];
    for (i, &k) in keys.iter().enumerate() {
        if i % 3 == 0 {
            read_all_ways(&pool, None, k, &allowed[&k], &mut t).map_err(ctx)?;
        } else {
            let got = pool
                .get_into(k, &mut buf)
                .map(|o| o.map(|i| (buf[..i.len as usize].to_vec(), i.codec)));
            read_ok(&got, &allowed[&k], &mut t)
                .map_err(|m| ctx(format!("Pool::get_into of key {k}: {m}")))?;
        }
    }

    // Take over the damaged partitions (recovery runs on the mutated index), then write and read.
    // The crashed holders are dead once this handle watched them for a lease.
    wait_out_lease(&pool, &clock);
    let mut owners = Vec::new();
    for _ in 0..PARTITIONS {
        if let Ok(p) = Participant::attach(&pool, no_heartbeat(true)) {
            if p.partition().is_some() {
                t.takeovers += 1;
            }
            owners.push(p);
        }
    }
    for (n, x) in owners.iter().enumerate() {
        let Some(part) = x.partition() else { continue };
        let own: Vec<Key> = img
            .keys
            .iter()
            .filter(|s| s.partition == part)
            .map(|s| s.key)
            .collect();
        for (i, &k) in own.iter().enumerate().take(12) {
            if i % 3 == 2 {
                if let Ok(_found) = x.delete(k) {
                    allowed.insert(k, Vec::new());
                }
            } else {
                let bytes = payload(k, 3, 1 + rng.below(BLOCK) as usize);
                match x.put(k, &bytes) {
                    Ok(_) => {
                        allowed.insert(k, vec![(bytes, Codec::Raw)]);
                    }
                    Err(_) => allowed.get_mut(&k).unwrap().push((bytes, Codec::Raw)),
                }
            }
        }
        // Enough new keys to force evictions in a nearly full partition.
        for i in 0..30u64 {
            let k = Key::from_bytes(
                &[
                    b"new".as_slice(),
                    &seed.to_le_bytes(),
                    &[n as u8],
                    &i.to_le_bytes(),
                ]
                .concat(),
            );
            let len = if rng.chance(15) {
                BLOCK
            } else {
                rng.below(300)
            };
            let bytes = payload(k, 1, len as usize);
            let ok = x.put(k, &bytes).is_ok();
            allowed.insert(k, vec![(bytes, Codec::Raw)]);
            if ok {
                t.new_puts += 1;
                match x.get(k) {
                    Ok(Some((v, _))) if allowed[&k].iter().any(|a| a.0 == v) => t.new_put_hits += 1,
                    Ok(Some(_)) => {
                        return Err(ctx(format!("fresh put of {k} reads back wrong bytes")))
                    }
                    _ => {}
                }
            }
        }
    }
    // After the takeover, every fifth key through every read path of the pool and a participant.
    let reader = owners.first();
    for &k in keys.iter().skip((seed % 5) as usize).step_by(5) {
        read_all_ways(&pool, reader, k, &allowed[&k], &mut t).map_err(ctx)?;
    }
    check(&pool).map_err(|e| ctx(format!("check after takeover failed: {e}")))?;
    Ok(t)
}

fn panic_text(e: &Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// What the process holds: (resident KiB, open file descriptors, memory mappings).
fn resources() -> (u64, u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    let maps = std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count() as u64);
    (rss, fds, maps)
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_flips_are_reported_and_never_return_wrong_bytes() {
    let imgs = images();
    let cases = env_u64("CXLKV_FUZZ_CASES", 5000);
    let base = env_u64("CXLKV_FUZZ_SEED", 0x00c0_ffee);
    let first = env_u64("CXLKV_FUZZ_FIRST", 0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4) as u64;
    let before = resources();
    let start = Instant::now();
    let results: Vec<(Tally, Vec<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|th| {
                s.spawn(move || {
                    let mut tally = Tally::default();
                    let mut failures = Vec::new();
                    let mut scratch: Vec<Vec<u8>> = imgs.iter().map(|i| i.bytes.clone()).collect();
                    for i in (first + th..first + cases).step_by(threads as usize) {
                        let seed = base.wrapping_mul(0x1_0000_0001).wrapping_add(i);
                        let which = (i % imgs.len() as u64) as usize;
                        let img = &imgs[which];
                        let bytes = &mut scratch[which];
                        match catch_unwind(AssertUnwindSafe(|| run_random_case(img, seed, bytes))) {
                            Ok(Ok(t)) => tally += t,
                            Ok(Err(why)) => {
                                failures.push(format!("case {i} seed {seed:#x}: {why}"))
                            }
                            Err(e) => {
                                failures.push(format!(
                                    "case {i} seed {seed:#x}: PANICKED: {}, image {}",
                                    panic_text(&e),
                                    img.name
                                ));
                                bytes.copy_from_slice(&img.bytes);
                            }
                        }
                        if failures.len() >= 5 {
                            break;
                        }
                    }
                    (tally, failures)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut total = Tally::default();
    let mut failures = Vec::new();
    for (t, f) in results {
        total += t;
        failures.extend(f);
    }
    println!(
        "{} mutation cases in {:.1?} (base seed {base:#x}; rerun one with CXLKV_FUZZ_SEED/CXLKV_FUZZ_CASES): {total:?}",
        total.cases,
        start.elapsed()
    );
    // Leaks: every case maps a fresh region and opens a pool on it; all of it must go away. A
    // few mappings and some resident memory may stay with the allocator's per-thread arenas,
    // nothing in proportion to the cases.
    let after = resources();
    let crashes = failures.iter().filter(|f| f.contains("PANICKED")).count();
    let wrong = failures
        .iter()
        .filter(|f| f.contains("wrong bytes"))
        .count();
    let leaked_fds = after.1.saturating_sub(before.1);
    let leaked_maps = after.2.saturating_sub(before.2);
    let rss_growth_mib = after.0.saturating_sub(before.0) / 1024;
    println!(
        "cases {}, crashes {crashes}, wrong reads {wrong}, leaks: fds +{leaked_fds}, mappings \
         +{leaked_maps}, resident memory +{rss_growth_mib} MiB (before {} MiB)",
        total.cases,
        before.0 / 1024
    );
    assert!(
        failures.is_empty(),
        "{} failing case(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(total.cases, cases);
    assert!(
        leaked_fds == 0 && leaked_maps < 64 && rss_growth_mib < 256,
        "resources leaked: fds +{leaked_fds}, mappings +{leaked_maps}, RSS +{rss_growth_mib} MiB"
    );
    // The run must have exercised what it claims: damage to detect, hits, takeovers, fresh writes
    // (over enough cases for the proportions to mean something; a rerun of one case skips this).
    if cases >= 100 {
        assert!(total.damage_expected > cases / 4 && total.hits > 0 && total.takeovers > cases);
        assert!(
            total.new_put_hits > total.new_puts / 2,
            "fresh puts after takeover mostly read back: {total:?}"
        );
    }
}

#[test]
fn extreme_values_in_structure_words_never_panic() {
    // Deterministic complement of the random cases: every word of the participant slots (header
    // line and first pins), partition headers, and some live index slots and block headers, set to
    // values that break careless arithmetic.
    let values = [
        0,
        1,
        u64::MAX,
        1 << 63,
        1 << 40,
        format::MAX_SEQ,
        format::MAX_SEQ + 1,
    ];
    let mut failures = Vec::new();
    let mut cases = 0;
    for img in images() {
        let geo = Geometry(img.sb);
        let mut words: Vec<(&'static str, u64)> = Vec::new();
        for q in 0..img.sb.participants {
            words.extend((0..8).map(|w| ("participant slot", geo.slot(q) + 8 * w)));
            words.extend((0..4).map(|w| ("pin", geo.slot(q) + format::slot::PINS + 8 * w)));
        }
        for p in 0..img.sb.partitions {
            words.extend([
                ("partition owner", geo.partition(p)),
                ("partition next seq", geo.partition(p) + 8),
            ]);
        }
        for l in img.live.iter().step_by(img.live.len() / 3) {
            words.extend(
                (0..4).map(|w| ("index slot", geo.index_slot(l.partition, l.slot) + 8 * w)),
            );
            words
                .extend((0..8).map(|w| ("block header", geo.header(l.partition, l.block) + 8 * w)));
        }
        for &(area, offset) in &words {
            for value in values {
                let mut bytes = img.bytes.clone();
                bytes[offset as usize..offset as usize + 8].copy_from_slice(&value.to_le_bytes());
                if bytes == img.bytes {
                    continue;
                }
                cases += 1;
                let m = [Mutation { area, offset }];
                let mut rng = SplitMix64::new(offset ^ value);
                match catch_unwind(AssertUnwindSafe(|| run_case(img, &mut rng, &bytes, &m))) {
                    Ok(Ok(_)) => {}
                    Ok(Err(why)) => {
                        failures.push(format!("{area} word at {offset:#x} = {value:#x}: {why}"))
                    }
                    Err(e) => failures.push(format!(
                        "{area} word at {offset:#x} = {value:#x}: PANICKED: {}",
                        panic_text(&e)
                    )),
                }
            }
        }
    }
    println!("{cases} extreme-value cases");
    assert!(
        failures.is_empty(),
        "{} failing case(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(cases > 1000);
}
