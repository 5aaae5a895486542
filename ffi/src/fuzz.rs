//! Malformed calls through the exported functions, by the thousand: a seeded loop draws a function
//! and its arguments — NULL, live, released, foreign and mistyped handles; NULL or valid pointers
//! with random lengths (never past the buffer they point to: that is undefined behaviour in C
//! too); random `struct_size`s, flags, modes, codes and counts — and calls it. Every call must
//! return (no panic crosses the ABI, no crash), every read that succeeds must return bytes some
//! put stored under that key (a model per partition, since two participants may each hold the
//! key), and at the end, with every handle released, the pool must hold no participant slot, no
//! pin and no damage (the leaks).
//!
//! `CXLKV_FFI_FUZZ_CALLS` sets the number of calls (default 5000; `scripts/fuzz-long.sh` makes
//! 100,000), `CXLKV_FFI_FUZZ_SEED` the seed. The run prints its counts.

use crate::batch::{
    cxlkv_participant_get_batch, cxlkv_participant_put_batch, cxlkv_pool_contains_batch,
};
use crate::errors::cxlkv_result::{self, *};
use crate::errors::{cxlkv_last_error_message, cxlkv_result_message};
use crate::keys::{
    cxlkv_key, cxlkv_key_chain, cxlkv_key_chain_salted, cxlkv_key_from_bytes,
    cxlkv_key_from_bytes_salted,
};
use crate::participant::*;
use crate::pool::*;
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_runtime::format::pin;
use cxlkv_runtime::region::{Backend, RegionOptions};
use cxlkv_runtime::{check, Pool};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, CString};
use std::ptr::{null, null_mut};
use std::sync::atomic::Ordering;

const KEYS: u64 = 24;
const BLOCK: usize = 4096;
/// Data buffers hold three blocks: puts up to that size make multi-block objects.
const DATA: usize = 3 * BLOCK;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the run saw.
#[derive(Debug, Default)]
struct Counts {
    calls: u64,
    /// Calls that panicked inside the library (`CXLKV_ERR_PANIC`): a bug, though caught.
    crashes: u64,
    ok: u64,
    errors: u64,
    reads_checked: u64,
    wrong_reads: u64,
}

/// The fuzzer's state: handles it holds, released ones it may pass again, and the model.
struct Fuzz {
    rng: SplitMix64,
    pool: *mut cxlkv_pool,
    participants: Vec<*mut cxlkv_participant>,
    pins: Vec<*mut cxlkv_pinned>,
    reservations: Vec<(*mut cxlkv_reservation, u32, cxlkv_key, Vec<u8>)>,
    /// Addresses of released handles (passing them again must be refused).
    released: Vec<usize>,
    /// What each partition may hold under each key: every value stored and not yet deleted.
    model: HashMap<(u32, (u64, u64)), Vec<u8>>,
    counts: Counts,
    spec: CString,
}

impl Fuzz {
    /// True `pct` times in a hundred.
    fn chance(&mut self, pct: u64) -> bool {
        self.rng.below(100) < pct
    }

    /// Whether `addr` is a handle this run still holds (the allocator may give a released
    /// address to a new handle: passing that one as "released" would release a live handle).
    fn held(&self, addr: usize) -> bool {
        addr == self.pool as usize
            || self.participants.iter().any(|&p| p as usize == addr)
            || self.pins.iter().any(|&p| p as usize == addr)
            || self.reservations.iter().any(|r| r.0 as usize == addr)
    }

    fn key(&mut self) -> cxlkv_key {
        let i = self.rng.below(KEYS);
        cxlkv_key {
            lo: 0x5eed_0000 + i,
            hi: i,
        }
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let s = self.rng.next_u64();
        (0..len)
            .map(|i| (s.wrapping_mul(i as u64 + 1) >> 29) as u8)
            .collect()
    }

