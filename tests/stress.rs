//! Multi-process stress test of the shared pool (the pool issue's acceptance test).
//!
//! Four worker processes attach one `/dev/shm` pool; each puts keys whose payload is derived from
//! the key (replacing them over and over, so blocks are freed and reused all the time) and gets
//! random keys of every worker, verifying every byte of every hit. The parent SIGKILLs workers at
//! random moments — mid-put included — and respawns them; a respawned worker must watch the dead
//! one's heartbeat stand still for a lease (its watch starts with its first attach), then takes
//! over its slot and partition. Afterwards: no reader saw a wrong
//! byte, `cxlkv pool check` passes, and every key any worker logged as committed (the killed ones
//! included) reads back exactly.
//!
//! Workers are this test binary re-executed with `CXLKV_STRESS_ROLE=worker`. A holder of several
//! partitions SIGKILLed mid-put is `holder` (issue #24).

use cxlkv::kernels::rng::SplitMix64;
use cxlkv::runtime::region::{Backend, Region, RegionOptions};
use cxlkv::runtime::{check, CoherenceMode, Key, Pool, PoolConfig, PoolError};
use cxlkv_test_support::attach_once_dead;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod holder;

const WORKERS: u32 = 4;
const KEYS_PER_INCARNATION: u64 = 150;
const BLOCK: u64 = 16 << 10;

fn key_of(worker: u64, incarnation: u64, i: u64) -> Key {
    Key::from_bytes(
        &[
            worker.to_le_bytes(),
            incarnation.to_le_bytes(),
            i.to_le_bytes(),
        ]
        .concat(),
    )
}

/// The payload every writer stores under `key`: length and bytes derived from the key alone.
fn payload_of(key: Key) -> Vec<u8> {
    let mut r = SplitMix64::new(key.lo());
    let len = 1 + r.below(BLOCK - 1) as usize;
    (0..len).map(|_| r.next_u64() as u8).collect()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// Worker body: runs only when re-executed by the test.
fn worker() -> ! {
    let backend: Backend = env("CXLKV_STRESS_POOL").parse().unwrap();
    let w: u64 = env("CXLKV_STRESS_WORKER").parse().unwrap();
    let inc: u64 = env("CXLKV_STRESS_INCARNATION").parse().unwrap();
    let until: u64 = env("CXLKV_STRESS_UNTIL_MS").parse().unwrap();
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(env("CXLKV_STRESS_LOG"))
        .unwrap();
    let pool = Pool::open_on(&backend, &RegionOptions::default()).unwrap();
    let me = loop {
        match pool.attach() {
            Ok(p) => break p,
            // All slots held: retry through the same pool handle, whose watch finds the dead
            // participant dead once its heartbeat stood still for a lease.
            Err(PoolError::NoFreeParticipant(_)) if now_ms() < until => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("attach: {e}"),
        }
    };
    let rec = &me.recovery;
    writeln!(
        log,
        "A {} {:?} {:?} {} {}",
        me.id(),
        me.partition(),
        rec.took_over_from,
        rec.blocks,
        rec.repaired_slots
    )
    .unwrap();
    let mut rng = SplitMix64::new((w << 32) ^ inc);
    let mut committed = vec![false; KEYS_PER_INCARNATION as usize];
    // Payloads made up front so that the loop is mostly puts and gets (kills land inside them).
    let mine: Vec<Vec<u8>> = (0..KEYS_PER_INCARNATION)
        .map(|s| payload_of(key_of(w, inc, s)))
        .collect();
    let mut i = 0u64;
    let mut buf = vec![0u8; BLOCK as usize];
    while now_ms() < until {
        // Put (replacing earlier versions of the same key: blocks are freed and reused).
        let slot = i % KEYS_PER_INCARNATION;
        let key = key_of(w, inc, slot);
        me.put(key, &mine[slot as usize]).unwrap();
        if !committed[slot as usize] {
            committed[slot as usize] = true;
            writeln!(log, "P {w} {inc} {slot}").unwrap();
        }
        i += 1;
        // Get a random key of a random worker and incarnation; verify every byte of a hit.
        let (ow, oi, os) = (
            rng.below(u64::from(WORKERS)),
            rng.below(4),
            rng.below(KEYS_PER_INCARNATION),
        );
        let k = key_of(ow, oi, os);
        if let Some(info) = me.get_into(k, &mut buf).unwrap() {
            let expect = if (ow, oi) == (w, inc) {
                mine[os as usize].clone()
            } else {
                payload_of(k)
            };
            if buf[..info.len as usize] != expect[..] {
                writeln!(log, "BAD {ow} {oi} {os}").unwrap();
                std::process::exit(3);
            }
        }
    }
    writeln!(log, "D {i} {:?}", me.stats()).unwrap();
    drop(me);
    std::process::exit(0)
}

fn spawn(pool: &str, w: u32, inc: u64, until: u64, log: &Path) -> Child {
    spawn_with(pool, w, inc, until, log, None)
}

fn spawn_with(
    pool: &str,
    w: u32,
    inc: u64,
    until: u64,
    log: &Path,
    crash_at: Option<&str>,
) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    if let Some(c) = crash_at {
        cmd.env("CXLKV_CRASH_AT", c);
    }
    cmd.args([
        "--exact",
        "stress_worker_entry",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("CXLKV_STRESS_ROLE", "worker")
    .env("CXLKV_STRESS_POOL", pool)
    .env("CXLKV_STRESS_WORKER", w.to_string())
    .env("CXLKV_STRESS_INCARNATION", inc.to_string())
    .env("CXLKV_STRESS_UNTIL_MS", until.to_string())
    .env("CXLKV_STRESS_LOG", log)
    .spawn()
    .unwrap()
}

/// Reads a worker log: the committed keys ("P" lines) and the recovery lines ("A").
fn committed_keys(text: &str) -> Vec<Key> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[0] == "P").then(|| {
                key_of(
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                    f[3].parse().unwrap(),
                )
            })
        })
        .collect()
}

