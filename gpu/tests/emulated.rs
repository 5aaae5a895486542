//! The CUDA kernels run on the host: gpu/kernels/attention.cu compiled by g++ under
//! gpu/emu/cuda_shim.h (each block's threads as OS threads, warp shuffles and `__syncthreads` as
//! barriers), checked against the CPU ATTEND within the GPU tests' tolerance
//! ([`common::assert_close`]). This tests the kernels' indexing, vector loads, online softmax,
//! block and chunk merges and the device-partial merge on machines without a GPU; the GPU tests
//! (device.rs) test the same on a device, with its memory model and `exp`.
//!
//! Needs a C++20 compiler (`$CXX`, default g++; the test command's HLS C-simulation needs one too).

mod common;

use common::{assert_close, cpu, workload};
use cxlkv_gpu::KvShape;
use cxlkv_kernels::{DType, Partial};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The emulator binary, built once per test run.
fn emulator() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("emu/run.cpp");
        let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cxlkv-gpu-emu");
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
        let out = Command::new(&cxx)
            .args([
                "-std=c++20",
                "-O2",
                "-pthread",
                "-fno-strict-aliasing",
                "-Wall",
                "-Wextra",
            ])
            .args(["-Wno-unknown-pragmas", "-Werror", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("run {cxx} (a C++20 compiler; set CXX): {e}"));
        assert!(
            out.status.success(),
            "{cxx} failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
}

/// What the emulator computes.
#[derive(Clone, Copy)]
enum Run<'a> {
    Full,
    Gather(&'a [u32]),
    Merge(&'a [Partial], usize),
}

/// One pass on the emulator: `chunks` blocks per head, then the merge.
#[allow(clippy::too_many_arguments)]
fn emulate(
    tag: &str,
    s: KvShape,
    g: usize,
    chunks: u32,
    scale: f32,
    k: &[u8],
    v: &[u8],
    q: &[f32],
    run: Run<'_>,
) -> Vec<Partial> {
    let (kind, sel, parts, count_b): (u32, &[u32], &[Partial], usize) = match run {
        Run::Full => (0, &[], &[], 0),
        Run::Gather(sel) => (1, sel, &[], 0),
        Run::Merge(p, c) => (2, &[], p, c),
    };
    let dtype = match s.dtype {
        DType::F16 => 0u32,
        DType::F32 => 1,
        t => panic!("{t:?}"),
    };
    let n_sel = (sel.len() / s.heads) as u32;
    let mut input = Vec::new();
    for x in [
        kind,
        dtype,
        s.heads as u32,
        s.rows as u32,
        s.dim as u32,
        g as u32,
        chunks,
        n_sel,
        count_b as u32,
    ] {
        input.extend(x.to_le_bytes());
    }
    input.extend(scale.to_le_bytes());
    input.extend(k);
    input.extend(v);
    input.extend(q.iter().flat_map(|x| x.to_le_bytes()));
    input.extend(sel.iter().flat_map(|x| x.to_le_bytes()));
    for p in parts {
        input.extend(
            p.out
                .iter()
                .chain([&p.max, &p.sum])
                .flat_map(|x| x.to_le_bytes()),
        );
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (inp, outp) = (
        dir.join(format!("emu-{tag}.in")),
        dir.join(format!("emu-{tag}.out")),
    );
    std::fs::write(&inp, &input).unwrap();
    let st = Command::new(emulator())
        .arg(&inp)
        .arg(&outp)
        .status()
        .unwrap();
    assert!(st.success(), "{tag}: the emulator failed");
    let bytes = std::fs::read(&outp).unwrap();
    let _ = (std::fs::remove_file(&inp), std::fs::remove_file(&outp));
    let f: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(f.len(), s.heads * g * (s.dim + 2), "{tag}: output size");
    f.chunks_exact(s.dim + 2)
        .map(|c| Partial {
            out: c[..s.dim].to_vec(),
            max: c[s.dim],
            sum: c[s.dim + 1],
        })
        .collect()
}

#[test]
fn the_kernels_agree_with_the_cpu_attend_on_the_host() {
    for (dtype, dim, g, rows, chunks) in [
        (DType::F16, 128, 4, 700, 3),
        (DType::F16, 64, 3, 333, 4),
        (DType::F32, 128, 1, 300, 2),
        (DType::F32, 64, 8, 200, 1),
        (DType::F16, 96, 2, 129, 5), // 3 elements per lane: the scalar loads
    ] {
        let heads = 2;
        let s = KvShape::new(heads, rows, dim, dtype).unwrap();
        let (k, v, q) = workload(heads, rows, dim, g, dtype, rows as u64 + 7);
        let scale = 1.0 / (dim as f32).sqrt();
        let what = format!("{} d={dim} G={g} rows={rows} chunks={chunks}", dtype.name());
        let tag = format!("{}-{dim}-{g}", dtype.name());
        let reference = cpu(&k, &v, &q, s, g, scale, None);
        let full = emulate(&tag, s, g, chunks, scale, &k, &v, &q, Run::Full);
        assert_close(&format!("full {what}"), &full, &reference);

        let n = rows / 3;
        let sel: Vec<u32> = (0..n as u32)
            .map(|i| (i * 7 + 1) % rows as u32)
            .chain((0..n as u32).map(|i| i * 2))
            .collect();
        let got = emulate(&tag, s, g, chunks, scale, &k, &v, &q, Run::Gather(&sel));
        assert_close(
            &format!("gather {what}"),
            &got,
            &cpu(&k, &v, &q, s, g, scale, Some(&sel)),
        );

        // merge: the device's partials over rows [0, stored) in two pieces, the open block on the
        // "GPU".
        let open = rows / 5;
        let stored = rows - open;
        let row = dtype.bytes(dim);
        let rows_of = |b: &[u8], h: usize, lo: usize, hi: usize| {
            b[(h * rows + lo) * row..(h * rows + hi) * row].to_vec()
        };
        let mut device = Vec::new();
        for h in 0..heads {
            for (lo, hi) in [(0, stored / 2), (stored / 2, stored)] {
                let piece = KvShape::new(1, hi - lo, dim, dtype).unwrap();
                device.extend(cpu(
                    &rows_of(&k, h, lo, hi),
                    &rows_of(&v, h, lo, hi),
                    &q[h * g * dim..(h + 1) * g * dim],
                    piece,
                    g,
                    scale,
                    None,
                ));
            }
        }
        let tail = |b: &[u8]| -> Vec<u8> {
            (0..heads)
                .flat_map(|h| rows_of(b, h, stored, rows))
                .collect()
        };
        let open_shape = KvShape::new(heads, open, dim, dtype).unwrap();
        let merged = emulate(
            &tag,
            open_shape,
            g,
            chunks,
            scale,
            &tail(&k),
            &tail(&v),
            &q,
            Run::Merge(&device, 2),
        );
        assert_close(&format!("merge {what}"), &merged, &reference);
    }
}

#[test]
fn empty_chunks_and_a_single_row_merge_to_the_right_partial() {
    // More chunks than rows: most blocks see no row and write the empty partial (sum 0), which
    // the merge must skip.
    let (dtype, dim, g, rows) = (DType::F32, 64, 2, 3);
    let s = KvShape::new(1, rows, dim, dtype).unwrap();
    let (k, v, q) = workload(1, rows, dim, g, dtype, 99);
    let got = emulate("empty", s, g, 8, 0.125, &k, &v, &q, Run::Full);
    assert_close(
        "3 rows in 8 chunks",
        &got,
        &cpu(&k, &v, &q, s, g, 0.125, None),
    );
    let s1 = KvShape::new(1, 1, dim, dtype).unwrap();
    let got = emulate(
        "one",
        s1,
        g,
        1,
        0.125,
        &k[..dim * 4],
        &v[..dim * 4],
        &q,
        Run::Full,
    );
    for (p, j) in got.iter().zip(0..) {
        assert_eq!(p.sum, 1.0, "query {j}: one row has weight exp(0) = 1");
        let want: Vec<f32> = v[..dim * 4]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(p.out, want, "query {j}: the output is the row itself");
    }
}
