//! Tenants inside one pool, with processes (format 3.2, docs/SECURITY.md): tenant B cannot read,
//! pin or find tenant A's keys, neither through its own salted chain for A's tokens nor with A's
//! raw keys, and its lookups never probe A's partition (counted, not timed); A still reads every
//! block; a storm of B writers far past B's quota leaves every block of A byte-exact while B gets
//! `QuotaExceeded` or evicts its own; `cxlkv pool stat` shows each tenant's use and quota.
//!
//! The pool is made by `cxlkv pool create --tenant`; each tenant is a process of this test binary
//! started with `CXLKV_TENANT_ROLE` (the `role_entry` test does nothing without it).

use cxlkv::runtime::region::{Backend, Region, RegionOptions};
use cxlkv::runtime::tenant::Tenant;
use cxlkv::runtime::{pool_stats, Key, KeyChain, Participant, Pool, PoolError};
use std::process::{Command, Output};

const TOKENS: usize = 16 * 24;
const CHUNK: usize = 16;
const A_SALT: &[u8] = b"alice's secret salt";
const B_SALT: &[u8] = b"bob's secret salt";
const PUBLIC: &[u8] = b"the shared system prompt";
const STORM_WRITERS: usize = 3;
const STORM_PUTS: usize = 300;
const B_QUOTA: u64 = 40;

/// A's tokens: the prompt both tenants send in the isolation test.
fn tokens() -> Vec<u32> {
    (0..TOKENS as u32).map(|i| i * 7 + 1).collect()
}

/// The keys of `tokens` in a chain salted with `salt`.
fn chain(salt: &[u8]) -> Vec<Key> {
    KeyChain::salted(salt, "engine", "model", 0, 31).keys(&tokens(), CHUNK)
}

/// The payload of A's block `i`: distinct bytes per block, checked byte for byte.
fn a_payload(i: usize) -> Vec<u8> {
    (0..3000).map(|j| (i * 131 + j * 7) as u8).collect()
}

