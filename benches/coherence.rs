//! Coherence cost, measured in one run: put and get of 256 KiB blocks on a software-coherent pool
//! (non-temporal payload stores on put, invalidation of the lines read on get) against a
//! hardware-coherent one (fences only), beside the copies they chase, and the raw cost of the
//! cache-maintenance instructions per line and per 256 KiB on dirty, clean and uncached lines.
//!
//! Target of the coherence issue: software-coherent get and put each ≤ 1.5× the coherent time.
//!
//! Both pools live in `/dev/shm` (unlinked at once) and are used in alternating rounds, so load
//! from other processes hits both alike. Each round puts, then gets, every key once in a shuffled
//! order; the keys span a working set larger than the last-level cache (default 1024 MiB per pool
//! over the 480 MiB L3 this was written on; `CXLKV_BENCH_WORKING_SET_MIB` overrides it), so every
//! call touches cold pool memory. The source of a put and the destination of a get are one private
//! 256 KiB buffer each (hot), as a staging buffer would be.
//!
//! `cargo bench --bench coherence`.
mod common;
use common::shuffled;

use cxlkv_runtime::{
    Backend, CoherenceMode, Key, Participant, Pool, PoolConfig, Region, RegionOptions,
};
use cxlkv_shm::cacheline::{self as coherence, detect, FlushKind};
use cxlkv_test_support::median;
use std::hint::black_box;
use std::time::{Duration, Instant};

const BLOCK: u64 = 256 << 10;

