//! `cxlkv demo`: the main job on the embedded default.
//!
//! Creates a shared-memory pool and runs participants as separate processes (`cxlkv demo-worker`)
//! that store and share the real SmolLM2-135M KV cache as typed blocks:
//!
//! 1. engine A serves request 1 (the first 3/4 of the tokens) and parks its KV for every layer the
//!    folder holds (meta.json's `dumped_layers`; layers 4 and 17 in data/kv/) in the pool, one
//!    typed block per 128-token chunk and layer;
//! 2. engine B serves request 2 (all the tokens, a continuation of request 1): it looks up
//!    the longest cached prefix, fetches those chunks instead of recomputing them, checks every
//!    byte against the model's tensors, and parks only the chunks that are new;
//! 3. a reader pins every block of the last layer and runs attention for the last token over the
//!    pinned KV, and compares it with attention over the original tensors.
//!
//! Then it checks the pool and prints what each participant did.
//!
//! Part 2 runs near-data processing (`cxlkv_ndp::demo`): a pool with the NDP device (in-process,
//! or `--device-process` for `cxlkv-ndpd`), the real KV and a synthetic long sequence
//! (`--tokens`) as typed blocks, and decode steps scored on the device against a host-side scan:
//! bytes over the link, time per step, modeled CXL time, recall and attention error.

use super::{human, Error, Result};
use clap::Args;
use cxlkv::kernels::DType;
use cxlkv::runtime::kv::chunk_kv;
use cxlkv::runtime::region::{Backend, Region, RegionOptions};
use cxlkv::runtime::{
    check, pool_stats, Key, KeyChain, KvBlock, KvShape, Participant, Pool, PoolConfig,
};
use cxlkv_bench_support::npy::read_npy;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// `println!`, or `eprintln!` when stdout carries the JSON report.
macro_rules! say {
    ($json:expr, $($t:tt)*) => {
        if $json { eprintln!($($t)*) } else { println!($($t)*) }
    };
}

const CHUNK: usize = 128;
const MODEL: &str = "SmolLM2-135M-Instruct";

/// Arguments of `cxlkv demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Folder in the format of data/kv/ (meta.json, tokens.npy, layerNN_{q,k,v}.npy).
    #[arg(long)]
    kv_dir: Option<PathBuf>,
    /// Pool backend (default: a fresh /dev/shm pool removed at the end).
    #[arg(long)]
    pool: Option<String>,
    /// Keep the part-1 pool afterwards (inspect it with `cxlkv pool stat|check`).
    #[arg(long)]
    keep: bool,
    /// Tokens of the synthetic long sequence of part 2 (runs at 1/16, 1/4 and all of it).
    #[arg(long, default_value_t = 262_144)]
    tokens: usize,
    /// Top-k per decode step in part 2.
    #[arg(long, default_value_t = 256)]
    k: usize,
    /// Run the NDP device as a separate `cxlkv-ndpd` process instead of a thread.
    #[arg(long)]
    device_process: bool,
    /// Print part 2's report as one JSON object (a `runs` array) on stdout; the rest goes to stderr.
    #[arg(long)]
    json: bool,
}

/// Arguments of the hidden `cxlkv demo-worker`.
#[derive(Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pool: String,
    #[arg(long)]
    role: String,
    #[arg(long)]
    kv_dir: PathBuf,
}

fn default_kv_dir() -> PathBuf {
    // The repository's copy, found from the binary (target/<profile>/cxlkv) or the working dir.
    let rel = Path::new("data/kv/smollm2_devil_2048");
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1) {
            if dir.join(rel).join("meta.json").is_file() {
                return dir.join(rel);
            }
        }
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The model's tensors for the demo: tokens and per-layer K, V as f16 bytes `[heads][tokens][d]`.
struct Tensors {
    tokens: Vec<u32>,
    heads: usize,
    dim: usize,
    k: Vec<Vec<u8>>,
    v: Vec<Vec<u8>>,
    /// The layers the folder holds, ascending; `k[i]` and `v[i]` belong to `layers[i]`.
    layers: Vec<u32>,
    /// Queries of the last layer (f16 bits, `[q_heads][tokens][dim]`).
    q_last: Vec<u16>,
    q_heads: usize,
}