fn public_key() -> Key {
    Key::from_bytes(PUBLIC)
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

fn open(spec: &str) -> Pool {
    Pool::open_on(&spec.parse().unwrap(), &RegionOptions::default()).unwrap()
}

/// The partitions tagged with tenant `id`.
fn partitions_of(pool: &Pool, id: u32) -> Vec<usize> {
    pool_stats(pool)
        .unwrap()
        .partitions
        .iter()
        .filter(|p| p.tenant == id)
        .map(|p| p.id as usize)
        .collect()
}

/// What one tenant process does, by role.
#[test]
fn role_entry() {
    let Ok(role) = std::env::var("CXLKV_TENANT_ROLE") else {
        return;
    };
    let pool = open(&env("CXLKV_TENANT_POOL"));
    match role.as_str() {
        "write-a" => {
            let a = Participant::attach_as(&pool, &Tenant::new("alice", A_SALT).unwrap()).unwrap();
            for (i, k) in chain(A_SALT).into_iter().enumerate() {
                a.put(k, &a_payload(i)).unwrap();
            }
            println!("A wrote {} blocks", TOKENS / CHUNK);
        }
        "read-a" => {
            let a = Participant::attach_as(&pool, &Tenant::new("alice", A_SALT).unwrap()).unwrap();
            let keys = chain(A_SALT);
            for (i, &k) in keys.iter().enumerate() {
                let (bytes, _) = a
                    .get(k)
                    .unwrap()
                    .unwrap_or_else(|| panic!("A lost block {i}"));
                assert!(bytes == a_payload(i), "A's block {i} changed");
            }
            assert_eq!(a.lookup_prefix(&keys).unwrap(), keys.len());
            assert!(a.pin(keys[0]).unwrap().is_some());
            // A Pool handle scoped to alice reads them too; a tenant-less one does not.
            let scoped = pool.for_tenant("alice").unwrap();
            assert_eq!(scoped.get(keys[3]).unwrap().unwrap().0, a_payload(3));
            assert!(pool.get(keys[3]).unwrap().is_none());
            // Tenant 0's public block is readable by every tenant.
            assert_eq!(a.get(public_key()).unwrap().unwrap().0, PUBLIC);
            println!("A reads all {} blocks byte-exact", keys.len());
        }
        "probe-b" => {
            let alice = cxlkv::runtime::tenant::find(&pool, "alice")
                .unwrap()
                .unwrap();
            let a_parts = partitions_of(&pool, alice.id);
            assert!(!a_parts.is_empty(), "A's partition is tagged");
            let bob = Tenant::new("bob", B_SALT).unwrap();
            let b = Participant::attach_as(&pool, &bob).unwrap();
            assert!(!a_parts.contains(&(b.partition().unwrap() as usize)));
            let before = b.pool().partition_probes();
            // B's own salted chain for A's very tokens: other keys, nothing found.
            let own = bob
                .key_chain("engine", "model", 0, 31)
                .keys(&tokens(), CHUNK);
            // A's raw keys (as if they leaked), and A's chain formed with A's salt by a tenant
            // that holds the same salt: still A's blocks, which B does not read.
            let raw = chain(A_SALT);
            for keys in [&own, &raw] {
                assert_eq!(b.lookup_prefix(keys).unwrap(), 0);
                for &k in keys.iter() {
                    assert!(b.get(k).unwrap().is_none(), "B read A's block");
                    assert!(b.pin(k).unwrap().is_none(), "B pinned A's block");
                    assert!(!b.contains_batch(&[k]).unwrap()[0], "B found A's key");
                    assert!(b.length(k).unwrap().is_none());
                }
            }
            let scoped = pool.for_tenant("bob").unwrap();
            assert!(scoped.get(raw[0]).unwrap().is_none());
            assert!(scoped.block_ref(raw[0]).unwrap().is_none());
            assert!(
                pool.get(raw[0]).unwrap().is_none(),
                "tenant-less reads A's block"
            );
            // The public block (tenant 0) is B's to read.
            assert_eq!(b.get(public_key()).unwrap().unwrap().0, PUBLIC);
            let after = b.pool().partition_probes();
            let probed: Vec<u64> = after.iter().zip(&before).map(|(x, y)| x - y).collect();
            for &p in &a_parts {
                assert_eq!(probed[p], 0, "B probed A's partition {p}: {probed:?}");
            }
            let total: u64 = probed.iter().sum();
            assert!(
                total >= 2 * raw.len() as u64,
                "B's lookups probed: {probed:?}"
            );
            println!("B probes per partition {probed:?}; A's partitions {a_parts:?}: untouched");
        }
        "storm-b" => {
            let w: usize = env("CXLKV_TENANT_WRITER").parse().unwrap();
            let b = Participant::attach_as(&pool, &Tenant::new("bob", B_SALT).unwrap()).unwrap();
            let (mut ok, mut refused) = (0, 0);
            for i in 0..STORM_PUTS {
                let k = Key::from_bytes_salted(B_SALT, format!("storm {w} {i}").as_bytes());
                match b.put(k, &[w as u8; 2048]) {
                    Ok(_) => ok += 1,
                    Err(PoolError::QuotaExceeded { quota, .. }) => {
                        assert_eq!(quota, B_QUOTA);
                        refused += 1;
                    }
                    Err(e) => panic!("B's put failed otherwise: {e}"),
                }
            }
            let evicted = b.stats().evictions;
            println!("storm writer {w}: ok {ok} quota_exceeded {refused} evictions {evicted}");
        }
        other => panic!("unknown role {other}"),
    }
}

/// Runs this binary's `role_entry` as `role` on the pool `spec`.
fn role(spec: &str, role: &str, extra: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "role_entry", "--nocapture"])
        .env("CXLKV_TENANT_ROLE", role)
        .env("CXLKV_TENANT_POOL", spec);
    for (k, v) in extra {
        c.env(k, v);
    }
    c
}

fn succeeded(what: &str, out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn cxlkv(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cxlkv"))
        .args(args)
        .output()
        .unwrap();
    succeeded(&format!("cxlkv {args:?}"), &out)
}

/// A pool on `/dev/shm`, made by `cxlkv pool create` with tenants alice (no quota) and bob
/// (quota `B_QUOTA`); removed on drop.
struct TenantPool {
    spec: String,
}

impl TenantPool {
    fn create(tag: &str) -> TenantPool {
        let spec = format!("shm:cxlkv-tenants-{tag}-{}", std::process::id());
        let bob = format!("bob={B_QUOTA}");
        let out = cxlkv(&[
            "pool",
            "create",
            "--backend",
            &spec,
            "--size",
            "48M",
            "--block-size",
            "4K",
            "--participants",
            "8",
            "--tenant",
            "alice",
            "--tenant",
            &bob,
        ]);
        assert!(out.contains("tenant 2 \"bob\": quota 40 blocks"), "{out}");
        TenantPool { spec }
    }
}

impl Drop for TenantPool {
    fn drop(&mut self) {
        let b: Backend = self.spec.parse().unwrap();
        let _ = Region::unlink(&b);
    }
}

/// The `tenants:` rows of `cxlkv pool stat`: (id, name, partitions, blocks, quota).
fn stat_tenants(spec: &str) -> Vec<(u32, String, u32, u64, u64)> {
    let text = cxlkv(&["pool", "stat", spec, "--watch-ms", "0"]);
    text.lines()
        .skip_while(|l| !l.starts_with("tenants"))
        .skip(2)
        // The table's rows are indented; the next section's heading is not.
        .take_while(|l| l.starts_with(' '))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].to_string(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                f[4].parse().unwrap(),
            )
        })
        .collect()
}

