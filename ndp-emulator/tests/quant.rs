//! Quantized (int8, int4) blocks on the device: ATTEND and SCORE_TOPK (plain and with a
//! selection) equal the host fallback bit for bit over randomly drawn shapes; gathered rows come
//! back as f32, dequantized; ATTEND over codes is attention over the dequantized block; FLAG_PRUNE
//! on quantized blocks is refused. Both engines: the HLS engine serves them through its dot unit,
//! ATTEND unit and row mover, and leaves the sparse ATTEND over them to the host.

mod common;
use common::*;
use cxlkv_kernels::attention::relative_error;
use cxlkv_kernels::{rng::SplitMix64, DType, GroupMode, KeyRows, Partial, QueryGroup, ScoreKernel};
use cxlkv_ndp::{Device, DeviceConfig, Engine};
use cxlkv_runtime::format;
use cxlkv_runtime::kv::chunk_kv;
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::{
    host_attend, host_gather, host_score_topk, reg, AttendRequest, BlockExpect, BlockSpec,
    DeviceLayout, FallbackReason, NdpDevice, NdpOptions, NdpPath, ScoreRequest, Select,
};
use cxlkv_runtime::{Key, KvBlock, KvShape, Participant, Pool};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn setup(tag: &str) -> (TempBackend, Pool) {
    let b = shm_backend(tag);
    let pool = create_pool(b.backend(), 192 << 20, 512 << 10);
    (b, pool)
}

