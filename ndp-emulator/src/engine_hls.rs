//! Compute engines of the device: the Rust kernels (`cxlkv-kernels`, the default) or the HLS
//! kernel of `fpga/` compiled as a host library (`cxlkv-ndpd --engine hls`).
//!
//! The HLS sources (`fpga/src/cxlkv_ndp_kernel.h`, `cxlkv_ndp_attend.h`, `cxlkv_ndp_select.h`,
//! `cxlkv_ndp_engine.cpp`) are compiled by this crate's build script with the system C++ compiler
//! and our HLS compatibility headers. The engine library runs the kernel's own dataflow functions
//! (key reader, G-query dot-product unit, lane reducer, streaming top-k network) behind
//! [`HlsScorer`], a [`BlockScorer`]; its selection unit behind [`HlsSelect`] (SCORE_TOPK with
//! `FLAG_SELECT`) and its ATTEND unit behind [`HlsAttend`]; which blocks
//! are read, in which order, and which are skipped is decided by the kernels' block-wise scan
//! ([`cxlkv_kernels::PrunedScan`]) for both engines. The device keeps everything else (command
//! checks, block resolution, pins, result encoding, block mass). Both engines compute scores in
//! the canonical summation order and rank with the same total order, so a device returns
//! identical results with either.
//!
//! All foreign calls are confined to this module.

use cxlkv_kernels::{BlockScorer, GroupMode, Hit, KeyRows, Partial, QueryGroup, TopK};
use cxlkv_runtime::ndp::abi::{
    cxlkv_ndp_hit, cxlkv_ndp_list_info, CXLKV_NDP_ERR_ARGS, CXLKV_NDP_ERR_INTERNAL,
};
use cxlkv_runtime::ndp::select::{Select, Selected, Selection, SEL_TOO_MANY_FORCED};
use cxlkv_runtime::ndp::DeviceStatus;
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
    use cxlkv_runtime::ndp::abi::{cxlkv_ndp_hit, cxlkv_ndp_list_info, cxlkv_ndp_select};

    /// Opaque scan state of the C library.
    #[repr(C)]
    pub(super) struct Scan {
        _private: [u8; 0],
    }

    unsafe extern "C" {
        pub(super) fn cxlkv_hls_scan_new(
            g: u32,
            k: u32,
            group_max: u32,
            queries: *const f32,
            dim: u32,
        ) -> *mut Scan;
        pub(super) fn cxlkv_hls_scan_free(s: *mut Scan);
        pub(super) fn cxlkv_hls_scan_block(
            s: *mut Scan,
            keys: *const u16,
            rows: u32,
            base: u32,
            dtype: u8,
        ) -> i32;
        pub(super) fn cxlkv_hls_kth(s: *const Scan, list: u32, score: *mut f32) -> i32;
        pub(super) fn cxlkv_hls_scan_finish(
            s: *const Scan,
            per_list: u32,
            out: *mut cxlkv_ndp_hit,
        ) -> u32;
        pub(super) fn cxlkv_hls_copy_row(src: *const u16, words: u32, dst: *mut u16);
        pub(super) fn cxlkv_hls_attend_new(
            g: u32,
            queries: *const f32,
            dim: u32,
            scale: f32,
        ) -> *mut Attend;
        pub(super) fn cxlkv_hls_attend_free(s: *mut Attend);
        pub(super) fn cxlkv_hls_attend_block(
            s: *mut Attend,
            keys: *const u16,
            values: *const u16,
            rows: u32,
            dtype: u8,
        ) -> i32;
        pub(super) fn cxlkv_hls_attend_finish(
            s: *const Attend,
            out: *mut f32,
            max: *mut f32,
            sum: *mut f32,
        );
    }

    // SAFETY: these declarations match fpga/src/cxlkv_ndp_engine.h (ABI 1.2, quantized blocks:
    // the pointer and integer types of its prototypes); each call site states what it passes.
    unsafe extern "C" {
        pub(super) fn cxlkv_hls_scan_block_q(
            s: *mut Scan,
            keys: *const u16,
            rows: u32,
            base: u32,
            dtype: u8,
            ks: *const f32,
        ) -> i32;
        pub(super) fn cxlkv_hls_sel_block_q(
            s: *mut Sel,
            keys: *const u16,
            rows: u32,
            base: u32,
            dtype: u8,
            ks: *const f32,
        ) -> i32;
        pub(super) fn cxlkv_hls_attend_block_q(
            s: *mut Attend,
            keys: *const u16,
            values: *const u16,
            rows: u32,
            dtype: u8,
            ks: *const f32,
            vs: *const f32,
        ) -> i32;
        pub(super) fn cxlkv_hls_dequant_row(
            src: *const u16,
            dim: u32,
            dtype: u8,
            scale: f32,
            dst: *mut f32,
        ) -> i32;
    }

    /// Opaque selection state of the C library.
    #[repr(C)]
    pub(super) struct Sel {
        _private: [u8; 0],
    }

    unsafe extern "C" {
        pub(super) fn cxlkv_hls_sel_new(
            g: u32,
            k: u32,
            group_max: u32,
            queries: *const f32,
            dim: u32,
            sel: *const cxlkv_ndp_select,
        ) -> *mut Sel;
        pub(super) fn cxlkv_hls_sel_free(s: *mut Sel);
        pub(super) fn cxlkv_hls_sel_block(
            s: *mut Sel,
            keys: *const u16,
            rows: u32,
            base: u32,
            dtype: u8,
        ) -> i32;
        pub(super) fn cxlkv_hls_sel_finish(
            s: *mut Sel,
            hits: *mut cxlkv_ndp_hit,
            info: *mut cxlkv_ndp_list_info,
        ) -> i32;
    }

    /// Opaque ATTEND state of the C library.
    #[repr(C)]
    pub(super) struct Attend {
        _private: [u8; 0],
    }

    /// Opaque sparse ATTEND state of the C library.
    #[repr(C)]
    pub(super) struct Sparse {
        _private: [u8; 0],
    }

    // SAFETY: these declarations match fpga/src/cxlkv_ndp_engine.h (C ABI, the pointer and
    // integer types of its prototypes); each call site states what it passes.
    unsafe extern "C" {
        pub(super) fn cxlkv_hls_sparse_new(
            g: u32,
            k: u32,
            queries: *const f32,
            dim: u32,
            scale: f32,
            sel: *const cxlkv_ndp_select,
        ) -> *mut Sparse;
        pub(super) fn cxlkv_hls_sparse_free(s: *mut Sparse);
        pub(super) fn cxlkv_hls_sparse_block(
            s: *mut Sparse,
            keys: *const u16,
            rows: u32,
            base: u32,
            dtype: u8,
        ) -> i32;
        pub(super) fn cxlkv_hls_sparse_union(s: *mut Sparse, tokens: *mut u32) -> i32;
        pub(super) fn cxlkv_hls_sparse_rows(
            s: *mut Sparse,
            keys: *const u16,
            values: *const u16,
            rows: u32,
            dtype: u8,
        ) -> i32;
        pub(super) fn cxlkv_hls_sparse_finish(
            s: *const Sparse,
            out: *mut f32,
            max: *mut f32,
            sum: *mut f32,
            info: *mut cxlkv_ndp_list_info,
        );
    }
}

