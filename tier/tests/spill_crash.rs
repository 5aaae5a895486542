//! The spill file's sync policies (issue #27): a writer process killed at every step of a spill
//! loses no acknowledged write or removal and leaves nothing torn, under each policy, at the level
//! of the spill file and at the level of the tiers; and each policy issues the syncs it promises.
//!
//! A child process (this test binary re-executed with `CXLKV_SPILL_ROLE=worker`) runs a fixed
//! list of spill operations (batches that add and supersede records, and removals) on a fresh
//! spill file, printing `spill-ack I` once operation I has returned, and SIGKILLs itself
//! (`CXLKV_CRASH_AT=SITE:N`, the runtime's test-only `crash-points` feature) at the N-th hit of
//! one step of [`SPILL_CRASH_SITES`]. For every policy and site, N runs from 1 until the child
//! gets through without reaching it. The parent then reopens the file and checks every key: it
//! holds exactly what the acknowledged operations left, or (for a key of the one operation in
//! flight) what that operation would have left, byte for byte; no other key appears.
//!
//! What this shows is a crash of the process, for which the three policies promise the same.
//! A power loss is not simulated (a killed process leaves the kernel's page cache and the
//! device's queue behind, a power loss does not); its promises rest on the order of writes and
//! syncs that `cxlkv_tier::durability` documents and `syncs_follow_the_policy` checks is issued.

use cxlkv_runtime::region::{Backend, Region, RegionOptions};
use cxlkv_runtime::{Key, Pool, PoolConfig};
use cxlkv_test_support::attach_once_dead;
use cxlkv_tier::spill::{SpillFile, SpillOptions};
use cxlkv_tier::{SyncPolicy, TierConfig, Tiers, SPILL_CRASH_SITES};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const MAX_PAYLOAD: usize = 64 << 10;
/// Every key the operations name.
const KEYS: std::ops::RangeInclusive<u64> = 1..=8;

/// One spill operation of the worker.
enum SpillOp {
    /// `write_batch` of these keys, each at the operation's version.
    Write(&'static [u64]),
    /// `remove` of this key.
    Remove(u64),
}

/// The worker's operations: records added, superseded (3, 4, 2, 6), removed (1, 5) and re-added
/// after removal (1).
const OPS: [SpillOp; 6] = [
    SpillOp::Write(&[1, 2, 3, 4]),
    SpillOp::Write(&[3, 4, 5, 6]),
    SpillOp::Remove(1),
    SpillOp::Write(&[1, 2, 7]),
    SpillOp::Remove(5),
    SpillOp::Write(&[6, 8]),
];

/// The bytes of `key` written by operation `op`: they name both, so a mix-up or a torn record
/// shows. Even keys compress (LZ4 records), odd ones do not; lengths differ per key.
fn payload(key: u64, op: usize) -> Vec<u8> {
    let len = 1000 + key as usize * 7000 + op * 100;
    let mut x = (key << 32) ^ (op as u64 + 1) ^ 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if key.is_multiple_of(2) && i % 64 >= 8 {
                0
            } else {
                x as u8
            }
        })
        .collect()
}

/// What the file holds per key after operations `0..n` have taken effect.
fn model(n: usize) -> BTreeMap<u64, Vec<u8>> {
    let mut m = BTreeMap::new();
    for (i, op) in OPS.iter().enumerate().take(n) {
        match op {
            SpillOp::Write(keys) => {
                for &k in keys.iter() {
                    m.insert(k, payload(k, i));
                }
            }
            SpillOp::Remove(k) => {
                m.remove(k);
            }
        }
    }
    m
}

fn options(sync: SyncPolicy) -> SpillOptions {
    SpillOptions {
        max_payload: MAX_PAYLOAD,
        queue_depth: 4,
        sync,
        ..Default::default()
    }
}

/// Worker body: runs only when re-executed by the test.
#[test]
fn spill_crash_worker_entry() {
    if std::env::var("CXLKV_SPILL_ROLE").as_deref() != Ok("worker") {
        return;
    }
    let path = PathBuf::from(std::env::var("CXLKV_SPILL_PATH").unwrap());
    let sync: SyncPolicy = std::env::var("CXLKV_SPILL_SYNC").unwrap().parse().unwrap();
    let (mut sf, _) = SpillFile::open(&path, options(sync)).unwrap();
    let mut out = std::io::stdout();
    for (i, op) in OPS.iter().enumerate() {
        match op {
            SpillOp::Write(keys) => {
                let bytes: Vec<(Key, Vec<u8>)> = keys
                    .iter()
                    .map(|&k| (Key(u128::from(k)), payload(k, i)))
                    .collect();
                let items: Vec<(Key, &[u8])> =
                    bytes.iter().map(|(k, b)| (*k, b.as_slice())).collect();
                sf.write_batch(&items).unwrap();
            }
            SpillOp::Remove(k) => assert!(sf.remove(Key(u128::from(*k)))),
        }
        // The acknowledgement: the parent holds the operation as done from here on.
        // On a line of its own: the test harness may have left "test ... " unterminated.
        writeln!(out, "\nspill-ack {i}").unwrap();
        out.flush().unwrap();
    }
    std::process::exit(0);
}