fn working_set() -> u64 {
    std::env::var("CXLKV_BENCH_WORKING_SET_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024u64)
        << 20
}

/// A one-participant pool of `mode` in `/dev/shm` holding `keys` blocks, every key put once.
struct Bed {
    _pool: Pool,
    me: Participant,
    keys: Vec<Key>,
    puts: Vec<f64>,
    gets: Vec<f64>,
}

impl Bed {
    fn new(mode: CoherenceMode, keys: u64, data: &[u8]) -> Bed {
        let backend: Backend =
            format!("shm:cxlkv-bench-coh-{}-{}", std::process::id(), mode as u32)
                .parse()
                .unwrap();
        let cfg = PoolConfig {
            block_size: BLOCK,
            participants: 1,
            coherence: mode,
            lease: Duration::from_secs(60),
            ..Default::default()
        };
        // A spare block per 32 keys (a put takes a fresh block before it frees the old one),
        // plus headers, index and tables.
        let size = (keys + keys / 32 + 8) * (BLOCK + 256) + (4 << 20);
        let pool = Pool::create_on(
            &backend,
            size,
            &cfg,
            &RegionOptions {
                prefault: true,
                ..Default::default()
            },
        )
        .unwrap();
        Region::unlink(&backend).unwrap();
        let me = pool.attach().unwrap();
        let keys: Vec<Key> = (0..keys)
            .map(|i| Key::from_bytes(&i.to_le_bytes()))
            .collect();
        for k in &keys {
            me.put(*k, data).unwrap();
        }
        Bed {
            _pool: pool,
            me,
            keys,
            puts: Vec::new(),
            gets: Vec::new(),
        }
    }

    /// One round: a put, then a get, of every key in `order`, each timed.
    fn round(&mut self, order: &[usize], data: &[u8], buf: &mut [u8]) {
        for &i in order {
            let t = Instant::now();
            self.me.put(self.keys[i], data).unwrap();
            self.puts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        for &i in order {
            let t = Instant::now();
            black_box(self.me.get_into(self.keys[i], buf).unwrap().unwrap());
            self.gets.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
}

/// Median microseconds of `f` over 256 KiB blocks of a cold `working_set` arena in rotation
/// (shuffled), as the pool sees it: `f(block, private)`.
fn copy_baseline(arena: &mut [u8], private: &mut [u8], f: impl Fn(&mut [u8], &mut [u8])) -> f64 {
    let n = arena.len() / BLOCK as usize;
    let order = shuffled(n, 7);
    let mut t = Vec::new();
    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        for &i in &order {
            let b = &mut arena[i * BLOCK as usize..(i + 1) * BLOCK as usize];
            let s = Instant::now();
            f(b, private);
            t.push(s.elapsed().as_secs_f64() * 1e6);
        }
    }
    black_box(&arena);
    median(t)
}

/// The cache state of the lines before a timed flush.
#[derive(Clone, Copy, Debug)]
enum LineState {
    /// Written just before (dirty in L1/L2).
    Dirty,
    /// Read just before (clean, cached).
    Clean,
    /// Flushed out just before (in memory only).
    Uncached,
}

/// Median nanoseconds of `f` over `bytes` of a private buffer whose lines are in `state`.
fn raw(bytes: usize, state: LineState, f: impl Fn(*const u8, usize)) -> f64 {
    let mut v = vec![1u8; bytes.max(64) + 64];
    let mut t = Vec::new();
    for round in 0..200u32 {
        v[..bytes].fill(round as u8);
        match state {
            LineState::Dirty => {}
            LineState::Clean => {
                // SAFETY: a live private buffer. Writes it back so that the read below caches it
                // clean.
                unsafe { coherence::write_back(v.as_ptr(), bytes, FlushKind::ClflushOpt) };
                black_box(v[..bytes].iter().step_by(64).fold(0u8, |a, &b| a ^ b));
            }
            LineState::Uncached => {
                // SAFETY: as above.
                unsafe { coherence::invalidate(v.as_ptr(), bytes, FlushKind::ClflushOpt) };
            }
        }
        let s = Instant::now();
        f(v.as_ptr(), bytes);
        t.push(s.elapsed().as_secs_f64() * 1e9);
    }
    black_box(&v);
    median(t)
}

fn main() {
    let kind = detect();
    let ws = working_set();
    let keys = ws / BLOCK;
    let data: Vec<u8> = (0..BLOCK).map(|i| (i * 7 + 3) as u8).collect();
    let mut buf = vec![0u8; BLOCK as usize];
    let mut hw = Bed::new(CoherenceMode::Hardware, keys, &data);
    let mut sw = Bed::new(CoherenceMode::Software, keys, &data);
    let order = shuffled(keys as usize, 1);
    let end = Instant::now() + Duration::from_secs(8);
    let mut rounds = 0;
    while Instant::now() < end || rounds < 2 {
        hw.round(&order, &data, &mut buf);
        sw.round(&order, &data, &mut buf);
        rounds += 1;
    }
    let (hp, hg) = (median(hw.puts.clone()), median(hw.gets.clone()));
    let (sp, sg) = (median(sw.puts.clone()), median(sw.gets.clone()));
    drop((hw, sw));

    // The copies a put and a get make, on a cold arena of the same size.
    let mut arena = vec![0u8; ws as usize];
    arena.iter_mut().step_by(4096).for_each(|b| *b = 1);
    let memcpy_in = copy_baseline(&mut arena, &mut buf, |b, p| {
        b.copy_from_slice(&data);
        black_box(p);
    });
    let stream_in = copy_baseline(&mut arena, &mut buf, |b, p| {
        // SAFETY: `b` is a private block of the arena, disjoint from `data`, not borrowed
        // elsewhere while the copy runs.
        unsafe { coherence::write_streaming(b.as_mut_ptr(), &data, kind) };
        black_box(p);
    });
    let memcpy_out = copy_baseline(&mut arena, &mut buf, |b, p| p.copy_from_slice(b));
    let inval_out = copy_baseline(&mut arena, &mut buf, |b, p| {
        // SAFETY: `b` is a live private block.
        unsafe { coherence::invalidate(b.as_ptr(), b.len(), kind) };
        p.copy_from_slice(b);
    });
    drop(arena);

    println!(
        "coherence bench: {kind:?} write-back, 256 KiB blocks, {} MiB per pool, {rounds} rounds, median per operation",
        ws >> 20
    );
    println!(
        "  into cold memory:   memcpy {memcpy_in:6.1} us  non-temporal (write_streaming) {stream_in:6.1} us"
    );
    println!(
        "  out of cold memory: memcpy {memcpy_out:6.1} us  invalidate + memcpy            {inval_out:6.1} us"
    );
    println!(
        "  put   hardware {hp:8.1} us  software {sp:8.1} us  ratio {:.2} (target <= 1.5)",
        sp / hp
    );
    println!(
        "  get   hardware {hg:8.1} us  software {sg:8.1} us  ratio {:.2} (target <= 1.5)",
        sg / hg
    );

    type Prim = (&'static str, fn(*const u8, usize));
    let prims: [Prim; 4] = [
        ("CLWB + SFENCE (write_back)", |p, n| {
            // SAFETY: `raw` passes the address and length of a live private buffer.
            unsafe { coherence::write_back(p, n, FlushKind::Clwb) }
        }),
        ("CLFLUSHOPT + SFENCE (write_back)", |p, n| {
            // SAFETY: as above.
            unsafe { coherence::write_back(p, n, FlushKind::ClflushOpt) }
        }),
        ("CLFLUSHOPT + MFENCE (invalidate)", |p, n| {
            // SAFETY: as above.
            unsafe { coherence::invalidate(p, n, FlushKind::ClflushOpt) }
        }),
        ("CLFLUSH + SFENCE (write_back)", |p, n| {
            // SAFETY: as above.
            unsafe { coherence::write_back(p, n, FlushKind::Clflush) }
        }),
    ];
    println!(
        "  per line (64 KiB runs) and per 256 KiB:   dirty            clean            uncached"
    );
    for (name, f) in prims {
        if name.starts_with("CLWB") && kind != FlushKind::Clwb {
            continue;
        }
        let mut row = format!("  {name:34}");
        for state in [LineState::Dirty, LineState::Clean, LineState::Uncached] {
            let line = raw(64 << 10, state, f) / 1024.0;
            let block = raw(256 << 10, state, f) / 1e3;
            row += &format!("  {line:5.2} ns {block:6.1} us");
        }
        println!("{row}");
    }
    println!(
        "summary: put {:.2}x get {:.2}x of hardware-coherent",
        sp / hp,
        sg / hg
    );
}
