//! Whose block the device reads, and from which pool (ABI 1.4, docs/ABI.md "Tenants and pools").
//!
//! Through a queue attached as tenant A, every command that reads blocks (SCORE_TOPK plain, pruned,
//! selected and over int8 blocks, GATHER, ATTEND, sparse and sketched ATTEND, BUILD_BOUNDS) is
//! served on A's blocks and on tenant 0's, equal to the host's answer, and refused with
//! `ERR_ACCESS` (detail: the index of the first foreign block) on a block of tenant B, by the
//! device and by the host fallback alike; the device keeps serving and counts each refusal. A
//! command on pool A's queue built from pool B's real blocks is refused too (`ERR_BLOCK`; keys A
//! also holds, for another sequence: `ERR_LAYOUT`; B's offsets, beyond A's geometry: `ERR_RANGE`). Each scenario runs with in-process devices and with
//! one `cxlkv-ndpd` serving both pools (and skipping a corrupt third it reports), on both engines.
//!
//! Test setup: until attaching as a tenant lands in the runtime, `attach_as` writes a slot's
//! `tenant` word and `give` the blocks' header `tenant` word (format 3.2; tests/common), as the
//! runtime will; the device trusts nothing else.

mod common;
use common::*;
use cxlkv_kernels::attention::default_scale;
use cxlkv_kernels::{rng::SplitMix64, DType, GroupMode, Partial};
use cxlkv_ndp::daemon::Daemon;
use cxlkv_ndp::{Device, DeviceConfig, DeviceHandle, Engine};
use cxlkv_runtime::kv::{chunk_kv, Sketch};
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::sparse::Sparse;
use cxlkv_runtime::ndp::{
    host_attend_as, host_gather, host_score_topk_as, reg, AttendRequest, BlockExpect, BlockSpec,
    DeviceLayout, DeviceStatus, FallbackReason, NdpDevice, NdpError, NdpOptions, NdpPath,
    ScoreRequest, Select,
};
use cxlkv_runtime::tenant::Tenant;
use cxlkv_runtime::{Key, KvShape, Participant, Pool};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const T1: u64 = 1;
const T2: u64 = 2;
const DIM: usize = 32;
const TOKENS: usize = 400;
const PER_BLOCK: usize = 100;

/// One layer of one sequence: 2 KV heads of `TOKENS` tokens in blocks of `PER_BLOCK`, each with
/// an int4 key sketch.
struct Layer {
    blocks: Vec<BlockSpec>,
    dtype: DType,
    sequence: u64,
}

fn store(p: &Participant, sequence: u64, dtype: DType) -> Layer {
    store_keyed(p, sequence, dtype, sequence)
}

/// [`store`] under the keys that [`store`] gives sequence `keys_of`.
fn store_keyed(p: &Participant, sequence: u64, dtype: DType, keys_of: u64) -> Layer {
    // Quantized blocks take f32 elements; the others their stored type.
    let input = if dtype.is_quantized() {
        DType::F32
    } else {
        dtype
    };
    let (k, v) = random_kv(sequence, 2, TOKENS, DIM, input);
    let mut blocks = Vec::new();
    for (range, bk, bv) in chunk_kv(&k, &v, 2, input.bytes(DIM), 0..TOKENS, PER_BLOCK) {
        let shape = KvShape {
            dtype,
            layer: 0,
            kv_heads: 2,
            head_dim: DIM as u32,
            tokens: range.len() as u32,
            sequence,
            token_offset: range.start as u64,
        };
        let key = Key::from_bytes(format!("tenants/{keys_of}/{}", range.start).as_bytes());
        p.put_kv_with(key, &shape, &bk, &bv, Sketch::Int4).unwrap();
        blocks.push(BlockSpec {
            key,
            token_offset: range.start as u64,
        });
    }
    Layer {
        blocks,
        dtype,
        sequence,
    }
}

/// A command kind that reads blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Score,
    Pruned,
    Selected,
    Gather,
    Attend,
    Sparse,
    Sketched,
    Bounds,
}

