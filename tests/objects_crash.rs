//! Crash at every step of a multi-block object put (issue #15's acceptance test).
//!
//! A child process (this test binary re-executed with `CXLKV_OBJ_ROLE=worker`) puts a new object
//! and then replaces an existing one, and SIGKILLs itself (`CXLKV_CRASH_AT=SITE:N`, feature
//! `crash-points`) at the N-th hit of one step: every part's claim, payload, header and index
//! steps, after each part (`object:part`), before the manifest (`object:manifest`), each step of
//! the manifest's own put, and the deletion of the replaced object's parts. For every site, N
//! runs from 1 until the child gets through without reaching it. The parent then takes the
//! partition over and checks: each object is absent or whole (byte-exact, never a mix of two
//! puts), `pool check` passes (orphan parts are notes, not damage), and new puts of the same keys
//! work.

use cxlkv::runtime::region::{Backend, Region, RegionOptions};
use cxlkv::runtime::{check, Key, Pool, PoolConfig};
use cxlkv_test_support::attach_once_dead;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::Duration;

const BLOCK: u64 = 16 << 10;
/// Two full parts and a short third.
const LEN: usize = 2 * BLOCK as usize + 100;

fn fresh_key() -> Key {
    Key::from_bytes(b"objects-crash fresh")
}

fn replaced_key() -> Key {
    Key::from_bytes(b"objects-crash replaced")
}

/// Version `v` of the bytes of `key`.
fn bytes_of(key: Key, v: u64) -> Vec<u8> {
    let mut x = key.lo() ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..LEN)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Worker body: runs only when re-executed by the test.
#[test]
fn objects_crash_worker_entry() {
    if std::env::var("CXLKV_OBJ_ROLE").as_deref() != Ok("worker") {
        return;
    }
    let backend: Backend = std::env::var("CXLKV_OBJ_POOL").unwrap().parse().unwrap();
    let pool = Pool::open_on(&backend, &RegionOptions::default()).unwrap();
    let me = attach_once_dead(&pool);
    me.put(fresh_key(), &bytes_of(fresh_key(), 1)).unwrap();
    me.put(replaced_key(), &bytes_of(replaced_key(), 2))
        .unwrap();
    drop(me);
    std::process::exit(0);
}

/// One run: a pool holding version 1 of the replaced object, a child that crashes at `site:n`.
/// Returns false when the child finished without reaching it.
fn run(site: &str, n: u32) -> bool {
    let name = format!(
        "cxlkv-objcrash-{}-{}-{n}",
        std::process::id(),
        site.replace(':', "_")
    );
    let spec = format!("shm:{name}");
    let backend: Backend = spec.parse().unwrap();
    let cfg = PoolConfig {
        block_size: BLOCK,
        participants: 1,
        lease: Duration::from_millis(40),
        ..Default::default()
    };
    let pool = Pool::create_on(&backend, 4 << 20, &cfg, &RegionOptions::default()).unwrap();
    {
        let first = pool.attach().unwrap();
        first
            .put(replaced_key(), &bytes_of(replaced_key(), 1))
            .unwrap();
    }
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "objects_crash_worker_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CXLKV_OBJ_ROLE", "worker")
        .env("CXLKV_OBJ_POOL", &spec)
        .env("CXLKV_CRASH_AT", format!("{site}:{n}"))
        .status()
        .unwrap();
    let crashed = match (status.signal(), status.code()) {
        (Some(9), _) => true,
        (_, Some(0)) => false,
        _ => panic!("{site}:{n}: worker ended with {status}"),
    };
    let heir = attach_once_dead(&pool);
    let what = format!("{site}:{n}");
    // Absent or whole: the fresh object is absent or version 1; the replaced one is version 1
    // or 2 (its old version stays until the new manifest is indexed), never partial or mixed.
    let fresh = heir.get(fresh_key()).unwrap().map(|(v, _)| v);
    assert!(
        fresh.is_none() || fresh == Some(bytes_of(fresh_key(), 1)),
        "{what}: fresh object partial"
    );
    let replaced = heir.get(replaced_key()).unwrap().map(|(v, _)| v);
    assert!(
        replaced == Some(bytes_of(replaced_key(), 1))
            || replaced == Some(bytes_of(replaced_key(), 2)),
        "{what}: replaced object absent, partial or mixed"
    );
    if !crashed {
        assert_eq!(fresh, Some(bytes_of(fresh_key(), 1)));
        assert_eq!(replaced, Some(bytes_of(replaced_key(), 2)));
    }
    let report = check(&pool).unwrap();
    assert!(report.ok(), "{what}: {report}");
    if crashed && site == "object:manifest" {
        // Killed with every part of a put indexed and no manifest: three orphans, a note.
        assert_eq!(report.orphan_parts, 3, "{what}: {report}");
    }
    // New puts of both keys work and read back whole.
    for k in [fresh_key(), replaced_key()] {
        heir.put(k, &bytes_of(k, 3)).unwrap();
        assert_eq!(
            heir.get(k).unwrap().unwrap().0,
            bytes_of(k, 3),
            "{what}: re-put"
        );
    }
    let report = check(&pool).unwrap();
    assert!(report.ok(), "{what} after re-put: {report}");
    if crashed && site == "object:manifest" {
        // Orphans are ordinary blocks to eviction: filling the partition reclaims them.
        let blocks = pool.superblock().blocks_per_partition;
        for i in 0..blocks {
            heir.put(Key(u128::from(i) + 1), b"filler").unwrap();
        }
        let report = check(&pool).unwrap();
        assert!(
            report.ok() && report.orphan_parts == 0,
            "{what} after filling: {report}"
        );
    }
    drop(heir);
    drop(pool);
    Region::unlink(&backend).unwrap();
    crashed
}

#[test]
fn crash_at_every_step_of_an_object_put() {
    let mut sites: Vec<&str> = cxlkv::runtime::CRASH_SITES.to_vec();
    sites.extend(cxlkv::runtime::OBJECT_CRASH_SITES);
    let mut runs = 0;
    for site in sites {
        let mut n = 1;
        while run(site, n) {
            n += 1;
            runs += 1;
            assert!(n < 200, "{site}: reached over 200 times");
        }
        assert!(n > 1, "{site}: never reached by an object put");
        eprintln!("{site}: crashed at each of its {} hits", n - 1);
    }
    eprintln!("{runs} crash runs");
}
