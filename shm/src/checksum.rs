//! Copying bytes out of shared memory and checksumming the copy in one pass.
//!
//! A reader of the pool must check the CRC-32C (Castagnoli) of exactly the bytes it copied (the
//! owner may rewrite the memory meanwhile). Copying, then checksumming the copy, reads every byte
//! twice; [`copy_crc32c`] reads it once: on x86_64 CPUs with AVX-512 and VPCLMULQDQ it folds the
//! CRC over the very 64-byte registers the copy loads and stores, prefetching ahead of the loads.
//! Elsewhere (other CPUs, other architectures, Miri) it copies 4 KiB pieces, checksumming each
//! while it is still in L1 with the next one already prefetched. [`crc32c_at`] is the same pass
//! without the copy, for bytes no other party writes meanwhile (a reservation being committed, a
//! pinned block).
//!
//! The folding is the one of Gopal et al., "Fast CRC Computation for Generic Polynomials Using
//! PCLMULQDQ Instruction" (Intel, 2009), in the bit-reflected order CRC-32C uses. Read the message
//! as a polynomial over GF(2), first bit highest. A 128-bit lane `X` (low quadword `X_lo` first)
//! that another lane `Y` follows `F` bits later contributes `X·x^F = X_lo·x^(F+64) + X_hi·x^F`
//! at `Y`'s place; modulo the CRC polynomial `P` that equals `X_lo·x^33·k1 + X_hi·x^33·k2` with
//! `k1 = x^(F+31) mod P` and `k2 = x^(F-33) mod P`, and a carry-less multiply of a reflected
//! quadword by a reflected 32-bit constant yields exactly `X_lo·x^33·k1` as a reflected 128-bit
//! lane (the multiply's own one-bit shift is in the `x^33`). So each lane becomes
//! `clmul(X_lo, k1) ^ clmul(X_hi, k2) ^ Y`, a shorter message with the same remainder. Four
//! 512-bit accumulators fold 256 bytes per step (`F` = 2,048 bits), then fold into one
//! (`F` = 512), whose 64 bytes and the tail under 64 bytes are a short message that `crc-fast`
//! finishes. CRC-32C starts from `0xFFFF_FFFF`, which is the message's first 32 bits inverted:
//! they are inverted in the first register, and again in the short message for `crc-fast`, which
//! applies its own start value. The tests compare every length and alignment with `crc-fast`.

/// Bytes copied, then checksummed, at a time on the portable path: the piece is still in L1 when
/// the CRC reads it, and the next piece streams in (prefetched) meanwhile.
const PIECE: usize = 4 << 10;

/// CRC-32C of `bytes` (`crc-fast`, which folds with (V)PCLMULQDQ where the CPU has it).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// Copies `dst.len()` bytes from `src` into `dst` and returns the CRC-32C of the bytes copied,
/// continuing `crc`: the CRC-32C of bytes before them (0 when there are none), so that a range
/// copied in parts has the CRC of the whole.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes and must not overlap `dst`. Another party
/// may write the source meanwhile (the copy may tear); the CRC is of the copy either way.
pub(crate) unsafe fn copy_crc32c(src: *const u8, dst: &mut [u8], crc: u32) -> u32 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        if dst.len() >= fused::MIN_LEN && fused::available() {
            // SAFETY: the CPU has AVX-512F and VPCLMULQDQ (checked just above); `src` is valid
            // for `dst.len()` bytes and does not overlap `dst` (this function's contract).
            return unsafe { fused::copy_crc32c(src, dst, crc) };
        }
    }
    // SAFETY: this function's contract.
    unsafe { copy_crc32c_in_pieces(src, dst, crc) }
}

/// The CRC-32C of `len` bytes at `src`, continuing `crc` (as [`copy_crc32c`]), read in place:
/// on the fused path the loads feed the CRC alone; elsewhere 4 KiB pieces are copied to the stack
/// and checksummed there (no Rust reference into memory another party may write).
///
/// # Safety
/// `src` must be valid for reads of `len` bytes. Another party may write them meanwhile; the
/// CRC is then of some mix of old and new bytes (a caller that must check what it uses copies
/// with [`copy_crc32c`] instead).
pub(crate) unsafe fn crc32c_at(src: *const u8, len: usize, crc: u32) -> u32 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        if len >= fused::MIN_LEN && fused::available() {
            // SAFETY: the CPU has AVX-512F and VPCLMULQDQ (checked just above); `src` is valid
            // for `len` bytes (this function's contract).
            return unsafe { fused::crc32c_at(src, len, crc) };
        }
    }
    let mut piece = [0u8; PIECE];
    let (mut crc, mut at) = (crc, 0);
    while at < len {
        let n = PIECE.min(len - at);
        // SAFETY: `[at, at + n)` is inside the `len` readable bytes at `src` (this function's
        // contract); `piece` is this function's own.
        crc = unsafe { copy_crc32c_in_pieces(src.add(at), &mut piece[..n], crc) };
        at += n;
    }
    crc
}