impl Kind {
    /// The kinds run over blocks of `dtype` (pruning and selection: unquantized blocks).
    fn over(dtype: DType) -> Vec<Kind> {
        use Kind::*;
        if dtype.is_quantized() {
            vec![Score, Gather, Attend, Sketched, Bounds]
        } else {
            vec![
                Score, Pruned, Selected, Gather, Attend, Sparse, Sketched, Bounds,
            ]
        }
    }

    fn score<'a>(self, l: &'a Layer, q: &'a [f32]) -> ScoreRequest<'a> {
        let (k, mode, prune, select) = match self {
            Kind::Pruned => (8, GroupMode::GroupMax, true, Select::default()),
            Kind::Selected => (
                64,
                GroupMode::PerQuery,
                false,
                Select {
                    sinks: 2,
                    top_p: Some(0.9),
                    ..Default::default()
                },
            ),
            _ => (8, GroupMode::PerQuery, false, Select::default()),
        };
        ScoreRequest {
            queries: q,
            dim: DIM,
            blocks: &l.blocks,
            sequence: l.sequence,
            layer: 0,
            kv_head: 1,
            dtype: l.dtype,
            k,
            mode,
            prune,
            gather_values: self == Kind::Score,
            scale: None,
            select,
        }
    }

    fn attend<'a>(self, l: &'a Layer, q: &'a [f32]) -> AttendRequest<'a> {
        let sparse = |candidates| Sparse {
            select: Select::default(),
            k: 16,
            candidates,
        };
        AttendRequest {
            queries: q,
            dim: DIM,
            blocks: &l.blocks,
            sequence: l.sequence,
            layer: 0,
            kv_head: 1,
            dtype: l.dtype,
            scale: Some(default_scale(DIM)),
            sparse: match self {
                Kind::Sparse => Some(sparse(None)),
                Kind::Sketched => Some(sparse(Some(24))),
                _ => None,
            },
        }
    }
}

/// An answer, without the stats that differ between paths.
#[derive(Debug, PartialEq)]
enum Out {
    TopK(Vec<Vec<u32>>, Vec<Vec<f32>>, Vec<u8>, Vec<f32>),
    Attend(Vec<Partial>, Vec<(u32, f32)>, Option<usize>),
    Rows(Vec<u8>),
    Bounds(Vec<f32>, Vec<f32>, bool),
}

type Answer = Result<Out, DeviceStatus>;

const GATHERED: [u32; 3] = [0, 150, 399];

fn expect(l: &Layer, tenant: u64) -> BlockExpect {
    BlockExpect {
        tenant,
        sequence: l.sequence,
        layer: 0,
        kv_head: 1,
        dtype: l.dtype,
        dim: DIM as u32,
    }
}

/// The device status of a refused command (any other error fails the test).
fn status(e: NdpError) -> DeviceStatus {
    match e {
        NdpError::Device(s) => s,
        e => panic!("expected a device status, got {e}"),
    }
}

/// `kind` over `l` through `ndp`: the answer and the path that gave it.
fn on_device(ndp: &mut NdpDevice, kind: Kind, l: &Layer, q: &[f32]) -> (Answer, Option<NdpPath>) {
    match kind {
        Kind::Score | Kind::Pruned | Kind::Selected => match ndp.score_topk(&kind.score(l, q)) {
            Ok(t) => (
                Ok(Out::TopK(t.indices, t.scores, t.values, t.left_out_mass)),
                t.stats.path,
            ),
            Err(e) => (Err(status(e)), None),
        },
        Kind::Attend | Kind::Sparse | Kind::Sketched => match ndp.attend(&kind.attend(l, q)) {
            Ok(a) => (
                Ok(Out::Attend(a.partials, a.selection, a.rescored)),
                a.stats.path,
            ),
            Err(e) => (Err(status(e)), None),
        },
        Kind::Gather => {
            let r = ndp.gather(&l.blocks, l.sequence, 0, 1, l.dtype, DIM, &GATHERED);
            match r {
                Ok((rows, stats)) => (Ok(Out::Rows(rows)), stats.path),
                Err(e) => (Err(status(e)), None),
            }
        }
        Kind::Bounds => {
            let want = expect(l, ndp.tenant().unwrap());
            match ndp.build_bounds(l.blocks[2], &want) {
                Ok((lo, hi, same)) => (Ok(Out::Bounds(lo, hi, same)), Some(NdpPath::Device)),
                Err(e) => (Err(status(e)), None),
            }
        }
    }
}

