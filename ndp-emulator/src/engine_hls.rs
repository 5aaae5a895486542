//! Compute engines of the device: the Rust kernels (`cxlkv-kernels`, the default) or the HLS
//! kernel of `fpga/` compiled as a host library (`cxlkv-ndpd --engine hls`).
//!
//! The HLS sources (`fpga/src/cxlkv_ndp_kernel.h`, `cxlkv_ndp_engine.cpp`) are compiled by this
//! crate's build script with the system C++ compiler and our HLS compatibility headers. The
//! engine library runs the kernel's own dataflow functions (key reader, G-query dot-product unit,
//! lane reducer, streaming top-k network), its bound formula and its visiting order; the device
//! keeps everything else (command checks, block resolution, pins, result encoding, block mass).
//! Both engines compute scores in the canonical summation order and rank with the same total
//! order, so a device returns identical results with either.
//!
//! All foreign calls are confined to this module.

use cxlkv_kernels::{GroupMode, Hit, KeyRows, QueryGroup, ScoreKernel};
use cxlkv_runtime::ndp::abi::cxlkv_ndp_hit;
use cxlkv_runtime::ndp::{ScanStats, TopKScan};
use std::ptr::NonNull;

/// The device's compute engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Engine {
    /// The Rust kernels of `cxlkv-kernels` (SIMD chosen at run time).
    #[default]
    Rust,
    /// The HLS kernel of `fpga/src`, compiled as a host library.
    Hls,
}

impl Engine {
    /// Both engines, the default first.
    pub const ALL: [Engine; 2] = [Engine::Rust, Engine::Hls];

    /// Short name (`rust`, `hls`).
    pub const fn name(self) -> &'static str {
        match self {
            Engine::Rust => "rust",
            Engine::Hls => "hls",
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rust" => Ok(Engine::Rust),
            "hls" => Ok(Engine::Hls),
            other => Err(format!("unknown engine {other:?} (expected rust or hls)")),
        }
    }
}

mod ffi {
    use cxlkv_runtime::ndp::abi::cxlkv_ndp_hit;

    /// Opaque scan state of the C library.
    #[repr(C)]
    pub struct Scan {
        _private: [u8; 0],
    }

    unsafe extern "C" {
        pub fn cxlkv_hls_scan_new(
            g: u32,
            k: u32,
            group_max: u32,
            queries: *const f32,
            dim: u32,
        ) -> *mut Scan;
        pub fn cxlkv_hls_scan_free(s: *mut Scan);
        pub fn cxlkv_hls_scan_block(
            s: *mut Scan,
            keys: *const u16,
            rows: u32,
            base: u32,
            dtype: u8,
        ) -> i32;
        pub fn cxlkv_hls_can_skip(s: *const Scan, ub: *const f32) -> i32;
        pub fn cxlkv_hls_scan_finish(s: *const Scan, per_list: u32, out: *mut cxlkv_ndp_hit)
            -> u32;
        pub fn cxlkv_hls_upper_bound(
            q: *const f32,
            lo: *const f32,
            hi: *const f32,
            dim: u32,
        ) -> f32;
        pub fn cxlkv_hls_visit_order(best: *const f32, n: u32, order: *mut u32);
        pub fn cxlkv_hls_copy_row(src: *const u16, words: u32, dst: *mut u16);
    }
}

/// A top-k scan run by the HLS kernel's library: the same protocol as [`TopKScan`].
pub struct HlsScan {
    raw: NonNull<ffi::Scan>,
    g: usize,
    dim: usize,
    lists: usize,
    seen: u64,
    k: usize,
    /// Counts so far.
    pub stats: ScanStats,
}

// SAFETY: the C scan state is plain memory owned by this value alone; no thread-local or shared
// state is involved, so moving it to another thread is sound.
unsafe impl Send for HlsScan {}

impl HlsScan {
    /// A scan of `queries` for the `k` best per list; `None` if the library refuses the shape
    /// (G, k or dim outside the device ABI's limits).
    pub fn new(queries: &QueryGroup<'_>, k: usize, mode: GroupMode) -> Option<HlsScan> {
        let (g, dim) = (queries.count(), queries.dim());
        let data = queries.data();
        if data.len() != g * dim {
            return None;
        }
        let group_max = u32::from(mode == GroupMode::GroupMax);
        // SAFETY: `data` holds g * dim f32 (checked above) and outlives the call, which copies
        // them; the library checks g, k and dim against its fixed capacities before using them.
        let raw = unsafe {
            ffi::cxlkv_hls_scan_new(
                u32::try_from(g).ok()?,
                u32::try_from(k).ok()?,
                group_max,
                data.as_ptr(),
                u32::try_from(dim).ok()?,
            )
        };
        Some(HlsScan {
            raw: NonNull::new(raw)?,
            g,
            dim,
            lists: if mode == GroupMode::PerQuery { g } else { 1 },
            seen: 0,
            k,
            stats: ScanStats::default(),
        })
    }

