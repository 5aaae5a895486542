//! `cxlkv-testbed`: both sides of the QEMU test bed's scenarios (testbed/qemu/).
//!
//! The guest side runs inside a QEMU guest on the memory the guest sees (an ivshmem BAR's
//! `resource2`, a `/dev/daxX.Y` of an emulated NVDIMM or CXL type-3 region): it formats a pool
//! there and runs the scenarios. The host side finds that pool in the host's backing file by its
//! superblock ([`cxlkv_runtime::locate`]), attaches as a second participant and, for the device
//! scenarios, runs `cxlkv-ndpd` on the same file. The two sides synchronise only through the pool:
//! each waits for keys the other puts. Every scenario ends with a line
//! `CXLKV-SCENARIO-<n> PASS|FAIL ...` that the test-bed script checks.
//!
//! Scenarios: 1 and 3 round-trip typed KV blocks byte-exact (guest → host and host → guest; 3 is
//! the same on CXL memory), 2 sends NOP, SCORE_TOPK and GATHER to the host-side device and compares
//! them with the host reference, 4 stops the device and expects the client to time out and fall
//! back to the host with the same answer, 5 runs in two guests at once on one region (`pair`: a
//! prefix shared between them, concurrent SCORE_TOPK, guest A killed and taken over by guest B).

use clap::{Parser, Subcommand};
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::{DType, ScoreKernel};
use cxlkv_ndp::daemon::Daemon;
use cxlkv_runtime::locate::{self, SCAN_ALIGN};
use cxlkv_runtime::ndp::{
    host_score_topk, BlockSpec, FallbackReason, NdpDevice, NdpOptions, NdpPath,
};
use cxlkv_runtime::{
    kv, Backend, CoherenceMode, Key, KvShape, Participant, Pool, PoolConfig, Region, RegionOptions,
    SharedMemory,
};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
mod pair;

use common::*;

/// QEMU test-bed scenario driver.
#[derive(Parser, Debug)]
#[command(name = "cxlkv-testbed", version)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Guest side: format a pool on BACKEND and run the scenarios.
    Guest {
        /// What the guest sees (file:/sys/bus/pci/devices/BDF/resource2, dax:/dev/dax0.0, ...).
        #[arg(long)]
        pool: String,
        /// Use only the first MiB of the backend (keep pools small on slow emulated CXL memory).
        #[arg(long = "window-mib")]
        window_mib: Option<u64>,
        /// Scenario numbers, comma separated (1,2,3,4; 5 runs alone, in two guests).
        #[arg(long, default_value = "1,2,4")]
        scenarios: String,
        /// Scenario 5: which of the two guests this is (a formats the pool and is killed, b takes
        /// it over).
        #[arg(long)]
        role: Option<String>,
        /// Scenario 5: the pool's coherence mode (hardware|software).
        #[arg(long, default_value = "software")]
        coherence: String,
        /// Scenario 5: the pool's lease in ms.
        #[arg(long = "lease-ms", default_value_t = 2000)]
        lease_ms: u64,
        /// Scenario 5, guest B: step this guest's wall clock by this many seconds (`date -s`)
        /// while it watches A's heartbeat (0: no step; the test bed passes it inside a guest only).
        #[arg(
            long = "step-clock-s",
            default_value_t = 0,
            allow_negative_numbers = true
        )]
        step_clock_s: i64,
        /// Seconds to wait for the host at each step.
        #[arg(long = "timeout-s", default_value_t = 180)]
        timeout_s: u64,
        /// NOP round trips and SCORE_TOPK commands to time.
        #[arg(long, default_value_t = 200)]
        iters: usize,
    },
    /// Host side: find the guest's pool in FILE and run the host half of the scenarios.
    Host {
        /// The host's backing file of the guest memory (e.g. /dev/shm/cxlkv-testbed-ivshmem).
        #[arg(long)]
        file: String,
        /// Scenario numbers, comma separated.
        #[arg(long, default_value = "1,2,4")]
        scenarios: String,
        /// The cxlkv-ndpd binary (scenarios 2 and 4).
        #[arg(long, default_value = "cxlkv-ndpd")]
        ndpd: String,
        /// Seconds to wait for the guest at each step.
        #[arg(long = "timeout-s", default_value_t = 240)]
        timeout_s: u64,
    },
    /// Print every valid pool superblock in a file or device, with its offset.
    Locate {
        /// Backend to scan (file:PATH, dax:/dev/daxX.Y).
        backend: String,
    },
}