/// The HLS kernel's library as a [`BlockScorer`]: its dot-product unit scores the blocks, its
/// top-k network keeps the lists.
pub struct HlsScorer {
    raw: NonNull<ffi::Scan>,
    dim: usize,
    mode: GroupMode,
    lists: usize,
    /// Keys offered so far (a list holds at most this many hits).
    seen: u64,
    k: usize,
}

// SAFETY: the C scan state is plain memory owned by this value alone; no thread-local or shared
// state is involved, so moving it to another thread is sound.
unsafe impl Send for HlsScorer {}

impl HlsScorer {
    /// Lists of the `topk.k` best keys for `queries`; `None` if the library refuses the shape
    /// (G, k or dim outside the device ABI's limits).
    pub fn new(queries: &QueryGroup<'_>, topk: TopK) -> Option<HlsScorer> {
        let (g, dim) = (queries.count(), queries.dim());
        let data = queries.data();
        if data.len() != g * dim {
            return None;
        }
        let group_max = u32::from(topk.mode == GroupMode::GroupMax);
        // SAFETY: `data` holds g * dim f32 (checked above) and outlives the call, which copies
        // them; the library checks g, k and dim against its fixed capacities before using them.
        let raw = unsafe {
            ffi::cxlkv_hls_scan_new(
                u32::try_from(g).ok()?,
                u32::try_from(topk.k).ok()?,
                group_max,
                data.as_ptr(),
                u32::try_from(dim).ok()?,
            )
        };
        Some(HlsScorer {
            raw: NonNull::new(raw)?,
            dim,
            mode: topk.mode,
            lists: topk.lists(g),
            seen: 0,
            k: topk.k,
        })
    }
}