    /// A handle argument: usually a live one, else NULL, a released address, a handle of another
    /// type, or a random address (the registry refuses it before anything is dereferenced).
    fn handle<T>(&mut self, live: &[*mut T]) -> *mut T {
        match self.rng.below(12) {
            0 => null_mut(),
            1 if !self.released.is_empty() => {
                let a = self.released[self.rng.below(self.released.len() as u64) as usize];
                if self.held(a) {
                    null_mut()
                } else {
                    a as *mut T
                }
            }
            2 => self.pool.cast(),
            3 => self
                .participants
                .first()
                .map_or(null_mut(), |p| p.cast::<T>()),
            4 => ((self.rng.next_u64() | 1) & 0x7fff_ffff_ffff) as *mut T,
            _ if !live.is_empty() => live[self.rng.below(live.len() as u64) as usize],
            _ => null_mut(),
        }
    }

    /// A pointer to `buf` or NULL (one time in eight).
    fn ptr_or_null<T>(&mut self, buf: *mut T) -> *mut T {
        if self.rng.below(8) == 0 {
            null_mut()
        } else {
            buf
        }
    }

    /// A length of at most `cap`, biased towards 0, 1 and `cap`.
    fn len(&mut self, cap: usize) -> usize {
        match self.rng.below(6) {
            0 => 0,
            1 => 1.min(cap),
            2 => cap,
            _ => self.rng.below(cap as u64 + 1) as usize,
        }
    }

    fn partition_of(&self, p: *mut cxlkv_participant) -> Option<u32> {
        let mut part = u32::MAX;
        (cxlkv_participant_id(p, null_mut(), &mut part) == CXLKV_OK && part != u32::MAX)
            .then_some(part)
    }

    /// Checks bytes read under `key` against the model.
    fn check_read(&mut self, key: cxlkv_key, got: &[u8], how: &str) {
        self.counts.reads_checked += 1;
        let ok = self
            .model
            .iter()
            .any(|(&(_, k), v)| k == (key.lo, key.hi) && v.as_slice() == got);
        if !ok {
            self.counts.wrong_reads += 1;
            eprintln!(
                "WRONG READ: {how} of key {:#x} returned {} bytes no put stored",
                key.lo,
                got.len()
            );
        }
    }

    fn release(&mut self, addr: usize) {
        self.released.push(addr);
        if self.released.len() > 64 {
            self.released.remove(0);
        }
    }