fn start(pool: &Pool, engine: Engine) -> (cxlkv_ndp::DeviceHandle, NdpDevice, Arc<Participant>) {
    let dev = Device::start(
        pool.clone(),
        DeviceConfig {
            engine,
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    let p = Arc::new(pool.attach().unwrap());
    let ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    (dev, ndp, p)
}

/// One layer of one sequence in quantized blocks, with each head's dequantized K and V
/// (`[tokens][dim]` f32, read back from the blocks) for references.
struct Quantized {
    blocks: Vec<BlockSpec>,
    dtype: DType,
    dim: usize,
    sequence: u64,
    /// `[head]` dequantized keys and values.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl Quantized {
    fn store(
        p: &Participant,
        seed: u64,
        heads: usize,
        tokens: usize,
        dim: usize,
        dtype: DType,
        per_block: usize,
    ) -> Quantized {
        let (k, v) = random_kv(seed, heads, tokens, dim, DType::F32);
        let sequence = 1000 + seed;
        let (mut blocks, mut dk, mut dv) =
            (Vec::new(), vec![Vec::new(); heads], vec![Vec::new(); heads]);
        for (range, bk, bv) in chunk_kv(&k, &v, heads, 4 * dim, 0..tokens, per_block) {
            let shape = KvShape {
                dtype,
                layer: 0,
                kv_heads: heads as u32,
                head_dim: dim as u32,
                tokens: range.len() as u32,
                sequence,
                token_offset: range.start as u64,
            };
            let key = Key::from_bytes(format!("q{sequence}/{}", range.start).as_bytes());
            p.put_kv(key, &shape, &bk, &bv).unwrap();
            let (payload, _) = p.get(key).unwrap().unwrap();
            let b = KvBlock::parse(&payload).unwrap();
            for h in 0..heads {
                let (hk, hv) = b.head_f32(h);
                dk[h].extend(hk);
                dv[h].extend(hv);
            }
            blocks.push(BlockSpec {
                key,
                token_offset: range.start as u64,
            });
        }
        Quantized {
            blocks,
            dtype,
            dim,
            sequence,
            k: dk,
            v: dv,
        }
    }

    fn attend<'a>(&'a self, h: u32, q: &'a [f32], scale: f32) -> AttendRequest<'a> {
        AttendRequest {
            queries: q,
            dim: self.dim,
            blocks: &self.blocks,
            sequence: self.sequence,
            layer: 0,
            kv_head: h,
            dtype: self.dtype,
            scale: Some(scale),
            sparse: None,
        }
    }

    fn score<'a>(&'a self, h: u32, q: &'a [f32], k: usize, mode: GroupMode) -> ScoreRequest<'a> {
        ScoreRequest {
            queries: q,
            dim: self.dim,
            blocks: &self.blocks,
            sequence: self.sequence,
            layer: 0,
            kv_head: h,
            dtype: self.dtype,
            k,
            mode,
            prune: false,
            gather_values: true,
            scale: Some(0.3),
            select: Select::default(),
        }
    }

    /// Bytes a full scan of head h's keys reads: codes plus one set of key scales per block.
    fn key_bytes(&self, tokens: usize) -> u64 {
        (tokens * self.dtype.bytes(self.dim) + 4 * self.dim * self.blocks.len()) as u64
    }

    fn f32_row(&self, h: usize, t: usize) -> Vec<u8> {
        self.v[h][t * self.dim..(t + 1) * self.dim]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect()
    }
}

/// Draws shapes at random (dtype int8 or int4, dim, tokens, block size, group) and checks that
/// the device's ATTEND and SCORE_TOPK (plain, group max, selection) equal the host fallback's bit
/// for bit, that gathered rows are the dequantized rows, and that ATTEND is attention over the
/// dequantized block.
#[test]
fn device_equals_the_host_on_random_quantized_blocks_rust_engine() {
    device_equals_the_host_on_random_quantized_blocks(Engine::Rust);
}

/// The same on the HLS engine: its dot unit scores the codes with the folded queries, its ATTEND
/// unit weights the value rows by their scales, its row mover dequantizes gathered rows.
#[test]
fn device_equals_the_host_on_random_quantized_blocks_hls_engine() {
    device_equals_the_host_on_random_quantized_blocks(Engine::Hls);
}

fn device_equals_the_host_on_random_quantized_blocks(engine: Engine) {
    let (_c, pool) = setup(&format!("quant-fuzz-{engine}"));
    let (_dev, mut ndp, p) = start(&pool, engine);
    let mut rng = SplitMix64::new(23);
    for case in 0..16u64 {
        let dtype = if case % 2 == 0 { DType::I8 } else { DType::I4 };
        let dim = 16 * (1 + rng.below(16) as usize);
        let tokens = 1 + rng.below(500) as usize;
        let per_block = 16 + rng.below(200) as usize;
        let g = 1 + rng.below(16) as usize;
        let s = Quantized::store(&p, case, 2, tokens, dim, dtype, per_block);
        let what =
            format!("case {case}: {dtype:?} dim {dim} tokens {tokens} per block {per_block} G {g}");
        let h = rng.below(2) as u32;
        let q: Vec<f32> = rng.normal_vec(g * dim);

        // ATTEND.
        let scale = 1.0 / (dim as f32).sqrt();
        let req = s.attend(h, &q, scale);
        let got = ndp.attend(&req).unwrap();
        assert_eq!(got.stats.path, Some(NdpPath::Device), "{what}");
        let host = host_attend(&pool, &req).unwrap();
        assert_eq!(
            got.partials, host.partials,
            "{what}: device and host bit for bit"
        );
        let scanned =
            2 * (tokens * dtype.bytes(dim)) as u64 + 4 * (dim * s.blocks.len() + tokens) as u64;
        assert_eq!(got.stats.bytes_scanned, scanned, "{what}");
        assert_eq!(host.stats.bytes_scanned, scanned, "{what}");
        // Attention over the dequantized block (scores of q·(code·s) versus (q·s)·code differ by
        // rounding only).
        let qg = QueryGroup::new(&q, dim).unwrap();
        let kb: Vec<u8> = s.k[h as usize]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let vb: Vec<u8> = s.v[h as usize]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let (keys, vals) = (
            KeyRows::new(&kb, DType::F32, dim).unwrap(),
            KeyRows::new(&vb, DType::F32, dim).unwrap(),
        );
        let mut raw = vec![0f32; tokens * g];
        ScoreKernel::scalar().score(&qg, &keys, &mut raw);
        let dense = Partial::over_group(&vals, &raw, g, scale);
        for (a, b) in got.partials.iter().zip(&dense) {
            assert!(relative_error(&a.finish(), &b.finish()) < 1e-4, "{what}");
        }

        // SCORE_TOPK, per query and group max, values gathered (f32 rows).
        for mode in [GroupMode::PerQuery, GroupMode::GroupMax] {
            let k = 1 + rng.below(16) as usize;
            let mut req = s.score(h, &q, k, mode);
            req.prune = case % 3 == 0; // a hint the client drops for quantized blocks
            let got = ndp.score_topk(&req).unwrap();
            assert_eq!(got.stats.path, Some(NdpPath::Device), "{what}");
            let host = host_score_topk(&pool, &req, Default::default()).unwrap();
            assert_eq!(got.indices, host.indices, "{what} {mode:?}");
            assert_eq!(got.scores, host.scores, "{what} {mode:?}");
            assert_eq!(got.values, host.values, "{what} {mode:?}");
            assert_eq!(got.stats.block_mass, host.stats.block_mass, "{what}");
            assert_eq!(got.stats.bytes_scanned, s.key_bytes(tokens), "{what}");
            assert_eq!(host.stats.bytes_scanned, s.key_bytes(tokens), "{what}");
            let want: Vec<u8> = got
                .indices
                .iter()
                .flatten()
                .flat_map(|&t| s.f32_row(h as usize, t as usize))
                .collect();
            assert_eq!(
                got.values, want,
                "{what}: gathered rows are dequantized f32"
            );
            // The best hit is the best folded score: within rounding of q·dequantized key.
            let best = got.indices[0][0] as usize;
            let mut all = vec![0f32; tokens * g];
            ScoreKernel::scalar().score(&qg, &keys, &mut all);
            let top = all[best * g];
            let max = (0..tokens)
                .map(|i| all[i * g])
                .fold(f32::NEG_INFINITY, f32::max);
            if mode == GroupMode::PerQuery {
                assert!(
                    (top - max).abs() <= 1e-3 * max.abs().max(1.0),
                    "{what}: {top} vs {max}"
                );
            }
        }

        // A selection: sinks, window and top-p.
        let sel = Select {
            sinks: 2.min(tokens as u64),
            window: Some(((tokens as u64).saturating_sub(8), tokens as u64)),
            exclude: None,
            top_p: Some(0.9),
        };
        let mut req = s.score(h, &q, tokens.clamp(12, 16), GroupMode::PerQuery);
        req.select = sel;
        let got = ndp.score_topk(&req).unwrap();
        assert_eq!(got.stats.path, Some(NdpPath::Device), "{what}");
        let host = host_score_topk(&pool, &req, Default::default()).unwrap();
        assert_eq!(got.indices, host.indices, "{what}");
        assert_eq!(got.scores, host.scores, "{what}");
        assert_eq!(got.values, host.values, "{what}");
        assert_eq!(got.left_out_mass, host.left_out_mass, "{what}");
        assert_eq!(got.stats.bytes_scanned, s.key_bytes(tokens), "{what}");

        // GATHER.
        let tokens_wanted: Vec<u32> = (0..5).map(|_| rng.below(tokens as u64) as u32).collect();
        let (rows, stats) = ndp
            .gather(&s.blocks, s.sequence, 0, h, dtype, dim, &tokens_wanted)
            .unwrap();
        assert_eq!(stats.path, Some(NdpPath::Device), "{what}");
        let want = BlockExpect {
            tenant: 0,
            sequence: s.sequence,
            layer: 0,
            kv_head: h,
            dtype,
            dim: dim as u32,
        };
        let (host_rows, _) = host_gather(&pool, &s.blocks, &want, &tokens_wanted).unwrap();
        assert_eq!(rows, host_rows, "{what}");
        let f32_rows: Vec<u8> = tokens_wanted
            .iter()
            .flat_map(|&t| s.f32_row(h as usize, t as usize))
            .collect();
        assert_eq!(rows, f32_rows, "{what}");
        for b in &s.blocks {
            p.delete(b.key).unwrap();
        }
    }
}

/// FLAG_PRUNE on quantized blocks completes with ERR_ARGS (DETAIL_BAD_OPTIONS); the same command
/// without it succeeds. A raw command with the wrong quantized dtype is a layout mismatch.
#[test]
fn raw_prune_on_quantized_blocks_is_refused() {
    let (_c, pool) = setup("quant-prune");
    let (_dev, mut ndp, p) = start(&pool, Engine::Rust);
    let dim = 32;
    let s = Quantized::store(&p, 1, 1, 300, dim, DType::I8, 100);
    let staging = ndp.staging_offsets()[0];
    let q = SplitMix64::new(1).normal_vec(dim);
    let mut args = Vec::new();
    for x in &q {
        args.extend_from_slice(&x.to_le_bytes());
    }
    for b in &s.blocks {
        args.extend_from_slice(format::as_bytes(&cxlkv_ndp_block {
            key_lo: b.key.lo(),
            key_hi: b.key.hi(),
            token_offset: b.token_offset,
        }));
    }
    pool.memory().write(staging, &args).unwrap();
    let base = cxlkv_ndp_cmd {
        opcode: CXLKV_NDP_OP_SCORE_TOPK as u16,
        k: 8,
        sequence: s.sequence,
        dtype: DType::I8 as u8,
        group: 1,
        dim: dim as u32,
        nblocks: s.blocks.len() as u32,
        args_off: staging,
        result_off: staging + 8192,
        args_len: args.len() as u32,
        result_len: 16384,
        ..Default::default()
    };
    let mut run = |cmd: cxlkv_ndp_cmd| {
        let tag = ndp.submit_raw(cmd).unwrap().unwrap();
        let c = ndp.wait_raw(tag).unwrap().unwrap();
        (c.status, c.detail)
    };
    assert_eq!(run(base), (CXLKV_NDP_OK, 0));
    let prune = cxlkv_ndp_cmd {
        flags: CXLKV_NDP_FLAG_PRUNE as u16,
        ..base
    };
    assert_eq!(
        run(prune),
        (CXLKV_NDP_ERR_ARGS, CXLKV_NDP_DETAIL_BAD_OPTIONS)
    );
    let int4 = cxlkv_ndp_cmd {
        dtype: DType::I4 as u8,
        ..base
    };
    assert_eq!(run(int4).0, CXLKV_NDP_ERR_LAYOUT);
    assert_eq!(run(base), (CXLKV_NDP_OK, 0), "the device keeps serving");
}

/// The HLS engine advertises CAP_QUANT but not CAP_SKETCH: its sparse unit has no datapath for
/// rows picked one by one, so the client computes a sparse ATTEND over quantized blocks on the
/// host (`Unsupported`), with the host's answer, and a raw one completes with ERR_ARGS
/// (BAD_OPTIONS); plain ATTEND and SCORE_TOPK run on the device.
#[test]
fn hls_engine_leaves_quantized_sparse_attend_to_the_host() {
    let (_c, pool) = setup("quant-hls");
    let (_dev, mut ndp, p) = start(&pool, Engine::Hls);
    let caps = DeviceLayout::of(&pool).regs + reg::CAPABILITIES;
    let caps = pool.memory().load_u64(caps, Ordering::Acquire).unwrap();
    assert_ne!(caps & u64::from(CXLKV_NDP_CAP_QUANT), 0);
    assert_eq!(caps & u64::from(CXLKV_NDP_CAP_SKETCH), 0);
    let dim = 64;
    let s = Quantized::store(&p, 2, 2, 200, dim, DType::I4, 64);
    let q = SplitMix64::new(2).normal_vec(3 * dim);
    let req = s.attend(1, &q, 0.125);
    let got = ndp.attend(&req).unwrap();
    assert_eq!(got.stats.path, Some(NdpPath::Device));
    assert_eq!(got.partials, host_attend(&pool, &req).unwrap().partials);
    let sparse = AttendRequest {
        sparse: Some(cxlkv_runtime::ndp::client::Sparse {
            select: Select::default(),
            k: 20,
            candidates: None,
        }),
        ..req
    };
    let got = ndp.attend(&sparse).unwrap();
    assert_eq!(
        got.stats.path,
        Some(NdpPath::Host(FallbackReason::Unsupported))
    );
    let host = host_attend(&pool, &sparse).unwrap();
    assert_eq!(got.partials, host.partials);
    assert_eq!(got.selection, host.selection);

    // A raw sparse ATTEND on the HLS engine: ERR_ARGS, BAD_OPTIONS.
    let staging = ndp.staging_offsets()[0];
    let mut args = Vec::new();
    for x in &q {
        args.extend_from_slice(&x.to_le_bytes());
    }
    for b in &s.blocks {
        args.extend_from_slice(format::as_bytes(&cxlkv_ndp_block {
            key_lo: b.key.lo(),
            key_hi: b.key.hi(),
            token_offset: b.token_offset,
        }));
    }
    args.extend_from_slice(format::as_bytes(&cxlkv_ndp_attend {
        scale: 0.125,
        ..Default::default()
    }));
    args.extend_from_slice(format::as_bytes(&Select::default().to_abi(0.125)));
    pool.memory().write(staging, &args).unwrap();
    let cmd = cxlkv_ndp_cmd {
        opcode: CXLKV_NDP_OP_ATTEND as u16,
        flags: CXLKV_NDP_FLAG_SELECT as u16,
        k: 20,
        sequence: s.sequence,
        kv_head: 1,
        dtype: DType::I4 as u8,
        group: 3,
        dim: dim as u32,
        nblocks: s.blocks.len() as u32,
        args_off: staging,
        result_off: staging + 8192,
        args_len: args.len() as u32,
        result_len: 16384,
        ..Default::default()
    };
    let tag = ndp.submit_raw(cmd).unwrap().unwrap();
    let c = ndp.wait_raw(tag).unwrap().unwrap();
    assert_eq!(
        (c.status, c.detail),
        (CXLKV_NDP_ERR_ARGS, CXLKV_NDP_DETAIL_BAD_OPTIONS)
    );
}