fn load(dir: &Path) -> Result<Tensors> {
    let err = |what: &str, e: &dyn std::fmt::Display| {
        Error::Other(format!("{}: {what}: {e}", dir.display()))
    };
    let tokens = read_npy(dir.join("tokens.npy")).map_err(|e| err("tokens.npy", &e))?;
    let tokens: Vec<u32> = tokens
        .to_i32()
        .map_err(|e| err("tokens.npy", &e))?
        .into_iter()
        .map(|t| t as u32)
        .collect();
    let (mut k, mut v) = (Vec::new(), Vec::new());
    let (mut heads, mut dim) = (0, 0);
    let layers = cxlkv::ndp::demo::dumped_layers(dir)
        .map_err(|m| Error::Other(format!("{}: {m}", dir.display())))?;
    for &layer in &layers {
        for (name, out) in [("k", &mut k), ("v", &mut v)] {
            let f = format!("layer{layer:02}_{name}.npy");
            let a = read_npy(dir.join(&f)).map_err(|e| err(&f, &e))?;
            if a.shape.len() != 3 || a.shape[1] != tokens.len() {
                return Err(Error::Other(format!(
                    "{f}: shape {:?}, expected [heads, {}, dim]",
                    a.shape,
                    tokens.len()
                )));
            }
            if !out.is_empty() && (a.shape[0], a.shape[2]) != (heads, dim) {
                return Err(Error::Other(format!(
                    "{f}: shape {:?}, but other layers have {heads} heads of dimension {dim}",
                    a.shape
                )));
            }
            (heads, dim) = (a.shape[0], a.shape[2]);
            let bits = a.to_f16_bits().map_err(|e| err(&f, &e))?;
            out.push(bits.iter().flat_map(|b| b.to_le_bytes()).collect());
        }
    }
    let last = *layers.last().expect("at least one layer");
    let qf = format!("layer{last:02}_q.npy");
    let q = read_npy(dir.join(&qf)).map_err(|e| err(&qf, &e))?;
    if q.shape.len() != 3 || q.shape[1] != tokens.len() || q.shape[2] != dim {
        return Err(Error::Other(format!(
            "{qf}: shape {:?}, expected [heads, {}, {dim}]",
            q.shape,
            tokens.len()
        )));
    }
    let q_heads = q.shape[0];
    let q_last = q.to_f16_bits().map_err(|e| err(&qf, &e))?;
    Ok(Tensors {
        tokens,
        heads,
        dim,
        k,
        v,
        layers,
        q_last,
        q_heads,
    })
}

impl Tensors {
    /// The typed blocks of `layer_idx` that cover tokens `span`, [`CHUNK`] tokens each (the last
    /// may hold fewer): token range, K and V bytes (head-major).
    fn chunks(
        &self,
        layer_idx: usize,
        span: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (std::ops::Range<usize>, Vec<u8>, Vec<u8>)> + '_ {
        let (k, v) = (&self.k[layer_idx], &self.v[layer_idx]);
        chunk_kv(k, v, self.heads, self.dim * 2, span, CHUNK)
    }

    fn shape(&self, layer: u32, t0: usize, t1: usize) -> KvShape {
        KvShape {
            dtype: DType::F16,
            layer,
            kv_heads: self.heads as u32,
            head_dim: self.dim as u32,
            tokens: (t1 - t0) as u32,
            sequence: 1,
            token_offset: t0 as u64,
        }
    }

    /// "layer 17", "layers 4 and 17", "layers 3, 9 and 20".
    fn layer_list(&self) -> String {
        let names: Vec<String> = self.layers.iter().map(|l| l.to_string()).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => {
                format!("layers {} and {last}", rest.join(", "))
            }
            _ => format!("layer {}", names.join("")),
        }
    }

    fn last_layer(&self) -> u32 {
        *self.layers.last().expect("at least one layer")
    }

    fn keys(&self, layer: u32, tokens: usize) -> Vec<Key> {
        KeyChain::new("demo", MODEL, layer, layer).keys(&self.tokens[..tokens], CHUNK)
    }
}

