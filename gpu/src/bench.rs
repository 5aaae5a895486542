//! `cxlkv bench gpu`: one decode step's attention over the same KV, four ways, on one GPU.
//!
//! - **dense**: K/V in GPU memory (HBM), the reference;
//! - **pull**: every K/V row read in place from registered host memory over the link;
//! - **gather**: only the top-k rows per KV head (exact top-k by the group's largest score,
//!   chosen on the CPU once) read in place from registered host memory;
//! - **ndp+merge**: the stored rows sit in a pool as typed KV blocks of [`BLOCK_TOKENS`] tokens;
//!   the CPU computes each KV head's ATTEND over them through the runtime's ATTEND path
//!   (`cxlkv_runtime::ndp::host_attend_with`: the device's computation and block checks, one
//!   thread per KV head as a device's workers), the GPU attends the open block (the last
//!   [`OPEN_ROWS`] rows, in GPU memory) and merges the two.
//!
//! A step runs every layer; layers cycle over the distinct layer data a workload holds (SmolLM2's
//! two dumped layers, one random layer of the Llama-3-8B shape), which reads the same bytes per
//! layer as distinct data would (the GPU's caches hold far less than a layer). Each path's
//! answer on the first layer is compared with the CPU ATTEND ([`Path::error`]); times are the best
//! of the repeats.

use crate::{link, DeviceKv, Gpu, GpuError, Kind, KvShape, Pass, RegisteredMemory, Result};
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::{attend_block, DType, KeyRows, Partial, QueryGroup, ScoreKernel};
use cxlkv_runtime::ndp::{host_attend_with, AttendRequest, BlockSpec};
use cxlkv_runtime::{Key, Pool, PoolConfig, Region, SharedMemory};
use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Instant;

/// Rows of the open block (the tokens not yet written to the pool) in the ndp+merge path.
pub const OPEN_ROWS: usize = 256;
/// Tokens per typed KV block in the ndp+merge path's pool.
pub const BLOCK_TOKENS: usize = 1024;

/// One model's KV at one length.
pub struct Workload {
    /// What it is (`SmolLM2-135M data/kv, 2048 tokens`).
    pub name: String,
    /// Layers of a decode step.
    pub layers: usize,
    /// The shape of one layer.
    pub shape: KvShape,
    /// Queries per KV head.
    pub group: usize,
    /// The scale of `q·k`.
    pub scale: f32,
    /// Distinct layers: K, V (head-major bytes) and queries (`heads × group × dim`).
    pub data: Vec<(Vec<u8>, Vec<u8>, Vec<f32>)>,
}

impl Workload {
    /// The real SmolLM2-135M KV of `dir` (data/kv/smollm2_devil_2048): its dumped layers, the
    /// last token's queries.
    pub fn smollm2(dir: &FsPath) -> Result<Workload> {
        let read = |name: &str| {
            cxlkv_bench_support::npy::read_npy(dir.join(name))
                .map_err(|e| GpuError::Shape(format!("{}: {e}", dir.join(name).display())))
        };
        let mut data = Vec::new();
        let mut shape = None;
        let mut group = 0;
        for layer in ["layer04", "layer17"] {
            let (k, v, q) = (
                read(&format!("{layer}_k.npy"))?,
                read(&format!("{layer}_v.npy"))?,
                read(&format!("{layer}_q.npy"))?,
            );
            let (&[heads, rows, dim], &[qheads, qrows, _]) = (&k.shape[..], &q.shape[..]) else {
                return Err(GpuError::Shape(format!(
                    "{layer}: K {:?}, Q {:?}: need 3 axes",
                    k.shape, q.shape
                )));
            };
            use cxlkv_bench_support::npy::NpyDType;
            let fits = k.dtype == NpyDType::F16
                && v.dtype == NpyDType::F16
                && v.shape == k.shape
                && heads > 0
                && qheads % heads == 0
                && qrows > 0
                && q.shape[2] == dim;
            if !fits {
                return Err(GpuError::Shape(format!(
                    "{layer}: need f16 K and V of one shape [heads, tokens, dim] and queries \
                     [G × heads, tokens, dim]; found K {:?} {:?}, V {:?} {:?}, Q {:?}",
                    k.dtype, k.shape, v.dtype, v.shape, q.shape
                )));
            }
            group = qheads / heads;
            let qf = q.to_f32().map_err(|e| GpuError::Shape(e.to_string()))?;
            // The last token's query of every query head; query head h uses KV head h / group.
            let last: Vec<f32> = (0..qheads)
                .flat_map(|h| qf[(h * qrows + qrows - 1) * dim..(h * qrows + qrows) * dim].to_vec())
                .collect();
            shape = Some(KvShape::new(heads, rows, dim, DType::F16)?);
            data.push((k.data, v.data, last));
        }
        let shape = shape.expect("two layers");
        Ok(Workload {
            name: format!("SmolLM2-135M {} ({} tokens)", dir.display(), shape.rows),
            layers: 30,
            shape,
            group,
            scale: 0.125,
            data,
        })
    }