    /// One call, drawn at random.
    fn step(&mut self) {
        let live = self.participants.clone();
        let r: cxlkv_result = match self.rng.below(28) {
            0 => {
                let p = self.handle(&live);
                let key = self.key();
                let data = self.bytes(DATA);
                let most = if self.chance(85) { BLOCK } else { DATA };
                let n = self.len(most);
                let kp = if self.rng.below(10) == 0 {
                    null()
                } else {
                    &key
                };
                let dp = self.ptr_or_null(data.as_ptr().cast_mut());
                let r = cxlkv_participant_put(p, kp, dp, n);
                if r == CXLKV_OK {
                    if let Some(part) = self.partition_of(p) {
                        self.model
                            .insert((part, (key.lo, key.hi)), data[..n].to_vec());
                    }
                }
                r
            }
            1 => {
                let p = self.handle(&live);
                let key = self.key();
                let data = self.bytes(BLOCK);
                let n = self.len(BLOCK);
                let mut stored = -7i32;
                let sp = self.ptr_or_null(&mut stored as *mut i32);
                let r = cxlkv_participant_put_if_absent(p, &key, data.as_ptr(), n, sp);
                if r == CXLKV_OK && stored == 1 {
                    if let Some(part) = self.partition_of(p) {
                        self.model
                            .insert((part, (key.lo, key.hi)), data[..n].to_vec());
                    }
                }
                r
            }
            2..=4 => {
                let p = self.handle(&live);
                let key = self.key();
                let mut buf = vec![0u8; DATA];
                let cap = self.len(DATA);
                let mut len = usize::MAX;
                let bp = self.ptr_or_null(buf.as_mut_ptr());
                let lp = self.ptr_or_null(&mut len as *mut usize);
                let r = cxlkv_participant_get(p, &key, bp, cap, lp);
                if r == CXLKV_OK {
                    self.check_read(key, &buf[..len], "get");
                }
                r
            }
            5 => {
                let p = self.handle(&live);
                let key = self.key();
                let r = cxlkv_participant_delete(p, &key);
                if r == CXLKV_OK {
                    if let Some(part) = self.partition_of(p) {
                        self.model.remove(&(part, (key.lo, key.hi)));
                    }
                }
                r
            }
            6 => {
                let p = self.handle(&live);
                let key = self.key();
                let mut out = null_mut();
                let mut data: *const u8 = null();
                let mut len = 0usize;
                let op = self.ptr_or_null(&mut out as *mut *mut cxlkv_pinned);
                let r = cxlkv_participant_pin(p, &key, op, &mut data, &mut len);
                if r == CXLKV_OK {
                    // SAFETY: a successful pin hands out `len` readable bytes at `data`, valid
                    // until the pin is released (below, or later in the run).
                    let got = unsafe { std::slice::from_raw_parts(data, len) }.to_vec();
                    self.check_read(key, &got, "pin");
                    self.pins.push(out);
                }
                r
            }
            7 => {
                let pick = self.pins.len();
                let h = if pick > 0 && self.chance(80) {
                    let at = self.rng.below(pick as u64) as usize;
                    let h = self.pins.swap_remove(at);
                    self.release(h as usize);
                    h
                } else {
                    self.handle(&[])
                };
                cxlkv_pinned_release(h)
            }
            8 => {
                let p = self.handle(&live);
                let key = self.key();
                let len = match self.rng.below(4) {
                    0 => self.rng.next_u64() as usize,
                    _ => self.len(BLOCK + 10),
                };
                let mut out = null_mut();
                let mut data: *mut u8 = null_mut();
                let dp = self.ptr_or_null(&mut data as *mut *mut u8);
                let r = cxlkv_participant_reserve(p, &key, len, &mut out, dp);
                if r == CXLKV_OK {
                    let bytes = self.bytes(len);
                    // SAFETY: a successful reservation hands out `len` writable bytes at `data`,
                    // valid until it is committed or aborted.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, len) };
                    let part = self.partition_of(p).unwrap_or(u32::MAX);
                    self.reservations.push((out, part, key, bytes));
                }
                r
            }
            9 => {
                if !self.reservations.is_empty() && self.chance(80) {
                    let at = self.rng.below(self.reservations.len() as u64) as usize;
                    let (h, part, key, bytes) = self.reservations.swap_remove(at);
                    self.release(h as usize);
                    if self.chance(50) {
                        let r = cxlkv_reservation_commit(h);
                        if r == CXLKV_OK {
                            self.model.insert((part, (key.lo, key.hi)), bytes);
                        }
                        r
                    } else {
                        cxlkv_reservation_abort(h)
                    }
                } else {
                    let h = self.handle(&[]);
                    if self.chance(50) {
                        cxlkv_reservation_commit(h)
                    } else {
                        cxlkv_reservation_abort(h)
                    }
                }
            }
            10 | 11 => self.batch(&live),
            12 => {
                if self.participants.len() < 3 || self.chance(10) {
                    let pool = self.handle(&[self.pool]);
                    let mut out = null_mut();
                    let op = self.ptr_or_null(&mut out as *mut *mut cxlkv_participant);
                    let r = cxlkv_participant_attach(pool, op);
                    if r == CXLKV_OK {
                        self.participants.push(out);
                    }
                    r
                } else {
                    CXLKV_OK
                }
            }
            13 => {
                // Detach one (pins and reservations keep it attached until they are released).
                if !self.participants.is_empty() && self.chance(30) {
                    let at = self.rng.below(self.participants.len() as u64) as usize;
                    let h = self.participants.swap_remove(at);
                    self.release(h as usize);
                    cxlkv_participant_detach(h)
                } else {
                    // Usually not a live participant; but `handle` may draw the first live one,
                    // which then leaves the run's list like the one detached above.
                    let h = self.handle(&[]);
                    if let Some(at) = self.participants.iter().position(|&p| p == h) {
                        self.participants.swap_remove(at);
                        self.release(h as usize);
                    }
                    cxlkv_participant_detach(h)
                }
            }
            14 => {
                let p = self.handle(&live);
                let mut id = 0u32;
                let mut part = 0u32;
                let ip = self.ptr_or_null(&mut id as *mut u32);
                let pp = self.ptr_or_null(&mut part as *mut u32);
                cxlkv_participant_id(p, ip, pp)
            }
            15 => {
                let p = self.handle(&live);
                let mut buf = [0u64; 16];
                buf[0] = self.rng.below(129);
                let sp = self.ptr_or_null(buf.as_mut_ptr().cast::<cxlkv_stats>());
                cxlkv_participant_stats(p, sp)
            }
            16 => {
                let pool = self.handle(&[self.pool]);
                let mut buf = [0u64; 16];
                buf[0] = self.rng.below(129);
                let ip = self.ptr_or_null(buf.as_mut_ptr().cast::<cxlkv_pool_info>());
                cxlkv_pool_describe(pool, ip)
            }
            17 => {
                let pool = self.handle(&[self.pool]);
                let keys: Vec<cxlkv_key> = (0..8).map(|_| self.key()).collect();
                let n = self.len(8);
                let mut found = 0usize;
                let kp = self.ptr_or_null(keys.as_ptr().cast_mut());
                let fp = self.ptr_or_null(&mut found as *mut usize);
                cxlkv_pool_lookup_prefix(pool, kp, n, fp)
            }
            18 => {
                let pool = self.handle(&[self.pool]);
                let mut base: *mut std::ffi::c_void = null_mut();
                let mut len = 0usize;
                let bp = self.ptr_or_null(&mut base as *mut *mut std::ffi::c_void);
                cxlkv_pool_mapping(pool, bp, &mut len)
            }
            19 => {
                let bytes = self.bytes(64);
                let n = self.len(64);
                let mut key = cxlkv_key::default();
                let bp = self.ptr_or_null(bytes.as_ptr().cast_mut());
                let kp = self.ptr_or_null(&mut key as *mut cxlkv_key);
                cxlkv_key_from_bytes(bp, n, kp)
            }
            20 => {
                let tokens: Vec<u32> = (0..32).map(|_| self.rng.below(50_000) as u32).collect();
                let mut keys = [cxlkv_key::default(); 8];
                let (nt, cap) = (self.len(32), self.len(8));
                let chunk = self.rng.below(6) as usize;
                let (l0, l1) = (self.rng.below(4) as u32, self.rng.below(4) as u32);
                let mut n_keys = 0usize;
                let ns = [c"tenant".as_ptr(), c"".as_ptr(), null()][self.rng.below(3) as usize];
                let model = self.ptr_or_null(c"model".as_ptr().cast_mut());
                let tp = self.ptr_or_null(tokens.as_ptr().cast_mut());
                let kp = self.ptr_or_null(keys.as_mut_ptr());
                let np = self.ptr_or_null(&mut n_keys as *mut usize);
                cxlkv_key_chain(ns, model, l0, l1, tp, nt, chunk, kp, cap, np)
            }
            21 => {
                // Create on a bad or fresh spec with a random config; what is created is removed.
                let mut cfg = [0u32; 32];
                for w in cfg.iter_mut() {
                    *w = match self.rng.below(4) {
                        0 => 0,
                        1 => self.rng.below(16) as u32,
                        _ => self.rng.next_u64() as u32,
                    };
                }
                cfg[0] = self.rng.below(129) as u32;
                if self.chance(50) {
                    let base = cxlkv_pool_config_default();
                    cfg[1] = 2;
                    cfg[2] = 4096;
                    cfg[3] = 0;
                    cfg[4] = base.lease_ms;
                    cfg[5] = self.rng.below(2) as u32;
                }
                let spec = match self.rng.below(4) {
                    0 => c"bogus:x".to_owned(),
                    1 => c"shm:".to_owned(),
                    _ => CString::new(format!("shm:cxlkv-ffi-fuzz-new-{}", std::process::id()))
                        .unwrap(),
                };
                let size = [0, 4096, 4 << 20, self.rng.next_u64()][self.rng.below(4) as usize];
                let mut out = null_mut();
                let cp = self.ptr_or_null(cfg.as_mut_ptr().cast::<cxlkv_pool_config>());
                let r = cxlkv_pool_create(spec.as_ptr(), size, cp, &mut out);
                if r == CXLKV_OK {
                    assert_eq!(cxlkv_pool_close(out), CXLKV_OK);
                    self.release(out as usize);
                }
                let _ = cxlkv_pool_unlink(spec.as_ptr());
                r
            }
            22 => {
                let spec = match self.rng.below(3) {
                    0 => self.spec.clone(),
                    1 => c"shm:cxlkv-ffi-fuzz-absent".to_owned(),
                    _ => c"file:/nonexistent/x".to_owned(),
                };
                let mut out = null_mut();
                let sp = if self.chance(10) {
                    null()
                } else {
                    spec.as_ptr()
                };
                let r = cxlkv_pool_open(sp, &mut out);
                if r == CXLKV_OK {
                    assert_eq!(cxlkv_pool_close(out), CXLKV_OK);
                    self.release(out as usize);
                }
                r
            }
            23 => {
                let (salt, bytes) = (self.bytes(32), self.bytes(64));
                let (ns, n) = (self.len(32), self.len(64));
                let mut key = cxlkv_key::default();
                let sp = self.ptr_or_null(salt.as_ptr().cast_mut());
                let bp = self.ptr_or_null(bytes.as_ptr().cast_mut());
                let kp = self.ptr_or_null(&mut key as *mut cxlkv_key);
                cxlkv_key_from_bytes_salted(sp, ns, bp, n, kp)
            }
            24 => {
                let salt = self.bytes(32);
                let tokens: Vec<u32> = (0..32).map(|_| self.rng.below(50_000) as u32).collect();
                let mut keys = [cxlkv_key::default(); 8];
                let (ns_len, nt, cap) = (self.len(32), self.len(32), self.len(8));
                let chunk = self.rng.below(6) as usize;
                let mut n_keys = 0usize;
                let sp = self.ptr_or_null(salt.as_ptr().cast_mut());
                let model = self.ptr_or_null(c"model".as_ptr().cast_mut());
                let tp = self.ptr_or_null(tokens.as_ptr().cast_mut());
                let kp = self.ptr_or_null(keys.as_mut_ptr());
                let np = self.ptr_or_null(&mut n_keys as *mut usize);
                cxlkv_key_chain_salted(
                    sp,
                    ns_len,
                    c"ns".as_ptr(),
                    model,
                    0,
                    1,
                    tp,
                    nt,
                    chunk,
                    kp,
                    cap,
                    np,
                )
            }
            25 => {
                let p = self.handle(&live);
                let keys: Vec<cxlkv_key> = (0..4).map(|_| self.key()).collect();
                let n = self.len(4);
                let mut found = 0usize;
                let kp = self.ptr_or_null(keys.as_ptr().cast_mut());
                let fp = self.ptr_or_null(&mut found as *mut usize);
                cxlkv_participant_lookup_prefix(p, kp, n, fp)
            }
            26 => {
                let p = self.handle(&live);
                let mut t = 0u32;
                let tp = self.ptr_or_null(&mut t as *mut u32);
                cxlkv_participant_tenant(p, tp)
            }
            _ => {
                let mut buf = [0 as c_char; 64];
                let cap = self.len(64);
                let bp = self.ptr_or_null(buf.as_mut_ptr());
                cxlkv_result_message(self.rng.next_u64() as u32 % 40, bp, cap);
                cxlkv_last_error_message(bp, cap);
                CXLKV_OK
            }
        };
        self.counts.calls += 1;
        if r == CXLKV_ERR_PANIC {
            self.counts.crashes += 1;
        }
        if r == CXLKV_OK {
            self.counts.ok += 1;
        } else {
            self.counts.errors += 1;
        }
    }