impl HlsScorer {
    /// Scores the key codes of a quantized block (tokens `base..`) with the queries folded by
    /// its key scales `ks` (`dim` f32), as the Rust engine's folded scan does.
    pub fn score_block_q(&mut self, keys: &KeyRows<'_>, base: u32, ks: &[f32]) {
        assert_eq!(keys.dim(), self.dim, "key and query dimensions differ");
        assert_eq!(ks.len(), self.dim, "one key scale per channel");
        let rows = u32::try_from(keys.len()).expect("rows fit in u32");
        let words = Words::of(keys);
        // SAFETY: as in `score_block`: `words` holds the rows as aligned u16 words, readable
        // during the call; `ks` holds `dim` f32; `raw` is live with dimension `self.dim`.
        let rc = unsafe {
            ffi::cxlkv_hls_scan_block_q(
                self.raw.as_ptr(),
                words.ptr(),
                rows,
                base,
                keys.dtype() as u8,
                ks.as_ptr(),
            )
        };
        assert_eq!(rc, 0, "the HLS engine refused a quantized dtype");
        self.seen += u64::from(rows);
    }
}

impl BlockScorer for HlsScorer {
    fn mode(&self) -> GroupMode {
        self.mode
    }

    fn kth_score(&mut self, list: usize) -> Option<f32> {
        assert!(list < self.lists, "list {list} of {}", self.lists);
        let mut score = 0f32;
        // SAFETY: `raw` is a live scan with more than `list` lists (asserted); the library writes
        // one f32 through `score`, a local, only when it returns 1.
        let full = unsafe { ffi::cxlkv_hls_kth(self.raw.as_ptr(), list as u32, &mut score) };
        (full == 1).then_some(score)
    }

    fn score_block(&mut self, keys: &KeyRows<'_>, base: u32) {
        assert_eq!(keys.dim(), self.dim, "key and query dimensions differ");
        let rows = u32::try_from(keys.len()).expect("rows fit in u32");
        let aligned = Words::of(keys);
        let words = aligned.ptr();
        // SAFETY: `words` points at `keys.byte_len() / 2` readable, 2-byte aligned u16: the view's
        // rows (readable for the view's life, which spans this call, by its invariant) or their
        // aligned copy (`Words`). rows * dim elements of `dtype` are rows * dim * size / 2 words, exactly
        // what the library reads. `raw` is a live scan whose dimension equals `keys.dim()`
        // (asserted). Little-endian host: the words read are the stored little-endian elements.
        let rc = unsafe {
            ffi::cxlkv_hls_scan_block(self.raw.as_ptr(), words, rows, base, keys.dtype() as u8)
        };
        assert_eq!(rc, 0, "the HLS engine refused a key dtype");
        self.seen += u64::from(rows);
    }

    fn into_lists(self) -> Vec<Vec<Hit>> {
        let per_list = self.k.min(self.seen as usize);
        if per_list == 0 {
            return vec![Vec::new(); self.lists];
        }
        let mut out = vec![cxlkv_ndp_hit::default(); self.lists * per_list];
        // SAFETY: `out` holds lists * per_list hits, the most the library writes for this
        // per_list; `raw` is live.
        let lists = unsafe {
            ffi::cxlkv_hls_scan_finish(self.raw.as_ptr(), per_list as u32, out.as_mut_ptr())
        } as usize;
        assert_eq!(lists, self.lists);
        out.chunks(per_list)
            .map(|c| {
                c.iter()
                    .map(|h| Hit {
                        index: h.token,
                        score: h.score,
                    })
                    .collect()
            })
            .collect()
    }
}

impl Drop for HlsScorer {
    fn drop(&mut self) {
        // SAFETY: `raw` came from cxlkv_hls_scan_new and is freed exactly once, here.
        unsafe { ffi::cxlkv_hls_scan_free(self.raw.as_ptr()) }
    }
}

/// The 16-bit words of a view's rows as the library reads them: the rows in place when they are
/// 2-byte aligned, else an aligned copy.
struct Words<'a> {
    rows: &'a KeyRows<'a>,
    copy: Option<Vec<u16>>,
}

impl<'a> Words<'a> {
    fn of(rows: &'a KeyRows<'a>) -> Words<'a> {
        let copy = (!rows.as_ptr().cast::<u16>().is_aligned()).then(|| {
            rows.to_vec()
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect()
        });
        Words { rows, copy }
    }

    /// `rows.byte_len() / 2` readable, aligned u16, valid while `self` lives.
    fn ptr(&self) -> *const u16 {
        match &self.copy {
            Some(v) => v.as_ptr(),
            None => self.rows.as_ptr().cast(),
        }
    }
}

/// The HLS kernel's ATTEND unit: the partials of a GQA group over blocks of keys and values, each
/// block one tile (key pass, weights, value accumulation), merged in the order given.
pub struct HlsAttend {
    raw: NonNull<ffi::Attend>,
    g: usize,
    dim: usize,
}

// SAFETY: the C state is plain memory owned by this value alone (as for `HlsScorer`).
unsafe impl Send for HlsAttend {}