/// A fresh, empty directory for one test.
fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cxlkv-spillcrash-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One run: a worker on a fresh file at `path`, killed at the `n`-th hit of `site`. Returns
/// `None` when it finished without reaching it, else how many operations it acknowledged.
fn run(path: &Path, sync: SyncPolicy, site: &str, n: u32) -> Option<usize> {
    let _ = std::fs::remove_file(path);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "spill_crash_worker_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CXLKV_SPILL_ROLE", "worker")
        .env("CXLKV_SPILL_PATH", path)
        .env("CXLKV_SPILL_SYNC", sync.name())
        .env("CXLKV_CRASH_AT", format!("{site}:{n}"))
        .output()
        .unwrap();
    let acked = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("spill-ack "))
        .count();
    if out.status.success() {
        assert_eq!(
            acked,
            OPS.len(),
            "a worker that finished acknowledged everything"
        );
        return None;
    }
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "{sync} {site}:{n}: the worker failed instead of crashing: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(acked)
}

/// Reopens the file a worker crashed on after acknowledging `acked` operations and checks every
/// key against the model; then checks that the file takes new writes.
fn check_recovered(path: &Path, sync: SyncPolicy, acked: usize, what: &str) {
    let done = model(acked);
    // The operation in flight may have taken effect for any of its keys.
    let in_flight = model((acked + 1).min(OPS.len()));
    let (mut sf, rec) = SpillFile::open(path, options(sync)).unwrap();
    for k in sf.keys() {
        assert!(
            u64::try_from(k.0).is_ok_and(|k| KEYS.contains(&k)),
            "{what}: unknown key {k:?}"
        );
    }
    for k in KEYS {
        let got = sf.read(Key(u128::from(k))).unwrap();
        let (want, may) = (done.get(&k), in_flight.get(&k));
        assert!(
            got.as_ref() == want || got.as_ref() == may,
            "{what}: key {k} holds {:?} bytes; acknowledged: {:?}, in flight: {:?} ({rec:?})",
            got.as_ref().map(Vec::len),
            want.map(Vec::len),
            may.map(Vec::len)
        );
    }
    let fresh = payload(1, 50);
    sf.write_batch(&[(Key(99), &fresh)]).unwrap();
    assert_eq!(sf.read(Key(99)).unwrap().as_deref(), Some(&fresh[..]));
}