    /// A put, get or contains batch with random counts, NULL arrays and short buffers.
    fn batch(&mut self, live: &[*mut cxlkv_participant]) -> cxlkv_result {
        let p = self.handle(live);
        let n = self.len(6);
        let keys: Vec<cxlkv_key> = (0..6).map(|_| self.key()).collect();
        let mut results = [CXLKV_ERR_IO; 6];
        let kp = self.ptr_or_null(keys.as_ptr().cast_mut());
        let rp = self.ptr_or_null(results.as_mut_ptr());
        match self.rng.below(3) {
            0 => {
                let bufs: Vec<Vec<u8>> = (0..6).map(|_| self.bytes(BLOCK)).collect();
                let lens: Vec<usize> = (0..6).map(|_| self.len(BLOCK)).collect();
                let ptrs: Vec<*const u8> = bufs
                    .iter()
                    .map(|b| if self.chance(5) { null() } else { b.as_ptr() })
                    .collect();
                let pp = self.ptr_or_null(ptrs.as_ptr().cast_mut());
                let lp = self.ptr_or_null(lens.as_ptr().cast_mut());
                let r = cxlkv_participant_put_batch(p, n, kp, pp, lp, rp);
                if !kp.is_null() && !rp.is_null() && !pp.is_null() && !lp.is_null() {
                    if let Some(part) = self.partition_of(p) {
                        for i in 0..n {
                            if results[i] == CXLKV_OK {
                                let k = (keys[i].lo, keys[i].hi);
                                self.model.insert((part, k), bufs[i][..lens[i]].to_vec());
                            }
                        }
                    }
                }
                r
            }
            1 => {
                let mut bufs: Vec<Vec<u8>> = (0..6).map(|_| vec![0u8; BLOCK]).collect();
                let caps: Vec<usize> = (0..6).map(|_| self.len(BLOCK)).collect();
                let mut lens = [usize::MAX; 6];
                let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
                let pp = self.ptr_or_null(ptrs.as_ptr().cast_mut());
                let cp = self.ptr_or_null(caps.as_ptr().cast_mut());
                let lp = self.ptr_or_null(lens.as_mut_ptr());
                let r = cxlkv_participant_get_batch(p, n, kp, pp, cp, lp, rp);
                if !kp.is_null() && !rp.is_null() && !pp.is_null() && !lp.is_null() {
                    for i in 0..n {
                        if results[i] == CXLKV_OK {
                            let got = bufs[i][..lens[i]].to_vec();
                            self.check_read(keys[i], &got, "get_batch");
                        }
                    }
                }
                r
            }
            _ => {
                let pool = self.handle(&[self.pool]);
                let mut present = [7u8; 6];
                let pp = self.ptr_or_null(present.as_mut_ptr());
                cxlkv_pool_contains_batch(pool, n, kp, pp)
            }
        }
    }
}

