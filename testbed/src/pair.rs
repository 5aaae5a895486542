//! Scenario 5: two QEMU guests (two kernels, two clocks) on one ivshmem region at once, the device
//! on the host.
//!
//! Guest A formats the pool and parks a prefix of typed KV blocks; guest B finds it with
//! `lookup_prefix` and reads it byte-exact. Both send SCORE_TOPK to the host's `cxlkv-ndpd` at the
//! same time and compare every answer with the host reference. A then says `CXLKV-TB KILL-ME`,
//! keeps committing small blocks, and the test-bed script kills its QEMU process (SIGKILL). B
//! watches A's heartbeat counter on its own monotonic clock, declares A dead once it stood still
//! for a lease, takes A's slot and partition over (`attach_slot`) and reads back every block A
//! committed. The guests' wall clocks differ by hours (QEMU `-rtc base=`) and B steps its own
//! during the watch; each prints the differences it observes. Every party attaches to a fixed slot
//! (`attach_slot`), as hosts of a software-coherent pool do; `--coherence` picks the pool's mode.

use crate::common::{flag, ms, pct, request, same_topk, wait_key, Res, DIM, GROUP, HEADS, TOPK};
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::{DType, ScoreKernel};
use cxlkv_runtime::clock::{system_monotonic_ns, system_now_ns};
use cxlkv_runtime::locate::{self, SCAN_ALIGN};
use cxlkv_runtime::ndp::{
    host_score_topk, now_ns, reg, BlockSpec, DeviceLayout, NdpDevice, NdpOptions, NdpPath,
};
use cxlkv_runtime::participant::participant_liveness;
use cxlkv_runtime::watch::Liveness;
use cxlkv_runtime::{
    kv, AttachOptions, Backend, CoherenceMode, Key, KeyChain, KvShape, Participant, Pool,
    PoolConfig, Region, RegionOptions,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Participant slots (and so partitions): guest A, guest B, the host.
pub const SLOT_A: u32 = 0;
pub const SLOT_B: u32 = 1;
pub const SLOT_HOST: u32 = 2;
/// Typed KV blocks of the parked prefix, tokens per block.
const PREFIX_BLOCKS: usize = 4;
const PREFIX_TOKENS: usize = 64;
/// The prefix's sequence id (the device checks it against every block).
const SEQ: u64 = 55;
/// SCORE_TOPK commands per guest.
const SCORES: usize = 8;
/// Small blocks A commits after asking to be killed (it is killed among them, or after).
const TAIL: usize = 200;
const TAIL_LEN: usize = 1024;

/// The pool both guests use.
pub fn pool_config(coherence: CoherenceMode, lease: Duration) -> PoolConfig {
    PoolConfig {
        block_size: 64 << 10,
        participants: 4,
        partitions: Some(4),
        lease,
        coherence,
        ..Default::default()
    }
}

fn prefix_tokens() -> Vec<u32> {
    (0..(PREFIX_BLOCKS * PREFIX_TOKENS) as u32)
        .map(|t| t.wrapping_mul(2_654_435_761) % 49_152)
        .collect()
}

fn prefix_keys() -> Vec<Key> {
    KeyChain::new("testbed-pair", "synthetic-2x64", 0, 0).keys(&prefix_tokens(), PREFIX_TOKENS)
}

/// Prefix block `b`: shape, K and V (deterministic).
fn prefix_block(b: usize) -> (KvShape, Vec<u8>, Vec<u8>) {
    let mut rng = SplitMix64::new(5000 + b as u64);
    let k = rng.key_bytes(HEADS * PREFIX_TOKENS, DIM, DType::F16);
    let v = rng.key_bytes(HEADS * PREFIX_TOKENS, DIM, DType::F16);
    let shape = KvShape {
        dtype: DType::F16,
        layer: 0,
        kv_heads: HEADS as u32,
        head_dim: DIM as u32,
        tokens: PREFIX_TOKENS as u32,
        sequence: SEQ,
        token_offset: (b * PREFIX_TOKENS) as u64,
    };
    (shape, k, v)
}

fn prefix_specs() -> Vec<BlockSpec> {
    prefix_keys()
        .into_iter()
        .enumerate()
        .map(|(b, key)| BlockSpec {
            key,
            token_offset: (b * PREFIX_TOKENS) as u64,
        })
        .collect()
}

fn tail_key(i: usize) -> Key {
    Key::from_bytes(format!("testbed/pair/a-tail/{i}").as_bytes())
}

fn tail_payload(i: usize) -> Vec<u8> {
    let mut rng = SplitMix64::new(9000 + i as u64);
    (0..TAIL_LEN).map(|_| rng.next_u64() as u8).collect()
}

/// Stores this party's clocks under `pair/clock/<who>`: wall ns, CLOCK_BOOTTIME ns.
pub fn stamp_clock(p: &Participant, who: &str) -> Res<()> {
    let mut b = system_now_ns().to_le_bytes().to_vec();
    b.extend_from_slice(&system_monotonic_ns().to_le_bytes());
    p.put(flag(&format!("pair/clock/{who}")), &b)?;
    Ok(())
}

/// `who`'s wall clock and boot clock minus ours, in seconds (the stamp's age included).
fn clock_diff(p: &Participant, who: &str, timeout: Duration) -> Res<(f64, f64)> {
    let b = wait_key(p, flag(&format!("pair/clock/{who}")), timeout, who)?;
    let word = |i: usize| -> Res<i128> {
        let w: [u8; 8] = b
            .get(8 * i..8 * i + 8)
            .and_then(|s| s.try_into().ok())
            .ok_or("short clock stamp")?;
        Ok(i128::from(u64::from_le_bytes(w)))
    };
    let wall = (word(0)? - i128::from(system_now_ns())) as f64 / 1e9;
    let boot = (word(1)? - i128::from(system_monotonic_ns())) as f64 / 1e9;
    Ok((wall, boot))
}

// ------------------------------------------------------------------------------------------------
// Both guests

/// Sends SCORE_TOPK commands at the same time as the other guest (both wait for each other's
/// ready flag first) and checks each against the host reference.
fn concurrent_scores(
    p: &Arc<Participant>,
    me: &str,
    other: &str,
    timeout: Duration,
) -> Res<String> {
    let opts = NdpOptions {
        timeout: Duration::from_secs(20),
        // The host device's heartbeat is watched on this guest's clock, never compared with it.
        stale_after: Duration::from_secs(5),
        // A futex wake does not cross the VM boundary: poll the completion ring.
        spin: Duration::from_secs(20),
        ..NdpOptions::default()
    };
    let mut dev = NdpDevice::open(p.clone(), opts)?;
    let t = Instant::now();
    loop {
        match dev.device_state()? {
            Ok(_) => break,
            Err(why) if t.elapsed() > timeout => {
                return Err(format!("no live device after {timeout:?}: {why:?}").into());
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    // What the old rule (heartbeat_ns against this guest's wall clock) would have concluded.
    let mem = p.pool().memory().clone();
    let hb = mem.load_u64(
        DeviceLayout::of(p.pool()).regs + reg::HEARTBEAT,
        Ordering::Acquire,
    )?;
    let age_s = (i128::from(now_ns()) - i128::from(hb)) as f64 / 1e9;
    let old_rule = if age_s > 0.5 { "dead" } else { "alive" };
    p.put(flag(&format!("pair/{me}-ndp-ready")), b"ready")?;
    wait_key(
        p,
        flag(&format!("pair/{other}-ndp-ready")),
        timeout,
        &format!("{other}'s device phase"),
    )?;
    let blocks = prefix_specs();
    let kernel = ScoreKernel::detect();
    let seed = if me == "a" { 100 } else { 200 };
    let mut lat = Vec::with_capacity(SCORES);
    let t = Instant::now();
    for i in 0..SCORES {
        let q = SplitMix64::new(seed + i as u64).normal_vec(GROUP * DIM);
        let req = request(&q, &blocks, SEQ);
        let t1 = Instant::now();
        let got = dev.score_topk(&req)?;
        lat.push(t1.elapsed().as_secs_f64() * 1e6);
        if got.stats.path != Some(NdpPath::Device) {
            return Err(format!(
                "SCORE_TOPK {i} ran on {:?}, not on the device",
                got.stats.path
            )
            .into());
        }
        let reference = host_score_topk(p.pool(), &req, kernel)?;
        same_topk(&got, &reference).map_err(|e| format!("SCORE_TOPK {i}: {e}"))?;
    }
    let took = t.elapsed();
    // The other guest had started (its ready flag came first); if it has not finished either,
    // the two loops overlapped.
    let overlapped = p.get(flag(&format!("pair/{other}-ndp-done")))?.is_none();
    p.put(flag(&format!("pair/{me}-ndp-done")), b"done")?;
    Ok(format!(
        "SCORE_TOPK(n={SCORES},{PREFIX_BLOCKS}x{PREFIX_TOKENS}tok,G={GROUP},k={TOPK}) p50={:.0}us p99={:.0}us in {:.0}ms, equal to host reference, other guest {} at the end; my wall clock - device heartbeat_ns = {age_s:+.1}s (old rule: {old_rule})",
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        ms(took),
        if overlapped { "still scoring" } else { "already done" },
    ))
}

/// Reads prefix block `b` and compares it byte for byte with its encoding.
fn check_prefix_block(p: &Participant, key: Key, b: usize) -> Res<()> {
    let (shape, k, v) = prefix_block(b);
    let want = kv::encode(&shape, &k, &v)?;
    match p.get(key)? {
        Some((got, _)) if got == want => Ok(()),
        Some((got, _)) => Err(format!(
            "prefix block {b}: {} bytes read, {} expected, first difference at {:?}",
            got.len(),
            want.len(),
            got.iter().zip(&want).position(|(x, y)| x != y)
        )
        .into()),
        None => Err(format!("prefix block {b} is missing").into()),
    }
}

/// Runs guest `role` ("a" or "b") of scenario 5 on `backend`. A never returns Ok: it is killed.
pub fn guest_pair(
    backend: &Backend,
    role: &str,
    coherence: CoherenceMode,
    lease: Duration,
    step_clock_s: i64,
    timeout: Duration,
) -> Res<String> {
    match role {
        "a" => guest_a(backend, coherence, lease, timeout),
        "b" => guest_b(backend, step_clock_s, timeout),
        _ => Err(format!("scenario 5 needs --role a|b, not '{role}'").into()),
    }
}

fn guest_a(
    backend: &Backend,
    coherence: CoherenceMode,
    lease: Duration,
    timeout: Duration,
) -> Res<String> {
    let t = Instant::now();
    let region = Region::open(backend, &RegionOptions::default())?;
    let pool = Pool::create(Arc::new(region), &pool_config(coherence, lease))?;
    let a = Arc::new(Participant::attach_slot(
        &pool,
        SLOT_A,
        AttachOptions::default(),
    )?);
    println!(
        "CXLKV-TB POOL-CREATED role=a backend={backend} pool={} coherence={coherence:?} lease={}ms participant={} ms={:.1}",
        pool.superblock().pool_size,
        lease.as_millis(),
        a.id(),
        ms(t.elapsed())
    );
    stamp_clock(&a, "a")?;
    let t = Instant::now();
    for (b, key) in prefix_keys().into_iter().enumerate() {
        let (shape, k, v) = prefix_block(b);
        a.put_kv(key, &shape, &k, &v)?;
    }
    let park = t.elapsed();
    a.put(flag("pair/a-parked"), b"parked")?;
    wait_key(
        &a,
        flag("pair/b-found"),
        timeout,
        "guest B to find the prefix",
    )?;
    let scores = concurrent_scores(&a, "a", "b", timeout)?;
    println!(
        "CXLKV-SCENARIO-5 PASS role=a parked {PREFIX_BLOCKS} typed blocks in {:.1}ms; {scores}",
        ms(park)
    );
    // Ask to be killed, and keep committing until it happens: B must find every block whose put
    // returned, whatever the moment of the kill.
    println!("CXLKV-TB KILL-ME");
    for i in 0..TAIL {
        a.put(tail_key(i), &tail_payload(i))?;
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("CXLKV-TB A-TAIL-DONE {TAIL} blocks");
    std::thread::sleep(timeout);
    Err(format!("guest A was not killed within {timeout:?}").into())
}

fn guest_b(backend: &Backend, step_clock_s: i64, timeout: Duration) -> Res<String> {
    let t = Instant::now();
    let pool = loop {
        match locate::open_located(backend, SCAN_ALIGN, 4096, &RegionOptions::default()) {
            Ok((pool, _)) => break pool,
            Err(locate::LocateError::NotFound { .. }) if t.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(format!("finding guest A's pool: {e}").into()),
        }
    };
    let b = Arc::new(Participant::attach_slot(
        &pool,
        SLOT_B,
        AttachOptions::default(),
    )?);
    let sb = *pool.superblock();
    println!(
        "CXLKV-TB POOL-OPENED role=b coherence={:?} lease={}ms participant={} after {:.1}s",
        CoherenceMode::from_code(sb.coherence),
        sb.lease_ns / 1_000_000,
        b.id(),
        t.elapsed().as_secs_f64()
    );
    stamp_clock(&b, "b")?;
    wait_key(&b, flag("pair/a-parked"), timeout, "guest A's prefix")?;
    let (a_wall, a_boot) = clock_diff(&b, "a", timeout)?;
    let (h_wall, h_boot) = clock_diff(&b, "host", timeout)?;
    let clocks = format!(
        "clocks seen by B: wall A-B={a_wall:+.1}s host-B={h_wall:+.1}s, boottime A-B={a_boot:+.1}s host-B={h_boot:+.1}s"
    );
    println!("CXLKV-TB {clocks}");

    // The prefix: found by lookup_prefix, read byte-exact.
    let keys = prefix_keys();
    let t = Instant::now();
    let found = b.lookup_prefix(&keys)?;
    let lookup = t.elapsed();
    if found != PREFIX_BLOCKS {
        return Err(format!("lookup_prefix found {found} of {PREFIX_BLOCKS} blocks").into());
    }
    let t = Instant::now();
    for (i, &key) in keys.iter().enumerate() {
        check_prefix_block(&b, key, i)?;
    }
    let read = t.elapsed();
    b.put(flag("pair/b-found"), b"found")?;

    let scores = concurrent_scores(&b, "b", "a", timeout)?;

    // A's QEMU is killed once it asked; B watches A's heartbeat counter on its own clock, with its
    // wall clock stepped meanwhile (liveness never reads it).
    let stepped = if step_clock_s == 0 {
        "not at all".to_string()
    } else {
        step_wall_clock(step_clock_s)
    };
    let t = Instant::now();
    let mut last_beat = None;
    let mut moved_at = Instant::now();
    let verdict = loop {
        let v = participant_liveness(&pool, SLOT_A)?;
        if last_beat != Some(v.heartbeat) {
            last_beat = Some(v.heartbeat);
            moved_at = Instant::now();
        }
        if v.liveness == Liveness::Dead {
            break v;
        }
        if t.elapsed() > timeout {
            return Err(format!("guest A not dead after {timeout:?}: {:?}", v.liveness).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let still = moved_at.elapsed();
    let t = Instant::now();
    let heir = Participant::attach_slot(&pool, SLOT_A, AttachOptions::default())?;
    let takeover = t.elapsed();
    if heir.partition() != Some(SLOT_A) {
        return Err(format!("took over partition {:?}, not A's", heir.partition()).into());
    }
    // Every block A committed: the prefix, and its tail up to the kill, without a hole.
    let t = Instant::now();
    for (i, &key) in keys.iter().enumerate() {
        check_prefix_block(&heir, key, i)?;
    }
    let mut tail = 0;
    for i in 0..TAIL {
        match heir.get(tail_key(i))? {
            Some((got, _)) if got == tail_payload(i) && tail == i => tail += 1,
            Some((got, _)) if got != tail_payload(i) => {
                return Err(format!("A's tail block {i} differs after the takeover").into());
            }
            Some(_) => {
                return Err(format!("A's tail block {i} present after a hole at {tail}").into())
            }
            None => {}
        }
    }
    let verify = t.elapsed();
    // The heir writes in A's partition.
    let mine = Key::from_bytes(b"testbed/pair/heir");
    heir.put(mine, b"written by B in A's partition")?;
    if heir.get(mine)?.map(|(v, _)| v) != Some(b"written by B in A's partition".to_vec()) {
        return Err("the heir's own block does not read back".into());
    }
    b.put(flag("pair/b-done"), b"done")?;
    Ok(format!(
        "prefix: lookup_prefix found {found}/{PREFIX_BLOCKS} in {:.1}ms, read byte-exact in {:.1}ms; {scores}; {clocks}; wall clock stepped {stepped}; A dead after its counter stood still {:.0}ms on B's clock (lease {}ms, watch said {:.0}ms), takeover of A's slot and partition {:.1}ms, {} prefix + {tail} tail blocks A committed read back in {:.1}ms",
        ms(lookup),
        ms(read),
        ms(still),
        sb.lease_ns / 1_000_000,
        verdict.still_ns as f64 / 1e6,
        ms(takeover),
        PREFIX_BLOCKS,
        ms(verify),
    ))
}

/// Steps this guest's wall clock by `secs` with the guest's `date -s` (busybox); says how it went.
fn step_wall_clock(secs: i64) -> String {
    let to = (system_now_ns() / 1_000_000_000) as i64 + secs;
    match std::process::Command::new("date")
        .args(["-u", "-s", &format!("@{to}")])
        .output()
    {
        Ok(o) if o.status.success() => format!("{secs:+}s"),
        Ok(o) => format!(
            "failed ({})",
            String::from_utf8_lossy(&o.stderr).trim().replace('\n', " ")
        ),
        Err(e) => format!("failed ({e})"),
    }
}

// ------------------------------------------------------------------------------------------------
// Host side

/// The host's half: attach to its slot, stamp its clocks, start the device (`start_device`) once
/// both guests hold their slots (the device attaches to the first free one), keep it up until B
/// is done.
pub fn host_pair<D>(
    pool: &Pool,
    timeout: Duration,
    start_device: impl FnOnce() -> Res<D>,
) -> Res<bool> {
    let h = Participant::attach_slot(pool, SLOT_HOST, AttachOptions::default())?;
    stamp_clock(&h, "host")?;
    for who in ["a", "b"] {
        wait_key(&h, flag(&format!("pair/clock/{who}")), timeout, who)?;
    }
    let _device = start_device()?;
    let mut ok = true;
    for who in ["a", "b"] {
        match wait_key(&h, flag(&format!("pair/{who}-ndp-done")), timeout, who) {
            Ok(_) => println!("host: guest {who} finished its SCORE_TOPK commands"),
            Err(e) => {
                println!("host: FAIL: {e}");
                ok = false;
            }
        }
    }
    // The host's own watch of A (a third clock): dead after a lease standing still, unless B took
    // the slot over (or let it go) first.
    let t = Instant::now();
    let seen = loop {
        let v = participant_liveness(pool, SLOT_A)?;
        match v.liveness {
            Liveness::Dead => {
                break format!(
                    "dead after its counter stood still {:.0}ms on the host's clock",
                    v.still_ns as f64 / 1e6
                )
            }
            Liveness::Free => break "freed (taken over and let go) first".to_string(),
            _ if h.get(flag("pair/b-done"))?.is_some() => {
                break format!("{} when B was done", v.liveness.name())
            }
            _ if t.elapsed() > timeout => break format!("{} after {timeout:?}", v.liveness.name()),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    println!("host: guest A's slot: {seen}");
    match wait_key(&h, flag("pair/b-done"), timeout, "guest B to finish") {
        Ok(_) => println!("host: guest B took A over"),
        Err(e) => {
            println!("host: FAIL: {e}");
            ok = false;
        }
    }
    Ok(ok)
}
