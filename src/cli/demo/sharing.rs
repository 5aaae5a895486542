//! Part 1 of `cxlkv demo`: participant processes share a real KV cache through the pool.
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
//! Then it checks the pool and prints what each participant did. Each worker prints its lines
//! for people and one `@@figures {json}` line that the parent collects for `--json`.

use super::super::{human, Error, Result};
use super::kv_dir::{self, KvDir};
use cxlkv::kernels::attention::default_scale;
use cxlkv::kernels::{f16_to_f32, DType};
use cxlkv::runtime::kv::chunk_kv;
use cxlkv::runtime::region::{Backend, Region, RegionOptions};
use cxlkv::runtime::{
    check, pool_stats, Key, KeyChain, KvBlock, KvShape, Participant, Pool, PoolConfig,
};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const CHUNK: usize = 128;
const MODEL: &str = "SmolLM2-135M-Instruct";

/// Line a holding worker prints when it is done and stays attached until stdin closes.
const HOLDING: &str = "@@holding";
/// Prefix of a worker's machine-readable line.
const FIGURES: &str = "@@figures ";

/// What part 1 did: the JSON object, and whether the pool checked clean.
pub struct Sharing {
    /// Every figure of part 1.
    pub json: serde_json::Value,
    /// `cxlkv pool check` found nothing wrong after the participants detached.
    pub ok: bool,
}

/// Arguments of the hidden `cxlkv demo-worker`.
#[derive(clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pool: String,
    #[arg(long)]
    role: String,
    #[arg(long)]
    kv_dir: PathBuf,
}

/// "layer 17", "layers 4 and 17", "layers 3, 9 and 20".
fn layer_list(t: &KvDir) -> String {
    let names: Vec<String> = t.layers.iter().map(|l| l.layer.to_string()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => {
            format!("layers {} and {last}", rest.join(", "))
        }
        _ => format!("layer {}", names.join("")),
    }
}

fn last_layer(t: &KvDir) -> u32 {
    t.layers.last().expect("at least one layer").layer
}

fn keys(t: &KvDir, layer: u32, tokens: usize) -> Vec<Key> {
    KeyChain::new("demo", MODEL, layer, layer).keys(&t.tokens[..tokens], CHUNK)
}

/// The typed blocks of layer index `li` that cover tokens `span`, [`CHUNK`] tokens each (the
/// last may hold fewer): token range, K and V bytes (head-major).
fn chunks(
    t: &KvDir,
    li: usize,
    span: std::ops::Range<usize>,
) -> impl Iterator<Item = (std::ops::Range<usize>, Vec<u8>, Vec<u8>)> + '_ {
    let l = &t.layers[li];
    chunk_kv(&l.k, &l.v, t.heads, t.dim * 2, span, CHUNK)
}

fn shape(t: &KvDir, layer: u32, t0: usize, t1: usize) -> KvShape {
    KvShape {
        dtype: DType::F16,
        layer,
        kv_heads: t.heads as u32,
        head_dim: t.dim as u32,
        tokens: (t1 - t0) as u32,
        sequence: 1,
        token_offset: t0 as u64,
    }
}

/// Runs part 1 on `kv_dir` (a fresh `/dev/shm` pool unless `pool` names one; kept with `keep`).
/// `say` prints a line for people.
pub fn run(kv_dir: &Path, pool: Option<&str>, keep: bool, say: &dyn Fn(&str)) -> Result<Sharing> {
    let spec = pool.map_or_else(
        || format!("shm:cxlkv-demo-{}", std::process::id()),
        str::to_string,
    );
    let backend: Backend = spec
        .parse()
        .map_err(|e: cxlkv::runtime::region::RegionError| Error::Usage(e.to_string()))?;
    let t = kv_dir::load(kv_dir)?;
    say("== part 1: participant processes share the KV cache through the pool");
    say(&format!(
        "cxlkv demo: pool {backend}, KV of {MODEL} over {} tokens ({}, {} KV heads, d = {}) from {}",
        t.tokens.len(),
        layer_list(&t),
        t.heads,
        t.dim,
        kv_dir.display()
    ));
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
    say(&format!(
        "created a {} pool: {} partitions x {} blocks of {}\n",
        human(sb.pool_size),
        sb.partitions,
        sb.blocks_per_partition,
        human(sb.block_size)
    ));
    let result = run_workers(&spec, kv_dir, &t, &pool, say);
    if keep {
        say(&format!("kept the pool: cxlkv pool stat {spec}"));
    } else {
        let _ = Region::unlink(&backend);
    }
    let (workers, participants, ok) = result?;
    Ok(Sharing {
        json: json!({
            "pool": spec,
            "pool_bytes": sb.pool_size,
            "block_bytes": sb.block_size,
            "model": MODEL,
            "tokens": t.tokens.len(),
            "layers": t.layers.iter().map(|l| l.layer).collect::<Vec<_>>(),
            "kv_heads": t.heads,
            "head_dim": t.dim,
            "workers": workers,
            "participants": participants,
            "check_ok": ok,
        }),
        ok,
    })
}