/// Kills a writer at every step of the write protocol (payload written, header written, index slot
/// odd, slot fields written, indexed), then checks that a new participant takes the partition
/// over, repairs what the crash left, and that every committed key reads back exactly.
#[test]
fn crash_at_every_step_of_a_put() {
    use std::os::unix::process::ExitStatusExt;
    for (i, site) in cxlkv::runtime::CRASH_SITES.iter().enumerate() {
        let name = format!("cxlkv-crash-{}-{i}", std::process::id());
        let spec = format!("shm:{name}");
        let backend: Backend = spec.parse().unwrap();
        let cfg = PoolConfig {
            block_size: BLOCK,
            participants: 1,
            lease: Duration::from_millis(100),
            ..Default::default()
        };
        let pool = Pool::create_on(&backend, 32 << 20, &cfg, &RegionOptions::default()).unwrap();
        let log = std::env::temp_dir().join(format!("{name}.log"));
        // The 37th time: well into the run, after 36 committed puts.
        let mut child = spawn_with(
            &spec,
            0,
            0,
            now_ms() + 20_000,
            &log,
            Some(&format!("{site}:37")),
        );
        let status = child.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(9),
            "{site}: worker should die by SIGKILL, got {status}"
        );
        let keys = committed_keys(&std::fs::read_to_string(&log).unwrap());
        assert!(
            keys.len() >= 30,
            "{site}: {} keys committed before the crash",
            keys.len()
        );
        let heir = attach_once_dead(&pool);
        assert_eq!(
            heir.recovery.took_over_from,
            Some(0),
            "{site}: partition taken over"
        );
        if site.starts_with("slot:") {
            assert_eq!(
                heir.recovery.repaired_slots, 1,
                "{site}: the half-written slot is repaired"
            );
        }
        for &k in &keys {
            assert_eq!(
                pool.get(k).unwrap().map(|(v, _)| v),
                Some(payload_of(k)),
                "{site}: committed key lost or wrong"
            );
        }
        let report = check(&pool).unwrap();
        assert!(report.ok(), "{site}: {report}");
        // The heir keeps writing in the repaired partition.
        for s in 0..KEYS_PER_INCARNATION {
            let k = key_of(9, 9, s);
            heir.put(k, &payload_of(k)).unwrap();
            assert_eq!(heir.get(k).unwrap().unwrap().0, payload_of(k));
        }
        assert!(check(&pool).unwrap().ok());
        drop(heir);
        drop(pool);
        Region::unlink(&backend).unwrap();
        let _ = std::fs::remove_file(&log);
    }
}

/// Entry point of re-executed workers; a no-op in a normal test run.
#[test]
fn stress_worker_entry() {
    if std::env::var("CXLKV_STRESS_ROLE").as_deref() == Ok("worker") {
        worker();
    }
}