const KV_BLOCKS: usize = 6;
const TOKENS: usize = 32;
const SEQ_BLOCKS: usize = 4;
const SEQ_TOKENS: usize = 64;
const SEQUENCE: u64 = 7;

fn main() {
    let args = Args::parse();
    let r = match args.cmd {
        Cmd::Guest {
            pool,
            window_mib,
            scenarios,
            role,
            coherence,
            lease_ms,
            step_clock_s,
            timeout_s,
            iters,
        } => {
            let timeout = Duration::from_secs(timeout_s);
            if parse_scenarios(&scenarios).is_ok_and(|v| v.contains(&5)) {
                guest_pair(
                    &pool,
                    &scenarios,
                    role,
                    &coherence,
                    lease_ms,
                    step_clock_s,
                    timeout,
                )
            } else {
                guest(&pool, window_mib, &scenarios, timeout, iters)
            }
        }
        Cmd::Host {
            file,
            scenarios,
            ndpd,
            timeout_s,
        } => host(&file, &scenarios, &ndpd, Duration::from_secs(timeout_s)),
        Cmd::Locate { backend } => locate_cmd(&backend),
    };
    if let Err(e) = r {
        eprintln!("cxlkv-testbed: error: {e}");
        std::process::exit(1);
    }
}

fn parse_scenarios(s: &str) -> Res<Vec<u32>> {
    let v: Vec<u32> = s
        .split(',')
        .filter(|x| !x.is_empty())
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    if let Some(bad) = v.iter().find(|&&n| !(1..=5).contains(&n)) {
        return Err(format!("unknown scenario {bad} (1..=5)").into());
    }
    if v.contains(&5) && v.len() > 1 {
        return Err("scenario 5 runs alone (it needs two guests)".into());
    }
    Ok(v)
}

/// The typed block `i` of `side` ("guest" or "host"): key, shape, K and V (deterministic).
fn kv_block(side: &str, i: usize) -> (Key, KvShape, Vec<u8>, Vec<u8>) {
    let seed = if side == "guest" { 1000 } else { 2000 } + i as u64;
    let mut rng = SplitMix64::new(seed);
    let k = rng.key_bytes(HEADS * TOKENS, DIM, DType::F16);
    let v = rng.key_bytes(HEADS * TOKENS, DIM, DType::F16);
    let shape = KvShape {
        dtype: DType::F16,
        layer: i as u32,
        kv_heads: HEADS as u32,
        head_dim: DIM as u32,
        tokens: TOKENS as u32,
        sequence: 100 + i as u64,
        token_offset: 0,
    };
    (
        Key::from_bytes(format!("testbed/{side}/kv/{i}").as_bytes()),
        shape,
        k,
        v,
    )
}

fn put_blocks(p: &Participant, side: &str) -> Res<Duration> {
    let t = Instant::now();
    for i in 0..KV_BLOCKS {
        let (key, shape, k, v) = kv_block(side, i);
        p.put_kv(key, &shape, &k, &v)?;
    }
    Ok(t.elapsed())
}

