//! `cxlkv-testbed`: both sides of the QEMU test bed's scenarios (ndp-emulator/qemu/).
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
//! back to the host with the same answer.

use clap::{Parser, Subcommand};
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::{DType, GroupMode, ScoreKernel};
use cxlkv_runtime::locate::{self, SCAN_ALIGN};
use cxlkv_runtime::ndp::{
    host_score_topk, BlockSpec, FallbackReason, NdpDevice, NdpOptions, NdpPath, ScoreRequest,
};
use cxlkv_runtime::{
    kv, Backend, Key, KvShape, Participant, Pool, PoolConfig, Region, RegionOptions, SharedMemory,
};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

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
        /// Scenario numbers, comma separated (1,2,3,4).
        #[arg(long, default_value = "1,2,4")]
        scenarios: String,
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
const HEADS: usize = 2;
const DIM: usize = 64;
const TOKENS: usize = 32;
const SEQ_BLOCKS: usize = 4;
const SEQ_TOKENS: usize = 64;
const SEQUENCE: u64 = 7;
const GROUP: usize = 4;
const TOPK: usize = 16;

fn main() {
    let args = Args::parse();
    let r = match args.cmd {
        Cmd::Guest {
            pool,
            window_mib,
            scenarios,
            timeout_s,
            iters,
        } => guest(
            &pool,
            window_mib,
            &scenarios,
            Duration::from_secs(timeout_s),
            iters,
        ),
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
    if let Some(bad) = v.iter().find(|&&n| !(1..=4).contains(&n)) {
        return Err(format!("unknown scenario {bad} (1..=4)").into());
    }
    Ok(v)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
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

fn flag(name: &str) -> Key {
    Key::from_bytes(format!("testbed/flag/{name}").as_bytes())
}

/// Waits until `key` is in the pool; returns its payload.
fn wait_key(p: &Participant, key: Key, timeout: Duration, what: &str) -> Res<Vec<u8>> {
    let t = Instant::now();
    loop {
        if let Some((payload, _)) = p.get(key)? {
            return Ok(payload);
        }
        if t.elapsed() > timeout {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
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

fn request<'a>(queries: &'a [f32], blocks: &'a [BlockSpec]) -> ScoreRequest<'a> {
    ScoreRequest {
        queries,
        dim: DIM,
        blocks,
        sequence: SEQUENCE,
        layer: 0,
        kv_head: 0,
        dtype: DType::F16,
        k: TOPK,
        mode: GroupMode::GroupMax,
        prune: false,
        gather_values: true,
        scale: 1.0 / (DIM as f32).sqrt(),
        select: Default::default(),
    }
}

fn ndp_options(timeout: Duration) -> NdpOptions {
    NdpOptions {
        timeout,
        // The device's heartbeat is stamped with the host's clock, which the guest's clock only
        // approximates (RTC granularity): judge liveness by timeouts, not by the heartbeat age.
        stale_after: Duration::from_secs(60),
        // A futex wake does not cross the VM boundary: poll the completion ring for the whole wait.
        spin: timeout,
        ..NdpOptions::default()
    }
}

fn same_topk(a: &cxlkv_runtime::ndp::TopK, b: &cxlkv_runtime::ndp::TopK) -> Result<(), String> {
    if a.indices != b.indices {
        return Err(format!(
            "indices differ: {:?} vs {:?}",
            a.indices, b.indices
        ));
    }
    let bits = |s: &Vec<Vec<f32>>| s.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
    if bits(&a.scores) != bits(&b.scores) {
        return Err(format!("scores differ: {:?} vs {:?}", a.scores, b.scores));
    }
    if a.values != b.values {
        return Err("gathered values differ".into());
    }
    Ok(())
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
        let req = request(&q, &blocks);
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
    let req = request(&run.queries, &run.blocks);
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

struct Ndpd(Child);

impl Ndpd {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Ndpd {
    fn drop(&mut self) {
        self.kill();
    }
}

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
    let p = pool.attach()?;
    let mut dev = None;
    if scenarios.iter().any(|&n| n == 2 || n == 4) {
        let child = Command::new(ndpd)
            .args([
                "--pool",
                &format!("file:{file}"),
                "--locate",
                "--idle-spin-us",
                "30000000",
            ])
            .spawn()
            .map_err(|e| format!("starting {ndpd}: {e}"))?;
        println!("host: started {ndpd} (pid {}) on file:{file}", child.id());
        dev = Some(Ndpd(child));
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
            d.kill();
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
