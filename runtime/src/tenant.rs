//! Tenants inside one pool (format 3.2): who may read which blocks, and how many blocks each may
//! hold.
//!
//! A tenant is a name an operator declares in the pool's tenant table (in the superblock page,
//! [`format::tenant_table`]) with a quota in blocks; its id is its entry's index plus one, and id
//! 0 is the pool's public space (tenant-less participants, every block written before 3.2). A
//! participant attaches as a tenant ([`Participant::attach_as`](crate::Participant::attach_as))
//! with the tenant's secret salt, which never enters the pool: it salts the tenant's keys
//! ([`Tenant::key_chain`]), so no other tenant can form them.
//!
//! Invariants the runtime keeps:
//! - A partition holds the blocks of one tenant, named by its tag ([`format::partition::TENANT`]).
//!   A participant of tenant T claims only a partition tagged T or one with no live blocks (which
//!   it then tags T).
//! - A reader of tenant R (a participant of R, or a [`Pool`] handle scoped to R with
//!   [`Pool::for_tenant`]) probes only partitions tagged R or 0 and accepts only blocks whose
//!   header says R or 0. A tenant-less reader sees tenant 0 alone. So a tenant's lookups never
//!   touch another tenant's partitions, and their time cannot depend on what those hold.
//! - A tenant's use is the sum of the live-block counts ([`format::partition::LIVE`]) of the
//!   partitions tagged with it. A put of a tenant at its quota first evicts that tenant's own
//!   least recently used block (from the writer's own partition, which only holds its tenant's
//!   blocks); with nothing to evict it fails with [`PoolError::QuotaExceeded`]. Writers of one
//!   tenant in several processes each read the use before they put, so together they may overshoot
//!   the quota by at most one block each.
//!
//! What this does not stop: a process that can map the pool can read and write any byte of it,
//! including its own slot's tenant word. Tenants inside a pool are enforced by the runtime among
//! cooperating processes; the pool (its file's owner, group and mode) is the boundary against
//! a hostile one (docs/SECURITY.md).

use crate::coherence::{self, Site};
use crate::format::{self, partition, tenant_table as tt, CoherenceMode};
use crate::key::{salt_key, Key, KeyChain};
use crate::pool::{Pool, PoolError, Result};
use std::sync::atomic::Ordering;
use xxhash_rust::xxh3::xxh3_64;

/// Tenant scoping of pool handles: which partitions and blocks a handle reads.
impl Pool {
    /// True when this handle's tenant may read partition `p`: it is tagged with that tenant or
    /// with 0 (format 3.2). Other tenants' partitions are never probed.
    pub(crate) fn reads_partition(&self, p: u32) -> Result<bool> {
        let tag = partition_tenant(self, p)?;
        Ok(tag == 0 || tag == self.tenant)
    }

    /// True when this handle's tenant may read a block of tenant `block_tenant`: its own, or
    /// tenant 0's.
    pub fn reads_tenant(&self, block_tenant: u32) -> bool {
        block_tenant == 0 || block_tenant == self.tenant
    }

    /// The tenant this handle reads as (0: tenant 0's blocks only).
    pub fn tenant(&self) -> u32 {
        self.tenant
    }

    /// A handle on the same mapping that reads as tenant id `tenant` (0: the public space).
    pub fn scoped(&self, tenant: u32) -> Pool {
        Pool {
            inner: self.inner.clone(),
            tenant,
        }
    }

    /// A handle on the same mapping that reads as the declared tenant `name`: it locates only in
    /// that tenant's and tenant 0's partitions and accepts only their blocks. Looks the name up
    /// only ([`PoolError::UnknownTenant`] if it is not declared); it registers nothing.
    pub fn for_tenant(&self, name: &str) -> Result<Pool> {
        let t = find(self, name)?.ok_or_else(|| PoolError::UnknownTenant(name.to_owned()))?;
        Ok(self.scoped(t.id))
    }

    /// How many index probes each partition has had through this mapping (every handle on it,
    /// whatever its tenant), in partition order: shows which partitions a tenant's lookups touch.
    pub fn partition_probes(&self) -> Vec<u64> {
        self.inner
            .probes
            .iter()
            .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
            .collect()
    }
}

/// A tenant a participant attaches as: its name (declared in the pool) and its secret salt (never
/// stored in the pool; only the keys it salts are).
#[derive(Clone)]
pub struct Tenant {
    name: String,
    key: [u8; 32],
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The salt's derived key is a secret: never printed.
        f.debug_struct("Tenant").field("name", &self.name).finish()
    }
}

