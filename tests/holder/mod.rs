//! A holder of several partitions (issue #24), SIGKILLed (`tests/stress.rs`) or SIGSTOPped
//! (`tests/pause.rs`): the holder (the test binary re-executed with `CXLKV_HOLDER_ROLE=holder`)
//! puts keys until it holds at least three partitions, then keeps putting. The parent kills or
//! stops it mid-put, takes every partition it held over (each once the holder's slots were
//! watched standing still for a lease), and then checks that every key the holder logged as
//! committed reads back byte-exact and `pool check` passes (library and CLI). A stopped holder is
//! resumed after the takeover: its next put must be `Fenced`.

use cxlkv::kernels::rng::SplitMix64;
use cxlkv::runtime::region::{Backend, Region, RegionOptions};
use cxlkv::runtime::{check, Key, Participant, Pool, PoolConfig, PoolError};
use std::io::Write;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const BLOCK: u64 = 16 << 10;
/// Partitions the holder holds before the parent strikes.
const HOLD: usize = 3;

fn key_of(i: u64) -> Key {
    Key::from_bytes(&[b"holder".as_slice(), &i.to_le_bytes()].concat())
}

fn payload_of(key: Key) -> Vec<u8> {
    let mut r = SplitMix64::new(key.lo());
    let len = 1 + r.below(BLOCK - 1) as usize;
    (0..len).map(|_| r.next_u64() as u8).collect()
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// The holder's body: runs only when re-executed by the test (`entry` names its test function).
pub fn holder_if_asked() {
    if std::env::var("CXLKV_HOLDER_ROLE").as_deref() != Ok("holder") {
        return;
    }
    let backend: Backend = env("CXLKV_HOLDER_POOL").parse().unwrap();
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(env("CXLKV_HOLDER_LOG"))
        .unwrap();
    let pool = Pool::open_on(&backend, &RegionOptions::default()).unwrap();
    let me = pool.attach().unwrap();
    // Keys 0.. until it holds HOLD partitions, then the same keys again (replacing them, so that
    // nothing committed is evicted).
    let mut said: Option<u64> = None;
    for n in 0.. {
        let i = said.map_or(n, |count| n % count);
        let key = key_of(i);
        match me.put(key, &payload_of(key)) {
            Ok(_) => writeln!(log, "P {i}").unwrap(),
            Err(PoolError::Fenced { .. }) => {
                writeln!(log, "F {i}").unwrap();
                std::process::exit(0);
            }
            Err(e) => panic!("put {i}: {e}"),
        }
        let held = me.partitions();
        if said.is_none() && held.len() >= HOLD {
            let list: Vec<String> = held.iter().map(|p| p.to_string()).collect();
            writeln!(log, "H {}", list.join(" ")).unwrap();
            said = Some(n + 1);
        }
        if said.is_some() {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    unreachable!()
}

/// How the parent strikes the holder (each including test binary uses one).
#[allow(dead_code)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Strike {
    Kill,
    Stop,
}

/// The scenario of the module; `entry` is the test function that calls [`holder_if_asked`].
pub fn holder_of_several_partitions(strike: Strike, entry: &str) {
    let name = format!("cxlkv-holder-{}-{}", std::process::id(), strike as u32);
    let spec = format!("shm:{name}");
    let backend: Backend = spec.parse().unwrap();
    let cfg = PoolConfig {
        block_size: BLOCK,
        participants: 16,
        partitions: Some(8),
        lease: Duration::from_millis(400),
        ..Default::default()
    };
    let pool = Pool::create_on(&backend, 12 << 20, &cfg, &RegionOptions::default()).unwrap();
    let log = std::env::temp_dir().join(format!("{name}.log"));
    let _ = std::fs::remove_file(&log);
    let mut child: Child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", entry, "--nocapture", "--test-threads=1"])
        .env("CXLKV_HOLDER_ROLE", "holder")
        .env("CXLKV_HOLDER_POOL", &spec)
        .env("CXLKV_HOLDER_LOG", &log)
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let held: Vec<u32> = loop {
        if let Some(l) = read_log().lines().find(|l| l.starts_with("H ")) {
            break l[2..].split(' ').map(|p| p.parse().unwrap()).collect();
        }
        assert!(child.try_wait().unwrap().is_none(), "holder exited early");
        assert!(
            Instant::now() < deadline,
            "holder never held {HOLD} partitions"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(held.len() >= HOLD, "{held:?}");
    std::thread::sleep(Duration::from_millis(20)); // mid-put, most likely
    let pid = child.id() as i32;
    match strike {
        Strike::Kill => {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
        }
        // SAFETY: kill(2) of our own child has no memory-safety preconditions.
        Strike::Stop => assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0),
    }

    // Take every partition over: attach until each is ours (free ones come first; the held ones
    // once this handle watched the holder's slots stand still for a lease).
    let mut successors: Vec<Participant> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while successors.len() < pool.superblock().partitions as usize {
        assert!(
            Instant::now() < deadline,
            "partitions {held:?} not taken over"
        );
        match pool.attach() {
            Ok(p) if p.partition().is_some() => successors.push(p),
            Ok(_) | Err(PoolError::NoFreeParticipant(_)) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("attach: {e}"),
        }
    }
    for p in &held {
        let s = successors
            .iter()
            .find(|s| s.partition() == Some(*p))
            .unwrap_or_else(|| panic!("partition {p} not taken over"));
        assert!(s.recovery.took_over_from.is_some(), "partition {p}");
    }

    if strike == Strike::Stop {
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "resumed holder hung");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "holder failed: {status}\n{}", read_log());
        assert!(
            read_log().lines().any(|l| l.starts_with("F ")),
            "a resumed holder's put must be fenced"
        );
    }

    let committed: Vec<u64> = read_log()
        .lines()
        .filter_map(|l| l.strip_prefix("P ").map(|i| i.parse().unwrap()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(committed.len() as u64 >= HOLD as u64);
    for &i in &committed {
        let key = key_of(i);
        let (v, _) = pool
            .get(key)
            .unwrap()
            .unwrap_or_else(|| panic!("committed key {i} lost"));
        assert_eq!(v, payload_of(key), "key {i} reads wrong bytes");
    }
    eprintln!(
        "holder: {} partitions {held:?} taken over, {} committed keys verified",
        held.len(),
        committed.len()
    );
    checks_clean(&pool, &spec);
    drop(successors);
    drop(pool);
    Region::unlink(&backend).unwrap();
    let _ = std::fs::remove_file(&log);
}

/// `pool check` finds no damage in `pool` (at `spec`), through the library and through the CLI.
pub fn checks_clean(pool: &Pool, spec: &str) {
    let report = check(pool).unwrap();
    assert!(report.ok(), "{report}");
    let cli = Command::new(env!("CARGO_BIN_EXE_cxlkv"))
        .args(["pool", "check", spec])
        .output()
        .unwrap();
    assert!(
        cli.status.success(),
        "cxlkv pool check failed:\n{}",
        String::from_utf8_lossy(&cli.stdout)
    );
}
