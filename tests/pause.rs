//! A writer paused inside a put (issue #16, part 3): a GC pause, SIGSTOP, a VM freeze or a long
//! page fault can hold a writer longer than its lease, a successor takes its partition over, and
//! the writer then resumes mid-put.
//!
//! For every step of a put (`CRASH_SITES`), for puts and for reservations, in both coherence
//! modes: writer A (this test binary re-executed) commits some blocks, then starts one more write
//! that stops itself (`CXLKV_PAUSE_AT`, SIGSTOP) at the step. The parent waits until A is stopped,
//! takes A's partition over once A's heartbeat stood still for a lease (successor B), writes enough
//! blocks to reuse every free block of the partition but one (A's in-flight block among them), and
//! then resumes A (SIGCONT). Then: A's paused write ends `Fenced` unless it had already landed
//! (the last step), A's next put is `Fenced`, every key reads back byte-exact or (only A's paused
//! key, when its write did not land) not at all, and `pool check` passes (library and CLI).
//!
//! Writers are this test binary re-executed with `CXLKV_PAUSE_ROLE=writer`. A SIGSTOPped holder of
//! several partitions, taken over and resumed, is `holder` (issue #24).

use cxlkv::kernels::rng::SplitMix64;
use cxlkv::runtime::region::{Backend, Region, RegionOptions};
use cxlkv::runtime::{
    check, AttachOptions, Codec, CoherenceMode, Key, Participant, Pool, PoolConfig, PoolError,
    CRASH_SITES,
};
use std::io::Write;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod holder;

const BLOCK: u64 = 4096;
/// Blocks A commits before the paused write.
const BEFORE: u64 = 8;
/// Short, so the successor takes over soon, but long enough that the writer's own lease (which a
/// software-coherent writer watches, fencing itself at three quarters) survives a loaded machine.
const LEASE: Duration = Duration::from_millis(500);

fn key_of(who: u64, i: u64) -> Key {
    Key::from_bytes(&[b"pause".as_slice(), &who.to_le_bytes(), &i.to_le_bytes()].concat())
}

/// The payload stored under `key`: length and bytes derived from the key alone.
fn payload_of(key: Key) -> Vec<u8> {
    let mut r = SplitMix64::new(key.lo());
    let len = 1 + r.below(BLOCK - 1) as usize;
    (0..len).map(|_| r.next_u64() as u8).collect()
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

fn attach(pool: &Pool, coherence: CoherenceMode, slot: u32) -> Result<Participant, PoolError> {
    match coherence {
        CoherenceMode::Hardware => pool.attach(),
        CoherenceMode::Software => Participant::attach_slot(pool, slot, AttachOptions::default()),
    }
}

fn outcome<T>(r: Result<T, PoolError>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(PoolError::Fenced { .. }) => "fenced".into(),
        Err(e) => format!("error {e}"),
    }
}

/// Writer A: commits `BEFORE` blocks, then one more write (put or reservation) that pauses itself
/// at `CXLKV_PAUSE_AT`, then one more put. Logs "P i" per commit, "R outcome" and "N outcome".
fn writer() -> ! {
    let backend: Backend = env("CXLKV_PAUSE_POOL").parse().unwrap();
    let coherence = match env("CXLKV_PAUSE_COHERENCE").as_str() {
        "software" => CoherenceMode::Software,
        _ => CoherenceMode::Hardware,
    };
    let reserve = env("CXLKV_PAUSE_WRITE") == "reserve";
    let mut log = std::fs::File::create(env("CXLKV_PAUSE_LOG")).unwrap();
    let pool = Pool::open_on(&backend, &RegionOptions::default()).unwrap();
    let me = attach(&pool, coherence, 0).unwrap();
    assert_eq!(me.partition(), Some(0));
    for i in 0..BEFORE {
        let k = key_of(0, i);
        me.put(k, &payload_of(k)).unwrap();
        writeln!(log, "P {i}").unwrap();
    }
    let k = key_of(0, BEFORE);
    let v = payload_of(k);
    let r = if reserve {
        me.reserve(k, v.len() as u64, Codec::Raw).and_then(|mut r| {
            // After a pause at the reservation's allocation, these in-place stores land late.
            r.write(0, &v)?;
            r.commit()
        })
    } else {
        me.put(k, &v)
    };
    writeln!(log, "R {}", outcome(r)).unwrap();
    let k = key_of(0, BEFORE + 1);
    writeln!(log, "N {}", outcome(me.put(k, &payload_of(k)))).unwrap();
    drop(me);
    std::process::exit(0)
}

/// Entry point of re-executed writers; a no-op in a normal test run.
#[test]
fn pause_writer_entry() {
    if std::env::var("CXLKV_PAUSE_ROLE").as_deref() == Ok("writer") {
        writer();
    }
}