impl HlsAttend {
    /// The partials of `queries`, scores scaled by `scale` before exp; `None` if the library
    /// refuses the shape (G or dim outside the device ABI's limits).
    pub fn new(queries: &QueryGroup<'_>, scale: f32) -> Option<HlsAttend> {
        let (g, dim) = (queries.count(), queries.dim());
        let data = queries.data();
        if data.len() != g * dim {
            return None;
        }
        // SAFETY: `data` holds g * dim f32 (checked) and outlives the call, which copies them;
        // the library checks g and dim against its capacities first.
        let raw = unsafe {
            ffi::cxlkv_hls_attend_new(
                u32::try_from(g).ok()?,
                data.as_ptr(),
                u32::try_from(dim).ok()?,
                scale,
            )
        };
        Some(HlsAttend {
            raw: NonNull::new(raw)?,
            g,
            dim,
        })
    }

    /// Folds one block (its keys and values, the same rows) into the partials.
    pub fn block(&mut self, keys: &KeyRows<'_>, values: &KeyRows<'_>) {
        assert_eq!(keys.dim(), self.dim, "key and query dimensions differ");
        assert_eq!(values.dim(), self.dim, "value and query dimensions differ");
        assert_eq!(
            keys.len(),
            values.len(),
            "keys and values have different rows"
        );
        assert_eq!(
            keys.dtype(),
            values.dtype(),
            "keys and values have different dtypes"
        );
        let rows = u32::try_from(keys.len()).expect("rows fit in u32");
        let (k, v) = (Words::of(keys), Words::of(values));
        // SAFETY: `k` and `v` point at rows * dim elements of the dtype as aligned u16 words,
        // readable during the call (the views' invariant, or the copies `k` and `v` hold), exactly
        // what the library reads; `raw` is live with dimension `self.dim` (asserted equal).
        let rc = unsafe {
            ffi::cxlkv_hls_attend_block(
                self.raw.as_ptr(),
                k.ptr(),
                v.ptr(),
                rows,
                keys.dtype() as u8,
            )
        };
        assert_eq!(rc, 0, "the HLS engine refused a block");
    }

    /// Folds one quantized block: key codes scored with the queries folded by `ks` (`dim`),
    /// value rows weighted by their token scales `vs` (one per row).
    pub fn block_q(&mut self, keys: &KeyRows<'_>, values: &KeyRows<'_>, ks: &[f32], vs: &[f32]) {
        assert_eq!(keys.dim(), self.dim, "key and query dimensions differ");
        assert_eq!((values.dim(), values.len()), (self.dim, keys.len()));
        assert_eq!((ks.len(), vs.len()), (self.dim, keys.len()), "scales");
        let rows = u32::try_from(keys.len()).expect("rows fit in u32");
        let (k, v) = (Words::of(keys), Words::of(values));
        // SAFETY: as in `block`, plus `ks` and `vs` hold `dim` and `rows` f32, readable during
        // the call.
        let rc = unsafe {
            ffi::cxlkv_hls_attend_block_q(
                self.raw.as_ptr(),
                k.ptr(),
                v.ptr(),
                rows,
                keys.dtype() as u8,
                ks.as_ptr(),
                vs.as_ptr(),
            )
        };
        assert_eq!(rc, 0, "the HLS engine refused a quantized block");
    }

    /// The partials, one per query.
    pub fn finish(self) -> Vec<Partial> {
        let (g, dim) = (self.g, self.dim);
        let mut out = vec![0f32; g * dim];
        let (mut max, mut sum) = (vec![0f32; g], vec![0f32; g]);
        // SAFETY: the buffers hold g * dim, g and g f32, what the library writes for this state's
        // g and dim; `raw` is live.
        unsafe {
            ffi::cxlkv_hls_attend_finish(
                self.raw.as_ptr(),
                out.as_mut_ptr(),
                max.as_mut_ptr(),
                sum.as_mut_ptr(),
            )
        };
        partials(&out, &max, &sum, dim)
    }
}

/// Partials from the library's outputs: `out [g][dim]`, `max [g]`, `sum [g]`.
fn partials(out: &[f32], max: &[f32], sum: &[f32], dim: usize) -> Vec<Partial> {
    out.chunks_exact(dim)
        .zip(max.iter().zip(sum))
        .map(|(o, (&max, &sum))| Partial {
            out: o.to_vec(),
            max,
            sum,
        })
        .collect()
}

impl Drop for HlsAttend {
    fn drop(&mut self) {
        // SAFETY: `raw` came from cxlkv_hls_attend_new and is freed exactly once, here.
        unsafe { ffi::cxlkv_hls_attend_free(self.raw.as_ptr()) }
    }
}

