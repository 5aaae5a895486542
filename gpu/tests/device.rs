//! The kernels against the CPU reference (`cxlkv_kernels::attend_block`, the CPU ATTEND), and the
//! registration of a real pool, on a GPU. Without one (no driver, no device) every test prints
//! why it skips and passes; scripts/gpu-check.sh runs this binary on a GPU machine.
//!
//! Tolerance: [`common::assert_close`].

mod common;

use common::{assert_close, cpu, workload};
use cxlkv_gpu::{DeviceKv, Gpu, GpuError, Kind, KvShape, Pass, RegisteredMemory};
use cxlkv_kernels::DType;
use cxlkv_runtime::{Backend, Pool, PoolConfig, Region, RegionOptions, SharedMemory};
use std::sync::Arc;

/// The GPU, or `None` after printing why the test skips. Errors other than "no GPU" fail.
fn gpu(test: &str) -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(g) => Some(g),
        Err(e) if e.is_no_gpu() => {
            println!("{test}: skipped, no GPU: {e}");
            None
        }
        Err(e) => panic!("{test}: a GPU is present but unusable: {e}"),
    }
}

/// K/V in a registered anonymous region: K at 0, V after it.
fn registered(gpu: &Gpu, k: &[u8], v: &[u8]) -> RegisteredMemory {
    let r = Region::anonymous((k.len() + v.len()) as u64).unwrap();
    r.write(0, k).unwrap();
    r.write(k.len() as u64, v).unwrap();
    RegisteredMemory::region(gpu, Arc::new(r)).unwrap()
}

#[test]
fn open_says_what_is_missing_or_opens() {
    match Gpu::open(0) {
        Ok(g) => println!("GPU 0: {} (compute {:?})", g.name(), g.capability()),
        Err(e) => {
            assert!(
                e.is_no_gpu() || matches!(e, GpuError::NoNvrtc { .. }),
                "unexpected: {e}"
            );
            assert!(!e.to_string().is_empty());
            println!("open_says_what_is_missing_or_opens: no GPU here: {e}");
        }
    }
}

#[test]
fn dense_pull_gather_and_merge_agree_with_the_cpu_attend() {
    let Some(gpu) = gpu("dense_pull_gather_and_merge_agree_with_the_cpu_attend") else {
        return;
    };
    for (dtype, dim, g, rows) in [
        (DType::F16, 128, 4, 3000),
        (DType::F16, 64, 3, 1031),
        (DType::F32, 128, 1, 700),
        (DType::F32, 64, 8, 5000),
    ] {
        let heads = 2;
        let s = KvShape::new(heads, rows, dim, dtype).unwrap();
        let (k, v, q) = workload(heads, rows, dim, g, dtype, rows as u64);
        let scale = 1.0 / (dim as f32).sqrt();
        let what = format!("{} d={dim} G={g} rows={rows}", dtype.name());
        let reference = cpu(&k, &v, &q, s, g, scale, None);

        let mut pass = Pass::new(&gpu, heads, g, dim, &q, scale).unwrap();
        let dense = DeviceKv::upload(&gpu, s, &k, &v).unwrap();
        pass.launch(&gpu, &dense.rows(&gpu), Kind::Full).unwrap();
        assert_close(
            &format!("dense {what}"),
            &pass.read(&gpu).unwrap(),
            &reference,
        );

        let reg = registered(&gpu, &k, &v);
        let host = reg.kv(0, k.len() as u64, heads, rows, dim, dtype).unwrap();
        assert!(
            reg.kv(8, k.len() as u64, heads, rows, dim, dtype).is_err(),
            "unaligned K"
        );
        assert!(
            reg.kv(0, k.len() as u64 + 16, heads, rows, dim, dtype)
                .is_err(),
            "V past the end"
        );
        pass.launch(&gpu, &host, Kind::Full).unwrap();
        assert_close(
            &format!("pull {what}"),
            &pass.read(&gpu).unwrap(),
            &reference,
        );

        // gather: every third row of head 0, every fifth of head 1 (same count per head).
        let n = rows / 5;
        let sel: Vec<u32> = (0..n as u32)
            .map(|i| i * 3 % rows as u32)
            .chain((0..n as u32).map(|i| i * 5))
            .collect();
        pass.set_selection(&gpu, &sel, rows).unwrap();
        pass.launch(&gpu, &host, Kind::Gather).unwrap();
        let want = cpu(&k, &v, &q, s, g, scale, Some(&sel));
        assert_close(&format!("gather {what}"), &pass.read(&gpu).unwrap(), &want);

        // merge: the device's partials over the first rows (computed by the CPU ATTEND, in two
        // pieces), the open block (the last rows) in GPU memory.
        let open = rows / 4;
        let stored = rows - open;
        let row = dtype.bytes(dim);
        let split = |b: &[u8], lo: usize, hi: usize| -> Vec<u8> {
            (0..heads)
                .flat_map(|h| b[(h * rows + lo) * row..(h * rows + hi) * row].to_vec())
                .collect()
        };
        let mut device = Vec::new();
        for h in 0..heads {
            for (lo, hi) in [(0, stored / 2), (stored / 2, stored)] {
                let piece = KvShape::new(1, hi - lo, dim, dtype).unwrap();
                let kk = split(&k, lo, hi)[h * (hi - lo) * row..(h + 1) * (hi - lo) * row].to_vec();
                let vv = split(&v, lo, hi)[h * (hi - lo) * row..(h + 1) * (hi - lo) * row].to_vec();
                device.extend(cpu(
                    &kk,
                    &vv,
                    &q[h * g * dim..(h + 1) * g * dim],
                    piece,
                    g,
                    scale,
                    None,
                ));
            }
        }
        let open_kv = KvShape::new(heads, open, dim, dtype).unwrap();
        let open_dev = DeviceKv::upload(
            &gpu,
            open_kv,
            &split(&k, stored, rows),
            &split(&v, stored, rows),
        )
        .unwrap();
        pass.set_device_partials(&gpu, &device, 2).unwrap();
        pass.launch(&gpu, &open_dev.rows(&gpu), Kind::Merge)
            .unwrap();
        assert_close(
            &format!("merge {what}"),
            &pass.read(&gpu).unwrap(),
            &reference,
        );
        println!("{what}: dense, pull, gather and merge agree with the CPU ATTEND");
    }
}

#[test]
fn a_real_pool_registers_and_a_file_pool_is_refused() {
    let Some(gpu) = gpu("a_real_pool_registers_and_a_file_pool_is_refused") else {
        return;
    };
    let cfg = PoolConfig::default();
    let pool = cxlkv_test_support::TempPool::create("gpu-register", 64 << 20, &cfg);
    let reg = RegisteredMemory::pool(&gpu, pool.pool()).expect("register a shm pool");
    assert_eq!(reg.len(), pool.pool().memory().size());
    assert!(reg.device_addr(reg.len() - 1, 2).is_err());
    drop(reg);

    let dir = std::env::temp_dir().join(format!("cxlkv-gpu-file-pool-{}", std::process::id()));
    let b = Backend::File(dir.clone());
    let file_pool = Pool::create_on(&b, 16 << 20, &cfg, &RegionOptions::default()).unwrap();
    let e = RegisteredMemory::pool(&gpu, &file_pool)
        .err()
        .expect("a file pool must be refused");
    drop(file_pool);
    let _ = std::fs::remove_file(&dir);
    assert!(e.to_string().contains("page cache"), "{e}");
}