fn process_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": the state follows the last ')'.
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

fn wait_exit(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: writer hung");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Attaches the successor through `pool` until it owns partition 0 (A's): the first attempt starts
/// this handle's watch of A, which finds A dead once its heartbeat stood still for a lease.
fn take_over(pool: &Pool, coherence: CoherenceMode, what: &str) -> Participant {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match attach(pool, coherence, 1) {
            Ok(p) if p.partition() == Some(0) => return p,
            Ok(_) | Err(PoolError::NoFreeParticipant(_)) => {}
            // Software-coherent: our previous attempt's participant, if its own lease lapsed on a
            // loaded machine, left its slot without a word (presumed dead); it frees in a lease.
            Err(PoolError::BadConfig(m)) if m.contains("held by a live participant") => {}
            Err(e) => panic!("{what}: attach: {e}"),
        }
        assert!(Instant::now() < deadline, "{what}: no takeover");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn pause_case(coherence: CoherenceMode, write: &str, site: &str, case: usize) {
    let what = format!("{coherence:?} {write} paused at {site}");
    let name = format!("cxlkv-pause-{}-{case}", std::process::id());
    let spec = format!("shm:{name}");
    let backend: Backend = spec.parse().unwrap();
    let cfg = PoolConfig {
        block_size: BLOCK,
        participants: 2,
        partitions: Some(1),
        lease: LEASE,
        coherence,
        ..Default::default()
    };
    let pool = Pool::create_on(&backend, 2 << 20, &cfg, &RegionOptions::default()).unwrap();
    let blocks = u64::from(pool.superblock().blocks_per_partition);
    assert!(blocks >= BEFORE + 8, "{blocks} blocks per partition");
    let log = std::env::temp_dir().join(format!("{name}.log"));
    let mut a = Writer(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "pause_writer_entry", "--nocapture"])
            .args(["--test-threads=1"])
            .env("CXLKV_PAUSE_ROLE", "writer")
            .env("CXLKV_PAUSE_POOL", &spec)
            .env(
                "CXLKV_PAUSE_COHERENCE",
                if coherence == CoherenceMode::Software {
                    "software"
                } else {
                    "hardware"
                },
            )
            .env("CXLKV_PAUSE_WRITE", write)
            .env("CXLKV_PAUSE_LOG", &log)
            // Every step is reached once per put before the paused one.
            .env("CXLKV_PAUSE_AT", format!("{site}:{}", BEFORE + 1))
            .spawn()
            .unwrap(),
    );
    let a = &mut a.0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while process_state(a.id()) != Some('T') {
        if let Some(s) = a.try_wait().unwrap() {
            panic!("{what}: writer exited before pausing: {s}");
        }
        assert!(Instant::now() < deadline, "{what}: writer never paused");
        std::thread::sleep(Duration::from_millis(2));
    }

    // The successor takes the partition over while A is stopped and reuses every free block but
    // one: the in-flight block of A is the lowest free one, the first a successor would reuse.
    let successor_pool = Pool::open_on(&backend, &RegionOptions::default()).unwrap();
    let b = take_over(&successor_pool, coherence, &what);
    assert_eq!(b.recovery.took_over_from, Some(0), "{what}");
    // What the successor found: A's blocks, and what A had in flight quarantined.
    let (live, quarantined_blocks, quarantined_slots) = match site {
        // Nothing claimed yet: A's late claim must fail (the successor reuses the block first).
        "claim:read" => (BEFORE, 0, 0),
        // Claimed, not committed: A may still store into it.
        "put:allocated" | "put:payload" => (BEFORE, 1, 0),
        // Committed, not indexed: free for the successor; A's late index write must fail.
        "put:header" => (BEFORE, 0, 0),
        // Slot odd: quarantined; fields not written yet, so nothing to re-home.
        "slot:odd" => (BEFORE, 0, 1),
        // Slot odd with its fields written: quarantined, and the committed block re-homed.
        "slot:fields" => (BEFORE + 1, 0, 1),
        "put:indexed" => (BEFORE + 1, 0, 0),
        _ => unreachable!("{site}"),
    };
    let rec = &b.recovery;
    assert_eq!(
        (rec.blocks, rec.quarantined_blocks, rec.quarantined_slots),
        (live, quarantined_blocks, quarantined_slots),
        "{what}: {rec:?}"
    );
    let b_keys: Vec<Key> = (0..blocks - BEFORE - 1).map(|j| key_of(1, j)).collect();
    for &k in &b_keys {
        b.put(k, &payload_of(k))
            .unwrap_or_else(|e| panic!("{what}: successor put: {e}"));
    }

    // A resumes mid-put.
    // SAFETY: kill(2) of our own child with SIGCONT has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(a.id() as i32, libc::SIGCONT) }, 0);
    let status = wait_exit(a, &what);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{what}: writer failed: {status}\n{text}");
    let committed = text.lines().filter(|l| l.starts_with("P ")).count() as u64;
    assert_eq!(committed, BEFORE, "{what}: {text}");
    let landed = site == "put:indexed";
    // A's paused write either landed before the takeover (the last step), was re-homed by the
    // successor (its slot's fields were written), or is nowhere.
    let visible = landed || site == "slot:fields";
    let expect_r = if landed { "R ok" } else { "R fenced" };
    assert!(text.contains(expect_r), "{what}: paused write: {text}");
    assert!(text.contains("N fenced"), "{what}: next put: {text}");

    // Every byte read is right; everything committed before the pause or by the successor reads
    // back; the paused write reads back exactly if it had landed.
    let mut wrong = Vec::new();
    let mut lost = Vec::new();
    let reader = Pool::open_on(&backend, &RegionOptions::default()).unwrap();
    let a_keys = (0..BEFORE).map(|i| (key_of(0, i), true));
    let paused = std::iter::once((key_of(0, BEFORE), visible));
    let next = std::iter::once((key_of(0, BEFORE + 1), false));
    let b_all = b_keys.iter().map(|&k| (k, true));
    for (k, must) in a_keys.chain(paused).chain(b_all) {
        match reader.get(k).unwrap() {
            Some((v, _)) if v != payload_of(k) => wrong.push(k),
            None if must => lost.push(k),
            _ => {}
        }
    }
    for (k, _) in next {
        if reader.get(k).unwrap().is_some() {
            wrong.push(k);
        }
    }
    if !visible {
        assert!(
            reader.get(key_of(0, BEFORE)).unwrap().is_none(),
            "{what}: the fenced write became visible"
        );
    }
    assert!(
        wrong.is_empty(),
        "{what}: {} keys read wrong bytes",
        wrong.len()
    );
    assert!(
        lost.is_empty(),
        "{what}: {} committed keys lost",
        lost.len()
    );
    let report = check(&reader).unwrap();
    assert!(report.ok(), "{what}: {report}");
    assert_eq!(
        (report.quarantined_blocks, report.quarantined_slots),
        (quarantined_blocks, quarantined_slots),
        "{what}: {report}"
    );
    let cli = Command::new(env!("CARGO_BIN_EXE_cxlkv"))
        .args(["pool", "check", &spec])
        .output()
        .unwrap();
    assert!(
        cli.status.success(),
        "{what}: cxlkv pool check: {}{}",
        String::from_utf8_lossy(&cli.stdout),
        String::from_utf8_lossy(&cli.stderr)
    );
    // The successor goes on writing.
    let k = key_of(1, blocks);
    b.put(k, &payload_of(k)).unwrap();
    assert_eq!(reader.get(k).unwrap().unwrap().0, payload_of(k));
    drop(b);
    drop((pool, successor_pool, reader));
    Region::unlink(&backend).unwrap();
    let _ = std::fs::remove_file(&log);
}

