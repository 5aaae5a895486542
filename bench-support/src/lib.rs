//! # cxlkv-bench-support
//!
//! Tooling for measuring the kernels and feeding them real data, kept out of the kernels library:
//!
//! - [`qk`]: the `cxlkv bench qk` harness, fused Q·K + top-k on cold keys beside a plain read of
//!   the same bytes ([`qk::run_qk_bench`]), and [`qk::synthetic_keys`] for the benches;
//! - [`cold`]: [`cold::evict`], which flushes a buffer from every cache level (`clflush`) so that
//!   a timed run reads memory, not a last-level cache;
//! - [`median`]: the upper median of measurements, as every bench reports them (the test helpers
//!   re-export it);
//! - [`npy`]: a small `.npy` reader and writer for the real SmolLM2 tensors under `data/` that the
//!   demo, the golden-vector examples and the real-data tests load.
//!
//! The `cxlkv` command line uses it (`cxlkv bench qk`, the demo's real tensors), so unlike
//! `cxlkv-test-support` it is a normal crate; no library below the command line depends on it.

// Items are `pub` only where a user of the crate can reach them.
#![warn(unreachable_pub)]

pub mod cold;
pub mod npy;
pub mod qk;

/// The upper median of `v` (the element at `len / 2` once sorted); `v` must be non-empty and
/// free of NaN.
pub fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
    assert!(!v.is_empty(), "median of no measurements");
    v.sort_by(|a, b| a.partial_cmp(b).expect("median of values without NaN"));
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::median;
    use std::time::Duration;

    #[test]
    fn median_is_the_upper_middle_element() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        let d = Duration::from_millis;
        assert_eq!(median(vec![d(9), d(1), d(5)]), d(5));
    }
}