fn row(rows: &[(u32, String, u32, u64, u64)], name: &str) -> (u32, String, u32, u64, u64) {
    rows.iter()
        .find(|r| r.1 == name)
        .unwrap_or_else(|| panic!("no tenant {name} in {rows:?}"))
        .clone()
}

/// Writes A's blocks (process A) and the public block (this process, tenant-less).
fn seed(tp: &TenantPool) -> Participant {
    let pool = open(&tp.spec);
    let public = pool.attach().unwrap();
    public.put(public_key(), PUBLIC).unwrap();
    succeeded(
        "tenant A's writer",
        &role(&tp.spec, "write-a", &[]).output().unwrap(),
    );
    public
}

#[test]
fn a_tenant_cannot_read_pin_or_find_anothers_keys() {
    let tp = TenantPool::create("iso");
    let _public = seed(&tp);
    let b = succeeded(
        "tenant B's probe",
        &role(&tp.spec, "probe-b", &[]).output().unwrap(),
    );
    assert!(b.contains("untouched"), "{b}");
    let a = succeeded(
        "tenant A's reader",
        &role(&tp.spec, "read-a", &[]).output().unwrap(),
    );
    assert!(a.contains("byte-exact"), "{a}");
    let rows = stat_tenants(&tp.spec);
    let alice = row(&rows, "alice");
    assert_eq!((alice.0, alice.3, alice.4), (1, (TOKENS / CHUNK) as u64, 0));
    assert_eq!(row(&rows, "-").3, 1, "the public block: {rows:?}");
    let check = cxlkv(&["pool", "check", &tp.spec]);
    assert!(check.contains("pool OK"), "{check}");
}

#[test]
fn quotas_hold_under_a_filling_storm() {
    let tp = TenantPool::create("storm");
    let _public = seed(&tp);
    let writers: Vec<_> = (0..STORM_WRITERS)
        .map(|w| {
            role(
                &tp.spec,
                "storm-b",
                &[("CXLKV_TENANT_WRITER", w.to_string())],
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let (mut ok, mut refused, mut evicted) = (0u64, 0u64, 0u64);
    for w in writers {
        let text = succeeded("a storm writer of B", &w.wait_with_output().unwrap());
        let line = text
            .lines()
            .find(|l| l.starts_with("storm writer"))
            .unwrap_or_else(|| panic!("{text}"));
        let f: Vec<&str> = line.split_whitespace().collect();
        ok += f[4].parse::<u64>().unwrap();
        refused += f[6].parse::<u64>().unwrap();
        evicted += f[8].parse::<u64>().unwrap();
    }
    assert_eq!(ok + refused, (STORM_WRITERS * STORM_PUTS) as u64);
    assert!(
        ok >= B_QUOTA && evicted >= ok.saturating_sub(B_QUOTA + STORM_WRITERS as u64),
        "B stored {ok}, evicted {evicted}, was refused {refused}"
    );
    println!(
        "storm: B's {} puts: {ok} stored ({evicted} of B's own evicted), {refused} refused with \
         QuotaExceeded",
        STORM_WRITERS * STORM_PUTS
    );
    // Every block of A is still there, byte-exact (a process of A reads them).
    let a = succeeded(
        "tenant A's reader",
        &role(&tp.spec, "read-a", &[]).output().unwrap(),
    );
    assert!(a.contains("byte-exact"), "{a}");
    let rows = stat_tenants(&tp.spec);
    let bob = row(&rows, "bob");
    assert_eq!(bob.4, B_QUOTA);
    assert!(
        bob.3 <= B_QUOTA + STORM_WRITERS as u64,
        "B holds {} blocks, quota {B_QUOTA}: {rows:?}",
        bob.3
    );
    assert_eq!(row(&rows, "alice").3, (TOKENS / CHUNK) as u64);
    let prom = cxlkv(&["pool", "stat", &tp.spec, "--watch-ms", "0", "--prometheus"]);
    assert!(
        prom.contains("cxlkv_pool_tenant_quota_blocks{tenant=\"2\",name=\"bob\"} 40"),
        "{prom}"
    );
    let check = cxlkv(&["pool", "check", &tp.spec]);
    assert!(check.contains("pool OK"), "{check}");
}