    /// True if no key of a block whose per-query bounds are `ub` can enter any list.
    pub fn can_skip(&self, ub: &[f32]) -> bool {
        assert_eq!(ub.len(), self.g, "one bound per query");
        // SAFETY: `raw` is a live scan of g queries; `ub` holds g floats (asserted) that the
        // library only reads.
        unsafe { ffi::cxlkv_hls_can_skip(self.raw.as_ptr(), ub.as_ptr()) != 0 }
    }

    /// Scores every row of `keys` (token `base + i`) and offers them to the lists.
    pub fn scan(&mut self, keys: &KeyRows<'_>, base: u32) {
        assert_eq!(keys.dim(), self.dim, "key and query dimensions differ");
        let bytes = keys.bytes();
        let rows = u32::try_from(keys.len()).expect("rows fit in u32");
        // The library reads 16-bit words; copy when the rows are not 2-byte aligned.
        let aligned: Vec<u16>;
        let words: *const u16 = if bytes.as_ptr().cast::<u16>().is_aligned() {
            bytes.as_ptr().cast()
        } else {
            aligned = bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            aligned.as_ptr()
        };
        // SAFETY: `words` points at `bytes.len() / 2` readable, 2-byte aligned u16 (the key rows
        // or their aligned copy, both alive until the call returns): rows * dim elements of
        // `dtype` are rows * dim * size / 2 words, which is exactly what the library reads.
        // `raw` is a live scan whose dimension equals `keys.dim()` (asserted). Little-endian host:
        // the words read are the stored little-endian elements.
        let rc = unsafe {
            ffi::cxlkv_hls_scan_block(self.raw.as_ptr(), words, rows, base, keys.dtype() as u8)
        };
        assert_eq!(rc, 0, "the HLS engine refused a key dtype");
        self.seen += u64::from(rows);
        self.stats.blocks_scanned += 1;
        self.stats.bytes_scanned += bytes.len() as u64;
    }

    /// The lists, best first.
    pub fn finish(self) -> (Vec<Vec<Hit>>, ScanStats) {
        let per_list = self.k.min(self.seen as usize);
        if per_list == 0 {
            return (vec![Vec::new(); self.lists], self.stats);
        }
        let mut out = vec![cxlkv_ndp_hit::default(); self.lists * per_list];
        // SAFETY: `out` holds lists * per_list hits, the most the library writes for this
        // per_list; `raw` is live.
        let lists = unsafe {
            ffi::cxlkv_hls_scan_finish(self.raw.as_ptr(), per_list as u32, out.as_mut_ptr())
        } as usize;
        assert_eq!(lists, self.lists);
        let hits = out
            .chunks(per_list)
            .take(lists)
            .map(|c| {
                c.iter()
                    .take(per_list)
                    .map(|h| Hit {
                        index: h.token,
                        score: h.score,
                    })
                    .collect()
            })
            .collect();
        (hits, self.stats)
    }
}

impl Drop for HlsScan {
    fn drop(&mut self) {
        // SAFETY: `raw` came from cxlkv_hls_scan_new and is freed exactly once, here.
        unsafe { ffi::cxlkv_hls_scan_free(self.raw.as_ptr()) }
    }
}

/// The HLS kernel's block bound (kernels/src/bounds.rs' formula, computed by the C++ code).
pub fn hls_upper_bound(q: &[f32], lo: &[f32], hi: &[f32]) -> f32 {
    assert!(q.len() == lo.len() && q.len() == hi.len());
    // SAFETY: the three slices hold `dim` floats each (asserted), only read.
    unsafe { ffi::cxlkv_hls_upper_bound(q.as_ptr(), lo.as_ptr(), hi.as_ptr(), q.len() as u32) }
}

/// A scan run by the chosen engine.
pub enum EngineScan {
    /// The Rust kernels.
    Rust(TopKScan),
    /// The HLS kernel's library.
    Hls(HlsScan),
}