/// The HLS kernel's selecting SCORE_TOPK (sinks, window, exclusion, top-p with `k_max`, the
/// left-out mass): its dot unit scores each block, its selection unit keeps the lists and the
/// running log-sum-exp, its finish pass cuts and sorts them. The answer equals the reference
/// [`Selection`]'s over the same blocks in the same order.
pub struct HlsSelect {
    raw: NonNull<ffi::Sel>,
    dim: usize,
    lists: usize,
    k: usize,
}

// SAFETY: the C state is plain memory owned by this value alone (as for `HlsScorer`).
unsafe impl Send for HlsSelect {}

impl HlsSelect {
    /// A selection of `k` hits per list (one list with `group_max`) for `queries` over blocks
    /// covering `ranges` (`[base, base + tokens)`, the order they will be fed in). A selection the
    /// reference refuses is refused with the same status (the control path's checks);
    /// `CXLKV_NDP_ERR_INTERNAL` if the library refuses the shape.
    pub fn new(
        queries: &QueryGroup<'_>,
        k: usize,
        group_max: bool,
        sel: &Select,
        scale: f32,
        ranges: &[(u64, u64)],
    ) -> Result<HlsSelect, DeviceStatus> {
        let (g, dim) = (queries.count(), queries.dim());
        let lists = if group_max { 1 } else { g };
        // The control path's checks: p, the ranges, the window inside the stored tokens, the
        // forced count against k.
        Selection::new(*sel, k, scale, lists, ranges)?;
        let internal = DeviceStatus::at(CXLKV_NDP_ERR_INTERNAL, 0);
        let data = queries.data();
        if data.len() != g * dim {
            return Err(internal);
        }
        let c = sel.to_abi(scale);
        let small = |x: usize| u32::try_from(x).map_err(|_| internal);
        // SAFETY: `data` holds g * dim f32 (checked) and `c` is a live struct of the C layout;
        // both outlive the call, which copies them. The library checks g, k and dim first.
        let raw = unsafe {
            ffi::cxlkv_hls_sel_new(
                small(g)?,
                small(k)?,
                u32::from(group_max),
                data.as_ptr(),
                small(dim)?,
                &c,
            )
        };
        Ok(HlsSelect {
            raw: NonNull::new(raw).ok_or(internal)?,
            dim,
            lists,
            k,
        })
    }

    /// Scores one block's keys as tokens `base..` and offers them to the lists.
    pub fn block(&mut self, keys: &KeyRows<'_>, base: u32) {
        assert_eq!(keys.dim(), self.dim, "key and query dimensions differ");
        let rows = u32::try_from(keys.len()).expect("rows fit in u32");
        let words = Words::of(keys);
        // SAFETY: as in `HlsScorer::score_block`: `words` holds the rows as aligned u16 words,
        // readable during the call; `raw` is live with dimension `self.dim` (asserted).
        let rc = unsafe {
            ffi::cxlkv_hls_sel_block(
                self.raw.as_ptr(),
                words.ptr(),
                rows,
                base,
                keys.dtype() as u8,
            )
        };
        assert_eq!(rc, 0, "the HLS engine refused a key dtype");
    }

    /// [`HlsSelect::block`] for a quantized block: the queries folded by its key scales `ks`.
    pub fn block_q(&mut self, keys: &KeyRows<'_>, base: u32, ks: &[f32]) {
        assert_eq!(keys.dim(), self.dim, "key and query dimensions differ");
        assert_eq!(ks.len(), self.dim, "one key scale per channel");
        let rows = u32::try_from(keys.len()).expect("rows fit in u32");
        let words = Words::of(keys);
        // SAFETY: as in `block`, plus `ks` holds `dim` f32 readable during the call.
        let rc = unsafe {
            ffi::cxlkv_hls_sel_block_q(
                self.raw.as_ptr(),
                words.ptr(),
                rows,
                base,
                keys.dtype() as u8,
                ks.as_ptr(),
            )
        };
        assert_eq!(rc, 0, "the HLS engine refused a quantized dtype");
    }

