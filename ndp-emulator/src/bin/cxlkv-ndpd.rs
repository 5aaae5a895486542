//! `cxlkv-ndpd`: the NDP device model as a daemon attached to one pool or several.

use clap::Parser;
use cxlkv_ndp::{Device, DeviceConfig, DeviceHandle, Engine};
use cxlkv_runtime::{Backend, Pool, RegionOptions};
use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

/// Serve the NDP device's queue pairs of one pool, or of several, until SIGINT or SIGTERM.
///
/// Each pool named with `--pool` gets its own device: its device area, registers, generation,
/// heartbeat and queue pairs live in that pool's memory, so a client's queues are bound to the
/// pool it attached through, and its workers (`--workers` per pool) serve only that pool. A pool
/// that cannot be opened or served is reported on stderr and the others are served; the daemon
/// fails only when none can be.
#[derive(Parser, Debug)]
#[command(name = "cxlkv-ndpd", version)]
struct Args {
    /// Pool backend (shm:NAME, file:PATH, dax:PATH, numa:NODE:NAME). Repeat to serve several
    /// pools from one daemon.
    #[arg(long, required = true)]
    pool: Vec<String>,
    /// Worker threads per pool.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Pace scans to this internal bandwidth in GB/s.
    #[arg(long = "internal-bw")]
    internal_bw: Option<f64>,
    /// Link bandwidth in GB/s (published for reports).
    #[arg(long = "link-bw")]
    link_bw: Option<f64>,
    /// Link latency in ns (published for reports).
    #[arg(long = "link-latency", default_value_t = 0)]
    link_latency: u64,
    /// Hotlist epoch in milliseconds.
    #[arg(long = "hot-epoch-ms", default_value_t = 1000)]
    hot_epoch_ms: u64,
    /// Compute engine of SCORE_TOPK and GATHER: `rust` (the cxlkv-kernels kernels) or `hls` (the
    /// HLS kernel of fpga/ compiled as a host library). Results are identical.
    #[arg(long, default_value = "rust")]
    engine: Engine,
    /// Find each pool inside its backend by its superblock (at any 4 KiB-aligned offset) instead
    /// of expecting it at offset 0: the backing file of a VM guest's memory (QEMU test bed).
    #[arg(long)]
    locate: bool,
    /// Microseconds a worker spins after its last command before sleeping on the doorbell; a
    /// client in a VM guest cannot wake the host's futex, so the test bed spins longer.
    #[arg(long = "idle-spin-us")]
    idle_spin_us: Option<u64>,
    /// Serve the device's Prometheus metrics, and the pool's (every participant's published
    /// counters and each partition's fill, as `cxlkv pool stat --prometheus`), over HTTP at
    /// `GET /metrics` on this address (`127.0.0.1:PORT`; port 0 picks a free one). The bound
    /// address is printed on stdout. With several pools every sample carries the label
    /// `pool="BACKEND"`, the pool's backend as the `serving` line names it.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("cxlkv-ndpd: {e}");
        std::process::exit(1);
    }
}

/// One pool being served: its name as given, its device, and a handle of its own for the metrics
/// endpoint (whose heartbeat watch then judges liveness across scrapes).
struct Served {
    name: String,
    handle: DeviceHandle,
    stat_pool: Pool,
}

/// A device's and its pool's metrics now, as one exposition.
fn metrics_of(device: &Device, pool: &Pool) -> String {
    let mut reg = prometheus_client::registry::Registry::default();
    device.register_metrics(&mut reg);
    // A pool that cannot be read now (it should not happen) leaves the device's metrics.
    if let Ok(st) = cxlkv_runtime::pool_stats(pool) {
        cxlkv_runtime::metrics::pool::register_pool(&st, &mut reg);
    }
    cxlkv_runtime::metrics::encode_registry(&reg)
}