#[test]
fn spill_crash_at_every_step_keeps_every_acknowledged_record() {
    if std::env::var("CXLKV_SPILL_ROLE").is_ok() {
        return;
    }
    let dir = tempdir("steps");
    let path = SpillFile::path_for(&dir, 0);
    let mut runs = 0;
    for sync in SyncPolicy::ALL {
        for site in SPILL_CRASH_SITES {
            let mut n = 1;
            while let Some(acked) = run(&path, sync, site, n) {
                check_recovered(&path, sync, acked, &format!("{sync} {site}:{n}"));
                n += 1;
                runs += 1;
            }
            // Every step is on the path of every policy: a site never reached tests nothing.
            assert!(n > 1, "{sync}: the worker never reached {site}");
        }
    }
    eprintln!("spill crash: {runs} crashed workers checked over 3 policies");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn syncs_follow_the_policy() {
    if std::env::var("CXLKV_SPILL_ROLE").is_ok() {
        return;
    }
    let dir = tempdir("syncs");
    for sync in SyncPolicy::ALL {
        let path = SpillFile::path_for(&dir, sync as u32);
        let (mut sf, _) = SpillFile::open(&path, options(sync)).unwrap();
        assert_eq!(sf.sync_policy(), sync);
        assert_eq!(sf.dsync(), sync == SyncPolicy::Always, "{sync}: O_DSYNC");
        let a = payload(1, 0);
        let b = payload(2, 0);
        sf.write_batch(&[(Key(1), &a), (Key(2), &b)]).unwrap();
        sf.write_batch(&[(Key(1), &b)]).unwrap();
        assert!(sf.remove(Key(2)));
        assert!(!sf.remove(Key(3)), "no record: nothing to sync");
        let want = if sync == SyncPolicy::OnBatch { 3 } else { 0 };
        assert_eq!(
            sf.stats().syncs,
            want,
            "{sync}: fdatasync per batch and removal"
        );
        sf.sync().unwrap();
        assert_eq!(sf.stats().syncs, want + 1, "{sync}: an explicit sync");
        assert_eq!(sf.read(Key(1)).unwrap().as_deref(), Some(&b[..]));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// The same at the level of the tiers: a process that puts blocks through `Tiers` (which spills
// the pool tier's victims to SSD in batches, then deletes their pool copies, and promotes SSD
// hits back, removing their records) is killed at every step of a spill; a new process takes the
// dead one's partition over, reopens the tiers on it and its spill file, and finds every block
// whose put was acknowledged, in the pool or on SSD, byte for byte.

/// Blocks the tier worker puts.
const TIER_PUTS: u64 = 24;

fn tier_cfg(dir: &Path, sync: SyncPolicy) -> TierConfig {
    TierConfig {
        pool_blocks: 8,
        dram_blocks: 0,
        spill_dir: Some(dir.to_path_buf()),
        spill: SpillOptions {
            max_payload: 4096,
            queue_depth: 4,
            sync,
            ..Default::default()
        },
        step_budget: 2,
        ..Default::default()
    }
}

fn tier_payload(k: u64) -> Vec<u8> {
    let mut v = payload(k % 2, k as usize);
    v.truncate(1000 + (k as usize * 97) % 3000);
    v
}

/// Tier worker body: runs only when re-executed by the test.
#[test]
fn tier_crash_worker_entry() {
    if std::env::var("CXLKV_SPILL_ROLE").as_deref() != Ok("tier-worker") {
        return;
    }
    let backend: Backend = std::env::var("CXLKV_SPILL_POOL").unwrap().parse().unwrap();
    let dir = PathBuf::from(std::env::var("CXLKV_SPILL_PATH").unwrap());
    let sync: SyncPolicy = std::env::var("CXLKV_SPILL_SYNC").unwrap().parse().unwrap();
    let pool = Pool::open_on(&backend, &RegionOptions::default()).unwrap();
    let (t, _) = Tiers::open(pool.attach().unwrap(), tier_cfg(&dir, sync)).unwrap();
    let mut out = std::io::stdout();
    let mut got = Vec::new();
    for k in 0..TIER_PUTS {
        t.put(Key(u128::from(k)), &tier_payload(k), None).unwrap();
        writeln!(out, "\ntier-ack {k}").unwrap();
        out.flush().unwrap();
        // Now and then an SSD hit, which the step promotes (removing its spill record).
        if k >= 16 && k % 4 == 0 {
            let hit = t.get(Key(u128::from(k - 16)), &mut got).unwrap();
            assert_eq!(
                hit,
                Some(cxlkv_tier::Tier::Ssd),
                "block {} was spilled",
                k - 16
            );
        }
        t.step().unwrap();
    }
    std::process::exit(0);
}

/// One tier run killed at the `n`-th hit of `site`; false when the worker finished first.
fn tier_run(sync: SyncPolicy, site: &str, n: u32) -> bool {
    let name = format!("cxlkv-tiercrash-{}", std::process::id());
    let backend: Backend = format!("shm:{name}").parse().unwrap();
    let _ = Region::unlink(&backend);
    let dir = tempdir("tiers");
    let cfg = PoolConfig {
        block_size: 4096,
        participants: 1,
        lease: Duration::from_millis(40),
        ..Default::default()
    };
    let pool = Pool::create_on(&backend, 4 << 20, &cfg, &RegionOptions::default()).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tier_crash_worker_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CXLKV_SPILL_ROLE", "tier-worker")
        .env("CXLKV_SPILL_POOL", backend.to_string())
        .env("CXLKV_SPILL_PATH", &dir)
        .env("CXLKV_SPILL_SYNC", sync.name())
        .env("CXLKV_CRASH_AT", format!("{site}:{n}"))
        .output()
        .unwrap();
    let what = format!("tiers {sync} {site}:{n}");
    let acked = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("tier-ack "))
        .count() as u64;
    let crashed = match (out.status.signal(), out.status.code()) {
        (Some(libc::SIGKILL), _) => true,
        (_, Some(0)) => false,
        _ => panic!(
            "{what}: worker ended with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    };
    let heir = attach_once_dead(&pool);
    let (t, rec) = Tiers::open(heir, tier_cfg(&dir, sync)).unwrap();
    let mut got = Vec::new();
    for k in 0..TIER_PUTS {
        let found = t.get(Key(u128::from(k)), &mut got).unwrap();
        if k < acked {
            assert!(
                found.is_some(),
                "{what}: acknowledged block {k} lost ({rec:?})"
            );
        }
        if found.is_some() {
            assert_eq!(got, tier_payload(k), "{what}: block {k} from {found:?}");
        }
    }
    drop(t);
    drop(pool);
    Region::unlink(&backend).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    crashed
}

#[test]
fn tiers_reopen_with_every_acknowledged_block_after_a_crash_mid_spill() {
    if std::env::var("CXLKV_SPILL_ROLE").is_ok() {
        return;
    }
    let mut runs = 0;
    for sync in SyncPolicy::ALL {
        for site in SPILL_CRASH_SITES {
            let mut n = 1;
            while tier_run(sync, site, n) {
                n += 1;
                runs += 1;
            }
            assert!(n > 1, "tiers {sync}: the worker never reached {site}");
        }
    }
    eprintln!("tier crash: {runs} crashed workers checked over 3 policies");
}