    /// The lists, best first, and the mass each leaves out.
    pub fn finish(self) -> Result<Selected, DeviceStatus> {
        let mut hits = vec![cxlkv_ndp_hit::default(); self.lists * self.k];
        let mut res = vec![cxlkv_ndp_list_info::default(); self.lists];
        // SAFETY: `hits` holds lists * k hits and `res` lists results, what the library writes
        // for this state; `raw` is live.
        let rc = unsafe {
            ffi::cxlkv_hls_sel_finish(self.raw.as_ptr(), hits.as_mut_ptr(), res.as_mut_ptr())
        };
        if rc < 0 {
            return Err(DeviceStatus::at(CXLKV_NDP_ERR_ARGS, SEL_TOO_MANY_FORCED));
        }
        assert_eq!(rc as usize, self.lists);
        let lists = hits
            .chunks(self.k)
            .zip(&res)
            .map(|(c, r)| {
                c[..r.count as usize]
                    .iter()
                    .map(|h| Hit {
                        index: h.token,
                        score: h.score,
                    })
                    .collect()
            })
            .collect();
        Ok(Selected {
            lists,
            left_out: res.iter().map(|r| r.left_out_mass).collect(),
            log_sum_exp: Vec::new(),
        })
    }
}

impl Drop for HlsSelect {
    fn drop(&mut self) {
        // SAFETY: `raw` came from cxlkv_hls_sel_new and is freed exactly once, here.
        unsafe { ffi::cxlkv_hls_sel_free(self.raw.as_ptr()) }
    }
}

/// The HLS kernel's sparse ATTEND unit (ABI 1.2): the per-query selection scan over the blocks,
/// the union of the group's lists, the partial over the union's gathered rows and the mass it
/// leaves out; the same answer as the reference path (`cxlkv_runtime::ndp::sparse`).
pub struct HlsSparse {
    raw: NonNull<ffi::Sparse>,
    g: usize,
    dim: usize,
    k: usize,
    union_len: Option<usize>,
}

// SAFETY: the C state is plain memory owned by this value alone (as for `HlsScorer`).
unsafe impl Send for HlsSparse {}

impl HlsSparse {
    /// A sparse ATTEND of `queries` with at most `k` tokens per query's list over blocks covering
    /// `ranges`; a selection the reference refuses is refused with the same status,
    /// `CXLKV_NDP_ERR_INTERNAL` if the library refuses the shape.
    pub fn new(
        queries: &QueryGroup<'_>,
        k: usize,
        sel: &Select,
        scale: f32,
        ranges: &[(u64, u64)],
    ) -> Result<HlsSparse, DeviceStatus> {
        let (g, dim) = (queries.count(), queries.dim());
        Selection::new(*sel, k, scale, g, ranges)?;
        let internal = DeviceStatus::at(CXLKV_NDP_ERR_INTERNAL, 0);
        let data = queries.data();
        if data.len() != g * dim {
            return Err(internal);
        }
        let c = sel.to_abi(scale);
        let small = |x: usize| u32::try_from(x).map_err(|_| internal);
        // SAFETY: `data` holds g * dim f32 (checked) and `c` is a live struct of the C layout;
        // both outlive the call, which copies them. The library checks g, k and dim first.
        let raw = unsafe {
            ffi::cxlkv_hls_sparse_new(small(g)?, small(k)?, data.as_ptr(), small(dim)?, scale, &c)
        };
        Ok(HlsSparse {
            raw: NonNull::new(raw).ok_or(internal)?,
            g,
            dim,
            k,
            union_len: None,
        })
    }

    /// Scores one block's keys as tokens `base..` and offers them to the lists.
    pub fn block(&mut self, keys: &KeyRows<'_>, base: u32) {
        assert_eq!(keys.dim(), self.dim, "key and query dimensions differ");
        let rows = u32::try_from(keys.len()).expect("rows fit in u32");
        let words = Words::of(keys);
        // SAFETY: `words` holds the rows as aligned u16 words, readable during the call; `raw` is
        // live with dimension `self.dim` (asserted).
        let rc = unsafe {
            ffi::cxlkv_hls_sparse_block(
                self.raw.as_ptr(),
                words.ptr(),
                rows,
                base,
                keys.dtype() as u8,
            )
        };
        assert_eq!(rc, 0, "the HLS engine refused a key dtype");
    }

    /// The union of the lists, ascending.
    pub fn union(&mut self) -> Result<Vec<u32>, DeviceStatus> {
        let mut tokens = vec![0u32; self.g * self.k];
        // SAFETY: `tokens` has room for g * k tokens, what the library may write; `raw` is live.
        let n = unsafe { ffi::cxlkv_hls_sparse_union(self.raw.as_ptr(), tokens.as_mut_ptr()) };
        if n < 0 {
            return Err(DeviceStatus::at(CXLKV_NDP_ERR_ARGS, SEL_TOO_MANY_FORCED));
        }
        tokens.truncate(n as usize);
        self.union_len = Some(tokens.len());
        Ok(tokens)
    }