/// Reads `side`'s blocks and compares them byte for byte with their encoding.
fn check_blocks(p: &Participant, side: &str, timeout: Duration) -> Res<Duration> {
    let t = Instant::now();
    for i in 0..KV_BLOCKS {
        let (key, shape, k, v) = kv_block(side, i);
        let got = wait_key(p, key, timeout, &format!("{side} block {i}"))?;
        let want = kv::encode(&shape, &k, &v)?;
        if got != want {
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            return Err(format!(
                "{side} block {i}: {} bytes read, {} expected, first difference at {first:?}",
                got.len(),
                want.len()
            )
            .into());
        }
    }
    Ok(t.elapsed())
}

// ------------------------------------------------------------------------------------------------
// Guest side

fn guest(
    spec: &str,
    window_mib: Option<u64>,
    scenarios: &str,
    timeout: Duration,
    iters: usize,
) -> Res<()> {
    let scenarios = parse_scenarios(scenarios)?;
    let backend: Backend = spec.parse()?;
    let t = Instant::now();
    let region = match window_mib {
        Some(m) => Region::open_range(&backend, 0, m << 20, &RegionOptions::default())?,
        None => Region::open(&backend, &RegionOptions::default())?,
    };
    let size = region.size();
    let cfg = PoolConfig {
        block_size: 64 << 10,
        participants: 4,
        partitions: Some(4),
        // Guest and host clocks differ by up to a second (RTC granularity) and TCG stalls: a long
        // lease keeps one side from taking over the other's partition.
        lease: Duration::from_secs(120),
        ..PoolConfig::default()
    };
    let pool = Pool::create(Arc::new(region), &cfg)?;
    let p = Arc::new(pool.attach()?);
    println!(
        "CXLKV-TB POOL-CREATED backend={backend} window={size} pool={} participant={} ms={:.1}",
        pool.superblock().pool_size,
        p.id(),
        ms(t.elapsed())
    );
    let mut failed = Vec::new();
    let mut ndp_state: Option<NdpRun> = None;
    for &n in &scenarios {
        let t = Instant::now();
        let r = match n {
            1 | 3 => guest_kv(&p, timeout),
            2 => guest_ndp(&p, timeout, iters).map(|(line, run)| {
                ndp_state = Some(run);
                line
            }),
            4 => guest_fallback(&p, timeout, ndp_state.take()),
            _ => unreachable!("checked"),
        };
        match r {
            Ok(line) => println!(
                "CXLKV-SCENARIO-{n} PASS {line} scenario-ms={:.0}",
                ms(t.elapsed())
            ),
            Err(e) => {
                println!("CXLKV-SCENARIO-{n} FAIL {e}");
                failed.push(n);
            }
        }
    }
    // Tell the host we are done (it may still be waiting on a flag of a failed scenario).
    let _ = p.put(flag("guest-done"), b"done");
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("scenarios {failed:?} failed").into())
    }
}

/// Scenario 5 in one of its two guests: prints its `CXLKV-SCENARIO-5` line (guest A prints its
/// PASS before it asks to be killed).
fn guest_pair(
    spec: &str,
    scenarios: &str,
    role: Option<String>,
    coherence: &str,
    lease_ms: u64,
    step_clock_s: i64,
    timeout: Duration,
) -> Res<()> {
    parse_scenarios(scenarios)?;
    let backend: Backend = spec.parse()?;
    let coherence = match coherence {
        "hardware" => CoherenceMode::Hardware,
        "software" => CoherenceMode::Software,
        other => return Err(format!("unknown coherence '{other}' (hardware|software)").into()),
    };
    let role = role.ok_or("scenario 5 needs --role a|b")?;
    let t = Instant::now();
    let r = pair::guest_pair(
        &backend,
        &role,
        coherence,
        Duration::from_millis(lease_ms),
        step_clock_s,
        timeout,
    );
    match r {
        Ok(line) => {
            println!(
                "CXLKV-SCENARIO-5 PASS role={role} {line} scenario-ms={:.0}",
                ms(t.elapsed())
            );
            Ok(())
        }
        Err(e) => {
            println!("CXLKV-SCENARIO-5 FAIL role={role} {e}");
            Err("scenario 5 failed".into())
        }
    }
}