/// The writer process; killed (also when stopped) if a case fails before it exited.
struct Writer(Child);

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs every case, then fails naming each case that failed (each printed its own panic).
fn pause_at_every_step(coherence: CoherenceMode) {
    let mut case = 0;
    let mut failed = Vec::new();
    for write in ["put", "reserve"] {
        for site in CRASH_SITES {
            if write == "reserve" && site == "put:payload" {
                continue; // a reservation's payload is the caller's in-place writes
            }
            let id = case + 100 * coherence as usize;
            if std::panic::catch_unwind(|| pause_case(coherence, write, site, id)).is_err() {
                failed.push(format!("{write} at {site}"));
                let spec = format!("shm:cxlkv-pause-{}-{id}", std::process::id());
                let _ = Region::unlink(&spec.parse::<Backend>().unwrap());
            }
            case += 1;
        }
    }
    assert!(failed.is_empty(), "{coherence:?}: failed cases: {failed:?}");
}

#[test]
fn writer_paused_in_a_put_cannot_land_after_a_takeover() {
    pause_at_every_step(CoherenceMode::Hardware);
}

#[test]
fn writer_paused_in_a_put_cannot_land_after_a_takeover_software_coherent() {
    pause_at_every_step(CoherenceMode::Software);
}

#[test]
fn holder_entry() {
    holder::holder_if_asked();
}

/// A SIGSTOPped holder of several partitions: all taken over, its next put after SIGCONT fenced,
/// every committed block readable.
#[test]
fn a_stopped_holder_of_several_partitions_is_taken_over_and_fenced() {
    holder::holder_of_several_partitions(holder::Strike::Stop, "holder_entry");
}
