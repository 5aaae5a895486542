//! The pool-wide metrics: what every participant publishes in its slot and each partition's
//! occupancy, from one [`PoolStats`] reading (`cxlkv pool stat --prometheus`).
//!
//! Participants carry the labels `participant` (slot) and `pid`; partitions `partition`. A
//! participant's `cxlkv_pool_participant_occupancy_ratio` is its partition's indexed blocks over
//! its capacity (absent for a participant without a partition, such as a device). Tenants (format
//! 3.2) carry `tenant` (id) and `name`: their live blocks, quota and partitions.

use super::encode_registry;
use crate::stats::PoolStats;
use crate::watch::Liveness;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(&'static str, String)>;
type Counters = Family<Labels, Counter>;
type Gauges = Family<Labels, Gauge>;
type Ratios = Family<Labels, Gauge<f64, AtomicU64>>;

/// The text exposition of `st` (ends with `# EOF`).
pub fn encode_pool(st: &PoolStats) -> String {
    let mut reg = Registry::default();
    register_pool(st, &mut reg);
    encode_registry(&reg)
}

/// Adds the metrics of `st` to `reg`.
pub fn register_pool(st: &PoolStats, reg: &mut Registry) {
    let counter_names: [(&str, &str); crate::format::counters::COUNT as usize] = [
        ("puts", "Blocks this participant stored"),
        ("hits", "Gets that found their key"),
        ("misses", "Gets that did not find their key"),
        (
            "retries",
            "Optimistic reads retried after a concurrent write",
        ),
        (
            "evictions",
            "Blocks evicted from its partition to make room",
        ),
        ("deletes", "Blocks it deleted"),
        ("pins", "Pins it took"),
        ("bytes_in", "Payload bytes its puts wrote"),
        ("bytes_out", "Payload bytes its gets copied out"),
        (
            "fallbacks",
            "Device requests the host answered because the device was unavailable or unsupported",
        ),
        ("pin_full", "Pins refused because its pin table was full"),
    ];
    let counters: Vec<Counters> = counter_names.iter().map(|_| Family::default()).collect();
    let live = Gauges::default();
    let heartbeat = Counters::default();
    let occupancy = Ratios::default();
    let part_blocks = Gauges::default();
    let part_capacity = Gauges::default();
    let part_tombstones = Gauges::default();
    let part_occupancy = Ratios::default();
    let partitions = &st.partitions;
    let ratio = |blocks: u64, capacity: u64| blocks as f64 / capacity.max(1) as f64;

    for p in &st.participants {
        let l: Labels = vec![
            ("participant", p.id.to_string()),
            ("pid", p.pid.to_string()),
        ];
        for ((f, (name, v)), (want, _)) in
            counters.iter().zip(p.counters.named()).zip(&counter_names)
        {
            debug_assert_eq!(name, *want);
            f.get_or_create(&l).inc_by(v);
        }
        live.get_or_create(&l).set(match p.liveness {
            Liveness::Live => 1,
            Liveness::Dead => 0,
            Liveness::Free | Liveness::Unknown => -1,
        });
        heartbeat.get_or_create(&l).inc_by(p.heartbeat);
        if let Some(part) = p
            .partition
            .and_then(|x| partitions.iter().find(|q| q.id == x))
        {
            occupancy
                .get_or_create(&l)
                .set(ratio(part.blocks, part.capacity));
        }
    }
    for p in partitions {
        let l: Labels = vec![("partition", p.id.to_string())];
        part_blocks.get_or_create(&l).set(p.blocks as i64);
        part_capacity.get_or_create(&l).set(p.capacity as i64);
        part_tombstones.get_or_create(&l).set(p.tombstones as i64);
        part_occupancy
            .get_or_create(&l)
            .set(ratio(p.blocks, p.capacity));
    }

    let tenant_blocks = Gauges::default();
    let tenant_quota = Gauges::default();
    let tenant_partitions = Gauges::default();
    for t in &st.tenants {
        let l: Labels = vec![("tenant", t.id.to_string()), ("name", t.name.clone())];
        tenant_blocks.get_or_create(&l).set(t.blocks as i64);
        tenant_quota.get_or_create(&l).set(t.quota as i64);
        tenant_partitions
            .get_or_create(&l)
            .set(i64::from(t.partitions));
    }

    for ((name, help), f) in counter_names.iter().zip(counters) {
        reg.register(format!("cxlkv_pool_participant_{name}"), *help, f);
    }
    reg.register(
        "cxlkv_pool_participant_live",
        "1 when the heartbeat counter moved during the watch, 0 when it stood still longer than \
         the lease, -1 when the watch could not tell",
        live,
    );
    reg.register(
        "cxlkv_pool_participant_heartbeat",
        "The participant's heartbeat counter",
        heartbeat,
    );
    reg.register(
        "cxlkv_pool_participant_occupancy_ratio",
        "Indexed blocks of the participant's partition over its capacity",
        occupancy,
    );
    reg.register(
        "cxlkv_pool_partition_blocks",
        "Blocks indexed in the partition",
        part_blocks,
    );
    reg.register(
        "cxlkv_pool_partition_capacity_blocks",
        "Blocks the partition holds",
        part_capacity,
    );
    reg.register(
        "cxlkv_pool_partition_tombstones",
        "Tombstones in the partition's index",
        part_tombstones,
    );
    reg.register(
        "cxlkv_pool_partition_occupancy_ratio",
        "Indexed blocks over capacity",
        part_occupancy,
    );
    reg.register(
        "cxlkv_pool_tenant_blocks",
        "Live blocks of the tenant (tenant 0: the public space of tenant-less participants)",
        tenant_blocks,
    );
    reg.register(
        "cxlkv_pool_tenant_quota_blocks",
        "Blocks the tenant may hold (0 = unlimited)",
        tenant_quota,
    );
    reg.register(
        "cxlkv_pool_tenant_partitions",
        "Partitions tagged with the tenant",
        tenant_partitions,
    );
}
