//! Multithreaded variants: the keys are split into contiguous ranges, one per thread
//! (`std::thread::scope`), and partial top-k lists are merged. Results equal the single-thread
//! scans exactly, because the ranking is a total order on `(score, index)`.

use crate::rows::{KeyRows, QueryGroup};
use crate::scan::{new_selectors, scan_into};
use crate::score::ScoreKernel;
use crate::topk::{Hit, TopK, TopKSelector};

/// `n` items split into at most `parts` contiguous non-empty ranges of near-equal size, whose
/// boundaries are multiples of `align` (except the end).
pub fn split_ranges(n: usize, parts: usize, align: usize) -> Vec<(usize, usize)> {
    let parts = parts.max(1);
    let align = align.max(1);
    let units = n.div_ceil(align);
    let parts = parts.min(units.max(1));
    let mut ranges = Vec::with_capacity(parts);
    for p in 0..parts {
        let start = (units * p / parts * align).min(n);
        let end = (units * (p + 1) / parts * align).min(n);
        if start < end {
            ranges.push((start, end));
        }
    }
    ranges
}

/// [`crate::scan::scan_topk`] with the keys split across `threads` threads.
pub fn scan_topk_parallel(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    topk: TopK,
    threads: usize,
) -> Vec<Vec<Hit>> {
    let ranges = split_ranges(keys.len(), threads, crate::scan::SCAN_CHUNK_KEYS);
    if ranges.len() <= 1 {
        return crate::scan::scan_topk(kernel, queries, keys, topk);
    }
    let partials: Vec<Vec<TopKSelector>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranges
            .iter()
            .map(|&(start, end)| {
                s.spawn(move || {
                    let mut sel = new_selectors(queries, topk);
                    let part = keys.slice(start, end);
                    scan_into(kernel, queries, &part, start as u32, topk.mode, &mut sel);
                    sel
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("scan thread panicked"))
            .collect()
    });
    merge(partials, topk)
}

/// Merges per-thread selectors list by list.
fn merge(partials: Vec<Vec<TopKSelector>>, topk: TopK) -> Vec<Vec<Hit>> {
    let lists = partials.first().map_or(0, Vec::len);
    let mut merged: Vec<TopKSelector> = (0..lists).map(|_| TopKSelector::new(topk.k)).collect();
    for part in partials {
        for (m, sel) in merged.iter_mut().zip(part) {
            m.extend(&sel.into_sorted());
        }
    }
    merged.into_iter().map(TopKSelector::into_sorted).collect()
}

/// [`ScoreKernel::score`] with the keys split across `threads` threads.
pub fn score_group_parallel(
    kernel: ScoreKernel,
    queries: &QueryGroup<'_>,
    keys: &KeyRows<'_>,
    out: &mut [f32],
    threads: usize,
) {
    let g = queries.count();
    assert_eq!(out.len(), keys.len() * g, "output must hold N * G scores");
    let ranges = split_ranges(keys.len(), threads, 64);
    std::thread::scope(|s| {
        let mut rest = out;
        for &(start, end) in &ranges {
            let (mine, tail) = rest.split_at_mut((end - start) * g);
            rest = tail;
            s.spawn(move || kernel.score(queries, &keys.slice(start, end), mine));
        }
    });
}

/// Wrapping sum of `bytes` read as little-endian u64 words (tail bytes added singly): a plain
/// streaming read, the bandwidth yardstick the kernels are compared with.
pub fn stream_sum(bytes: &[u8]) -> u64 {
    stream_sum_impl(bytes)
}

/// [`stream_sum`] with the widest vector loads the CPU has (AVX-512, else AVX2), written with
/// intrinsics: four 64-byte (32-byte) accumulators over 256-byte (128-byte) groups. Same result.
/// Which of the two reads is the faster depends on the CPU: on the 2-core Zen 4 VM the plain one
/// read 22.7 GB/s, this one 19.1 (when it was [`stream_sum`]'s loop compiled for AVX-512 it read
/// 5.0), so a yardstick takes the faster of both.
pub fn stream_sum_wide(bytes: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected on this CPU.
            return unsafe { stream_sum_avx512(bytes) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected on this CPU.
            return unsafe { stream_sum_avx2(bytes) };
        }
    }
    stream_sum_impl(bytes)
}