    /// A Llama-3-8B-shaped sequence: 32 layers, 8 KV heads, G = 4, d = 128, f16, random K/V.
    pub fn llama3_8b(tokens: usize) -> Result<Workload> {
        let shape = KvShape::new(8, tokens, 128, DType::F16)?;
        let mut r = SplitMix64::new(tokens as u64);
        let k = r.key_bytes(shape.heads * tokens, shape.dim, DType::F16);
        let v = r.key_bytes(shape.heads * tokens, shape.dim, DType::F16);
        let q = r.normal_vec(shape.heads * 4 * shape.dim);
        Ok(Workload {
            name: format!("Llama-3-8B shape, {tokens} tokens (random K/V)"),
            layers: 32,
            shape,
            group: 4,
            scale: 1.0 / (shape.dim as f32).sqrt(),
            data: vec![(k, v, q)],
        })
    }
}

/// One path's result.
#[derive(Clone, Debug)]
pub struct Path {
    /// `dense`, `pull`, `gather`, `ndp+merge`.
    pub name: &'static str,
    /// Best time of one decode step (every layer), seconds.
    pub step_s: f64,
    /// Bytes the step moves over the link (host to GPU).
    pub link_bytes: u64,
    /// Largest difference of the first layer's attention outputs from the CPU ATTEND's, relative
    /// to the largest output.
    pub error: f64,
}

/// The bench of one workload.
pub struct Report {
    /// The workload's name.
    pub workload: String,
    /// Tokens (rows per head).
    pub tokens: usize,
    /// Layers per step.
    pub layers: usize,
    /// Rows per head that gather reads.
    pub topk: usize,
    /// Each path.
    pub paths: Vec<Path>,
}

/// Host-to-GPU bandwidth of the machine, measured over `bytes`.
pub fn link(gpu: &Gpu, bytes: u64) -> Result<link::LinkBandwidth> {
    link::measure(gpu, bytes, 5)
}

fn rel_error(got: &[Partial], want: &[Partial]) -> f64 {
    let mut scale = 0f32;
    let mut err = 0f32;
    for (a, b) in got.iter().zip(want) {
        for (x, y) in a.finish().iter().zip(b.finish()) {
            scale = scale.max(y.abs());
            err = err.max((x - y).abs());
        }
    }
    f64::from(err / scale.max(f32::MIN_POSITIVE))
}

/// The CPU ATTEND per head over rows `[lo, hi)` (threads: one per head), or over `sel`.
fn cpu_attend(
    w: &Workload,
    layer: usize,
    lo: usize,
    hi: usize,
    sel: Option<&[u32]>,
) -> Vec<Partial> {
    let s = w.shape;
    let (k, v, q) = &w.data[layer];
    let row = s.dtype.bytes(s.dim);
    let kernel = ScoreKernel::detect();
    let per_head: Vec<Vec<Partial>> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..s.heads)
            .map(|h| {
                scope.spawn(move || {
                    let base = h * s.rows * row;
                    let (kh, vh) = match sel {
                        Some(sel) => {
                            let n = sel.len() / s.heads;
                            let pick = |b: &[u8]| -> Vec<u8> {
                                sel[h * n..(h + 1) * n]
                                    .iter()
                                    .flat_map(|&i| {
                                        b[base + i as usize * row..base + (i as usize + 1) * row]
                                            .to_vec()
                                    })
                                    .collect()
                            };
                            (pick(k), pick(v))
                        }
                        None => (
                            k[base + lo * row..base + hi * row].to_vec(),
                            v[base + lo * row..base + hi * row].to_vec(),
                        ),
                    };
                    let keys = KeyRows::new(&kh, s.dtype, s.dim).expect("rows");
                    let values = KeyRows::new(&vh, s.dtype, s.dim).expect("rows");
                    let qs =
                        QueryGroup::new(&q[h * w.group * s.dim..(h + 1) * w.group * s.dim], s.dim)
                            .expect("queries");
                    attend_block(kernel, &qs, &keys, &values, w.scale)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("attend thread"))
            .collect()
    });
    per_head.into_iter().flatten().collect()
}

