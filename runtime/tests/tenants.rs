//! Tenants inside one pool (format 3.2), in one process: a block whose tenant word differs from
//! the reader's is refused even in a partition the reader may probe; quotas evict only the
//! tenant's own blocks and refuse a put when all of them are pinned; no participant takes over a
//! partition holding another tenant's blocks; a software-coherent pool attaches only declared
//! tenants, a hardware-coherent one registers others. `tests/tenants.rs` (root crate) shows the same
//! across processes.

use cxlkv_runtime::region::Region;
use cxlkv_runtime::tenant::{self, Tenant};
use cxlkv_runtime::{Key, Participant, Pool, PoolConfig, PoolError};
use std::sync::Arc;

fn pool() -> Pool {
    let mem = Region::anonymous(16 << 20).unwrap();
    let cfg = PoolConfig {
        block_size: 64 << 10,
        participants: 4,
        ..PoolConfig::default()
    };
    Pool::create(Arc::new(mem), &cfg).unwrap()
}

/// Live blocks of the tenant `name`, as `cxlkv pool stat` reads them.
fn blocks_of(pool: &Pool, name: &str) -> u64 {
    tenant::usage(pool)
        .unwrap()
        .into_iter()
        .find(|t| t.name == name)
        .map_or(0, |t| t.blocks)
}

#[test]
fn a_block_of_another_tenant_is_refused_even_in_a_readable_partition() {
    let pool = pool();
    let public = pool.attach().unwrap();
    let key = Key::from_bytes(b"k");
    let loc = public.put(key, b"public bytes").unwrap();
    assert_eq!(pool.get(key).unwrap().unwrap().0, b"public bytes");
    // Forge the block's tenant word (outside the header CRC): tenant 0's readers refuse it,
    // tenant 5's accept it, since its partition is tagged 0.
    let sb = pool.superblock();
    let off = pool.partition_offset(loc.partition).unwrap()
        + sb.block_headers_off
        + 64 * u64::from(loc.block)
        + 56;
    pool.memory().write(off, &5u32.to_le_bytes()).unwrap();
    assert!(pool.get(key).unwrap().is_none());
    assert!(public.get(key).unwrap().is_none());
    assert!(public.pin(key).unwrap().is_none());
    assert_eq!(pool.scoped(5).get(key).unwrap().unwrap().0, b"public bytes");
    assert!(pool.scoped(6).get(key).unwrap().is_none());
    let report = cxlkv_runtime::check(&pool).unwrap();
    assert!(
        report.errors.iter().any(|e| e.what.contains("tenant 5")),
        "{report}"
    );
}

#[test]
fn quotas_evict_only_the_tenants_own_and_refuse_when_all_are_pinned() {
    let pool = pool();
    tenant::declare(&pool, "a", 3).unwrap();
    let other = Participant::attach_as(&pool, &Tenant::new("b", b"sb").unwrap()).unwrap();
    for i in 0..5u8 {
        other.put(Key::from_bytes(&[b'b', i]), &[i; 100]).unwrap();
    }
    let a = Participant::attach_as(&pool, &Tenant::new("a", b"sa").unwrap()).unwrap();
    assert_ne!(a.partition(), other.partition());
    let keys: Vec<Key> = (0..3u8).map(|i| Key::from_bytes(&[b'a', i])).collect();
    for (i, &k) in keys.iter().enumerate() {
        a.put(k, &[i as u8; 100]).unwrap();
    }
    assert_eq!(blocks_of(&pool, "a"), 3);
    // At the quota: the put evicts a's least recently used block, never b's.
    a.put(Key::from_bytes(b"a3"), &[3; 100]).unwrap();
    assert_eq!(blocks_of(&pool, "a"), 3);
    assert!(a.get(keys[0]).unwrap().is_none());
    assert_eq!(a.stats().evictions, 1);
    for i in 0..5u8 {
        let k = Key::from_bytes(&[b'b', i]);
        assert_eq!(other.get(k).unwrap().unwrap().0, vec![i; 100]);
    }
    // Every block of a pinned: nothing of its own to evict.
    let pins: Vec<_> = [keys[1], keys[2], Key::from_bytes(b"a3")]
        .iter()
        .map(|&k| a.pin(k).unwrap().unwrap())
        .collect();
    assert!(matches!(
        a.put(Key::from_bytes(b"a4"), b"x"),
        Err(PoolError::QuotaExceeded {
            tenant: 1,
            quota: 3
        })
    ));
    drop(pins);
    a.put(Key::from_bytes(b"a4"), b"x").unwrap();
    let rows = tenant::usage(&pool).unwrap();
    let row = rows.iter().find(|r| r.name == "a").unwrap();
    assert_eq!((row.partitions, row.blocks, row.quota), (1, 3, 3));
}

#[test]
fn nobody_takes_a_partition_holding_another_tenants_blocks() {
    let pool = pool();
    let a = Participant::attach_as(&pool, &Tenant::new("a", b"sa").unwrap()).unwrap();
    let pa = a.partition().unwrap();
    a.put(Key::from_bytes(b"x"), b"a's").unwrap();
    drop(a); // detached: the partition is free, tagged a, with one live block
    let mut others = Vec::new();
    for _ in 0..3 {
        let b = Participant::attach_as(&pool, &Tenant::new("b", b"sb").unwrap()).unwrap();
        assert_ne!(b.partition(), Some(pa));
        others.push(b);
    }
    // Tenant-less participants take none of a's either: the pool's 4 partitions are all
    // taken but a's, so this one gets no partition at all.
    let none = pool.attach().unwrap();
    assert_eq!(none.partition(), None);
    drop(none);
    let a = Participant::attach_as(&pool, &Tenant::new("a", b"sa").unwrap()).unwrap();
    assert_eq!(a.partition(), Some(pa));
    assert_eq!(a.get(Key::from_bytes(b"x")).unwrap().unwrap().0, b"a's");
}

#[test]
fn a_software_coherent_pool_attaches_only_declared_tenants() {
    let mem = Region::anonymous(16 << 20).unwrap();
    let cfg = PoolConfig {
        block_size: 64 << 10,
        participants: 4,
        coherence: cxlkv_runtime::CoherenceMode::Software,
        ..PoolConfig::default()
    };
    let pool = Pool::create(Arc::new(mem), &cfg).unwrap();
    let carol = Tenant::new("carol", b"sc").unwrap();
    assert!(matches!(
        Participant::attach_as(&pool, &carol),
        Err(PoolError::UnknownTenant(name)) if name == "carol"
    ));
    assert!(
        tenant::list(&pool).unwrap().is_empty(),
        "nothing registered"
    );
    tenant::declare(&pool, "carol", 0).unwrap();
    let p = Participant::attach_as(&pool, &carol).unwrap();
    assert_eq!(p.tenant_id(), 1);
    p.put(carol.key_from_bytes(b"k"), b"v").unwrap();
    assert_eq!(p.get(carol.key_from_bytes(b"k")).unwrap().unwrap().0, b"v");
    // On a hardware-coherent pool an undeclared name registers with the default quota.
    let hw = pool_with_default_quota(5);
    let dave = Participant::attach_as(&hw, &Tenant::new("dave", b"sd").unwrap()).unwrap();
    let row = tenant::find(&hw, "dave").unwrap().unwrap();
    assert_eq!((row.id, row.quota, dave.tenant_id()), (1, 5, 1));
}

fn pool_with_default_quota(quota: u64) -> Pool {
    let p = pool();
    tenant::set_default_quota(&p, quota).unwrap();
    p
}