/// Runs `cxlkv demo`: part 1 (processes sharing the pool), then part 2 (near-data top-k).
pub fn run(a: &DemoArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let code = sharing(a)?;
    if code != ExitCode::SUCCESS {
        return Ok(code);
    }
    say(
        a.json,
        "\n== part 2: near-data top-k attention (the NDP device)",
    );
    let opts = cxlkv::ndp::demo::DemoOptions {
        tokens: a.tokens,
        k: a.k,
        device_process: a.device_process,
        kv_dir: a.kv_dir.clone(),
        pool: None,
    };
    use std::io::{IsTerminal, Write};
    let tty = std::io::stderr().is_terminal();
    let report = cxlkv::ndp::demo::run_demo(&opts, &mut |m| {
        // Progress bars redraw in place on a terminal; logs get no bars.
        if tty {
            eprint!("\r{m:<78}");
            let _ = std::io::stderr().flush();
        }
    });
    if tty {
        eprint!("\r{:<78}\r", "");
    }
    let report = report.map_err(|e| Error::Other(format!("demo part 2: {e}")))?;
    if a.json {
        println!("{}", report.to_json());
    } else {
        println!("{report}");
    }
    say(
        a.json,
        &format!("demo finished in {:.1} s", started.elapsed().as_secs_f64()),
    );
    Ok(ExitCode::SUCCESS)
}

/// Prints to stdout, or to stderr when stdout carries JSON.
fn say(json: bool, line: &str) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// Part 1: participant processes share the real KV through the pool.
fn sharing(a: &DemoArgs) -> Result<ExitCode> {
    let json = a.json;
    let kv_dir = a.kv_dir.clone().unwrap_or_else(default_kv_dir);
    let spec = a
        .pool
        .clone()
        .unwrap_or_else(|| format!("shm:cxlkv-demo-{}", std::process::id()));
    let backend: Backend = spec
        .parse()
        .map_err(|e: cxlkv::runtime::region::RegionError| Error::Usage(e.to_string()))?;
    let t = load(&kv_dir)?;
    say!(
        json,
        "== part 1: participant processes share the KV cache through the pool"
    );
    say!(json, "cxlkv demo: pool {backend}, KV of {MODEL} over {} tokens ({}, {} KV heads, d = {}) from {}", t.tokens.len(), t.layer_list(), t.heads, t.dim, kv_dir.display());

    let block = ((2 * t.heads * CHUNK * t.dim * 2 + 64 + t.heads * t.dim * 8) as u64)
        .next_multiple_of(4096);
    let cfg = PoolConfig {
        block_size: block,
        participants: 4,
        lease: Duration::from_secs(2),
        ..Default::default()
    };
    let pool = Pool::create_on(&backend, 64 << 20, &cfg, &RegionOptions::default())?;
    let sb = *pool.superblock();
    say!(
        json,
        "created a {} pool: {} partitions x {} blocks of {}\n",
        human(sb.pool_size),
        sb.partitions,
        sb.blocks_per_partition,
        human(sb.block_size)
    );
    let result = run_workers(&spec, &kv_dir, &t, &pool, json);
    if !a.keep {
        let _ = Region::unlink(&backend);
    } else {
        say!(json, "kept the pool: cxlkv pool stat {spec}");
    }
    result
}