/// `kind` over `l` on the host, read as `tenant` (`None` for BUILD_BOUNDS: no host path).
fn on_host(pool: &Pool, tenant: u64, kind: Kind, l: &Layer, q: &[f32]) -> Option<Answer> {
    let kernel = Default::default();
    Some(match kind {
        Kind::Score | Kind::Pruned | Kind::Selected => {
            host_score_topk_as(pool, tenant, &kind.score(l, q), kernel)
                .map(|t| Out::TopK(t.indices, t.scores, t.values, t.left_out_mass))
                .map_err(status)
        }
        Kind::Attend | Kind::Sparse | Kind::Sketched => {
            host_attend_as(pool, tenant, &kind.attend(l, q), kernel)
                .map(|a| Out::Attend(a.partials, a.selection, a.rescored))
                .map_err(status)
        }
        Kind::Gather => host_gather(pool, &l.blocks, &expect(l, tenant), &GATHERED)
            .map(|(rows, _)| Out::Rows(rows))
            .map_err(status),
        Kind::Bounds => return None,
    })
}

/// What a command over a layer must get.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Its answer, equal to the host's read as the same tenant.
    Served,
    /// `CXLKV_NDP_ERR_*` `code` naming block `detail`, from the device and the host alike.
    Refused(u32, u32),
}

/// Runs `kinds` over `l` through `ndp` (attached as `tenant`) and checks them against `want`;
/// `path` is the path a served kind takes. Returns the refusals the device itself made.
#[allow(clippy::too_many_arguments)]
fn check(
    ndp: &mut NdpDevice,
    pool: &Pool,
    tenant: u64,
    l: &Layer,
    kinds: &[Kind],
    want: Expect,
    path: &dyn Fn(Kind) -> NdpPath,
) -> u64 {
    let q = SplitMix64::new(l.sequence).normal_vec(2 * DIM);
    let mut on_device_refusals = 0;
    for &kind in kinds {
        let what = format!("{kind:?} over sequence {} as tenant {tenant}", l.sequence);
        let (got, got_path) = on_device(ndp, kind, l, &q);
        let host = on_host(pool, tenant, kind, l, &q);
        match want {
            Expect::Served => {
                let got = got.unwrap_or_else(|e| panic!("{what}: refused with {e}"));
                if kind != Kind::Bounds {
                    assert_eq!(got_path, Some(path(kind)), "{what}");
                }
                match host {
                    Some(h) => assert_eq!(Ok(&got), h.as_ref(), "{what}: device against host"),
                    // No host path: the bounds it recomputed equal the stored ones (unquantized).
                    None => assert!(
                        matches!(got, Out::Bounds(_, _, same) if same || l.dtype.is_quantized()),
                        "{what}"
                    ),
                }
            }
            Expect::Refused(code, detail) => {
                let refusal = Err(DeviceStatus { code, detail });
                assert_eq!(got, refusal, "{what}");
                if let Some(h) = host {
                    assert_eq!(h, refusal, "{what}: on the host");
                }
                // A kind the engine lacks ran on the host, which refused it there.
                if code == CXLKV_NDP_ERR_ACCESS && path(kind) == NdpPath::Device {
                    on_device_refusals += 1;
                }
            }
        }
    }
    on_device_refusals
}

/// Two pools, three clients and their blocks.
struct Scene {
    pool_a: Pool,
    pool_b: Pool,
    /// Clients of pool A attached as tenants 1 and 2, and of pool B as tenant 1.
    a1: NdpDevice,
    a2: NdpDevice,
    b1: NdpDevice,
    /// Pool A: tenant 1's, tenant 2's, tenant 0's, tenant 1's but block 2 tenant 2's, tenant 1's
    /// int8 blocks.
    own1: Layer,
    own2: Layer,
    public: Layer,
    mixed: Layer,
    quant1: Layer,
    /// Pool B: tenant 1's, in a partition that lies beyond pool A's end; and tenant 1's whose keys
    /// pool A also holds, for another sequence (`twin`).
    in_b: Layer,
    in_b_twin: Layer,
    /// Participants kept attached so that their partitions stay theirs.
    _others: Vec<Participant>,
}