    /// The partials over the union's rows, gathered in the union's order.
    pub fn rows(&mut self, keys: &KeyRows<'_>, values: &KeyRows<'_>) {
        assert_eq!(Some(keys.len()), self.union_len, "one row per union token");
        assert_eq!(
            values.len(),
            keys.len(),
            "keys and values have different rows"
        );
        assert_eq!(keys.dim(), self.dim, "key and query dimensions differ");
        let (k, v) = (Words::of(keys), Words::of(values));
        let rows = u32::try_from(keys.len()).expect("rows fit in u32");
        // SAFETY: `k` and `v` point at rows * dim elements as aligned u16 words, readable during
        // the call; `raw` is live and its union has `rows` tokens (asserted).
        let rc = unsafe {
            ffi::cxlkv_hls_sparse_rows(
                self.raw.as_ptr(),
                k.ptr(),
                v.ptr(),
                rows,
                keys.dtype() as u8,
            )
        };
        assert_eq!(rc, 0, "the HLS engine refused the union's rows");
    }

    /// The partials and, per query, `(|U|, left-out mass)`.
    pub fn finish(self) -> (Vec<Partial>, Vec<(u32, f32)>) {
        let (g, dim) = (self.g, self.dim);
        let mut out = vec![0f32; g * dim];
        let (mut max, mut sum) = (vec![0f32; g], vec![0f32; g]);
        let mut info = vec![cxlkv_ndp_list_info::default(); g];
        // SAFETY: the buffers hold g * dim, g, g f32 and g infos, what the library writes for this
        // state's g and dim; `raw` is live.
        unsafe {
            ffi::cxlkv_hls_sparse_finish(
                self.raw.as_ptr(),
                out.as_mut_ptr(),
                max.as_mut_ptr(),
                sum.as_mut_ptr(),
                info.as_mut_ptr(),
            )
        };
        let parts = partials(&out, &max, &sum, dim);
        (
            parts,
            info.iter().map(|i| (i.count, i.left_out_mass)).collect(),
        )
    }
}

impl Drop for HlsSparse {
    fn drop(&mut self) {
        // SAFETY: `raw` came from cxlkv_hls_sparse_new and is freed exactly once, here.
        unsafe { ffi::cxlkv_hls_sparse_free(self.raw.as_ptr()) }
    }
}

/// Copies the rows of `src` (an even number of bytes; shared memory included) into `dst` with the
/// engine's GATHER row mover.
pub fn copy_rows(engine: Engine, src: &KeyRows<'_>, dst: &mut [u8]) {
    assert_eq!(src.byte_len(), dst.len(), "row lengths differ");
    match engine {
        Engine::Rust => src.copy_to(dst),
        Engine::Hls => {
            assert_eq!(dst.len() % 2, 0, "rows are whole 16-bit words");
            let words = (dst.len() / 2) as u32;
            if !src.as_ptr().cast::<u16>().is_aligned() || !dst.as_ptr().cast::<u16>().is_aligned()
            {
                // The library moves aligned 16-bit words; go through aligned buffers.
                let s: Vec<u16> = src
                    .to_vec()
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                let mut d = vec![0u16; s.len()];
                // SAFETY: both buffers hold s.len() aligned u16; the library reads one and
                // writes the other.
                unsafe { ffi::cxlkv_hls_copy_row(s.as_ptr(), words, d.as_mut_ptr()) };
                for (o, w) in dst.chunks_exact_mut(2).zip(d) {
                    o.copy_from_slice(&w.to_le_bytes());
                }
            } else {
                // SAFETY: src and dst are 2-byte aligned (checked) and hold len / 2 u16 each: the
                // view's bytes are readable for its life (its invariant), `dst` is a unique
                // borrow of private memory, so they do not overlap.
                unsafe {
                    ffi::cxlkv_hls_copy_row(src.as_ptr().cast(), words, dst.as_mut_ptr().cast())
                };
            }
        }
    }
}