fn run_workers(
    spec: &str,
    kv_dir: &Path,
    t: &Tensors,
    pool: &Pool,
    json: bool,
) -> Result<ExitCode> {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Stdio};
    let exe = std::env::current_exe()
        .map_err(|e| Error::Other(format!("cannot find own binary: {e}")))?;
    // Engines stay attached (holding their partitions) until we close their stdin, so all three
    // participants are live at once and each reads what the others wrote.
    let mut held: Vec<Child> = Vec::new();
    let n = t.tokens.len();
    let roles = [
        (
            "engine-a",
            format!("engine A (process) serves request 1: {} tokens", n * 3 / 4),
        ),
        (
            "engine-b",
            format!("engine B (process) serves request 2: {n} tokens continuing request 1"),
        ),
        (
            "reader",
            format!(
                "reader (process) pins layer {} and runs attention over the pool's KV",
                t.last_layer()
            ),
        ),
    ];
    let mut failed = None;
    for (role, what) in roles {
        say!(json, "== {what}");
        let t0 = Instant::now();
        let mut child = match Command::new(&exe)
            .args(["demo-worker", "--pool", spec, "--role", role, "--kv-dir"])
            .arg(kv_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                failed = Some(format!("spawn {role}: {e}"));
                break;
            }
        };
        let out = child.stdout.take().expect("piped");
        let mut done = false;
        for line in BufReader::new(out)
            .lines()
            .map_while(std::result::Result::ok)
        {
            if line == HOLDING {
                done = true;
                break;
            }
            say!(json, "{line}");
        }
        if done {
            say!(
                json,
                "   ({role} ready after {:.1} ms, stays attached)\n",
                t0.elapsed().as_secs_f64() * 1e3
            );
            held.push(child);
            continue;
        }
        let status = child
            .wait()
            .map_err(|e| Error::Other(format!("wait {role}: {e}")))?;
        if !status.success() {
            failed = Some(format!("{role} failed ({status})"));
            break;
        }
        say!(
            json,
            "   ({role} took {:.1} ms)\n",
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    let st = pool_stats(pool)?;
    say!(json, "== pool while the engines are attached");
    for p in &st.participants {
        let c = p.counters;
        say!(
            json,
            "   participant {} (pid {}, partition {}): {} puts, {} hits, {} misses, {} pins",
            p.id,
            p.pid,
            p.partition.map_or("-".into(), |x| x.to_string()),
            c.puts,
            c.hits,
            c.misses,
            c.pins
        );
    }
    for p in &st.partitions {
        if p.blocks > 0 {
            say!(json, "   partition {}: {} blocks", p.id, p.blocks);
        }
    }
    for mut c in held {
        drop(c.stdin.take()); // EOF: detach and exit
        let _ = c.wait();
    }
    if let Some(f) = failed {
        return Err(Error::Other(f));
    }
    let report = check(pool)?;
    say!(
        json,
        "   after they detached, check: {}",
        report.to_string().lines().last().unwrap_or("")
    );
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Line a holding worker prints when it is done and stays attached until stdin closes.
const HOLDING: &str = "@@holding";

/// Runs one demo participant process.
pub fn worker(a: &WorkerArgs) -> Result<ExitCode> {
    let backend: Backend = a
        .pool
        .parse()
        .map_err(|e: cxlkv::runtime::region::RegionError| Error::Usage(e.to_string()))?;
    let pool = Pool::open_on(&backend, &RegionOptions::default())?;
    let t = load(&a.kv_dir)?;
    let me = pool.attach()?;
    let n = t.tokens.len();
    match a.role.as_str() {
        "engine-a" => store_chunks(&me, &t, 0, n * 3 / 4),
        "engine-b" => {
            let chain = t.keys(t.layers[0], n);
            let started = Instant::now();
            let cached = me.lookup_prefix(&chain)?;
            println!(
                "   participant {}: lookup_prefix: {cached} of {} chunks ({} of {n} tokens) already in the pool ({:.1} µs)",
                me.id(), chain.len(), (cached * CHUNK).min(n), started.elapsed().as_secs_f64() * 1e6
            );
            let started = Instant::now();
            let mut bytes = 0u64;
            for (li, &layer) in t.layers.iter().enumerate() {
                for (c, key) in t.keys(layer, n).into_iter().take(cached).enumerate() {
                    let (payload, _) = me.get(key)?.ok_or_else(|| {
                        Error::Other(format!("chunk {c} of layer {layer} vanished"))
                    })?;
                    let blk = KvBlock::parse(&payload)?;
                    let (_, k, v) = t
                        .chunks(li, c * CHUNK..(c + 1) * CHUNK)
                        .next()
                        .expect("a chunk of tokens");
                    if blk.k != k || blk.v != v || blk.shape.token_offset != (c * CHUNK) as u64 {
                        return Err(Error::Other(format!(
                            "chunk {c} of layer {layer}: bytes differ from the model's"
                        )));
                    }
                    bytes += payload.len() as u64;
                }
            }
            let secs = started.elapsed().as_secs_f64();
            println!(
                "   fetched {} cached blocks ({}) in {:.2} ms ({:.2} GB/s), every byte equal to the model's K and V",
                cached * t.layers.len(), human(bytes), secs * 1e3, bytes as f64 / secs / 1e9
            );
            store_chunks(&me, &t, cached * CHUNK, n)
        }
        "reader" => reader(&me, &t),
        other => Err(Error::Usage(format!("unknown demo role {other:?}"))),
    }?;
    if a.role.starts_with("engine") {
        use std::io::{Read, Write};
        println!("{HOLDING}");
        std::io::stdout()
            .flush()
            .map_err(|e| Error::Other(e.to_string()))?;
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    }
    Ok(ExitCode::SUCCESS)
}

fn store_chunks(me: &Participant, t: &Tensors, from: usize, to: usize) -> Result<()> {
    let started = Instant::now();
    let mut bytes = 0u64;
    let mut blocks = 0;
    for (li, &layer) in t.layers.iter().enumerate() {
        let keys = t.keys(layer, to);
        for (range, k, v) in t.chunks(li, from..to) {
            let key = keys[range.start / CHUNK];
            me.put_kv(key, &t.shape(layer, range.start, range.end), &k, &v)?;
            bytes += (k.len() + v.len()) as u64;
            blocks += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "   participant {} (partition {}): parked {blocks} typed blocks (tokens {from}..{to}, {} of K and V) in {:.2} ms",
        me.id(), me.partition().map_or("-".into(), |p| p.to_string()), human(bytes), secs * 1e3
    );
    Ok(())
}

fn reader(me: &Participant, t: &Tensors) -> Result<()> {
    use cxlkv::kernels::f16_to_f32;
    let n = t.tokens.len();
    let last = t.last_layer();
    let keys = t.keys(last, n);
    let pins: Vec<_> = keys
        .iter()
        .map(|&k| me.pin(k))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let pins: Vec<_> = pins
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::Other(format!("a chunk of layer {last} is missing")))?;
    println!(
        "   participant {}: pinned {} blocks of layer {last} (owners will not reuse them while pinned)",
        me.id(),
        pins.len()
    );
    // Gather K and V rows of KV head 0 from the pinned blocks, in token order.
    let (d, heads) = (t.dim, t.heads);
    let (mut kp, mut vp) = (Vec::new(), Vec::new());
    for p in &pins {
        let mut buf = vec![0u8; p.len() as usize];
        p.read(0, &mut buf)?;
        let blk = KvBlock::parse(&buf)?;
        let rows = blk.shape.tokens as usize;
        kp.extend_from_slice(&blk.k[..rows * d * 2]);
        vp.extend_from_slice(&blk.v[..rows * d * 2]);
    }
    let to_f32 = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    };
    let (k_pool, v_pool) = (to_f32(&kp), to_f32(&vp));
    let li = t.layers.len() - 1;
    let (k_ref, v_ref) = (to_f32(&t.k[li][..n * d * 2]), to_f32(&t.v[li][..n * d * 2]));
    // Query head 0 at the last position attends to KV head 0 (GQA: head h uses KV head h / 3).
    let q: Vec<f32> = t.q_last[(n - 1) * d..n * d]
        .iter()
        .map(|&b| f16_to_f32(b))
        .collect();
    let attend = |k: &[f32], v: &[f32]| -> Vec<f32> {
        let scale = 1.0 / (d as f32).sqrt();
        let s: Vec<f32> = k
            .chunks_exact(d)
            .map(|row| row.iter().zip(&q).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect();
        let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f32 = w.iter().sum();
        let mut o = vec![0f32; d];
        for (wi, row) in w.iter().zip(v.chunks_exact(d)) {
            for (oi, vi) in o.iter_mut().zip(row) {
                *oi += wi / z * vi;
            }
        }
        o
    };
    let (o_pool, o_ref) = (attend(&k_pool, &v_pool), attend(&k_ref, &v_ref));
    let diff = o_pool
        .iter()
        .zip(&o_ref)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!(
        "   attention of query head 0 at token {} over {n} pooled tokens: max |pool - model| = {diff:e} ({} of {} KV heads read)",
        n - 1, 1, heads
    );
    let _ = t.q_heads;
    if diff != 0.0 {
        return Err(Error::Other(format!(
            "attention over pooled KV differs from the model's by {diff}"
        )));
    }
    Ok(())
}