impl Scene {
    fn new(pool_a: &Pool, pool_b: &Pool) -> Scene {
        let client = |p: Participant| NdpDevice::open(Arc::new(p), NdpOptions::default()).unwrap();
        let (p1, p2) = (pool_a.attach().unwrap(), pool_a.attach().unwrap());
        attach_as(pool_a, &p1, T1);
        attach_as(pool_a, &p2, T2);
        let own1 = store(&p1, 101, DType::F16);
        let own2 = store(&p2, 102, DType::F16);
        let public = store(&p1, 103, DType::F16);
        let mixed = store(&p1, 104, DType::F16);
        let quant1 = store(&p1, 105, DType::I8);
        give(pool_a, &own1.blocks, T1 as u32);
        give(pool_a, &own2.blocks, T2 as u32);
        give(pool_a, &mixed.blocks, T1 as u32);
        give(pool_a, &mixed.blocks[2..3], T2 as u32);
        give(pool_a, &quant1.blocks, T1 as u32);
        // In pool B, the client whose partition starts past pool A's last byte.
        let (q1, q2) = (pool_b.attach().unwrap(), pool_b.attach().unwrap());
        let beyond_a = |p: &Participant| {
            pool_b.partition_offset(p.partition().unwrap()).unwrap() >= pool_a.memory().size()
        };
        let (b, other) = if beyond_a(&q1) { (q1, q2) } else { (q2, q1) };
        assert!(beyond_a(&b), "pool B is laid out past pool A's size");
        attach_as(pool_b, &b, T1);
        let in_b = store(&b, 201, DType::F16);
        give(pool_b, &in_b.blocks, T1 as u32);
        let in_b_twin = store(&b, 202, DType::F16);
        give(pool_b, &in_b_twin.blocks, T1 as u32);
        let twin = store_keyed(&p1, 203, DType::F16, 202);
        give(pool_a, &twin.blocks, T1 as u32);
        Scene {
            pool_a: pool_a.clone(),
            pool_b: pool_b.clone(),
            a1: client(p1),
            a2: client(p2),
            b1: client(b),
            own1,
            own2,
            public,
            mixed,
            quant1,
            in_b,
            in_b_twin,
            _others: vec![other],
        }
    }