impl Tenant {
    /// A tenant named `name` (1 to 40 bytes of UTF-8, no NUL) holding the secret `salt` (any
    /// bytes; an empty salt still salts, but every holder of the empty salt forms the same keys).
    pub fn new(name: &str, salt: &[u8]) -> Result<Tenant> {
        check_name(name)?;
        Ok(Tenant {
            name: name.to_owned(),
            key: salt_key(salt),
        })
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tenant's salted key chain ([`KeyChain::salted`]).
    pub fn key_chain(
        &self,
        namespace: &str,
        model: &str,
        layer_first: u32,
        layer_last: u32,
    ) -> KeyChain {
        KeyChain::salted_with_key(&self.key, namespace, model, layer_first, layer_last)
    }

    /// The tenant's salted key of opaque bytes ([`Key::from_bytes_salted`]).
    pub fn key_from_bytes(&self, bytes: &[u8]) -> Key {
        let h = blake3::keyed_hash(&self.key, bytes);
        let mut first = [0u8; 16];
        first.copy_from_slice(&h.as_bytes()[..16]);
        Key(u128::from_le_bytes(first))
    }
}

/// A tenant declared in a pool's tenant table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantInfo {
    /// Its id (1-based; 0 is no tenant).
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Blocks it may hold (0 = unlimited).
    pub quota: u64,
}

/// A tenant's use of a pool, as anyone can read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantUse {
    /// Its id (0: the public space of tenant-less participants).
    pub id: u32,
    /// Its name (`-` for id 0).
    pub name: String,
    /// Blocks it may hold (0 = unlimited).
    pub quota: u64,
    /// Partitions tagged with it.
    pub partitions: u32,
    /// Live blocks in those partitions.
    pub blocks: u64,
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > tt::NAME_MAX || name.contains('\0') {
        return Err(PoolError::BadConfig(format!(
            "tenant name {name:?}: use 1 to {} bytes of UTF-8 without NUL",
            tt::NAME_MAX
        )));
    }
    Ok(())
}

/// The state word of `name`: its hash, never 0 (0 marks a free entry).
fn name_hash(name: &str) -> u64 {
    xxh3_64(name.as_bytes()) | 1
}

/// Line CRC: of the first 60 bytes of a 64-byte line.
fn line_crc(line: &[u8; 64]) -> u32 {
    format::crc32c(&line[..tt::CRC as usize])
}

fn read_line(pool: &Pool, off: u64) -> Result<[u8; 64]> {
    let mut line = [0u8; 64];
    // Pairs with the publish of the line by whoever declared the tenant or set its quota.
    pool.mem().acquire(off, 64);
    pool.mem().read(off, &mut line)?;
    Ok(line)
}

fn word(line: &[u8; 64], at: u64) -> u64 {
    u64::from_le_bytes(
        line[at as usize..at as usize + 8]
            .try_into()
            .expect("8 bytes"),
    )
}