#[test]
fn holder_entry() {
    holder::holder_if_asked();
}

/// A SIGKILLed holder of several partitions: all taken over, every committed block readable.
#[test]
fn a_killed_holder_of_several_partitions_is_taken_over_whole() {
    holder::holder_of_several_partitions(holder::Strike::Kill, "holder_entry");
}

#[test]
fn processes_share_a_pool_through_sigkills() {
    stress(CoherenceMode::Hardware);
}

/// The same run on a software-coherent pool: every publish writes lines back (CLWB, CLFLUSHOPT or
/// CLFLUSH) and every acquire invalidates them, on real memory.
#[test]
fn processes_share_a_software_coherent_pool_through_sigkills() {
    stress(CoherenceMode::Software);
}

fn stress(coherence: CoherenceMode) {
    let name = format!("cxlkv-stress-{}-{}", std::process::id(), coherence as u32);
    let spec = format!("shm:{name}");
    let backend: Backend = spec.parse().unwrap();
    let cfg = PoolConfig {
        block_size: BLOCK,
        participants: WORKERS,
        // A software-coherent worker fences itself three quarters of a lease after its last beat:
        // 400 ms leaves a heartbeat thread 250 ms of scheduling delay on a loaded machine.
        lease: Duration::from_millis(400),
        coherence,
        ..Default::default()
    };
    let pool = Pool::create_on(&backend, 96 << 20, &cfg, &RegionOptions::default()).unwrap();
    assert_eq!(pool.superblock().coherence, coherence as u32);
    assert!(
        pool.superblock().blocks_per_partition as u64 >= 4 * KEYS_PER_INCARNATION + 50,
        "no eviction: every committed key must stay"
    );
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    let log = |w: u32, inc: u64| -> PathBuf { dir.join(format!("w{w}-i{inc}.log")) };

    let seconds: u64 = std::env::var("CXLKV_STRESS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let until = now_ms() + seconds * 1000;
    let mut children: Vec<(u32, u64, Child)> = (0..WORKERS)
        .map(|w| (w, 0, spawn(&spec, w, 0, until, &log(w, 0))))
        .collect();
    let mut rng = SplitMix64::new(now_ms());
    let kills = 3;
    let mut killed = Vec::new();
    for _ in 0..kills {
        // The last kill leaves a respawned worker at least 900 ms to watch its predecessor for a
        // lease (400 ms) and attach.
        std::thread::sleep(Duration::from_millis(
            200 + rng.below((seconds * 1000 - 1500) / kills),
        ));
        let idx = rng.below(children.len() as u64) as usize;
        let (w, inc, mut child) = children.swap_remove(idx);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        killed.push((w, inc));
        children.push((
            w,
            inc + 1,
            spawn(&spec, w, inc + 1, until, &log(w, inc + 1)),
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(seconds + 30);
    for (w, inc, mut c) in children {
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "worker {w}.{inc} hung");
            std::thread::sleep(Duration::from_millis(20));
        };
        let text = std::fs::read_to_string(log(w, inc)).unwrap_or_default();
        assert!(
            !text.contains("BAD"),
            "worker {w}.{inc} read wrong bytes:\n{text}"
        );
        assert!(status.success(), "worker {w}.{inc} failed: {status}");
    }

    // Every committed key of every incarnation (killed ones too) reads back exactly.
    let mut committed = 0;
    let mut takeovers = 0;
    let mut repaired = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.first() {
                Some(&"P") if f.len() == 4 => {
                    let key = key_of(
                        f[1].parse().unwrap(),
                        f[2].parse().unwrap(),
                        f[3].parse().unwrap(),
                    );
                    let (v, _) = pool
                        .get(key)
                        .unwrap()
                        .unwrap_or_else(|| panic!("committed key {line} lost"));
                    assert_eq!(v, payload_of(key), "key {line} reads wrong bytes");
                    committed += 1;
                }
                Some(&"A") if f.len() == 6 => {
                    takeovers += usize::from(f[3].starts_with("Some"));
                    repaired += f[5].parse::<u64>().unwrap();
                }
                _ => {}
            }
        }
    }
    eprintln!("stress: {committed} committed keys verified, {} kills, {takeovers} takeovers, {repaired} index slots repaired", killed.len());
    assert!(
        takeovers >= 1,
        "a killed participant's partition must be taken over"
    );
    assert!(committed > 0);

    holder::checks_clean(&pool, &spec);
    drop(pool);
    Region::unlink(&backend).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