/// Runs the three workers; returns their figures, each participant's counters while attached,
/// and whether the pool checked clean after they detached.
fn run_workers(
    spec: &str,
    kv_dir: &Path,
    t: &KvDir,
    pool: &Pool,
    say: &dyn Fn(&str),
) -> Result<(serde_json::Value, Vec<serde_json::Value>, bool)> {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Stdio};
    let exe = std::env::current_exe()
        .map_err(|e| Error::Other(format!("cannot find own binary: {e}")))?;
    // Engines stay attached (holding their partitions) until we close their stdin, so all three
    // participants are live at once and each reads what the others wrote.
    let mut held: Vec<Child> = Vec::new();
    let mut figures = serde_json::Map::new();
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
                last_layer(t)
            ),
        ),
    ];
    let mut failed = None;
    for (role, what) in roles {
        say(&format!("== {what}"));
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
        let mut mine = serde_json::Map::new();
        for line in BufReader::new(out)
            .lines()
            .map_while(std::result::Result::ok)
        {
            if line == HOLDING {
                done = true;
                break;
            }
            match line.strip_prefix(FIGURES) {
                Some(j) => {
                    if let Ok(serde_json::Value::Object(m)) = serde_json::from_str(j) {
                        mine.extend(m);
                    }
                }
                None => say(&line),
            }
        }
        if done {
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            say(&format!(
                "   ({role} ready after {ms:.1} ms, stays attached)\n"
            ));
            mine.insert("ms".into(), json!(ms));
            figures.insert(role.into(), mine.into());
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
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        say(&format!("   ({role} took {ms:.1} ms)\n"));
        mine.insert("ms".into(), json!(ms));
        figures.insert(role.into(), mine.into());
    }
    let st = pool_stats(pool)?;
    say("== pool while the engines are attached");
    let mut participants = Vec::new();
    for p in &st.participants {
        let c = p.counters;
        say(&format!(
            "   participant {} (pid {}, partition {}): {} puts, {} hits, {} misses, {} pins",
            p.id,
            p.pid,
            p.partition.map_or("-".into(), |x| x.to_string()),
            c.puts,
            c.hits,
            c.misses,
            c.pins
        ));
        participants.push(json!({
            "id": p.id, "pid": p.pid, "partition": p.partition,
            "puts": c.puts, "hits": c.hits, "misses": c.misses, "pins": c.pins,
        }));
    }
    for p in &st.partitions {
        if p.blocks > 0 {
            say(&format!("   partition {}: {} blocks", p.id, p.blocks));
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
    say(&format!(
        "   after they detached, check: {}",
        report.to_string().lines().last().unwrap_or("")
    ));
    Ok((figures.into(), participants, report.ok()))
}

/// Prints a worker's figures for the parent.
fn figures(j: serde_json::Value) {
    println!("{FIGURES}{j}");
}

/// Runs one demo participant process.
pub fn worker(a: &WorkerArgs) -> Result<()> {
    let backend: Backend = a
        .pool
        .parse()
        .map_err(|e: cxlkv::runtime::region::RegionError| Error::Usage(e.to_string()))?;
    let pool = Pool::open_on(&backend, &RegionOptions::default())?;
    let t = kv_dir::load(&a.kv_dir)?;
    let me = pool.attach()?;
    let n = t.tokens.len();
    match a.role.as_str() {
        "engine-a" => store_chunks(&me, &t, 0, n * 3 / 4),
        "engine-b" => {
            let chain = keys(&t, t.layers[0].layer, n);
            let started = Instant::now();
            let cached = me.lookup_prefix(&chain)?;
            let lookup_us = started.elapsed().as_secs_f64() * 1e6;
            println!(
                "   participant {}: lookup_prefix: {cached} of {} chunks ({} of {n} tokens) already in the pool ({lookup_us:.1} µs)",
                me.id(), chain.len(), (cached * CHUNK).min(n)
            );
            let started = Instant::now();
            let mut bytes = 0u64;
            for (li, l) in t.layers.iter().enumerate() {
                for (c, key) in keys(&t, l.layer, n).into_iter().take(cached).enumerate() {
                    let (payload, _) = me.get(key)?.ok_or_else(|| {
                        Error::Other(format!("chunk {c} of layer {} vanished", l.layer))
                    })?;
                    let blk = KvBlock::parse(&payload)?;
                    let (_, k, v) = chunks(&t, li, c * CHUNK..(c + 1) * CHUNK)
                        .next()
                        .expect("a chunk of tokens");
                    if blk.k != k || blk.v != v || blk.shape.token_offset != (c * CHUNK) as u64 {
                        return Err(Error::Other(format!(
                            "chunk {c} of layer {}: bytes differ from the model's",
                            l.layer
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
            figures(json!({
                "prefix_chunks_cached": cached, "prefix_chunks": chain.len(),
                "lookup_us": lookup_us, "fetched_blocks": cached * t.layers.len(),
                "fetched_bytes": bytes, "fetch_ms": secs * 1e3, "fetched_bytes_equal": true,
            }));
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
    Ok(())
}

fn store_chunks(me: &Participant, t: &KvDir, from: usize, to: usize) -> Result<()> {
    let started = Instant::now();
    let mut bytes = 0u64;
    let mut blocks = 0;
    for (li, l) in t.layers.iter().enumerate() {
        let keys = keys(t, l.layer, to);
        for (range, k, v) in chunks(t, li, from..to) {
            let key = keys[range.start / CHUNK];
            me.put_kv(key, &shape(t, l.layer, range.start, range.end), &k, &v)?;
            bytes += (k.len() + v.len()) as u64;
            blocks += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "   participant {} (partition {}): parked {blocks} typed blocks (tokens {from}..{to}, {} of K and V) in {:.2} ms",
        me.id(), me.partition().map_or("-".into(), |p| p.to_string()), human(bytes), secs * 1e3
    );
    figures(json!({
        "parked_blocks": blocks, "parked_tokens": [from, to], "parked_bytes": bytes,
        "park_ms": secs * 1e3,
    }));
    Ok(())
}

fn reader(me: &Participant, t: &KvDir) -> Result<()> {
    let n = t.tokens.len();
    let last = last_layer(t);
    let pins: Vec<_> = keys(t, last, n)
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
    let d = t.dim;
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
    let l = t.layers.last().expect("at least one layer");
    let (k_ref, v_ref) = (to_f32(&l.k[..n * d * 2]), to_f32(&l.v[..n * d * 2]));
    // Query head 0 at the last position attends to KV head 0 (GQA: head h uses KV head h / 3).
    let q = to_f32(&l.q[(n - 1) * d * 2..n * d * 2]);
    let attend = |k: &[f32], v: &[f32]| -> Vec<f32> {
        let scale = default_scale(d);
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
        "   attention of query head 0 at token {} over {n} pooled tokens: max |pool - model| = {diff:e} (1 of {} KV heads read)",
        n - 1, t.heads
    );
    figures(json!({
        "pinned_blocks": pins.len(), "layer": last, "attention_tokens": n,
        "max_abs_diff_pool_vs_model": diff,
    }));
    if diff != 0.0 {
        return Err(Error::Other(format!(
            "attention over pooled KV differs from the model's by {diff}"
        )));
    }
    Ok(())
}