    /// Every scenario with the devices serving; returns the refusals pool A's device made.
    fn check_served(&mut self, engine: Engine) -> u64 {
        let path = |k: Kind| {
            if engine == Engine::Hls && k == Kind::Sketched {
                // The HLS engine lacks CAP_SKETCH: the client computes it on the host.
                NdpPath::Host(FallbackReason::Unsupported)
            } else {
                NdpPath::Device
            }
        };
        let f16 = Kind::over(DType::F16);
        let (a, b) = (&self.pool_a.clone(), &self.pool_b.clone());
        let served = Expect::Served;
        let foreign = |detail| Expect::Refused(CXLKV_NDP_ERR_ACCESS, detail);
        // A tenant's own blocks and tenant 0's are served, equal to the host's answer.
        check(&mut self.a1, a, T1, &self.own1, &f16, served, &path);
        check(&mut self.a1, a, T1, &self.public, &f16, served, &path);
        check(&mut self.a2, a, T2, &self.own2, &f16, served, &path);
        check(&mut self.a2, a, T2, &self.public, &f16, served, &path);
        let q8 = Kind::over(DType::I8);
        check(&mut self.a1, a, T1, &self.quant1, &q8, served, &path);
        check(&mut self.b1, b, T1, &self.in_b, &f16, served, &path);
        // Another tenant's blocks are refused, naming the first foreign block.
        let mut refused = 0;
        refused += check(&mut self.a1, a, T1, &self.own2, &f16, foreign(0), &path);
        refused += check(&mut self.a2, a, T2, &self.own1, &f16, foreign(0), &path);
        refused += check(&mut self.a2, a, T2, &self.quant1, &q8, foreign(0), &path);
        // BUILD_BOUNDS names one block (block 2, tenant 2's in `mixed`): the lists only.
        let lists: Vec<Kind> = f16.iter().copied().filter(|&k| k != Kind::Bounds).collect();
        refused += check(&mut self.a1, a, T1, &self.mixed, &lists, foreign(2), &path);
        refused += check(&mut self.a2, a, T2, &self.mixed, &lists, foreign(0), &path);
        assert!(refused >= 30, "{refused} refusals");
        // The device kept serving.
        self.a1.nop().unwrap();
        check(&mut self.a1, a, T1, &self.own1, &f16, served, &path);
        // Pool B's real blocks named on pool A's queue: not in A, refused; never read.
        let missing = Expect::Refused(CXLKV_NDP_ERR_BLOCK, 0);
        check(&mut self.a1, a, T1, &self.in_b, &f16, missing, &path);
        // Keys that pool A holds too, but for another sequence: A's blocks, which do not match.
        let mismatch = Expect::Refused(CXLKV_NDP_ERR_LAYOUT, 0);
        check(&mut self.a1, a, T1, &self.in_b_twin, &f16, mismatch, &path);
        self.refuses_offsets_of_pool_b();
        check(&mut self.b1, b, T1, &self.in_b, &f16, served, &path);
        check(&mut self.b1, b, T1, &self.in_b_twin, &f16, served, &path);
        refused
    }

    /// A GATHER on pool A's queue whose arguments are pool B's block (its payload offset, past
    /// A's end) completes with `ERR_RANGE`.
    fn refuses_offsets_of_pool_b(&mut self) {
        let r = self
            .pool_b
            .block_ref_any_tenant(self.in_b.blocks[0].key)
            .unwrap()
            .unwrap();
        assert!(r.payload_off >= self.pool_a.memory().size());
        let cmd = cxlkv_ndp_cmd {
            opcode: CXLKV_NDP_OP_GATHER as u16,
            k: 1,
            sequence: self.in_b.sequence,
            layer: 0,
            kv_head: 1,
            dtype: DType::F16 as u8,
            group: 1,
            dim: DIM as u32,
            nblocks: 1,
            args_off: r.payload_off,
            args_len: 24 + 4,
            result_off: self.a1.staging_offsets()[0],
            result_len: 4096,
            ..Default::default()
        };
        let tag = self.a1.submit_raw(cmd).unwrap().expect("submitted");
        let cpl = self.a1.wait_raw(tag).unwrap().expect("completed");
        assert_eq!(cpl.status, CXLKV_NDP_ERR_RANGE);
    }

    /// With pool A's device gone, the host fallback serves and refuses what the device did.
    fn check_host_fallback(&mut self) {
        let path = |_| NdpPath::Host(FallbackReason::Absent);
        let kinds: Vec<Kind> = Kind::over(DType::F16)
            .into_iter()
            .filter(|&k| k != Kind::Bounds)
            .collect();
        let a = &self.pool_a.clone();
        let foreign = |detail| Expect::Refused(CXLKV_NDP_ERR_ACCESS, detail);
        check(
            &mut self.a1,
            a,
            T1,
            &self.own1,
            &kinds,
            Expect::Served,
            &path,
        );
        check(
            &mut self.a1,
            a,
            T1,
            &self.public,
            &kinds,
            Expect::Served,
            &path,
        );
        check(&mut self.a1, a, T1, &self.own2, &kinds, foreign(0), &path);
        check(&mut self.a1, a, T1, &self.mixed, &kinds, foreign(2), &path);
    }
}

/// `CXLKV_NDP_CTR_REFUSED` as the device publishes it in `pool`'s registers.
fn refused_register(pool: &Pool) -> u64 {
    let off = DeviceLayout::of(pool).regs + reg::COUNTERS + 8 * u64::from(CXLKV_NDP_CTR_REFUSED);
    pool.memory().load_u64(off, Ordering::Acquire).unwrap()
}

