//! Helpers shared by the benches (`mod common;` in each).

/// A fixed pseudo-random permutation of `0..n` (xorshift): the order in which a bench visits cold
/// blocks, the same for the measured path and its baseline.
pub fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut x = seed | 1;
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}
