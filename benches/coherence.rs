//! Coherence cost, measured in one run: put and get of 256 KiB blocks on a software-coherent pool
//! (write-back on publish, invalidation on acquire) against a hardware-coherent one (fences only),
//! and the raw cost of `write_back` and `invalidate` per line and per 256 KiB.
//!
//! Target of the coherence issue: software-coherent get and put each ≤ 1.5× the coherent time.
//! Both pools live in `/dev/shm` (unlinked at once), cycle over 64 blocks (16 MiB) per round.
//!
//! `cargo bench --bench coherence`.

use cxlkv_runtime::coherence::{self, detect, FlushKind};
use cxlkv_runtime::{Backend, CoherenceMode, Key, Pool, PoolConfig, Region, RegionOptions};
use std::hint::black_box;
use std::time::{Duration, Instant};

const BLOCK: u64 = 256 << 10;
const KEYS: u64 = 64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Median microseconds of one put and one get of a 256 KiB block on a pool of `mode`.
fn put_get(mode: CoherenceMode) -> (f64, f64) {
    let backend: Backend = format!("shm:cxlkv-bench-coh-{}-{}", std::process::id(), mode as u32)
        .parse()
        .unwrap();
    let cfg = PoolConfig {
        block_size: BLOCK,
        participants: 1,
        coherence: mode,
        ..Default::default()
    };
    let pool = Pool::create_on(
        &backend,
        96 << 20,
        &cfg,
        &RegionOptions {
            prefault: true,
            ..Default::default()
        },
    )
    .unwrap();
    Region::unlink(&backend).unwrap();
    let me = pool.attach().unwrap();
    let data: Vec<u8> = (0..BLOCK).map(|i| (i * 7 + 3) as u8).collect();
    let keys: Vec<Key> = (0..KEYS)
        .map(|i| Key::from_bytes(&i.to_le_bytes()))
        .collect();
    let mut buf = vec![0u8; BLOCK as usize];
    for k in &keys {
        me.put(*k, &data).unwrap();
    }
    let (mut puts, mut gets) = (Vec::new(), Vec::new());
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        let t = Instant::now();
        for k in &keys {
            me.put(*k, &data).unwrap();
        }
        puts.push(t.elapsed().as_secs_f64() * 1e6 / KEYS as f64);
        let t = Instant::now();
        for k in &keys {
            black_box(me.get_into(*k, &mut buf).unwrap().unwrap());
        }
        gets.push(t.elapsed().as_secs_f64() * 1e6 / KEYS as f64);
    }
    (median(puts), median(gets))
}

/// Median nanoseconds of `f` over `bytes` of a dirty (written) buffer.
fn raw(bytes: usize, f: impl Fn(*const u8, usize)) -> f64 {
    let mut v = vec![1u8; bytes.max(64) + 64];
    let mut t = Vec::new();
    for round in 0..200u32 {
        v[..bytes].fill(round as u8);
        let s = Instant::now();
        f(v.as_ptr(), bytes);
        t.push(s.elapsed().as_secs_f64() * 1e9);
    }
    black_box(&v);
    median(t)
}

fn main() {
    let kind = detect();
    let (hp, hg) = put_get(CoherenceMode::Hardware);
    let (sp, sg) = put_get(CoherenceMode::Software);
    let wb = |p: *const u8, n: usize| {
        // SAFETY: `raw` passes the address and length of a live private buffer.
        unsafe { coherence::write_back(p, n, kind) }
    };
    let inv = |p: *const u8, n: usize| {
        // SAFETY: as above.
        unsafe { coherence::invalidate(p, n, kind) }
    };
    let clf = |p: *const u8, n: usize| {
        // SAFETY: as above.
        unsafe { coherence::write_back(p, n, FlushKind::Clflush) }
    };
    let line = |f: &dyn Fn(*const u8, usize)| raw(64 << 10, f) / 1024.0;
    println!("coherence bench ({kind:?} write-back), 256 KiB blocks, median per operation:");
    println!(
        "  put   hardware {hp:8.1} us  software {sp:8.1} us  ratio {:.2} (target <= 1.5)",
        sp / hp
    );
    println!(
        "  get   hardware {hg:8.1} us  software {sg:8.1} us  ratio {:.2} (target <= 1.5)",
        sg / hg
    );
    println!(
        "  write_back ({kind:?}) {:6.2} ns/line (64 KiB runs)  {:8.1} us / 256 KiB",
        line(&wb),
        raw(256 << 10, wb) / 1e3
    );
    println!(
        "  invalidate           {:6.2} ns/line (64 KiB runs)  {:8.1} us / 256 KiB",
        line(&inv),
        raw(256 << 10, inv) / 1e3
    );
    println!(
        "  write_back (Clflush) {:6.2} ns/line (64 KiB runs)  {:8.1} us / 256 KiB",
        line(&clf),
        raw(256 << 10, clf) / 1e3
    );
    println!(
        "summary: put {:.2}x get {:.2}x of hardware-coherent",
        sp / hp,
        sg / hg
    );
}
