//! Cost of the C ABI: `cxlkv_participant_get` of a 256 KiB block against the Rust API
//! (`Participant::get_into`) on the same pool, participant and buffer, in the same run. The C entry
//! point adds a handle-registry check, the panic boundary and argument checks.
//!
//! `cargo bench --bench ffi` prints criterion's figures and a summary line with the ratio.

use criterion::{criterion_group, Criterion, Throughput};
use cxlkv::runtime::region::{Backend, Region, RegionOptions};
use cxlkv::runtime::{Key, Pool, PoolConfig};
use std::hint::black_box;
use std::time::Instant;

const BLOCK: usize = 256 << 10;
const KEYS: u64 = 64;

struct Fixture {
    backend: Backend,
    pool: *mut ffi::cxlkv_pool,
    me: *mut ffi::cxlkv_participant,
    rust: cxlkv::runtime::Participant,
    keys: Vec<ffi::cxlkv_key>,
}

fn fixture() -> Fixture {
    let name = format!("cxlkv-bench-ffi-{}", std::process::id());
    let backend: Backend = format!("shm:{name}").parse().unwrap();
    let cfg = PoolConfig {
        block_size: BLOCK as u64,
        participants: 2,
        ..Default::default()
    };
    let pool = Pool::create_on(
        &backend,
        64 << 20,
        &cfg,
        &RegionOptions {
            prefault: true,
            ..Default::default()
        },
    )
    .unwrap();
    let rust = pool.attach().unwrap();
    let data = vec![0x5au8; BLOCK];
    let keys: Vec<ffi::cxlkv_key> = (0..KEYS)
        .map(|i| {
            let k = Key::from_bytes(&i.to_le_bytes());
            rust.put(k, &data).unwrap();
            ffi::cxlkv_key {
                lo: k.lo(),
                hi: k.hi(),
            }
        })
        .collect();
    let spec = std::ffi::CString::new(format!("shm:{name}")).unwrap();
    let mut h = std::ptr::null_mut();
    assert_eq!(
        ffi::cxlkv_pool_open(spec.as_ptr(), &mut h),
        ffi::cxlkv_result::CXLKV_OK
    );
    let mut me = std::ptr::null_mut();
    assert_eq!(
        ffi::cxlkv_participant_attach(h, &mut me),
        ffi::cxlkv_result::CXLKV_OK
    );
    Fixture {
        backend,
        pool: h,
        me,
        rust,
        keys,
    }
}

fn get_rust(f: &Fixture, i: usize, buf: &mut [u8]) -> usize {
    let k = f.keys[i % f.keys.len()];
    f.rust
        .get_into(Key::from_parts(k.lo, k.hi), buf)
        .unwrap()
        .unwrap()
        .len as usize
}

fn get_c(f: &Fixture, i: usize, buf: &mut [u8]) -> usize {
    let mut len = 0usize;
    let r = ffi::cxlkv_participant_get(
        f.me,
        &f.keys[i % f.keys.len()],
        buf.as_mut_ptr(),
        buf.len(),
        &mut len,
    );
    assert_eq!(r, ffi::cxlkv_result::CXLKV_OK);
    len
}

fn bench(c: &mut Criterion) {
    let f = fixture();
    let mut buf = vec![0u8; BLOCK];
    let mut g = c.benchmark_group("get_256k");
    g.throughput(Throughput::Bytes(BLOCK as u64));
    let mut i = 0;
    g.bench_function("rust_api", |b| {
        b.iter(|| {
            i += 1;
            black_box(get_rust(&f, i, &mut buf))
        })
    });
    g.bench_function("c_abi", |b| {
        b.iter(|| {
            i += 1;
            black_box(get_c(&f, i, &mut buf))
        })
    });
    g.finish();

    // Summary: interleaved rounds so drift affects both sides alike; median per-call time.
    let (rounds, calls) = (41, 400);
    let (mut rs, mut cs) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        for which in [r % 2, 1 - r % 2] {
            let t = Instant::now();
            for j in 0..calls {
                black_box(if which == 0 {
                    get_rust(&f, j, &mut buf)
                } else {
                    get_c(&f, j, &mut buf)
                });
            }
            let per = t.elapsed().as_secs_f64() / calls as f64;
            if which == 0 {
                rs.push(per)
            } else {
                cs.push(per)
            }
        }
    }
    rs.sort_by(f64::total_cmp);
    cs.sort_by(f64::total_cmp);
    let (r, cc) = (rs[rounds / 2], cs[rounds / 2]);
    println!(
        "summary: get 256 KiB over {KEYS} blocks: Rust API {:.2} µs ({:.1} GB/s), C ABI {:.2} µs ({:.1} GB/s): C/Rust = {:.3} ({:+.2} %)",
        r * 1e6, BLOCK as f64 / r / 1e9, cc * 1e6, BLOCK as f64 / cc / 1e9, cc / r, (cc / r - 1.0) * 100.0
    );
    ffi::cxlkv_participant_detach(f.me);
    ffi::cxlkv_pool_close(f.pool);
    drop(f.rust);
    Region::unlink(&f.backend).unwrap();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}

fn main() {
    benches();
    Criterion::default().final_summary();
}