/// The top-`k` rows per head of layer 0 by the group's largest score, head-major.
fn top_rows(w: &Workload, k: usize) -> Vec<u32> {
    let s = w.shape;
    let (keys, _, q) = &w.data[0];
    let row = s.dtype.bytes(s.dim);
    let kernel = ScoreKernel::detect();
    let mut sel = Vec::with_capacity(k * s.heads);
    for h in 0..s.heads {
        let kh = KeyRows::new(
            &keys[h * s.rows * row..(h + 1) * s.rows * row],
            s.dtype,
            s.dim,
        )
        .expect("rows");
        let qs = QueryGroup::new(&q[h * w.group * s.dim..(h + 1) * w.group * s.dim], s.dim)
            .expect("queries");
        let mut scores = vec![0f32; s.rows * w.group];
        kernel.score(&qs, &kh, &mut scores);
        let mut best: Vec<(f32, u32)> = scores
            .chunks_exact(w.group)
            .enumerate()
            .map(|(i, c)| (c.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)), i as u32))
            .collect();
        best.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
        let mut top: Vec<u32> = best[..k].iter().map(|b| b.1).collect();
        top.sort_unstable();
        sel.extend(top);
    }
    sel
}

/// The stored rows of every distinct layer as typed KV blocks in a pool, and each layer's block
/// list for its ATTEND requests.
struct NdpStore {
    pool: Pool,
    /// Per distinct layer, its blocks in token order.
    blocks: Vec<Vec<BlockSpec>>,
}

impl NdpStore {
    /// Writes rows `[0, stored)` of each distinct layer of `w` into a fresh anonymous pool.
    fn new(w: &Workload, stored: usize) -> Result<NdpStore> {
        let s = w.shape;
        let ndp = |e: &dyn std::fmt::Display| GpuError::Shape(format!("the ndp+merge pool: {e}"));
        let block_shape = |layer: usize, t0: usize, t1: usize| cxlkv_runtime::KvShape {
            dtype: s.dtype,
            layer: layer as u32,
            kv_heads: s.heads as u32,
            head_dim: s.dim as u32,
            tokens: (t1 - t0) as u32,
            sequence: 1,
            token_offset: t0 as u64,
        };
        let full = block_shape(0, 0, BLOCK_TOKENS.min(stored))
            .payload_bytes()
            .ok_or_else(|| ndp(&"block too large"))? as u64;
        let block_size = full.div_ceil(4096) * 4096;
        let count = (stored.div_ceil(BLOCK_TOKENS) * w.data.len()) as u64;
        let cfg = PoolConfig {
            block_size,
            participants: 1,
            ..PoolConfig::default()
        };
        let size = (count + 8) * (block_size + (64 << 10)) + (16 << 20);
        let region = Region::anonymous(size).map_err(|e| ndp(&e))?;
        let pool = Pool::create(Arc::new(region), &cfg).map_err(|e| ndp(&e))?;
        let writer = pool.attach().map_err(|e| ndp(&e))?;
        let row = s.dtype.bytes(s.dim);
        let mut blocks = Vec::new();
        for (layer, (k, v, _)) in w.data.iter().enumerate() {
            let mut specs = Vec::new();
            for t0 in (0..stored).step_by(BLOCK_TOKENS) {
                let t1 = (t0 + BLOCK_TOKENS).min(stored);
                // [kv_heads][tokens][head_dim], as put_kv takes a block.
                let slice = |b: &[u8]| -> Vec<u8> {
                    (0..s.heads)
                        .flat_map(|h| b[(h * s.rows + t0) * row..(h * s.rows + t1) * row].to_vec())
                        .collect()
                };
                let key = Key::from_bytes(format!("cxlkv-gpu-bench/{layer}/{t0}").as_bytes());
                writer
                    .put_kv(key, &block_shape(layer, t0, t1), &slice(k), &slice(v))
                    .map_err(|e| ndp(&e))?;
                specs.push(BlockSpec {
                    key,
                    token_offset: t0 as u64,
                });
            }
            blocks.push(specs);
        }
        Ok(NdpStore { pool, blocks })
    }