/// Pool A (16 MiB) and pool B (128 MiB, its later partitions past A's end).
fn pools(tag: &str) -> (TempBackend, Pool, TempBackend, Pool) {
    let (ba, bb) = (
        shm_backend(&format!("{tag}-a")),
        shm_backend(&format!("{tag}-b")),
    );
    let a = create_pool(ba.backend(), 16 << 20, 64 << 10);
    let b = create_pool(bb.backend(), 128 << 20, 64 << 10);
    (ba, a, bb, b)
}

#[test]
fn in_process_devices_refuse_other_tenants_and_other_pools_rust_engine() {
    in_process(Engine::Rust);
}

#[test]
fn in_process_devices_refuse_other_tenants_and_other_pools_hls_engine() {
    in_process(Engine::Hls);
}

fn in_process(engine: Engine) {
    let (_ba, pool_a, _bb, pool_b) = pools(&format!("tenants-{engine}"));
    let cfg = DeviceConfig {
        engine,
        ..DeviceConfig::default()
    };
    let dev_a = Device::start(pool_a.clone(), cfg.clone()).unwrap();
    let dev_b = Device::start(pool_b.clone(), cfg).unwrap();
    let caps = pool_a
        .memory()
        .load_u64(
            DeviceLayout::of(&pool_a).regs + reg::CAPABILITIES,
            Ordering::Acquire,
        )
        .unwrap();
    assert_ne!(caps & u64::from(CXLKV_NDP_CAP_TENANT), 0);
    let mut scene = Scene::new(&pool_a, &pool_b);
    let refused = scene.check_served(engine);
    assert_eq!(dev_a.device().counter(CXLKV_NDP_CTR_REFUSED), refused);
    assert_eq!(refused_register(&pool_a), refused);
    assert_eq!(dev_b.device().counter(CXLKV_NDP_CTR_REFUSED), 0);
    let metrics = dev_a.device().encode_metrics();
    assert!(
        metrics.contains(&format!("cxlkv_ndp_refused_total {refused}\n")),
        "{metrics}"
    );
    dev_a.stop();
    scene.check_host_fallback();
}

#[test]
fn one_daemon_serves_two_pools_and_refuses_other_tenants_rust_engine() {
    daemon("rust");
}

#[test]
fn one_daemon_serves_two_pools_and_refuses_other_tenants_hls_engine() {
    daemon("hls");
}

/// The sample `name{pool="POOL"}` of a scrape of `addr`.
fn sample(addr: &str, name: &str, pool: &str) -> f64 {
    let answer = http_get(addr, "/metrics");
    let series = format!("{name}{{pool=\"{pool}\"}} ");
    let line = answer
        .lines()
        .find(|l| l.starts_with(&series))
        .unwrap_or_else(|| panic!("no {series} in {answer}"));
    line[series.len()..].parse().unwrap()
}