fn guest_kv(p: &Participant, timeout: Duration) -> Res<String> {
    let put = put_blocks(p, "guest")?;
    let read = check_blocks(p, "host", timeout)?;
    Ok(format!(
        "guest-put={KV_BLOCKS}x{}B in {:.1}ms; host blocks read byte-exact in {:.1}ms (incl. waiting for the host)",
        kv::encode(
            &kv_block("guest", 0).1,
            &kv_block("guest", 0).2,
            &kv_block("guest", 0).3
        )?
        .len(),
        ms(put),
        ms(read)
    ))
}

/// What scenario 2 leaves for scenario 4: the sequence and a query.
struct NdpRun {
    blocks: Vec<BlockSpec>,
    queries: Vec<f32>,
}

fn store_sequence(p: &Participant) -> Res<(Vec<BlockSpec>, Vec<u8>)> {
    let mut rng = SplitMix64::new(77);
    let mut blocks = Vec::new();
    // Private copy of V for head 0: [tokens][dim] over the whole sequence.
    let mut v0 = Vec::new();
    for b in 0..SEQ_BLOCKS {
        let k = rng.key_bytes(HEADS * SEQ_TOKENS, DIM, DType::F16);
        let v = rng.key_bytes(HEADS * SEQ_TOKENS, DIM, DType::F16);
        v0.extend_from_slice(&v[..SEQ_TOKENS * DIM * 2]);
        let shape = KvShape {
            dtype: DType::F16,
            layer: 0,
            kv_heads: HEADS as u32,
            head_dim: DIM as u32,
            tokens: SEQ_TOKENS as u32,
            sequence: SEQUENCE,
            token_offset: (b * SEQ_TOKENS) as u64,
        };
        let key = Key::from_bytes(format!("testbed/seq/{b}").as_bytes());
        p.put_kv(key, &shape, &k, &v)?;
        blocks.push(BlockSpec {
            key,
            token_offset: (b * SEQ_TOKENS) as u64,
        });
    }
    Ok((blocks, v0))
}

fn ndp_options(timeout: Duration) -> NdpOptions {
    NdpOptions {
        timeout,
        // The client watches the device's heartbeat stand still on the guest's own clock (the
        // host's and the guest's clocks are never compared); TCG stalls call for a wide margin.
        stale_after: Duration::from_secs(5),
        // A futex wake does not cross the VM boundary: poll the completion ring for the whole wait.
        spin: timeout,
        ..NdpOptions::default()
    }
}

