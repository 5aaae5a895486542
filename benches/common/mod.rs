//! Helpers shared by the benches (`mod common;` in each).

use cxlkv_kernels::rng::SplitMix64;

/// A fixed pseudo-random permutation of `0..n` (Fisher-Yates over the project's seeded
/// SplitMix64): the order in which a bench visits cold blocks, the same for the measured path and
/// its baseline.
pub fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
    v
}