fn daemon(engine: &str) {
    let (ba, pool_a, bb, pool_b) = pools(&format!("tenants-daemon-{engine}"));
    // A third pool that is no pool at all: reported, and the others served.
    let corrupt = std::env::temp_dir().join(format!(
        "cxlkv-ndp-test-corrupt-{engine}-{}",
        std::process::id()
    ));
    std::fs::write(&corrupt, vec![0u8; 4 << 20]).unwrap();
    let (a, b) = (ba.backend().to_string(), bb.backend().to_string());
    let c = format!("file:{}", corrupt.display());
    let spawned = Daemon::spawn_pools(
        Path::new(env!("CARGO_BIN_EXE_cxlkv-ndpd")),
        &[&a, &c, &b],
        &["--engine", engine, "--metrics", "127.0.0.1:0"],
    );
    std::fs::remove_file(&corrupt).unwrap();
    let mut d = spawned.expect("spawn cxlkv-ndpd");
    let said = d.said().to_string();
    assert!(said.contains("serving 2 of 3 pools"), "{said}");
    assert!(said.contains(&format!("not served: {c}")), "{said}");
    assert!(said.contains(&format!("engine {engine}")), "{said}");
    let line = d.read_line().unwrap();
    let addr = line
        .trim()
        .strip_prefix("cxlkv-ndpd: metrics on http://")
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address in {line:?}"))
        .to_string();

    let mut scene = Scene::new(&pool_a, &pool_b);
    let engine = if engine == "hls" {
        Engine::Hls
    } else {
        Engine::Rust
    };
    let refused = scene.check_served(engine);
    assert_eq!(refused_register(&pool_a), refused);
    assert_eq!(refused_register(&pool_b), 0);
    // Per pool in the metrics: the refusals, and both pools' commands.
    assert_eq!(sample(&addr, "cxlkv_ndp_refused_total", &a), refused as f64);
    assert_eq!(sample(&addr, "cxlkv_ndp_refused_total", &b), 0.0);
    assert!(sample(&addr, "cxlkv_ndp_commands_total", &a) > refused as f64);
    assert!(sample(&addr, "cxlkv_ndp_commands_total", &b) > 0.0);
    // One family each, both pools' samples under it (the pool metrics' too).
    let body = http_get(&addr, "/metrics");
    for family in [
        "cxlkv_ndp_commands counter",
        "cxlkv_pool_participant_live gauge",
    ] {
        let announced = body.matches(&format!("# TYPE {family}\n")).count();
        assert_eq!(announced, 1, "{family} in {body}");
    }
    assert_eq!(body.matches("# EOF").count(), 1);
    drop(d);
    scene.check_host_fallback();
}

/// A 16 MiB pool of 64 KiB blocks and an in-process device on `engine` serving it.
fn served_pool(tag: &str, engine: Engine) -> (TempBackend, Pool, DeviceHandle) {
    let backend = shm_backend(tag);
    let pool = create_pool(backend.backend(), 16 << 20, 64 << 10);
    let cfg = DeviceConfig {
        engine,
        ..DeviceConfig::default()
    };
    let dev = Device::start(pool.clone(), cfg).unwrap();
    (backend, pool, dev)
}

#[test]
fn fuzz_style_mixed_tenant_lists_rust_engine() {
    mixed_tenant_lists(Engine::Rust);
}

#[test]
fn fuzz_style_mixed_tenant_lists_hls_engine() {
    mixed_tenant_lists(Engine::Hls);
}

/// Random block lists (a random subset of a layer's blocks in random order), each block of a
/// random tenant (0, 1 or 2), submitted by a random tenant's client as SCORE_TOPK or ATTEND: the
/// device refuses exactly the lists holding a foreign block, naming the first, and answers the
/// others as the host does; its refusal counter counts each refusal.
fn mixed_tenant_lists(engine: Engine) {
    const CASES: usize = 300;
    let (_backend, pool, dev) = served_pool(&format!("tenants-mixed-{engine}"), engine);
    let (p1, p2) = (pool.attach().unwrap(), pool.attach().unwrap());
    attach_as(&pool, &p1, T1);
    attach_as(&pool, &p2, T2);
    let layer = store(&p1, 301, DType::F16);
    let mut clients = [
        NdpDevice::open(Arc::new(p1), NdpOptions::default()).unwrap(),
        NdpDevice::open(Arc::new(p2), NdpOptions::default()).unwrap(),
    ];
    let mut rng = SplitMix64::new(27);
    let mut below = |n: usize| rng.below(n as u64) as usize;
    let (mut refused, mut served) = (0u64, 0u64);
    for case in 0..CASES {
        let tenants: Vec<u32> = layer.blocks.iter().map(|_| below(3) as u32).collect();
        for (b, &t) in layer.blocks.iter().zip(&tenants) {
            give(&pool, std::slice::from_ref(b), t);
        }
        let mut order: Vec<usize> = (0..layer.blocks.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, below(i + 1));
        }
        order.truncate(1 + below(order.len()));
        let l = Layer {
            blocks: order.iter().map(|&i| layer.blocks[i]).collect(),
            dtype: layer.dtype,
            sequence: layer.sequence,
        };
        let c = below(2);
        let tenant = [T1, T2][c];
        let kind = [Kind::Score, Kind::Attend][below(2)];
        let q = SplitMix64::new(case as u64).normal_vec(2 * DIM);
        let (got, _) = on_device(&mut clients[c], kind, &l, &q);
        let first_foreign = order
            .iter()
            .position(|&i| tenants[i] != 0 && u64::from(tenants[i]) != tenant);
        let what = format!("case {case}: {kind:?} as {tenant} over {order:?} of {tenants:?}");
        match first_foreign {
            Some(i) => {
                let want = DeviceStatus::at(CXLKV_NDP_ERR_ACCESS, i);
                assert_eq!(got, Err(want), "{what}");
                refused += 1;
            }
            None => {
                let host = on_host(&pool, tenant, kind, &l, &q).unwrap();
                assert_eq!(got, host, "{what}");
                assert!(got.is_ok(), "{what}");
                served += 1;
            }
        }
    }
    // Both outcomes were drawn often.
    assert!(
        refused > 50 && served > 50,
        "{refused} refused, {served} served"
    );
    assert_eq!(dev.device().counter(CXLKV_NDP_CTR_REFUSED), refused);
}