/// Opens the pool `spec` names and starts its device.
fn serve_pool(spec: &str, args: &Args, cfg: &DeviceConfig) -> Result<Served, Box<dyn Error>> {
    let backend: Backend = spec.parse()?;
    let pool = if args.locate {
        let (pool, loc) = cxlkv_runtime::locate::open_located(
            &backend,
            cxlkv_runtime::locate::SCAN_ALIGN,
            4096,
            &RegionOptions::default(),
        )?;
        println!(
            "cxlkv-ndpd: pool found at offset {:#x} ({} bytes)",
            loc.offset, loc.pool_size
        );
        pool
    } else {
        Pool::open_on(&backend, &RegionOptions::default())?
    };
    let stat_pool = pool.clone();
    let handle = Device::start(pool, cfg.clone())?;
    Ok(Served {
        name: backend.to_string(),
        handle,
        stat_pool,
    })
}

fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    for (i, spec) in args.pool.iter().enumerate() {
        if args.pool[..i].contains(spec) {
            // A second device on one pool would take over the first one's device area.
            return Err(format!("pool {spec} is named twice").into());
        }
    }
    // Bind before anything starts, so that a taken address fails at once.
    let metrics = args
        .metrics
        .as_deref()
        .map(cxlkv_ndp::metrics_http::bind)
        .transpose()?;
    // Block the stop signals before any thread starts, so that only `sigwait` below takes them.
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initializes the set it is given; sigaddset and pthread_sigmask only read
    // and write that set and this thread's mask.
    let set = unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        let mut set = set.assume_init();
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let cfg = DeviceConfig {
        workers: args.workers,
        internal_bw_gbps: args.internal_bw,
        link_bw_gbps: args.link_bw,
        link_latency_ns: args.link_latency,
        hot_epoch: Duration::from_millis(args.hot_epoch_ms.max(1)),
        engine: args.engine,
        idle_spin: args
            .idle_spin_us
            .map_or(DeviceConfig::default().idle_spin, Duration::from_micros),
        ..DeviceConfig::default()
    };
    let mut served = Vec::new();
    let mut failed = Vec::new();
    for spec in &args.pool {
        match serve_pool(spec, args, &cfg) {
            Ok(s) => served.push(s),
            // One pool: its error is the daemon's, as it always was.
            Err(e) if args.pool.len() == 1 => return Err(e),
            Err(e) => {
                eprintln!("cxlkv-ndpd: pool {spec} is not served: {e}");
                failed.push(spec.as_str());
            }
        }
    }
    if served.is_empty() {
        return Err(format!("none of the {} pools can be served", args.pool.len()).into());
    }
    // One pool named: the line it always printed. Several: each served pool, and the others.
    if let ([one], [_]) = (&served[..], &args.pool[..]) {
        println!(
            "cxlkv-ndpd: serving {} (generation {}, {} worker(s), engine {})",
            one.name,
            one.handle.device().generation(),
            args.workers,
            args.engine
        );
    } else {
        let list: Vec<String> = served
            .iter()
            .map(|s| format!("{} (generation {})", s.name, s.handle.device().generation()))
            .collect();
        let skipped = if failed.is_empty() {
            String::new()
        } else {
            format!("; not served: {}", failed.join(", "))
        };
        println!(
            "cxlkv-ndpd: serving {} of {} pools: {} ({} worker(s) each, engine {}{skipped})",
            served.len(),
            args.pool.len(),
            list.join(", "),
            args.workers,
            args.engine
        );
    }
    if let Some(listener) = metrics {
        let pools: Vec<(String, Arc<Device>, Pool)> = served
            .iter()
            .map(|s| (s.name.clone(), s.handle.shared(), s.stat_pool.clone()))
            .collect();
        // Labelled by pool whenever several were named, even if only one of them is served.
        let several = args.pool.len() > 1;
        let addr = cxlkv_ndp::metrics_http::serve(listener, move || match &pools[..] {
            [(_, device, pool)] if !several => metrics_of(device, pool),
            many => {
                let parts: Vec<(&str, String)> = many
                    .iter()
                    .map(|(name, device, pool)| (name.as_str(), metrics_of(device, pool)))
                    .collect();
                cxlkv_ndp::metrics_http::label_pools(&parts)
            }
        })?;
        println!("cxlkv-ndpd: metrics on http://{addr}/metrics");
    }
    let mut sig = 0;
    // SAFETY: `set` is an initialized signal set; `sig` is a valid out-pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    eprintln!("cxlkv-ndpd: signal {sig}, stopping");
    for s in served {
        s.handle.stop();
    }
    Ok(())
}