    /// The ATTEND partials of distinct layer `i`, `heads × g`, head-major (one thread per head).
    fn attend(&self, w: &Workload, i: usize) -> Result<Vec<Partial>> {
        let s = w.shape;
        let kernel = ScoreKernel::detect();
        let q = &w.data[i].2;
        let per_head: Vec<Result<Vec<Partial>>> = std::thread::scope(|scope| {
            let hs: Vec<_> = (0..s.heads)
                .map(|h| {
                    scope.spawn(move || {
                        let req = AttendRequest {
                            queries: &q[h * w.group * s.dim..(h + 1) * w.group * s.dim],
                            dim: s.dim,
                            blocks: &self.blocks[i],
                            sequence: 1,
                            layer: i as u32,
                            kv_head: h as u32,
                            dtype: s.dtype,
                            scale: Some(w.scale),
                            sparse: None,
                        };
                        host_attend_with(&self.pool, &req, kernel)
                            .map(|a| a.partials)
                            .map_err(|e| GpuError::Shape(format!("ATTEND of head {h}: {e}")))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("ATTEND thread"))
                .collect()
        });
        let mut out = Vec::with_capacity(s.heads * w.group);
        for p in per_head {
            out.extend(p?);
        }
        Ok(out)
    }
}

fn best_of(repeats: usize, mut step: impl FnMut() -> Result<()>) -> Result<f64> {
    step()?; // warm-up
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        step()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Runs the four paths over `w`; progress to stderr.
pub fn run(gpu: &Gpu, w: &Workload, topk: usize, repeats: usize) -> Result<Report> {
    let s = w.shape;
    let topk = topk.clamp(1, s.rows);
    let layer_bytes = 2 * s.bytes() as u64;
    let note = |m: &str| eprintln!("bench gpu: {}: {m}", w.name);
    note("CPU reference (first layer)");
    let reference = cpu_attend(w, 0, 0, s.rows, None);
    let mut paths = Vec::new();
    let mut passes = w
        .data
        .iter()
        .map(|(_, _, q)| Pass::new(gpu, s.heads, w.group, s.dim, q, w.scale))
        .collect::<Result<Vec<_>>>()?;

    note("dense (K/V in GPU memory)");
    let dev = w
        .data
        .iter()
        .map(|(k, v, _)| DeviceKv::upload(gpu, s, k, v))
        .collect::<Result<Vec<_>>>()?;
    let rows: Vec<_> = dev.iter().map(|d| d.rows(gpu)).collect();
    let step = |kind: Kind, kv: &[crate::KvRows<'_>], passes: &mut [Pass]| -> Result<()> {
        for l in 0..w.layers {
            let i = l % kv.len();
            passes[i].launch(gpu, &kv[i], kind)?;
        }
        gpu.synchronize()
    };
    let t = best_of(repeats, || step(Kind::Full, &rows, &mut passes))?;
    passes[0].launch(gpu, &rows[0], Kind::Full)?;
    let error = rel_error(&passes[0].read(gpu)?, &reference);
    paths.push(Path {
        name: "dense",
        step_s: t,
        link_bytes: 0,
        error,
    });
    drop(rows);
    drop(dev);

    note("pull (every row from registered host memory)");
    let region = Region::anonymous(layer_bytes * w.data.len() as u64)
        .map_err(|e| GpuError::Shape(e.to_string()))?;
    for (i, (k, v, _)) in w.data.iter().enumerate() {
        let off = i as u64 * layer_bytes;
        region
            .write(off, k)
            .map_err(|e| GpuError::Shape(e.to_string()))?;
        region
            .write(off + s.bytes() as u64, v)
            .map_err(|e| GpuError::Shape(e.to_string()))?;
    }
    let reg = RegisteredMemory::region(gpu, Arc::new(region))?;
    let host = (0..w.data.len())
        .map(|i| {
            let off = i as u64 * layer_bytes;
            reg.kv(off, off + s.bytes() as u64, s.heads, s.rows, s.dim, s.dtype)
        })
        .collect::<Result<Vec<_>>>()?;
    let t = best_of(repeats, || step(Kind::Full, &host, &mut passes))?;
    passes[0].launch(gpu, &host[0], Kind::Full)?;
    let error = rel_error(&passes[0].read(gpu)?, &reference);
    paths.push(Path {
        name: "pull",
        step_s: t,
        link_bytes: layer_bytes * w.layers as u64,
        error,
    });

    note(&format!(
        "gather (top-{topk} rows per head from registered host memory)"
    ));
    let sel = top_rows(w, topk);
    for p in passes.iter_mut() {
        p.set_selection(gpu, &sel, s.rows)?;
    }
    let t = best_of(repeats, || step(Kind::Gather, &host, &mut passes))?;
    passes[0].launch(gpu, &host[0], Kind::Gather)?;
    let error = rel_error(&passes[0].read(gpu)?, &cpu_attend(w, 0, 0, 0, Some(&sel)));
    let gathered = 2 * s.dtype.bytes(s.dim) as u64 * sel.len() as u64 * w.layers as u64;
    paths.push(Path {
        name: "gather",
        step_s: t,
        link_bytes: gathered,
        error,
    });
    drop(host);
    drop(reg);

    note(&format!(
        "ndp+merge (the runtime's ATTEND over {BLOCK_TOKENS}-token pool blocks on the CPU, GPU merge with the last {OPEN_ROWS} rows)"
    ));
    let open = OPEN_ROWS.min(s.rows - 1).max(1);
    let stored = s.rows - open;
    let store = NdpStore::new(w, stored)?;
    let open_shape = KvShape::new(s.heads, open, s.dim, s.dtype)?;
    let row = s.dtype.bytes(s.dim);
    let tail = |b: &[u8]| -> Vec<u8> {
        (0..s.heads)
            .flat_map(|h| b[(h * s.rows + stored) * row..(h + 1) * s.rows * row].to_vec())
            .collect()
    };
    let open_dev = w
        .data
        .iter()
        .map(|(k, v, _)| DeviceKv::upload(gpu, open_shape, &tail(k), &tail(v)))
        .collect::<Result<Vec<_>>>()?;
    let open_rows: Vec<_> = open_dev.iter().map(|d| d.rows(gpu)).collect();
    let mut ndp_step = |layers: usize| -> Result<()> {
        for l in 0..layers {
            let i = l % w.data.len();
            let parts = store.attend(w, i)?;
            passes[i].set_device_partials(gpu, &parts, 1)?;
            passes[i].launch(gpu, &open_rows[i], Kind::Merge)?;
        }
        gpu.synchronize()
    };
    let t = best_of(repeats, || ndp_step(w.layers))?;
    ndp_step(1)?;
    let error = rel_error(&passes[0].read(gpu)?, &reference);
    let partial_bytes = (s.heads * w.group * (s.dim + 2) * 4) as u64 * w.layers as u64;
    paths.push(Path {
        name: "ndp+merge",
        step_s: t,
        link_bytes: partial_bytes,
        error,
    });

    Ok(Report {
        workload: w.name.clone(),
        tokens: s.rows,
        layers: w.layers,
        topk,
        paths,
    })
}

/// Where two paths' step times cross, by a straight line through each path's times at the
/// reports' lengths (the first and last report of the same model): `Some(tokens)` inside or
/// beyond the measured range, `None` when one path is faster at every length.
pub fn crossover(reports: &[&Report], a: &str, b: &str) -> Option<f64> {
    let (first, last) = (reports.first()?, reports.last()?);
    if first.tokens == last.tokens {
        return None;
    }
    let time = |r: &Report, n: &str| r.paths.iter().find(|p| p.name == n).map(|p| p.step_s);
    let (n0, n1) = (first.tokens as f64, last.tokens as f64);
    let (a0, a1, b0, b1) = (
        time(first, a)?,
        time(last, a)?,
        time(first, b)?,
        time(last, b)?,
    );
    let (sa, sb) = ((a1 - a0) / (n1 - n0), (b1 - b0) / (n1 - n0));
    if sa == sb {
        return None;
    }
    let n = n0 + (b0 - a0) / (sa - sb);
    (n > 0.0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(tokens: usize, times: &[(&'static str, f64)]) -> Report {
        Report {
            workload: String::new(),
            tokens,
            layers: 1,
            topk: 1,
            paths: times
                .iter()
                .map(|&(name, step_s)| Path {
                    name,
                    step_s,
                    link_bytes: 0,
                    error: 0.0,
                })
                .collect(),
        }
    }

    #[test]
    fn crossover_is_where_the_lines_meet() {
        // a: 1 + 1/token-unit, b: 3 + 0.5: equal at 4 units.
        let r0 = report(1, &[("a", 2.0), ("b", 3.5)]);
        let r1 = report(3, &[("a", 4.0), ("b", 4.5)]);
        let n = crossover(&[&r0, &r1], "a", "b").unwrap();
        assert!((n - 4.0).abs() < 1e-9, "{n}");
        assert_eq!(crossover(&[&r0, &r0], "a", "b"), None);
        let parallel = report(3, &[("a", 4.0), ("b", 5.5)]);
        assert_eq!(crossover(&[&r0, &parallel], "a", "b"), None);
    }

    #[test]
    fn the_smollm2_kv_loads_and_the_cpu_paths_agree() {
        let dir = FsPath::new(env!("CARGO_MANIFEST_DIR")).join("../data/kv/smollm2_devil_2048");
        let w = Workload::smollm2(&dir).unwrap();
        assert_eq!(
            (w.shape.heads, w.shape.rows, w.shape.dim, w.group),
            (3, 2048, 64, 3)
        );
        assert_eq!(w.data.len(), 2);
        assert_eq!(w.data[0].2.len(), 9 * 64);
        let sel = top_rows(&w, 64);
        assert_eq!(sel.len(), 3 * 64);
        for h in sel.chunks_exact(64) {
            assert!(h.windows(2).all(|p| p[0] < p[1]), "sorted, distinct");
        }
        // The ndp+merge split: the stored rows' partials merged with the open block's equal the
        // whole (the rule the GPU merge applies).
        let all = cpu_attend(&w, 0, 0, 2048, None);
        let stored = cpu_attend(&w, 0, 0, 2048 - OPEN_ROWS, None);
        let open = cpu_attend(&w, 0, 2048 - OPEN_ROWS, 2048, None);
        let merged: Vec<Partial> = stored
            .into_iter()
            .zip(open)
            .map(|(mut a, b)| {
                a.merge(&b);
                a
            })
            .collect();
        assert!(rel_error(&merged, &all) < 1e-5);
        assert!(rel_error(&cpu_attend(&w, 0, 0, 0, Some(&sel)), &all) > 0.0);
        // The ndp+merge path's device share: the runtime's ATTEND over the pool's blocks.
        let store = NdpStore::new(&w, 2048 - OPEN_ROWS).unwrap();
        assert_eq!(
            store.blocks[1].len(),
            (2048 - OPEN_ROWS).div_ceil(BLOCK_TOKENS)
        );
        for layer in 0..2 {
            let open = cpu_attend(&w, layer, 2048 - OPEN_ROWS, 2048, None);
            let mut device = store.attend(&w, layer).unwrap();
            for (d, o) in device.iter_mut().zip(&open) {
                d.merge(o);
            }
            let err = rel_error(&device, &cpu_attend(&w, layer, 0, 2048, None));
            assert!(err < 1e-5, "layer {layer}: {err}");
        }
    }

    #[test]
    fn a_bad_kv_folder_is_an_error_not_a_panic() {
        use cxlkv_bench_support::npy::{encode_npy, NpyDType};
        let dir = std::env::temp_dir().join(format!("cxlkv-gpu-badkv-{}", std::process::id()));
        let e = Workload::smollm2(&dir).err().expect("a missing folder");
        assert!(e.to_string().contains("layer04_k.npy"), "{e}");
        std::fs::create_dir_all(&dir).unwrap();
        let f32s = encode_npy(NpyDType::F32, &[1, 4, 32], &[0u8; 4 * 4 * 32]);
        let f16s = encode_npy(NpyDType::F16, &[1, 4, 32], &[0u8; 2 * 4 * 32]);
        for l in ["layer04", "layer17"] {
            std::fs::write(dir.join(format!("{l}_k.npy")), &f32s).unwrap();
            std::fs::write(dir.join(format!("{l}_v.npy")), &f16s).unwrap();
            std::fs::write(dir.join(format!("{l}_q.npy")), &f32s).unwrap();
        }
        let e = Workload::smollm2(&dir).err().expect("f32 keys");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.to_string().contains("need f16 K and V"), "{e}");
    }

    #[test]
    fn the_llama_shape_is_llama_3_8b() {
        let w = Workload::llama3_8b(512).unwrap();
        assert_eq!(
            (w.layers, w.shape.heads, w.shape.dim, w.group),
            (32, 8, 128, 4)
        );
        assert_eq!(w.shape.dtype, DType::F16);
        assert_eq!(w.data[0].0.len(), 8 * 512 * 128 * 2);
        let store = NdpStore::new(&w, 512 - OPEN_ROWS).unwrap();
        assert_eq!(store.attend(&w, 0).unwrap().len(), 8 * 4);
    }
}