/// Entry `id` if it is declared and its CRC holds (a few attempts, for a concurrent writer).
fn read_entry(pool: &Pool, id: u32) -> Result<Option<TenantInfo>> {
    for _ in 0..crate::pool::READ_RETRIES {
        let line = read_line(pool, tt::entry(id))?;
        let state = word(&line, tt::STATE);
        if state == 0 {
            return Ok(None);
        }
        let stored = u32::from_le_bytes(line[tt::CRC as usize..].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(
            line[tt::NAME_LEN as usize..tt::NAME_LEN as usize + 4]
                .try_into()
                .expect("4 bytes"),
        ) as usize;
        if stored != line_crc(&line) || len > tt::NAME_MAX {
            // Being written (declared or its quota set) right now, or damaged.
            std::thread::yield_now();
            continue;
        }
        let name = &line[tt::NAME as usize..tt::NAME as usize + len];
        let Ok(name) = std::str::from_utf8(name) else {
            return Ok(None);
        };
        if name_hash(name) != state {
            return Ok(None);
        }
        return Ok(Some(TenantInfo {
            id,
            name: name.to_owned(),
            quota: word(&line, tt::QUOTA),
        }));
    }
    Ok(None)
}

/// Writes entry `id` (whose state word the caller holds) with its name and quota, CRC last in
/// the same line, then publishes it.
fn write_entry(pool: &Pool, id: u32, name: &str, quota: u64) -> Result<()> {
    let mut line = [0u8; 64];
    line[..8].copy_from_slice(&name_hash(name).to_le_bytes());
    line[8..16].copy_from_slice(&quota.to_le_bytes());
    line[16..16 + name.len()].copy_from_slice(name.as_bytes());
    line[56..60].copy_from_slice(&(name.len() as u32).to_le_bytes());
    let crc = line_crc(&line);
    line[60..].copy_from_slice(&crc.to_le_bytes());
    let off = tt::entry(id);
    let mem = pool.mem();
    // The state word is already ours (compare-and-swap); the rest of the line follows it.
    mem.write(off + 8, &line[8..])?;
    mem.publish(off, 64);
    Ok(())
}

/// Every tenant declared in `pool`.
pub fn list(pool: &Pool) -> Result<Vec<TenantInfo>> {
    let mut out = Vec::new();
    for id in 1..=tt::ENTRIES {
        if let Some(t) = read_entry(pool, id)? {
            out.push(t);
        }
    }
    Ok(out)
}

/// The tenant named `name`, if declared.
pub fn find(pool: &Pool, name: &str) -> Result<Option<TenantInfo>> {
    let h = name_hash(name);
    for id in 1..=tt::ENTRIES {
        let off = tt::entry(id) + tt::STATE;
        pool.mem().acquire(off, 8);
        if pool.mem().load_u64(off, Ordering::Acquire)? != h {
            continue;
        }
        if let Some(t) = read_entry(pool, id)? {
            if t.name == name {
                return Ok(Some(t));
            }
        }
    }
    Ok(None)
}

/// Declares tenant `name` with `quota` blocks (0 = unlimited) and returns its id; a tenant already
/// declared keeps its quota (use [`set_quota`]). Entries are claimed by compare-and-swap, which
/// several hosts of a software-coherent pool cannot share: declare its tenants at create, before
/// anyone attaches.
pub fn declare(pool: &Pool, name: &str, quota: u64) -> Result<u32> {
    check_name(name)?;
    if let Some(t) = find(pool, name)? {
        return Ok(t.id);
    }
    let h = name_hash(name);
    let mem = pool.mem();
    for id in 1..=tt::ENTRIES {
        let off = tt::entry(id) + tt::STATE;
        mem.acquire(off, 8);
        match mem.compare_exchange_u64(off, 0, h)? {
            Ok(_) => {
                write_entry(pool, id, name, quota)?;
                return Ok(id);
            }
            Err(cur) if cur == h => {
                // Someone declares the same name now (or did, with a colliding hash): theirs is
                // ours once written.
                if let Some(t) = find(pool, name)? {
                    return Ok(t.id);
                }
            }
            Err(_) => {}
        }
    }
    Err(PoolError::TenantTableFull(tt::ENTRIES))
}

/// Sets the quota of declared tenant `name`; returns its id.
pub fn set_quota(pool: &Pool, name: &str, quota: u64) -> Result<u32> {
    let t = find(pool, name)?.ok_or_else(|| PoolError::UnknownTenant(name.to_owned()))?;
    write_entry(pool, t.id, name, quota)?;
    Ok(t.id)
}

/// The quota of tenants registered by attaching ([`resolve`]), set with [`set_default_quota`]:
/// 0 (unlimited) in a pool that never set one.
pub fn default_quota(pool: &Pool) -> Result<u64> {
    let line = read_line(pool, tt::HEADER)?;
    if line.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    let stored = u32::from_le_bytes(line[tt::CRC as usize..].try_into().expect("4 bytes"));
    if stored != line_crc(&line) {
        return Err(PoolError::Geometry(
            "tenant table header fails its CRC".into(),
        ));
    }
    Ok(word(&line, 0))
}

/// Sets the quota that tenants registered by attaching get.
pub fn set_default_quota(pool: &Pool, quota: u64) -> Result<()> {
    let mut line = [0u8; 64];
    line[..8].copy_from_slice(&quota.to_le_bytes());
    let crc = line_crc(&line);
    line[60..].copy_from_slice(&crc.to_le_bytes());
    pool.mem().write(tt::HEADER, &line)?;
    pool.mem().publish(tt::HEADER, 64);
    Ok(())
}

/// The id of tenant `name` for a participant attaching as it: the declared entry, or, on a
/// hardware-coherent pool, a new one with the pool's default quota. A software-coherent pool
/// refuses an undeclared tenant (no compare-and-swap across hosts).
pub(crate) fn resolve(pool: &Pool, name: &str) -> Result<u32> {
    check_name(name)?;
    if let Some(t) = find(pool, name)? {
        return Ok(t.id);
    }
    if CoherenceMode::from_code(pool.superblock().coherence) != Some(CoherenceMode::Hardware) {
        return Err(PoolError::UnknownTenant(name.to_owned()));
    }
    let quota = default_quota(pool)?;
    declare(pool, name, quota)
}

/// The quota of tenant `id` (0 = unlimited; tenant 0 and an unreadable entry have none).
pub(crate) fn quota_of(pool: &Pool, id: u32) -> Result<u64> {
    if id == 0 || id > tt::ENTRIES {
        return Ok(0);
    }
    Ok(read_entry(pool, id)?.map_or(0, |t| t.quota))
}

/// Tag and live-block count of partition `p` (owner-written words; any party may read them).
pub(crate) fn partition_tag(pool: &Pool, p: u32) -> Result<(u32, u64)> {
    let tag = partition_tenant(pool, p)?;
    // The same line as the tag, acquired with it.
    let live = pool
        .mem()
        .load_u64(pool.partition_off(p) + partition::LIVE, Ordering::Relaxed)?;
    Ok((tag, live))
}

/// The tenant tag of partition `p` alone: what every lookup reads before probing the partition.
fn partition_tenant(pool: &Pool, p: u32) -> Result<u32> {
    let base = pool.partition_off(p);
    let mem = pool.mem();
    // Pairs with the OwnerWrite publish of the tag line by the partition's owner (the tag and
    // the live count share the line).
    coherence::acquire(mem, Site::OwnerRead, base + partition::TENANT, 16);
    let tag = mem.load_u64(base + partition::TENANT, Ordering::Acquire)?;
    Ok(tag.min(u64::from(u32::MAX)) as u32)
}

/// Live blocks of tenant `id`: the sum over the partitions tagged with it.
pub(crate) fn use_of(pool: &Pool, id: u32) -> Result<u64> {
    let mut used = 0u64;
    for p in 0..pool.superblock().partitions {
        let (tag, live) = partition_tag(pool, p)?;
        if tag == id {
            used = used.saturating_add(live);
        }
    }
    Ok(used)
}

/// Use and quota of every tenant with a declared entry or a tagged partition, tenant 0 first.
pub fn usage(pool: &Pool) -> Result<Vec<TenantUse>> {
    let mut rows: Vec<TenantUse> = vec![TenantUse {
        id: 0,
        name: "-".into(),
        quota: 0,
        partitions: 0,
        blocks: 0,
    }];
    for t in list(pool)? {
        rows.push(TenantUse {
            id: t.id,
            name: t.name,
            quota: t.quota,
            partitions: 0,
            blocks: 0,
        });
    }
    for p in 0..pool.superblock().partitions {
        let (tag, live) = partition_tag(pool, p)?;
        let row = match rows.iter().position(|r| r.id == tag) {
            Some(i) => &mut rows[i],
            None => {
                rows.push(TenantUse {
                    id: tag,
                    name: "?".into(),
                    quota: 0,
                    partitions: 0,
                    blocks: 0,
                });
                rows.last_mut().expect("just pushed")
            }
        };
        row.partitions += 1;
        row.blocks = row.blocks.saturating_add(live);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolConfig;
    use cxlkv_shm::region::Region;
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

    #[test]
    fn declare_find_set_and_list() {
        let pool = pool();
        assert_eq!(list(&pool).unwrap(), vec![]);
        assert_eq!(default_quota(&pool).unwrap(), 0);
        let a = declare(&pool, "alice", 10).unwrap();
        let b = declare(&pool, "bob", 0).unwrap();
        assert_eq!((a, b), (1, 2));
        assert_eq!(
            declare(&pool, "alice", 99).unwrap(),
            a,
            "declared twice: one entry"
        );
        assert_eq!(find(&pool, "alice").unwrap().unwrap().quota, 10);
        set_quota(&pool, "alice", 3).unwrap();
        assert_eq!(quota_of(&pool, a).unwrap(), 3);
        assert!(matches!(
            set_quota(&pool, "carol", 1),
            Err(PoolError::UnknownTenant(_))
        ));
        set_default_quota(&pool, 7).unwrap();
        assert_eq!(resolve(&pool, "carol").unwrap(), 3);
        assert_eq!(quota_of(&pool, 3).unwrap(), 7);
        let names: Vec<String> = list(&pool).unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["alice", "bob", "carol"]);
        assert!(Tenant::new("", b"s").is_err());
        assert!(Tenant::new(&"x".repeat(41), b"s").is_err());
        // A damaged entry is not read as a tenant.
        pool.mem().write(tt::entry(b) + tt::NAME, b"X").unwrap();
        assert_eq!(find(&pool, "bob").unwrap(), None);
    }

    #[test]
    fn the_table_fills_up() {
        let pool = pool();
        for i in 0..tt::ENTRIES {
            declare(&pool, &format!("t{i}"), 0).unwrap();
        }
        assert!(matches!(
            declare(&pool, "one-more", 0),
            Err(PoolError::TenantTableFull(59))
        ));
    }

    #[test]
    fn tenant_keys_are_the_salted_keys() {
        let t = Tenant::new("a", b"salt").unwrap();
        assert_eq!(
            t.key_chain("ns", "m", 0, 1).keys(&[1, 2, 3], 2),
            KeyChain::salted(b"salt", "ns", "m", 0, 1).keys(&[1, 2, 3], 2)
        );
        assert_eq!(
            t.key_from_bytes(b"x"),
            Key::from_bytes_salted(b"salt", b"x")
        );
        assert!(!format!("{t:?}").contains("salt\""));
    }
}