/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_sum_avx512(bytes: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let groups = bytes.len() / 256;
    let p = bytes.as_ptr();
    // SAFETY: group `i < len / 256` spans bytes `256 i .. 256 i + 256` of `bytes`; the loads are
    // unaligned.
    let sum = unsafe {
        let mut acc = [_mm512_setzero_si512(); 4];
        for i in 0..groups {
            for (k, a) in acc.iter_mut().enumerate() {
                let v = _mm512_loadu_si512(p.add(i * 256 + k * 64).cast());
                *a = _mm512_add_epi64(*a, v);
            }
        }
        let s = _mm512_add_epi64(
            _mm512_add_epi64(acc[0], acc[1]),
            _mm512_add_epi64(acc[2], acc[3]),
        );
        _mm512_reduce_add_epi64(s) as u64
    };
    // The rest starts on a 64-byte boundary of `bytes`: the same words and tail bytes.
    sum.wrapping_add(stream_sum_impl(&bytes[groups * 256..]))
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_sum_avx2(bytes: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let groups = bytes.len() / 128;
    let p = bytes.as_ptr();
    let mut lanes = [0u64; 4];
    // SAFETY: group `i < len / 128` spans bytes `128 i .. 128 i + 128` of `bytes`; the loads are
    // unaligned; the store writes the 32 bytes of `lanes`.
    unsafe {
        let mut acc = [_mm256_setzero_si256(); 4];
        for i in 0..groups {
            for (k, a) in acc.iter_mut().enumerate() {
                let v = _mm256_loadu_si256(p.add(i * 128 + k * 32).cast());
                *a = _mm256_add_epi64(*a, v);
            }
        }
        let s = _mm256_add_epi64(
            _mm256_add_epi64(acc[0], acc[1]),
            _mm256_add_epi64(acc[2], acc[3]),
        );
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), s);
    }
    let sum = lanes.iter().fold(0u64, |a, &x| a.wrapping_add(x));
    sum.wrapping_add(stream_sum_impl(&bytes[groups * 128..]))
}

#[inline(always)]
fn stream_sum_impl(bytes: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    let mut lines = bytes.chunks_exact(64);
    for line in &mut lines {
        for (j, a) in acc.iter_mut().enumerate() {
            let w = u64::from_le_bytes(line[8 * j..8 * j + 8].try_into().expect("8 bytes"));
            *a = a.wrapping_add(w);
        }
    }
    let tail: u64 = lines.remainder().iter().map(|&b| b as u64).sum();
    acc.iter().fold(tail, |s, &a| s.wrapping_add(a))
}

/// [`stream_sum`] with the buffer split across `threads` threads (partial sums added).
pub fn stream_sum_parallel(bytes: &[u8], threads: usize) -> u64 {
    let ranges = split_ranges(bytes.len(), threads, 4096);
    if ranges.len() <= 1 {
        return stream_sum(bytes);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = ranges
            .iter()
            .map(|&(a, b)| s.spawn(move || stream_sum(&bytes[a..b])))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("sum thread panicked"))
            .fold(0u64, u64::wrapping_add)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::rng::SplitMix64;

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn wide_stream_sum_equals_the_plain_one() {
        let bytes = SplitMix64::new(3).key_bytes(1000, 16, DType::F32);
        for end in [0, 7, 64, 127, 128, 255, 256, 1000, 4095, bytes.len()] {
            assert_eq!(stream_sum_wide(&bytes[..end]), stream_sum(&bytes[..end]));
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected (the AVX-512 form is what `stream_sum_wide` ran above).
            assert_eq!(unsafe { stream_sum_avx2(&bytes) }, stream_sum(&bytes));
        }
        assert_ne!(stream_sum(&bytes), 0);
    }

    #[test]
    fn ranges_cover_everything_once() {
        for n in [0, 1, 5, 255, 256, 257, 10_000] {
            for parts in [1, 2, 3, 8] {
                let r = split_ranges(n, parts, 256);
                let covered: usize = r.iter().map(|(a, b)| b - a).sum();
                assert_eq!(covered, n);
                for w in r.windows(2) {
                    assert_eq!(w[0].1, w[1].0);
                    assert_eq!(w[0].1 % 256, 0);
                }
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri (over 45 s)")]
    fn threads_change_nothing() {
        let mut rng = SplitMix64::new(8);
        let (n, dim, g) = (3000, 32, 2);
        let qv = rng.normal_vec(g * dim);
        let q = QueryGroup::new(&qv, dim).unwrap();
        let kernel = ScoreKernel::detect();
        for dtype in [DType::I8, DType::I4, DType::F16] {
            let kb = rng.key_bytes(n, dim, dtype);
            let keys = KeyRows::new(&kb, dtype, dim).unwrap();
            for topk in [TopK::per_query(50), TopK::group_max(7)] {
                let one = crate::scan::scan_topk(kernel, &q, &keys, topk);
                for t in [2, 3, 5] {
                    assert_eq!(scan_topk_parallel(kernel, &q, &keys, topk, t), one);
                }
            }
        }
        let kb = rng.key_bytes(n, dim, DType::F16);
        let keys = KeyRows::new(&kb, DType::F16, dim).unwrap();
        let mut a = vec![0.0; n * g];
        let mut b = vec![0.0; n * g];
        kernel.score(&q, &keys, &mut a);
        score_group_parallel(kernel, &q, &keys, &mut b, 3);
        assert_eq!(a, b);
        let bytes: Vec<u8> = (0..100_003u32).map(|i| (i * 7) as u8).collect();
        let whole = bytes.len() / 64 * 64;
        let words = bytes[..whole].chunks(8).fold(0u64, |s, c| {
            s.wrapping_add(u64::from_le_bytes(c.try_into().unwrap()))
        });
        let naive = bytes[whole..]
            .iter()
            .fold(words, |s, &x| s.wrapping_add(x as u64));
        assert_eq!(stream_sum(&bytes), naive);
        assert_eq!(stream_sum_parallel(&bytes, 3), stream_sum(&bytes));
    }
}