/// One value row of a quantized block (`src`, one row of codes) dequantized with its token's
/// `scale` by the HLS GATHER row mover: `dim` little-endian f32, as the Rust engine returns it.
pub fn dequant_row(src: &KeyRows<'_>, scale: f32) -> Vec<u8> {
    assert_eq!(src.len(), 1, "one row");
    let dim = src.dim();
    let mut out = vec![0f32; dim];
    let words = Words::of(src);
    // SAFETY: `words` holds the row's codes as aligned u16 words (readable during the call) and
    // `out` room for `dim` f32, what the library reads and writes.
    let rc = unsafe {
        ffi::cxlkv_hls_dequant_row(
            words.ptr(),
            dim as u32,
            src.dtype() as u8,
            scale,
            out.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "the HLS engine refused a quantized dtype");
    out.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cxlkv_kernels::rng::SplitMix64;
    use cxlkv_kernels::{DType, ScoreKernel};

    /// The HLS ATTEND unit returns the Rust reference's partials (per block `attend_block`, merged
    /// in block order) bit for bit, for every dtype, G and block split (blocks shorter and longer
    /// than the 64-row chunk). The merge calls the same expf as Rust's f32::exp.
    #[test]
    fn attend_matches_the_reference() {
        let mut rng = SplitMix64::new(0xa77e);
        for (dtype, dim, n, block) in [
            (DType::F16, 64usize, 300usize, 128usize),
            (DType::Bf16, 128, 200, 64),
            (DType::F32, 64, 150, 150),
            (DType::F32, 256, 40, 16),
        ] {
            let kb = rng.key_bytes(n, dim, dtype);
            let vb = rng.key_bytes(n, dim, dtype);
            // Odd byte offsets: the engine must take the unaligned path too.
            let mut kodd = vec![0u8];
            kodd.extend_from_slice(&kb);
            let keys = KeyRows::new(&kodd[1..], dtype, dim).unwrap();
            let values = KeyRows::new(&vb, dtype, dim).unwrap();
            for g in [1usize, 3, 16] {
                let qv = rng.normal_vec(g * dim);
                let q = QueryGroup::new(&qv, dim).unwrap();
                let scale = cxlkv_kernels::attention::default_scale(dim);
                let mut want: Vec<Partial> = (0..g).map(|_| Partial::empty(dim)).collect();
                let mut hls = HlsAttend::new(&q, scale).unwrap();
                for start in (0..n).step_by(block) {
                    let end = (start + block).min(n);
                    let (k, v) = (keys.slice(start, end), values.slice(start, end));
                    let parts =
                        cxlkv_kernels::attend_block(ScoreKernel::scalar(), &q, &k, &v, scale);
                    for (w, p) in want.iter_mut().zip(parts) {
                        w.merge(&p);
                    }
                    hls.block(&k, &v);
                }
                assert_eq!(hls.finish(), want, "{dtype:?} d {dim} G {g}");
            }
        }
        let q = vec![0f32; 17 * 64];
        assert!(HlsAttend::new(&QueryGroup::new(&q, 64).unwrap(), 1.0).is_none());
    }

    /// The HLS selection returns the reference `Selection`'s lists (identical indices and
    /// scores) and left-out masses, and refuses what it refuses with the same detail.
    #[test]
    fn selection_matches_the_reference() {
        let mut rng = SplitMix64::new(0x5e1);
        let (dim, n, block) = (64usize, 500usize, 96usize);
        let kb = rng.key_bytes(n, dim, DType::F16);
        let keys = KeyRows::new(&kb, DType::F16, dim).unwrap();
        let ranges: Vec<(u64, u64)> = (0..n)
            .step_by(block)
            .map(|a| (a as u64, (a + block).min(n) as u64))
            .collect();
        let s = |sinks, window, exclude, top_p| Select {
            sinks,
            window,
            exclude,
            top_p,
        };
        let n64 = n as u64;
        let sels = [
            (s(4, None, None, None), 16usize),
            (s(2, Some((n64 - 20, n64)), Some((100, 300)), None), 64),
            (s(0, None, None, Some(0.7)), 200),
            (s(3, Some((10, 20)), None, Some(0.95)), 40),
            (s(0, None, Some((0, 0)), Some(1.0)), 8),
            (s(0, None, None, Some(0.0)), 8),
            (s(0, Some((0, n64 + 1)), None, None), 8),
            (s(20, None, None, None), 8),
        ];
        for g in [1usize, 4] {
            let qv = rng.normal_vec(g * dim);
            let q = QueryGroup::new(&qv, dim).unwrap();
            for (sel, k) in sels {
                for group_max in [false, true] {
                    let lists = if group_max { 1 } else { g };
                    let scale = cxlkv_kernels::attention::default_scale(dim);
                    let want = Selection::new(sel, k, scale, lists, &ranges).map(|mut r| {
                        for &(a, b) in &ranges {
                            let blk = keys.slice(a as usize, b as usize);
                            let mut sc = vec![0f32; blk.len() * g];
                            ScoreKernel::scalar().score(&q, &blk, &mut sc);
                            r.feed(a as u32, &sc, g, group_max);
                        }
                        // The HLS selection unit does not report the log-sum-exp.
                        Selected {
                            log_sum_exp: Vec::new(),
                            ..r.finish()
                        }
                    });
                    let got =
                        HlsSelect::new(&q, k, group_max, &sel, scale, &ranges).and_then(|mut h| {
                            for &(a, b) in &ranges {
                                h.block(&keys.slice(a as usize, b as usize), a as u32);
                            }
                            h.finish()
                        });
                    assert_eq!(got, want, "{sel:?} k {k} G {g} group_max {group_max}");
                }
            }
        }
    }
}