fn guest_ndp(p: &Arc<Participant>, timeout: Duration, iters: usize) -> Res<(String, NdpRun)> {
    let (blocks, v0) = store_sequence(p)?;
    let queries = SplitMix64::new(78).normal_vec(GROUP * DIM);
    let mut dev = NdpDevice::open(p.clone(), ndp_options(Duration::from_secs(10)))?;
    // Wait for the host to start the device on the pool.
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
    let wait_dev = t.elapsed();
    // Mailbox round trip: NOP commands through the rings, the device answering from the host.
    let mut nop = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        nop.push(dev.nop()?.as_secs_f64() * 1e6);
    }
    let kernel = ScoreKernel::detect();
    let mut lat = Vec::new();
    for i in 0..(iters / 10).max(5) {
        let mut q = queries.clone();
        q.rotate_left(i % DIM);
        let req = request(&q, &blocks, SEQUENCE);
        let t = Instant::now();
        let got = dev.score_topk(&req)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        if got.stats.path != Some(NdpPath::Device) {
            return Err(format!(
                "SCORE_TOPK {i} ran on {:?}, not on the device",
                got.stats.path
            )
            .into());
        }
        let reference = host_score_topk(p.pool(), &req, kernel)?;
        same_topk(&got, &reference)
            .map_err(|e| format!("SCORE_TOPK {i}: device vs host reference: {e}"))?;
    }
    // GATHER of chosen tokens against the guest's private copy of V (head 0).
    let tokens: Vec<u32> = vec![0, 5, 63, 64, 130, 255];
    let t = Instant::now();
    let (vals, st) = dev.gather(&blocks, SEQUENCE, 0, 0, DType::F16, DIM, &tokens)?;
    let gather_us = t.elapsed().as_secs_f64() * 1e6;
    if st.path != Some(NdpPath::Device) {
        return Err(format!("GATHER ran on {:?}, not on the device", st.path).into());
    }
    let row = DIM * 2;
    let want: Vec<u8> = tokens
        .iter()
        .flat_map(|&t| v0[t as usize * row..(t as usize + 1) * row].to_vec())
        .collect();
    if vals != want {
        return Err("GATHER values differ from the stored rows".into());
    }
    p.put(flag("ndp-done"), b"done")?;
    let n = lat.len();
    let line = format!(
        "device-up-after={:.0}ms mailbox-rtt(NOP,n={}) p50={:.1}us p99={:.1}us; SCORE_TOPK(n={n},{}x{}tok,G={GROUP},k={TOPK}) p50={:.1}us p99={:.1}us, equal to host reference; GATHER({} rows)={:.1}us equal",
        ms(wait_dev),
        nop.len(),
        pct(&mut nop, 0.5),
        pct(&mut nop, 0.99),
        SEQ_BLOCKS,
        SEQ_TOKENS,
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        tokens.len(),
        gather_us
    );
    drop(dev);
    Ok((line, NdpRun { blocks, queries }))
}

fn guest_fallback(p: &Arc<Participant>, timeout: Duration, run: Option<NdpRun>) -> Res<String> {
    let run = match run {
        Some(r) => r,
        None => {
            let (blocks, _) = store_sequence(p)?;
            p.put(flag("ndp-done"), b"done")?;
            NdpRun {
                blocks,
                queries: SplitMix64::new(78).normal_vec(GROUP * DIM),
            }
        }
    };
    wait_key(
        p,
        flag("device-stopped"),
        timeout,
        "the host to stop the device",
    )?;
    let dev_timeout = Duration::from_secs(2);
    let mut dev = NdpDevice::open(p.clone(), ndp_options(dev_timeout))?;
    let req = request(&run.queries, &run.blocks, SEQUENCE);
    let t = Instant::now();
    let got = dev.score_topk(&req)?;
    let took = t.elapsed();
    let reason = match got.stats.path {
        Some(NdpPath::Host(r @ (FallbackReason::Timeout | FallbackReason::Dead))) => r,
        other => {
            return Err(format!("expected a host fallback after a timeout, got {other:?}").into());
        }
    };
    if reason == FallbackReason::Timeout && took < dev_timeout {
        return Err(format!("fell back after {took:?}, before the {dev_timeout:?} timeout").into());
    }
    let reference = host_score_topk(p.pool(), &req, ScoreKernel::detect())?;
    same_topk(&got, &reference).map_err(|e| format!("fallback vs host reference: {e}"))?;
    // The next command after a timeout must not hang either.
    let t2 = Instant::now();
    let again = dev.score_topk(&req)?;
    if !matches!(again.stats.path, Some(NdpPath::Host(_))) {
        return Err(format!(
            "second command after the stop ran on {:?}",
            again.stats.path
        )
        .into());
    }
    same_topk(&again, &reference).map_err(|e| format!("second fallback: {e}"))?;
    Ok(format!(
        "device stopped: SCORE_TOPK fell back ({reason:?}) after {:.0}ms (timeout {}ms), next command {:?} in {:.0}ms, results equal the host reference",
        ms(took),
        dev_timeout.as_millis(),
        again
            .stats
            .path
            .map(|p| format!("{p:?}"))
            .unwrap_or_default(),
        ms(t2.elapsed())
    ))
}

