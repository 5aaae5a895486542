//! Thousands of malformed commands: every one gets an error completion, the device never touches
//! memory outside the pool (guard region) nor writes outside its device area and the staging
//! blocks commands name (a bounds-tracking memory view), and valid commands interleaved succeed.
//! The mutated commands alternate between SCORE_TOPK, the sparse ATTEND and the sparse ATTEND on
//! key sketches (ABI 1.3). The block of another participant that mutations name belongs to another
//! tenant (ABI 1.4): those commands complete with `ERR_ACCESS`, and the device never reads a byte
//! of that block's payload. Runs once per compute engine.
//!
//! `CXLKV_NDP_FUZZ_CASES` sets the number of malformed commands per engine (default 3000; the
//! long run of `scripts/fuzz-long.sh` sends 100,000). Each run prints its counts: malformed
//! commands, crashes (a command without its completion), wrong reads (a valid command between
//! them answering other than the host reference) and leaks (pins left held in any participant
//! slot once the device is idle, against the count before the run).

mod common;
use common::*;
use cxlkv_kernels::{rng::SplitMix64, DType, GroupMode};
use cxlkv_ndp::{Device, DeviceConfig, Engine};
use cxlkv_runtime::ndp::abi::*;
use cxlkv_runtime::ndp::{NdpDevice, NdpOptions, NdpPath};
use cxlkv_runtime::{
    format, mem, AttachOptions, Participant, Pool, PoolConfig, Region, SharedMemory,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const GUARD: u64 = 1 << 20;
const GUARD_BYTE: u8 = 0xA5;

/// A view of the first `size` bytes of a region followed by a guard; it records every access
/// made from a device thread and counts those outside the ranges the device may touch.
struct Tracking {
    inner: Region,
    size: u64,
    /// Ranges device threads may write: the device area, then staging blocks.
    writable: Mutex<Vec<(u64, u64)>>,
    violations: AtomicU64,
    /// A range device threads must never read (a block of another tenant), and reads inside it.
    forbidden: Mutex<(u64, u64)>,
    forbidden_reads: AtomicU64,
    device_reads: AtomicU64,
    device_writes: AtomicU64,
}

fn on_device() -> bool {
    std::thread::current()
        .name()
        .is_some_and(|n| n.starts_with("cxlkv-ndp"))
}

impl Tracking {
    fn check_read(&self, off: u64, len: u64) {
        if on_device() {
            self.device_reads.fetch_add(1, Ordering::Relaxed);
            if off.checked_add(len).is_none_or(|e| e > self.size) {
                self.violations.fetch_add(1, Ordering::Relaxed);
            }
            let (lo, hi) = *self.forbidden.lock().unwrap();
            if off < hi && off.saturating_add(len) > lo {
                self.forbidden_reads.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    fn check_write(&self, off: u64, len: u64) {
        if on_device() {
            self.device_writes.fetch_add(1, Ordering::Relaxed);
            let ok = off.checked_add(len).is_some_and(|e| {
                self.writable
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|&(a, b)| off >= a && e <= b)
            });
            if !ok {
                eprintln!("device write outside its ranges: {off} + {len}");
                self.violations.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl SharedMemory for Tracking {
    fn size(&self) -> u64 {
        self.size
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> mem::Result<()> {
        self.check_read(offset, dst.len() as u64);
        mem::check_range(offset, dst.len() as u64, self.size)?;
        self.inner.read(offset, dst)
    }
    fn write(&self, offset: u64, src: &[u8]) -> mem::Result<()> {
        self.check_write(offset, src.len() as u64);
        mem::check_range(offset, src.len() as u64, self.size)?;
        self.inner.write(offset, src)
    }
    fn fill(&self, offset: u64, len: u64, byte: u8) -> mem::Result<()> {
        self.check_write(offset, len);
        mem::check_range(offset, len, self.size)?;
        self.inner.fill(offset, len, byte)
    }
    fn load_u64(&self, offset: u64, order: Ordering) -> mem::Result<u64> {
        self.check_read(offset, 8);
        mem::check_range(offset, 8, self.size)?;
        self.inner.load_u64(offset, order)
    }
    fn store_u64(&self, offset: u64, value: u64, order: Ordering) -> mem::Result<()> {
        self.check_write(offset, 8);
        mem::check_range(offset, 8, self.size)?;
        self.inner.store_u64(offset, value, order)
    }
    fn compare_exchange_u64(
        &self,
        offset: u64,
        current: u64,
        new: u64,
    ) -> mem::Result<Result<u64, u64>> {
        self.check_write(offset, 8);
        mem::check_range(offset, 8, self.size)?;
        self.inner.compare_exchange_u64(offset, current, new)
    }
    fn publish(&self, offset: u64, len: u64) {
        self.inner.publish(offset, len)
    }
    fn acquire(&self, offset: u64, len: u64) {
        self.inner.acquire(offset, len)
    }
    fn raw_range(&self, offset: u64, len: u64) -> mem::Result<Option<*mut u8>> {
        // The device reads keys in place through this; count it as a read of the whole range.
        self.check_read(offset, len);
        mem::check_range(offset, len, self.size)?;
        self.inner.raw_range(offset, len)
    }
}

fn scramble(rng: &mut SplitMix64) -> u64 {
    match rng.below(6) {
        0 => 0,
        1 => u64::MAX - rng.below(1000),
        2 => rng.below(1 << 30),
        3 => rng.below(64 << 20),
        4 => 1 << rng.below(64),
        _ => rng.next_u64(),
    }
}

#[test]
fn malformed_commands_get_errors_and_the_device_stays_in_bounds_rust_engine() {
    malformed_commands(Engine::Rust);
}

#[test]
fn malformed_commands_get_errors_and_the_device_stays_in_bounds_hls_engine() {
    malformed_commands(Engine::Hls);
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Pin entries held (a nonzero sequence word) in every participant slot of the pool.
fn pins_held(pool: &Pool) -> u64 {
    let sb = pool.superblock();
    let layout = sb.slot_layout();
    let mut held = 0;
    for q in 0..u64::from(sb.participants) {
        let base = sb.participant_table_off + q * layout.size;
        for e in 0..layout.pins {
            let seq = pool
                .memory()
                .load_u64(base + layout.pin(e) + format::pin::SEQ, Ordering::Acquire)
                .unwrap();
            held += u64::from(seq != 0);
        }
    }
    held
}

fn malformed_commands(engine: Engine) {
    let size = 48u64 << 20;
    let region = Region::anonymous(size + GUARD).unwrap();
    region.fill(size, GUARD, GUARD_BYTE).unwrap();
    let view = Arc::new(Tracking {
        inner: region,
        size,
        writable: Mutex::new(Vec::new()),
        violations: AtomicU64::new(0),
        forbidden: Mutex::new((0, 0)),
        forbidden_reads: AtomicU64::new(0),
        device_reads: AtomicU64::new(0),
        device_writes: AtomicU64::new(0),
    });
    let cfg = PoolConfig {
        block_size: 64 << 10,
        participants: 4,
        ..PoolConfig::default()
    };
    let pool = Pool::create(view.clone(), &cfg).unwrap();
    let sb = *pool.superblock();
    view.writable
        .lock()
        .unwrap()
        .push((sb.device_area_off, sb.device_area_off + sb.device_area_size));

    let p = Arc::new(Participant::attach(&pool, AttachOptions::default()).unwrap());
    let other = Participant::attach(&pool, AttachOptions::default()).unwrap();
    let (dim, heads, tokens) = (32usize, 2usize, 400usize);
    let (k, v) = random_kv(1, heads, tokens, dim, DType::F16);
    let s = store(&p, &k, &v, heads, tokens, dim, DType::F16, 100, 10, 2);
    // The same keys and values with key sketches, for the sketched sparse ATTEND (ABI 1.3).
    let sk = store_with(
        &p,
        &k,
        &v,
        heads,
        tokens,
        dim,
        DType::F16,
        100,
        12,
        2,
        cxlkv_runtime::kv::Sketch::Int4,
    );
    // A block of another sequence, in another participant's partition.
    let (k2, v2) = random_kv(2, heads, 100, dim, DType::F16);
    let foreign = store(&other, &k2, &v2, heads, 100, dim, DType::F16, 100, 11, 2);
    // Of another tenant than the fuzzing client's (tenant 1): its payload is never to be read.
    attach_as(&pool, &p, 1);
    give(&pool, &foreign.blocks, 7);
    let r = pool
        .block_ref_any_tenant(foreign.blocks[0].key)
        .unwrap()
        .unwrap();
    *view.forbidden.lock().unwrap() = (r.payload_off, r.payload_off + r.header.len);
    give(&pool, &s.blocks, 1);
    let foreign_args_off = {
        let r = other
            .reserve(cxlkv_runtime::Key(99), 4096, cxlkv_runtime::Codec::Raw)
            .unwrap();
        let off = r.payload_offset();
        std::mem::forget(r);
        off
    };

    let _dev = Device::start(
        pool.clone(),
        DeviceConfig {
            engine,
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    // The device's own participant slot, where it records the pins it holds while scanning.
    let slot = sb.participant_table_off + u64::from(_dev.device().participant_slot()) * 4096;
    view.writable.lock().unwrap().push((slot, slot + 4096));
    let mut ndp = NdpDevice::open(p.clone(), NdpOptions::default()).unwrap();
    for off in ndp.staging_offsets() {
        view.writable
            .lock()
            .unwrap()
            .push((off, off + sb.block_size));
    }
    let staging = ndp.staging_offsets()[0];
    let mut rng = SplitMix64::new(2024);
    let q = rng.normal_vec(2 * dim);
    let want = reference(&s, 1, &q, 8, GroupMode::PerQuery);

    // Valid arguments for mutations: 2 queries, then the block list.
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
    let base = cxlkv_ndp_cmd {
        opcode: CXLKV_NDP_OP_SCORE_TOPK as u16,
        flags: CXLKV_NDP_FLAG_PRUNE as u16,
        k: 8,
        sequence: 10,
        layer: 2,
        kv_head: 1,
        dtype: DType::F16 as u8,
        group: 2,
        dim: dim as u32,
        nblocks: s.blocks.len() as u32,
        args_off: staging,
        result_off: staging + 4096,
        args_len: args.len() as u32,
        result_len: 16384,
        ..Default::default()
    };
    // The sparse ATTEND (ATTEND with FLAG_SELECT): the same queries and blocks, then its tail.
    let mut sparse_args = args.clone();
    sparse_args.extend_from_slice(format::as_bytes(&cxlkv_ndp_attend {
        scale: 0.125,
        ..Default::default()
    }));
    let sel = cxlkv_runtime::ndp::Select {
        sinks: 2,
        top_p: Some(0.9),
        ..Default::default()
    };
    sparse_args.extend_from_slice(format::as_bytes(&sel.to_abi(0.125)));
    let sparse_base = cxlkv_ndp_cmd {
        opcode: CXLKV_NDP_OP_ATTEND as u16,
        flags: CXLKV_NDP_FLAG_SELECT as u16,
        args_len: sparse_args.len() as u32,
        ..base
    };
    // The sketched sparse ATTEND: the sketched blocks, the tail with SEL_SKETCH.
    let mut sketch_args = Vec::new();
    for x in &q {
        sketch_args.extend_from_slice(&x.to_le_bytes());
    }
    for b in &sk.blocks {
        sketch_args.extend_from_slice(format::as_bytes(&cxlkv_ndp_block {
            key_lo: b.key.lo(),
            key_hi: b.key.hi(),
            token_offset: b.token_offset,
        }));
    }
    sketch_args.extend_from_slice(&sparse_args[args.len()..args.len() + 16]);
    let mut w = sel.to_abi(0.125);
    w.options |= CXLKV_NDP_SEL_SKETCH;
    w.candidates = 40;
    sketch_args.extend_from_slice(format::as_bytes(&w));
    let sketch_base = cxlkv_ndp_cmd {
        sequence: 12,
        args_len: sketch_args.len() as u32,
        ..sparse_base
    };
    for (a, c, what) in [
        (&sparse_args, sparse_base, "sparse ATTEND"),
        (&sketch_args, sketch_base, "sketched sparse ATTEND"),
    ] {
        pool.memory().write(staging, a).unwrap();
        let tag = ndp.submit_raw(c).unwrap().expect("ring has room");
        let cpl = ndp.wait_raw(tag).unwrap().expect("device answers");
        if engine == Engine::Hls && c.sequence == 12 {
            // The HLS engine has no sketch datapath: refused, with its reason.
            assert_eq!(
                (cpl.status, cpl.detail),
                (CXLKV_NDP_ERR_ARGS, CXLKV_NDP_DETAIL_BAD_OPTIONS)
            );
        } else {
            assert_eq!(cpl.status, CXLKV_NDP_OK, "the unmutated {what} succeeds");
        }
    }
    let n_cases = env_u64("CXLKV_NDP_FUZZ_CASES", 3000);
    let mut errors = 0;
    let mut refused = 0u64;
    let mut valid = 0u64;
    let pins_before = pins_held(&pool);
    let start = std::time::Instant::now();
    for i in 0..n_cases {
        let sparse = i % 3 != 0;
        let sketched = i % 3 == 2;
        if i % 100 == 0 {
            let got = ndp
                .score_topk(&request(
                    &s,
                    1,
                    &q,
                    8,
                    GroupMode::PerQuery,
                    i % 200 == 0,
                    true,
                ))
                .unwrap();
            assert_eq!(got.stats.path, Some(NdpPath::Device));
            assert_eq!(hits_of(&got), want);
            valid += 1;
        }
        let (a, mut c) = match (sparse, sketched) {
            (_, true) => (&sketch_args, sketch_base),
            (true, false) => (&sparse_args, sparse_base),
            _ => (&args, base),
        };
        pool.memory().write(staging, a).unwrap();
        let mut entry_override = None;
        match rng.below(20) {
            0 => {
                // Everything random (opcode NOP excluded: it reads no field).
                c = cxlkv_ndp_cmd {
                    opcode: 1 + rng.below(9) as u16,
                    flags: rng.next_u64() as u16,
                    k: scramble(&mut rng) as u32,
                    sequence: rng.next_u64(),
                    layer: rng.next_u64() as u32,
                    kv_head: rng.next_u64() as u16,
                    dtype: rng.next_u64() as u8,
                    group: rng.next_u64() as u8,
                    dim: scramble(&mut rng) as u32,
                    nblocks: scramble(&mut rng) as u32,
                    args_off: scramble(&mut rng),
                    result_off: scramble(&mut rng),
                    args_len: scramble(&mut rng) as u32,
                    result_len: scramble(&mut rng) as u32,
                    ..Default::default()
                };
            }
            1 => c.args_off = size - 8 + rng.below(1 << 20),
            2 => c.result_off = size - rng.below(4096),
            3 => c.k = 0,
            4 => c.k = CXLKV_NDP_MAX_K + 1 + rng.below(1 << 20) as u32,
            // Another dtype than the blocks', quantized ones included (ABI 1.2).
            5 => c.dtype = [DType::F32, DType::I8, DType::I4][rng.below(3) as usize] as u8,
            // For the sketched command: the unsketched copy of its blocks (no sketch to score),
            // or a candidate count of 0 or past the limit.
            6 if sketched && rng.below(2) == 0 => {
                let mut a = args.clone();
                a.extend_from_slice(&sketch_args[sketch_args.len() - 80..]);
                pool.memory().write(staging, &a).unwrap();
                c.sequence = 10;
            }
            6 if sketched => {
                let bad = [0, CXLKV_NDP_MAX_CANDIDATES + 1 + rng.below(1000) as u32];
                let at = sketch_args.len() - 64 + 12;
                pool.memory()
                    .write(
                        staging + at as u64,
                        &bad[rng.below(2) as usize].to_le_bytes(),
                    )
                    .unwrap();
            }
            6 => c.sequence = 11,
            7 => {
                entry_override =
                    Some((rng.below(s.blocks.len() as u64) as usize, foreign.blocks[0]))
            }
            8 => {
                c.group = if rng.below(2) == 0 {
                    0
                } else {
                    17 + rng.below(200) as u8
                }
            }
            9 => c.dim = [0, 8, 33, 272, 1 << 20][rng.below(5) as usize],
            10 => c.kv_head = 2 + rng.below(1000) as u16,
            11 => c.layer = 3 + rng.below(100) as u32,
            12 => c.args_len = c.args_len.wrapping_add(1 + rng.below(100) as u32),
            13 => c.result_len = rng.below(100) as u32,
            14 => c.args_off = foreign_args_off,
            15 => c.result_off = sb.device_area_off + rng.below(sb.device_area_size),
            16 => c.opcode = 5 + u16::from(sparse) + rng.below(60000) as u16,
            17 if sparse => c.flags = 8 | (16 << rng.below(11)),
            17 => c.flags = 8 << rng.below(12),
            18 => c.nblocks = c.nblocks + 1 + rng.below(100_000) as u32,
            _ => {
                // A token offset that does not match the block's layout.
                let mut b = s.blocks[rng.below(s.blocks.len() as u64) as usize];
                b.token_offset += 1 + rng.below(50);
                entry_override = Some((rng.below(s.blocks.len() as u64) as usize, b));
            }
        }
        if let Some((at, b)) = entry_override {
            let e = cxlkv_ndp_block {
                key_lo: b.key.lo(),
                key_hi: b.key.hi(),
                token_offset: b.token_offset,
            };
            pool.memory()
                .write(
                    staging + (2 * dim * 4 + 24 * at) as u64,
                    format::as_bytes(&e),
                )
                .unwrap();
        }
        let tag = ndp.submit_raw(c).unwrap().expect("ring has room");
        let cpl = ndp.wait_raw(tag).unwrap().expect("device answers");
        assert_eq!(cpl.tag, tag);
        assert_ne!(cpl.status, CXLKV_NDP_OK, "case {i}: {c:?} succeeded");
        errors += 1;
        refused += u64::from(cpl.status == CXLKV_NDP_ERR_ACCESS);
    }
    // Ring indices out of range: an error completion, then the queue pair serves again.
    for bogus in [u64::MAX / 3, 12345678, 0] {
        let before = ndp.counter(CXLKV_NDP_CTR_ERRORS).unwrap();
        let cur = ndp.counter(CXLKV_NDP_CTR_COMMANDS).unwrap();
        let _ = cur;
        ndp.corrupt_sq_tail(bogus).unwrap();
        let t0 = std::time::Instant::now();
        while ndp.counter(CXLKV_NDP_CTR_ERRORS).unwrap() == before {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(5),
                "no ring error for tail {bogus}"
            );
            std::thread::yield_now();
        }
        ndp.resync().unwrap();
        let got = ndp
            .score_topk(&request(&s, 1, &q, 8, GroupMode::PerQuery, true, true))
            .unwrap();
        assert_eq!(got.stats.path, Some(NdpPath::Device));
        assert_eq!(hits_of(&got), want);
    }
    assert_eq!(errors, n_cases);
    // The foreign block was named (about one case in 20) and refused each time, unread.
    assert!(
        refused > 0 || n_cases < 1000,
        "no command named the foreign block"
    );
    assert_eq!(ndp.counter(CXLKV_NDP_CTR_REFUSED).unwrap(), refused);
    assert_eq!(
        view.forbidden_reads.load(Ordering::Relaxed),
        0,
        "the device read a block of another tenant"
    );
    // Leaks: once the device has answered everything, it holds no pin it took for a command.
    let pins_after = pins_held(&pool);
    println!(
        "{engine:?} engine: {n_cases} malformed commands in {:.1?}, {valid} valid ones between them; \
         crashes 0, wrong reads 0, leaks {} (pins held {pins_before} before, {pins_after} after)",
        start.elapsed(),
        pins_after.saturating_sub(pins_before)
    );
    assert_eq!(pins_after, pins_before, "pins leaked by the device");
    assert!(
        view.device_reads.load(Ordering::Relaxed) > 0
            && view.device_writes.load(Ordering::Relaxed) > 0
    );
    assert_eq!(
        view.violations.load(Ordering::Relaxed),
        0,
        "device accessed memory outside its ranges"
    );
    let mut guard = vec![0u8; GUARD as usize];
    view.inner.read(size, &mut guard).unwrap();
    assert!(
        guard.iter().all(|&b| b == GUARD_BYTE),
        "guard region was written"
    );
}