/// The portable path of [`copy_crc32c`]: 4 KiB pieces, each checksummed while in L1 as the next
/// is prefetched.
///
/// # Safety
/// As [`copy_crc32c`].
unsafe fn copy_crc32c_in_pieces(src: *const u8, dst: &mut [u8], crc: u32) -> u32 {
    // The digest's state is the CRC register: the finished CRC `crc` inverted.
    let mut crc =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    let len = dst.len();
    let mut at = 0;
    for piece in dst.chunks_mut(PIECE) {
        // SAFETY: `[at, at + piece.len())` is inside the `len` readable bytes at `src`, and the
        // piece is part of `dst`, which does not overlap them (this function's contract).
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), piece.as_mut_ptr(), piece.len()) };
        at += piece.len();
        // SAFETY: `[at, at + n)` with `n <= len - at` is inside the readable bytes at `src`.
        unsafe { prefetch(src.add(at), PIECE.min(len - at)) };
        crc.update(piece);
    }
    crc.finalize() as u32
}

/// Starts `len` bytes at `p` on their way into L2 (x86_64; nothing elsewhere). A hint only.
///
/// # Safety
/// `p` must be valid for reads of `len` bytes (a prefetch never faults, but the address must be
/// one this process may form).
#[inline]
pub(crate) unsafe fn prefetch(p: *const u8, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        const LINE: usize = crate::cacheline::LINE as usize;
        let end = p as usize + len;
        let mut line = p as usize & !(LINE - 1);
        while line < end {
            // SAFETY: a prefetch only hints the caches; it neither faults nor changes memory.
            // `line` rounds an address inside the range down to its cache line, which lies in
            // the same page as that address.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(line as *const i8) };
            line += LINE;
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = (p, len);
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod fused {
    use std::arch::x86_64::{
        __m512i, _mm512_clmulepi64_epi128, _mm512_loadu_si512, _mm512_set_epi32, _mm512_set_epi64,
        _mm512_storeu_si512, _mm512_ternarylogic_epi64, _mm512_xor_si512, _mm_prefetch,
        _MM_HINT_T0,
    };

    /// Shortest copy worth the fused path (one register).
    pub(super) const MIN_LEN: usize = 64;
    /// How far ahead of the loads the prefetches run (1, 2, 4 and 8 KiB measured alike on Zen 4).
    const AHEAD: usize = 2 << 10;
    /// The base page size, and how far ahead the loop touches the next page.
    const PAGE_AHEAD: usize = 4 << 10;

    /// CRC-32C's polynomial without its `x^32` term, in normal bit order.
    const POLY: u64 = 0x1EDC_6F41;

    /// `x^n mod P` as a reflected 32-bit constant (bit `j` is the coefficient of `x^(31-j)`).
    const fn xpow_mod(n: u32) -> i64 {
        let mut r: u64 = 1;
        let mut i = 0;
        while i < n {
            r <<= 1;
            if r & (1 << 32) != 0 {
                r ^= (1 << 32) | POLY;
            }
            i += 1;
        }
        (r as u32).reverse_bits() as i64
    }

    /// The two constants of a fold over `f` bits: `x^(f+31) mod P` for the low quadword,
    /// `x^(f-33) mod P` for the high one.
    const fn fold_constants(f: u32) -> (i64, i64) {
        (xpow_mod(f + 31), xpow_mod(f - 33))
    }
    const BY_512: (i64, i64) = fold_constants(512);
    const BY_2048: (i64, i64) = fold_constants(2048);

    /// Whether this CPU runs the fused path (cached by the standard library after the first ask).
    pub(super) fn available() -> bool {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("vpclmulqdq")
    }

    /// Every 128-bit lane of a register holds `(lo, hi)`.
    #[target_feature(enable = "avx512f")]
    fn lanes((lo, hi): (i64, i64)) -> __m512i {
        _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)
    }

    /// `acc` folded over the constants `k` onto `next`.
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold(acc: __m512i, k: __m512i, next: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128(acc, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(acc, k, 0x11);
        // 0x96: the three-way XOR.
        _mm512_ternarylogic_epi64(lo, hi, next, 0x96)
    }

    /// [`super::copy_crc32c`] on AVX-512 with VPCLMULQDQ, for `dst.len() >= MIN_LEN`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and VPCLMULQDQ; `src` must be valid for reads of `dst.len()`
    /// bytes and must not overlap `dst`.
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    pub(super) unsafe fn copy_crc32c(src: *const u8, dst: &mut [u8], crc: u32) -> u32 {
        // SAFETY: this function's contract; `dst` is valid for writes of its length.
        unsafe { fold_crc32c::<true>(src, dst.as_mut_ptr(), dst.len(), crc) }
    }

    /// [`super::crc32c_at`] on AVX-512 with VPCLMULQDQ, for `len >= MIN_LEN`: the same loop
    /// without the stores.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and VPCLMULQDQ; `src` must be valid for reads of `len` bytes.
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    pub(super) unsafe fn crc32c_at(src: *const u8, len: usize, crc: u32) -> u32 {
        // SAFETY: this function's contract; with `COPY` false nothing is written to `out`.
        unsafe { fold_crc32c::<false>(src, std::ptr::null_mut(), len, crc) }
    }

    /// The CRC-32C of `len` bytes at `src`, continuing `crc`, copying them to `out` as it reads
    /// them when `COPY`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and VPCLMULQDQ; `len >= MIN_LEN`; `src` must be valid for
    /// reads of `len` bytes; with `COPY`, `out` must be valid for writes of `len` bytes and must
    /// not overlap them.
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    unsafe fn fold_crc32c<const COPY: bool>(
        src: *const u8,
        out: *mut u8,
        len: usize,
        crc: u32,
    ) -> u32 {
        debug_assert!(len >= MIN_LEN);
        let load = |i: usize| {
            // SAFETY: callers pass `i` with `i + 64 <= len`: the 64 bytes lie inside `src`'s
            // readable range. An unaligned load.
            unsafe { _mm512_loadu_si512(src.add(i).cast()) }
        };
        let store = |i: usize, v: __m512i| {
            if COPY {
                // SAFETY: callers pass `i` with `i + 64 <= len`: the 64 bytes lie inside `out`'s
                // writable range (with `COPY`). An unaligned store.
                unsafe { _mm512_storeu_si512(out.add(i).cast(), v) }
            }
        };
        // The start: the CRC register (the CRC so far, inverted; all ones for none) XORed into
        // the message's first 32 bits, least significant byte first.
        let start = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, !crc as i32);
        let by_512 = lanes(BY_512);
        let mut at;
        let mut acc;
        if len >= 256 {
            let (d0, d1, d2, d3) = (load(0), load(64), load(128), load(192));
            store(0, d0);
            store(64, d1);
            store(128, d2);
            store(192, d3);
            let (mut a0, mut a1, mut a2, mut a3) = (_mm512_xor_si512(d0, start), d1, d2, d3);
            let by_2048 = lanes(BY_2048);
            at = 256;
            while at + 256 <= len {
                let ahead = src.wrapping_add(at + AHEAD);
                for line in [0, 64, 128, 192] {
                    // Only a hint: it never faults, also past the end of the source (the address
                    // is formed with wrapping arithmetic and never dereferenced).
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
                }
                let page = at + PAGE_AHEAD;
                if page < len && (src as usize + page) % PAGE_AHEAD < 256 {
                    // Once per page, a page ahead: a real load, which walks the page table now
                    // (a prefetch that misses the TLB may be dropped, and on 4 KiB pages the
                    // copy would wait for a walk and a memory latency at every page).
                    // SAFETY: `page < len`: inside the source's readable range.
                    let _ = unsafe { src.add(page).read_volatile() };
                }
                let (d0, d1, d2, d3) = (load(at), load(at + 64), load(at + 128), load(at + 192));
                store(at, d0);
                store(at + 64, d1);
                store(at + 128, d2);
                store(at + 192, d3);
                a0 = fold(a0, by_2048, d0);
                a1 = fold(a1, by_2048, d1);
                a2 = fold(a2, by_2048, d2);
                a3 = fold(a3, by_2048, d3);
                at += 256;
            }
            acc = fold(fold(fold(a0, by_512, a1), by_512, a2), by_512, a3);
        } else {
            let d = load(0);
            store(0, d);
            acc = _mm512_xor_si512(d, start);
            at = 64;
        }
        while at + 64 <= len {
            let d = load(at);
            store(at, d);
            acc = fold(acc, by_512, d);
            at += 64;
        }
        // The short message: the accumulator's 64 bytes, then the tail (copied last).
        let tail = len - at;
        let mut short = [0u8; 128];
        // SAFETY: `short` has room for the 64 bytes stored.
        unsafe { _mm512_storeu_si512(short.as_mut_ptr().cast(), acc) };
        // SAFETY: `[at, len)` is inside `src`'s readable range, `tail < 64` fits `short` after
        // the accumulator, and `short` is this function's own.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), short.as_mut_ptr().add(64), tail) };
        if COPY {
            // SAFETY: `[at, len)` is inside `out`'s writable range (with `COPY`); `short` is
            // this function's own.
            unsafe { std::ptr::copy_nonoverlapping(short.as_ptr().add(64), out.add(at), tail) };
        }
        // crc-fast starts from 0xFFFF_FFFF itself: undo the inversion made at the start.
        for b in &mut short[..4] {
            *b ^= 0xff;
        }
        super::crc32c(&short[..64 + tail])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize) -> Vec<u8> {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect()
    }

    /// Every length from 0 to 1,100 and a few long ones, at several source alignments: the copy
    /// is exact and its CRC is crc-fast's, on whichever path this CPU takes.
    #[test]
    fn copies_and_checksums_like_crc_fast() {
        let data = bytes(70_000);
        let lens = (0..1100).chain([4095, 4096, 4097, 65_536, 69_000]);
        for len in lens {
            for off in [0, 1, 13, 64] {
                if off + len > data.len() {
                    continue;
                }
                let src = &data[off..off + len];
                let mut dst = vec![0u8; len];
                // SAFETY: `src` is a live private slice of `len` bytes, disjoint from `dst`.
                let crc = unsafe { copy_crc32c(src.as_ptr(), &mut dst, 0) };
                assert_eq!(crc, crc32c(src), "len {len} offset {off}");
                assert!(dst == src, "copy of len {len} offset {off}");
                // The portable path too, whatever this CPU has.
                dst.fill(0);
                // SAFETY: as above.
                let crc = unsafe { copy_crc32c_in_pieces(src.as_ptr(), &mut dst, 0) };
                assert_eq!(crc, crc32c(src), "portable: len {len} offset {off}");
                assert!(dst == src, "portable copy of len {len} offset {off}");
                // In two parts, the second continuing the first's CRC.
                let cut = len / 3;
                // SAFETY: both parts lie inside `src`, disjoint from `dst`.
                let first = unsafe { copy_crc32c(src.as_ptr(), &mut dst[..cut], 0) };
                // SAFETY: as above.
                let whole = unsafe { copy_crc32c(src[cut..].as_ptr(), &mut dst[cut..], first) };
                assert_eq!(whole, crc32c(src), "len {len} offset {off} cut {cut}");
                // In place, whole and in two parts.
                // SAFETY: `src` is valid for reads of `len` bytes.
                let crc = unsafe { crc32c_at(src.as_ptr(), len, 0) };
                assert_eq!(crc, crc32c(src), "in place: len {len} offset {off}");
                // SAFETY: both parts lie inside `src`.
                let first = unsafe { crc32c_at(src.as_ptr(), cut, 0) };
                // SAFETY: as above.
                let whole = unsafe { crc32c_at(src[cut..].as_ptr(), len - cut, first) };
                assert_eq!(
                    whole,
                    crc32c(src),
                    "in place: len {len} offset {off} cut {cut}"
                );
            }
        }
        assert_eq!(crc32c(b"123456789"), 0xE306_9283, "the CRC-32C check value");
    }

    /// A bit flipped anywhere changes the CRC of the copy, which stays crc-fast's.
    #[test]
    fn a_changed_byte_changes_the_crc() {
        let data = bytes(4096);
        let mut dst = vec![0u8; 4096];
        // SAFETY: as above.
        let before = unsafe { copy_crc32c(data.as_ptr(), &mut dst, 0) };
        for at in [0, 3, 4, 63, 64, 255, 256, 4000, 4095] {
            let mut changed = data.clone();
            changed[at] ^= 1;
            // SAFETY: as above.
            let after = unsafe { copy_crc32c(changed.as_ptr(), &mut dst, 0) };
            assert_ne!(before, after, "a flipped bit at {at} went unseen");
            assert_eq!(after, crc32c(&changed));
        }
    }
}