// ------------------------------------------------------------------------------------------------
// Host side

fn host(file: &str, scenarios: &str, ndpd: &str, timeout: Duration) -> Res<()> {
    let scenarios = parse_scenarios(scenarios)?;
    let backend = Backend::File(file.into());
    let t = Instant::now();
    let (pool, loc) = loop {
        match locate::open_located(&backend, SCAN_ALIGN, 4096, &RegionOptions::default()) {
            Ok(x) => break x,
            Err(locate::LocateError::NotFound { .. }) if t.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(format!("finding the guest's pool in {file}: {e}").into()),
        }
    };
    println!(
        "host: pool found in {file} at offset {:#x} ({} bytes) after {:.1}s",
        loc.offset,
        loc.pool_size,
        t.elapsed().as_secs_f64()
    );
    if scenarios.contains(&5) {
        // Two guests poll the device: spin a little after each command, then sleep (10 ms naps).
        return if pair::host_pair(&pool, timeout, || start_ndpd(ndpd, file, 20_000))? {
            println!("host: OK");
            Ok(())
        } else {
            Err("host side failed".into())
        };
    }
    let p = pool.attach()?;
    let mut dev = None;
    if scenarios.iter().any(|&n| n == 2 || n == 4) {
        dev = Some(start_ndpd(ndpd, file, 30_000_000)?);
    }
    let mut ok = true;
    if scenarios.iter().any(|&n| n == 1 || n == 3) {
        match check_blocks(&p, "guest", timeout) {
            Ok(d) => println!(
                "host: {KV_BLOCKS} guest blocks read byte-exact ({:.1}ms incl. wait)",
                ms(d)
            ),
            Err(e) => {
                println!("host: FAIL reading the guest's blocks: {e}");
                ok = false;
            }
        }
        let d = put_blocks(&p, "host")?;
        println!("host: put {KV_BLOCKS} host blocks in {:.1}ms", ms(d));
    }
    if let Some(mut d) = dev {
        match wait_key(&p, flag("ndp-done"), timeout, "the guest's device scenario") {
            Ok(_) => println!("host: guest finished the device scenario"),
            Err(e) => {
                println!("host: FAIL: {e}");
                ok = false;
            }
        }
        if scenarios.contains(&4) {
            // A dead device: no clean shutdown, no deregistration.
            d.kill()?;
            println!("host: cxlkv-ndpd killed (SIGKILL); telling the guest");
            p.put(flag("device-stopped"), b"stopped")?;
        }
        drop(d);
    }
    // Stay attached until the guest is done, so that its last reads see a live peer.
    if let Err(e) = wait_key(&p, flag("guest-done"), timeout, "the guest to finish") {
        println!("host: FAIL: {e}");
        ok = false;
    }
    if ok {
        println!("host: OK");
        Ok(())
    } else {
        Err("host side failed".into())
    }
}

/// Starts `cxlkv-ndpd` on the pool in `file`, spinning `spin_us` after each command, and waits
/// until it serves.
fn start_ndpd(ndpd: &str, file: &str, spin_us: u64) -> Res<Daemon> {
    let d = Daemon::spawn(
        Path::new(ndpd),
        &format!("file:{file}"),
        &["--locate", "--idle-spin-us", &spin_us.to_string()],
    )?;
    print!("{}", d.said());
    println!("host: started {ndpd} (pid {}) on file:{file}", d.pid());
    Ok(d)
}

fn locate_cmd(spec: &str) -> Res<()> {
    let backend: Backend = spec.parse()?;
    let found = locate::scan(&backend, SCAN_ALIGN, &RegionOptions::default())?;
    if found.is_empty() {
        return Err(format!("no cxlkv pool in {backend}").into());
    }
    for l in found {
        println!("offset={:#x} pool_size={}", l.offset, l.pool_size);
    }
    Ok(())
}