/// Pin entries held in every participant slot of `pool`.
fn pins_held(pool: &Pool) -> u64 {
    let sb = pool.superblock();
    let layout = sb.slot_layout();
    let mut held = 0;
    for q in 0..u64::from(sb.participants) {
        let base = sb.participant_table_off + q * layout.size;
        for e in 0..layout.pins {
            let off = base + layout.pin(e) + pin::SEQ;
            held += u64::from(pool.memory().load_u64(off, Ordering::Acquire).unwrap() != 0);
        }
    }
    held
}

#[test]
fn malformed_calls_never_crash_misread_or_leak() {
    let calls = env_u64("CXLKV_FFI_FUZZ_CALLS", 5000);
    let seed = env_u64("CXLKV_FFI_FUZZ_SEED", 0xf0_22ed);
    let name = format!("shm:cxlkv-ffi-fuzz-{}", std::process::id());
    let spec = CString::new(name.clone()).unwrap();
    let mut cfg = cxlkv_pool_config_default();
    cfg.block_size = BLOCK as u64;
    cfg.participants = 4;
    cfg.lease_ms = 60_000;
    let mut pool = null_mut();
    assert_eq!(
        cxlkv_pool_create(spec.as_ptr(), 4 << 20, &cfg, &mut pool),
        CXLKV_OK
    );
    // Found by this loop: a block size so large that the "cannot hold" message's arithmetic
    // overflowed panicked inside `cxlkv_pool_create` instead of refusing the config.
    let mut huge = cfg;
    huge.block_size = (u64::MAX / 3) & !4095;
    let mut out = null_mut();
    let absent = c"shm:cxlkv-ffi-fuzz-huge";
    assert_eq!(
        cxlkv_pool_create(absent.as_ptr(), 4 << 20, &huge, &mut out),
        CXLKV_ERR_INVALID_ARG
    );
    let mut msg = [0 as c_char; 256];
    cxlkv_last_error_message(msg.as_mut_ptr(), msg.len());
    // SAFETY: the library NUL-terminates what it writes into `msg`.
    let msg = unsafe { std::ffi::CStr::from_ptr(msg.as_ptr()) }.to_string_lossy();
    assert!(msg.contains("cannot hold"), "{msg}");
    let mut f = Fuzz {
        rng: SplitMix64::new(seed),
        pool,
        participants: Vec::new(),
        pins: Vec::new(),
        reservations: Vec::new(),
        released: Vec::new(),
        model: HashMap::new(),
        counts: Counts::default(),
        spec: spec.clone(),
    };
    let start = std::time::Instant::now();
    for _ in 0..calls {
        f.step();
    }
    let elapsed = start.elapsed();
    // Release everything the run still holds; each release succeeds once and is refused again.
    let mut handles = HashSet::new();
    for h in std::mem::take(&mut f.pins) {
        assert_eq!(cxlkv_pinned_release(h), CXLKV_OK);
        assert_eq!(cxlkv_pinned_release(h), CXLKV_ERR_INVALID_HANDLE);
        handles.insert(h as usize);
    }
    for (h, ..) in std::mem::take(&mut f.reservations) {
        assert_eq!(cxlkv_reservation_abort(h), CXLKV_OK);
        handles.insert(h as usize);
    }
    for h in std::mem::take(&mut f.participants) {
        assert_eq!(cxlkv_participant_detach(h), CXLKV_OK);
        assert_eq!(cxlkv_participant_detach(h), CXLKV_ERR_INVALID_HANDLE);
        handles.insert(h as usize);
    }
    assert_eq!(cxlkv_pool_close(f.pool), CXLKV_OK);

    // Leaks: the pool, opened afresh, holds no participant slot, no pin and no damage.
    let backend: Backend = name.parse().unwrap();
    let opened = Pool::open_on(&backend, &RegionOptions::default()).unwrap();
    let report = check(&opened).unwrap();
    let pins = pins_held(&opened);
    let slots = report.held_participants;
    drop(opened);
    assert_eq!(cxlkv_pool_unlink(spec.as_ptr()), CXLKV_OK);
    let c = &f.counts;
    println!(
        "C ABI: {} calls in {elapsed:.1?} (seed {seed:#x}; CXLKV_FFI_FUZZ_CALLS/_SEED): {} ok, {} \
         refused; crashes {}, wrong reads {} of {} checked, leaks: participant slots {slots}, \
         pins {pins}, damage {}",
        c.calls,
        c.ok,
        c.errors,
        c.crashes,
        c.wrong_reads,
        c.reads_checked,
        report.errors.len()
    );
    assert_eq!(c.crashes, 0, "calls panicked inside the library");
    assert_eq!(c.wrong_reads, 0, "reads returned bytes no put stored");
    assert_eq!(
        (slots, pins),
        (0, 0),
        "handles released but slots or pins held"
    );
    assert!(report.ok(), "damage after the run: {:?}", report.errors);
    // The run must have exercised what it claims: successes, refusals and checked reads.
    assert!(c.ok > calls / 10 && c.errors > calls / 10 && c.reads_checked > calls / 100);
}
