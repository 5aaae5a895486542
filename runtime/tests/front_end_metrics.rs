//! The one metrics scenario every front end runs (here through the Rust API; `ffi/tests/metrics.c`
//! through the C ABI; `python/tests/test_metrics_front_ends.py` through Python), with the same
//! expected numbers, because the runtime counts inside its operations
//! (`cxlkv_runtime::metrics`): on a fresh pool (8 MiB, blocks of 4096 bytes, 2 participants),
//! 3 puts of 100 bytes, one put too large for the pool (fails: an error, no bytes), a put-if-absent
//! of a present key (a put of 0 bytes), 2 gets that hit, 1 that misses and 1 into a 10-byte buffer
//! (fails), a pin, a delete and a delete of an absent key (a miss).
//!
//! Its own test binary, so no other test of this process records in the registry meanwhile.

use cxlkv_runtime::metrics::{global, MetricsSnapshot, Op, OpSnapshot};
use cxlkv_runtime::{Key, Pool, PoolConfig, Region};
use std::sync::Arc;

/// (ok, miss, error, bytes_in, bytes_out, calls timed) of `op` between two snapshots.
fn delta(before: &MetricsSnapshot, after: &MetricsSnapshot, op: Op) -> [u64; 6] {
    let f = |s: OpSnapshot| {
        [
            s.ok,
            s.miss,
            s.error,
            s.bytes_in,
            s.bytes_out,
            s.latency.count,
        ]
    };
    let (a, b) = (f(after.op(op)), f(before.op(op)));
    std::array::from_fn(|i| a[i] - b[i])
}

#[test]
fn the_front_end_scenario_counts_each_call_once() {
    let cfg = PoolConfig {
        block_size: 4096,
        participants: 2,
        ..Default::default()
    };
    let pool = Pool::create(Arc::new(Region::anonymous(8 << 20).unwrap()), &cfg).unwrap();
    let me = pool.attach().unwrap();
    let before = global().snapshot();

    let k = |i: u64| Key::from_parts(i, 7);
    for i in 0..3 {
        me.put(k(i), &[i as u8; 100]).unwrap();
    }
    assert!(me.put(k(9), &vec![0u8; (8 << 20) + 1]).is_err());
    assert!(!me.put_if_absent(k(1), &[1; 100]).unwrap().stored());
    let mut buf = [0u8; 256];
    assert_eq!(me.get_into(k(0), &mut buf).unwrap().unwrap().len, 100);
    assert_eq!(me.get(k(1)).unwrap().unwrap().0.len(), 100);
    assert!(me
        .get_into(Key::from_parts(99, 99), &mut buf)
        .unwrap()
        .is_none());
    assert!(me.get_into(k(2), &mut [0u8; 10]).is_err());
    drop(me.pin(k(2)).unwrap().unwrap());
    assert!(me.delete(k(0)).unwrap());
    assert!(!me.delete(Key::from_parts(99, 99)).unwrap());

    let after = global().snapshot();
    // [ok, miss, error, bytes_in, bytes_out, calls timed]
    assert_eq!(delta(&before, &after, Op::Put), [4, 0, 1, 300, 0, 5]);
    assert_eq!(delta(&before, &after, Op::Get), [2, 1, 1, 0, 200, 4]);
    assert_eq!(delta(&before, &after, Op::Pin), [1, 0, 0, 0, 100, 1]);
    assert_eq!(delta(&before, &after, Op::Delete), [1, 1, 0, 0, 0, 2]);
}