impl EngineScan {
    /// A scan of `queries` for the `k` best per list with `engine` (`kernel` for the Rust one);
    /// `None` if the engine refuses the shape.
    pub fn new(
        engine: Engine,
        kernel: ScoreKernel,
        queries: &QueryGroup<'_>,
        k: usize,
        mode: GroupMode,
    ) -> Option<EngineScan> {
        match engine {
            Engine::Rust => Some(EngineScan::Rust(TopKScan::new(
                kernel,
                queries.count(),
                k,
                mode,
            ))),
            Engine::Hls => HlsScan::new(queries, k, mode).map(EngineScan::Hls),
        }
    }

    /// Per-query upper bounds of each block and the visiting order, computed by the engine (see
    /// [`TopKScan::visit_order`]).
    pub fn visit_order(
        &self,
        queries: &QueryGroup<'_>,
        bounds: &[(Vec<f32>, Vec<f32>)],
    ) -> (Vec<f32>, Vec<usize>) {
        match self {
            EngineScan::Rust(_) => TopKScan::visit_order(queries, bounds),
            EngineScan::Hls(_) => {
                let g = queries.count();
                let mut ub = vec![0f32; bounds.len() * g];
                let mut best = vec![f32::NEG_INFINITY; bounds.len()];
                for (b, (lo, hi)) in bounds.iter().enumerate() {
                    for q in 0..g {
                        let u = hls_upper_bound(queries.query(q), lo, hi);
                        ub[b * g + q] = u;
                        best[b] = best[b].max(u);
                    }
                }
                let mut order = vec![0u32; bounds.len()];
                // SAFETY: `best` and `order` both hold bounds.len() elements; the library reads
                // the first and writes the second, nothing more.
                unsafe {
                    ffi::cxlkv_hls_visit_order(best.as_ptr(), best.len() as u32, order.as_mut_ptr())
                };
                (ub, order.into_iter().map(|b| b as usize).collect())
            }
        }
    }

    /// True if no key of a block with per-query bounds `ub` can enter any list.
    pub fn can_skip(&mut self, ub: &[f32]) -> bool {
        match self {
            EngineScan::Rust(s) => s.can_skip(ub),
            EngineScan::Hls(s) => s.can_skip(ub),
        }
    }

    /// Records a skipped block.
    pub fn skipped(&mut self) {
        match self {
            EngineScan::Rust(s) => s.skipped(),
            EngineScan::Hls(s) => s.stats.blocks_pruned += 1,
        }
    }

    /// Scores every row of `keys` (token `base + i`) and offers them to the lists.
    pub fn scan(&mut self, queries: &QueryGroup<'_>, keys: &KeyRows<'_>, base: u32) {
        match self {
            EngineScan::Rust(s) => s.scan(queries, keys, base),
            EngineScan::Hls(s) => s.scan(keys, base),
        }
    }

    /// Counts so far.
    pub fn stats(&self) -> &ScanStats {
        match self {
            EngineScan::Rust(s) => &s.stats,
            EngineScan::Hls(s) => &s.stats,
        }
    }

    /// The lists, best first, and the counts.
    pub fn finish(self) -> (Vec<Vec<Hit>>, ScanStats) {
        match self {
            EngineScan::Rust(s) => s.finish(),
            EngineScan::Hls(s) => s.finish(),
        }
    }
}

/// Copies one value row (`src`, an even number of bytes) into `dst` with the engine's GATHER
/// row mover.
pub fn copy_row(engine: Engine, src: &[u8], dst: &mut [u8]) {
    assert_eq!(src.len(), dst.len(), "row lengths differ");
    match engine {
        Engine::Rust => dst.copy_from_slice(src),
        Engine::Hls => {
            assert_eq!(src.len() % 2, 0, "rows are whole 16-bit words");
            if !src.as_ptr().cast::<u16>().is_aligned() || !dst.as_ptr().cast::<u16>().is_aligned()
            {
                // The library moves aligned 16-bit words; go through aligned buffers.
                let s: Vec<u16> = src
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                let mut d = vec![0u16; s.len()];
                // SAFETY: both buffers hold s.len() aligned u16; the library reads one and
                // writes the other.
                unsafe { ffi::cxlkv_hls_copy_row(s.as_ptr(), s.len() as u32, d.as_mut_ptr()) };
                for (o, w) in dst.chunks_exact_mut(2).zip(d) {
                    o.copy_from_slice(&w.to_le_bytes());
                }
            } else {
                // SAFETY: src and dst are 2-byte aligned (checked), hold len / 2 u16 each, and do
                // not overlap (a shared and a unique borrow).
                unsafe {
                    ffi::cxlkv_hls_copy_row(
                        src.as_ptr().cast(),
                        (src.len() / 2) as u32,
                        dst.as_mut_ptr().cast(),
                    )
                };
            }
        }
    }
}