#[test]
fn tenants_attached_through_the_runtime_rust_engine() {
    through_the_runtime(Engine::Rust);
}

#[test]
fn tenants_attached_through_the_runtime_hls_engine() {
    through_the_runtime(Engine::Hls);
}

/// The blocks as the runtime lays them out (format 3.2): participants attached as tenants with
/// `Participant::attach_as`, their partitions tagged and their blocks written by their own puts.
/// Each tenant's device commands are served over its own blocks and tenant 0's (equal to the
/// host's answers) and refused over the other tenant's: located as the queue's tenant, the device
/// never probes the other tenant's partition, so the block is not found (`ERR_BLOCK`, as a miss).
fn through_the_runtime(engine: Engine) {
    let (_backend, pool, dev) = served_pool(&format!("tenants-runtime-{engine}"), engine);
    let alice = Tenant::new("alice", b"alice's secret").unwrap();
    let bob = Tenant::new("bob", b"bob's secret").unwrap();
    let (pa, pb) = (
        Participant::attach_as(&pool, &alice).unwrap(),
        Participant::attach_as(&pool, &bob).unwrap(),
    );
    let public = pool.attach().unwrap();
    let (ta, tb) = (u64::from(pa.tenant_id()), u64::from(pb.tenant_id()));
    assert!(ta != 0 && tb != 0 && ta != tb);
    let of_alice = store(&pa, 401, DType::F16);
    let of_bob = store(&pb, 402, DType::F16);
    let of_all = store(&public, 403, DType::F16);
    let mut a = NdpDevice::open(Arc::new(pa), NdpOptions::default()).unwrap();
    let mut b = NdpDevice::open(Arc::new(pb), NdpOptions::default()).unwrap();
    let q = SplitMix64::new(4).normal_vec(2 * DIM);
    for kind in [Kind::Score, Kind::Attend, Kind::Gather] {
        for (ndp, tenant, own, other) in [
            (&mut a, ta, &of_alice, &of_bob),
            (&mut b, tb, &of_bob, &of_alice),
        ] {
            for served in [own, &of_all] {
                let (got, path) = on_device(ndp, kind, served, &q);
                assert_eq!(path, Some(NdpPath::Device), "{kind:?} as {tenant}");
                assert_eq!(
                    Some(got),
                    on_host(&pool, tenant, kind, served, &q),
                    "{kind:?}"
                );
            }
            let (got, _) = on_device(ndp, kind, other, &q);
            assert_eq!(
                got,
                Err(DeviceStatus::at(CXLKV_NDP_ERR_BLOCK, 0)),
                "{kind:?} as {tenant} over the other tenant's blocks"
            );
            let host = on_host(&pool, tenant, kind, other, &q).unwrap();
            assert!(host.is_err(), "the host refuses them too: {host:?}");
        }
    }
    // The device never probed another tenant's partition for a command: the refusals were misses.
    assert_eq!(dev.device().counter(CXLKV_NDP_CTR_REFUSED), 0);
    drop(public);
}
