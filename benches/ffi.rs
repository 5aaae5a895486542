//! Cost of the C ABI: `cxlkv_participant_get` of a 256 KiB block through `libcxlkv.so` (loaded with
//! dlopen, as an engine links it) against the Rust API (`Participant::get_into`), on the same pool
//! and buffer, in the same run. Build the library first: `cargo build --release -p cxlkv-ffi`
//! (the bench looks for it in the target directory, or at $CXLKV_LIB).
//!
//! `cargo bench --bench ffi` prints criterion's figures and a summary line with the ratio.

use criterion::{criterion_group, Criterion, Throughput};
use cxlkv::runtime::region::{Backend, Region, RegionOptions};
use cxlkv::runtime::{Key, Participant, Pool, PoolConfig};
use std::ffi::{c_char, c_void, CString};
use std::hint::black_box;
use std::time::Instant;

const BLOCK: usize = 256 << 10;
const KEYS: u64 = 64;

#[repr(C)]
#[derive(Clone, Copy)]
struct CKey {
    lo: u64,
    hi: u64,
}

type OpenFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> u32;
type AttachFn = unsafe extern "C" fn(*const c_void, *mut *mut c_void) -> u32;
type GetFn = unsafe extern "C" fn(*const c_void, *const CKey, *mut u8, usize, *mut usize) -> u32;
type ReleaseFn = unsafe extern "C" fn(*mut c_void) -> u32;

struct CApi {
    participant: *mut c_void,
    pool: *mut c_void,
    get: GetFn,
    detach: ReleaseFn,
    close: ReleaseFn,
}

fn library_path() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("CXLKV_LIB") {
        return p.into();
    }
    // target/release/deps/ffi-HASH → target/release/libcxlkv.so
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let lib = dir.join("libcxlkv.so");
    assert!(
        lib.is_file(),
        "{} missing: run `cargo build --release -p cxlkv-ffi` first",
        lib.display()
    );
    lib
}

fn sym<T: Copy>(lib: *mut c_void, name: &str) -> T {
    let c = CString::new(name).unwrap();
    // SAFETY: dlsym on a handle from dlopen with a NUL-terminated name; the result is checked.
    let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
    assert!(!p.is_null(), "{name} not exported");
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is the extern "C" fn type matching the header's declaration of `name`, and has
    // the size of a pointer (checked above).
    unsafe { std::mem::transmute_copy(&p) }
}

fn open_c(spec: &str) -> CApi {
    let path = CString::new(library_path().to_str().unwrap()).unwrap();
    // SAFETY: dlopen of our own library by path; the handle is checked and kept for the process.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null(), "dlopen {path:?} failed");
    let open: OpenFn = sym(lib, "cxlkv_pool_open");
    let attach: AttachFn = sym(lib, "cxlkv_participant_attach");
    let spec = CString::new(spec).unwrap();
    let (mut pool, mut participant) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the C ABI's documented contract: valid string and out-pointers.
    unsafe {
        assert_eq!(open(spec.as_ptr(), &mut pool), 0);
        assert_eq!(attach(pool, &mut participant), 0);
    }
    CApi {
        participant,
        pool,
        get: sym(lib, "cxlkv_participant_get"),
        detach: sym(lib, "cxlkv_participant_detach"),
        close: sym(lib, "cxlkv_pool_close"),
    }
}

fn get_rust(p: &Participant, keys: &[Key], i: usize, buf: &mut [u8]) -> usize {
    p.get_into(keys[i % keys.len()], buf).unwrap().unwrap().len as usize
}

fn get_c(c: &CApi, keys: &[CKey], i: usize, buf: &mut [u8]) -> usize {
    let mut len = 0usize;
    // SAFETY: live participant handle, valid key, buffer of buf.len() writable bytes, out-pointer.
    let r = unsafe {
        (c.get)(
            c.participant,
            &keys[i % keys.len()],
            buf.as_mut_ptr(),
            buf.len(),
            &mut len,
        )
    };
    assert_eq!(r, 0);
    len
}

fn bench(c: &mut Criterion) {
    let name = format!("cxlkv-bench-ffi-{}", std::process::id());
    let spec = format!("shm:{name}");
    let backend: Backend = spec.parse().unwrap();
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
    let keys: Vec<Key> = (0..KEYS)
        .map(|i| Key::from_bytes(&i.to_le_bytes()))
        .collect();
    for &k in &keys {
        rust.put(k, &data).unwrap();
    }
    let ckeys: Vec<CKey> = keys
        .iter()
        .map(|k| CKey {
            lo: k.lo(),
            hi: k.hi(),
        })
        .collect();
    let capi = open_c(&spec);
    let mut buf = vec![0u8; BLOCK];

    let mut g = c.benchmark_group("get_256k");
    g.throughput(Throughput::Bytes(BLOCK as u64));
    let mut i = 0;
    g.bench_function("rust_api", |b| {
        b.iter(|| {
            i += 1;
            black_box(get_rust(&rust, &keys, i, &mut buf))
        })
    });
    g.bench_function("c_abi", |b| {
        b.iter(|| {
            i += 1;
            black_box(get_c(&capi, &ckeys, i, &mut buf))
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
                    get_rust(&rust, &keys, j, &mut buf)
                } else {
                    get_c(&capi, &ckeys, j, &mut buf)
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
        "summary: get 256 KiB over {KEYS} blocks: Rust API {:.2} µs ({:.1} GB/s), C ABI (libcxlkv.so) {:.2} µs ({:.1} GB/s): C/Rust = {:.3} ({:+.2} %)",
        r * 1e6,
        BLOCK as f64 / r / 1e9,
        cc * 1e6,
        BLOCK as f64 / cc / 1e9,
        cc / r,
        (cc / r - 1.0) * 100.0
    );
    // SAFETY: handles from this library, released once.
    unsafe {
        (capi.detach)(capi.participant);
        (capi.close)(capi.pool);
    }
    drop(rust);
    Region::unlink(&backend).unwrap();
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
