//! The pool handle: `cxlkv_pool` (from `cxlkv_pool_create` or `cxlkv_pool_open`, released by
//! `cxlkv_pool_close`), its configuration and geometry structs, and the calls that need only a
//! pool (describe, prefix lookup, unlink).

use crate::args::{cstr, need, put_out};
use crate::errors::cxlkv_result::{self, CXLKV_ERR_INVALID_ARG, CXLKV_ERR_UNAVAILABLE};
use crate::errors::{fail, guard, map_err};
use crate::handles::{borrow, register, unregister, Kind};
use crate::keys::{cxlkv_key, key_slice};
use crate::sized::{check_out, read_in, sized, write_out};
use cxlkv_runtime::region::{Access, Backend, RegionError, RegionOptions};
use cxlkv_runtime::{Pool, PoolConfig};
use std::ffi::{c_char, c_void};
use std::time::Duration;

/// `cxlkv_pool_config::access_flags`: `owner` is set (else the creating process's user owns the
/// pool).
pub const CXLKV_ACCESS_OWNER: u32 = 1;
/// `cxlkv_pool_config::access_flags`: `group` is set (else the creating process's group).
pub const CXLKV_ACCESS_GROUP: u32 = 2;

/// Parameters of `cxlkv_pool_create`; start from `cxlkv_pool_config_default` (which sets
/// `struct_size`). The first layout ends before `pins_per_participant` (20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_pool_config {
    /// `sizeof(cxlkv_pool_config)` as the caller's header declares it.
    pub struct_size: u32,
    /// Participant slots (and partitions).
    pub participants: u32,
    /// Payload capacity of a block (a multiple of 4096).
    pub block_size: u64,
    /// Lease in milliseconds: a participant whose heartbeat counter an observer watched stand
    /// still for longer than this, on the observer's own clock, is dead.
    pub lease_ms: u32,
    /// Size of each participant's pin table (pins it may hold at once); 0 = the default (64).
    /// More pins make each participant slot larger (docs/FORMAT.md §3).
    pub pins_per_participant: u32,
    /// Permission bits of the file the pool creates (`0001`..`0777`, e.g. `0660`); 0 = the
    /// default, `0600` (owner only). Applied as given, whatever the umask (docs/SECURITY.md).
    pub mode: u32,
    /// Owning user id, used when `access_flags` has `CXLKV_ACCESS_OWNER` (giving a file to
    /// another user takes root).
    pub owner: u32,
    /// Owning group id, used when `access_flags` has `CXLKV_ACCESS_GROUP` (an ordinary user may
    /// name only one of its own groups).
    pub group: u32,
    /// `CXLKV_ACCESS_OWNER` | `CXLKV_ACCESS_GROUP`: which of `owner` and `group` are set (0: the
    /// creator's user and group). Other bits are refused.
    pub access_flags: u32,
}
sized!(cxlkv_pool_config, 20);

impl cxlkv_pool_config {
    /// The permissions this config asks for: `Access::default()` (0600) where it says nothing.
    fn access(&self) -> Result<Access, cxlkv_result> {
        if self.access_flags & !(CXLKV_ACCESS_OWNER | CXLKV_ACCESS_GROUP) != 0 {
            return Err(fail(
                CXLKV_ERR_INVALID_ARG,
                format!(
                    "config->access_flags {:#x} has bits other than CXLKV_ACCESS_OWNER | CXLKV_ACCESS_GROUP",
                    self.access_flags
                ),
            ));
        }
        let mut a = Access::default();
        if self.mode != 0 {
            a = Access::with_mode(self.mode)
                .map_err(|e| fail(CXLKV_ERR_INVALID_ARG, format!("config->mode: {e}")))?;
        }
        a.owner = (self.access_flags & CXLKV_ACCESS_OWNER != 0).then_some(self.owner);
        a.group = (self.access_flags & CXLKV_ACCESS_GROUP != 0).then_some(self.group);
        Ok(a)
    }
}

/// What `cxlkv_pool_describe` reports. The first layout ends before `map_base` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_pool_info {
    /// `sizeof(cxlkv_pool_info)` as the caller's header declares it; on return, the bytes written.
    pub struct_size: u32,
    /// Participant slots.
    pub participants: u32,
    /// Pool bytes.
    pub pool_size: u64,
    /// Payload capacity of a block.
    pub block_size: u64,
    /// Partitions.
    pub partitions: u32,
    /// Blocks per partition.
    pub blocks_per_partition: u32,
    /// Format major version.
    pub version_major: u16,
    /// Format minor version.
    pub version_minor: u16,
    /// Zero.
    pub reserved: u32,
    /// Address of the pool's mapping in this process (as `cxlkv_pool_mapping`), NULL when the
    /// memory has no stable address.
    pub map_base: *mut c_void,
    /// Bytes of that mapping (the pool size; 0 with a NULL `map_base`).
    pub map_len: u64,
    /// Pins each participant may hold at once (its pin table's size).
    pub pins_per_participant: u32,
    /// Zero.
    pub reserved2: u32,
}
sized!(cxlkv_pool_info, 40);

impl Default for cxlkv_pool_info {
    fn default() -> Self {
        cxlkv_pool_info {
            struct_size: std::mem::size_of::<cxlkv_pool_info>() as u32,
            participants: 0,
            pool_size: 0,
            block_size: 0,
            partitions: 0,
            blocks_per_partition: 0,
            version_major: 0,
            version_minor: 0,
            reserved: 0,
            map_base: std::ptr::null_mut(),
            map_len: 0,
            pins_per_participant: 0,
            reserved2: 0,
        }
    }
}

/// An open pool (opaque).
pub struct cxlkv_pool {
    pub(crate) pool: Pool,
}

/// Default pool parameters (256 KiB blocks, 8 participants, 2 s lease, the default pin table),
/// with `struct_size = sizeof(cxlkv_pool_config)`. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_config_default() -> cxlkv_pool_config {
    let d = PoolConfig::default();
    cxlkv_pool_config {
        struct_size: std::mem::size_of::<cxlkv_pool_config>() as u32,
        participants: d.participants,
        block_size: d.block_size,
        lease_ms: d.lease.as_millis() as u32,
        pins_per_participant: 0,
        mode: 0,
        owner: 0,
        group: 0,
        access_flags: 0,
    }
}

fn backend(spec: *const c_char) -> Result<Backend, cxlkv_result> {
    cstr(spec, "spec")?
        .parse()
        .map_err(|e: RegionError| fail(CXLKV_ERR_INVALID_ARG, e.to_string()))
}

/// Creates a pool of `size` bytes on `spec` (`shm:NAME`, `file:PATH`, `dax:PATH`, `numa:N[:NAME]`).
/// `config` may be NULL for defaults; its `struct_size` must be set (`cxlkv_pool_config_default`
/// does). On success stores a new handle in `*out`; release it with
/// `cxlkv_pool_close`. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_create(
    spec: *const c_char,
    size: u64,
    config: *const cxlkv_pool_config,
    out: *mut *mut cxlkv_pool,
) -> cxlkv_result {
    guard(|| {
        need(out, "out")?;
        let b = backend(spec)?;
        let c = if config.is_null() {
            cxlkv_pool_config_default()
        } else {
            read_in(config, cxlkv_pool_config_default(), "config")?
        };
        let cfg = PoolConfig {
            block_size: c.block_size,
            participants: c.participants,
            lease: Duration::from_millis(u64::from(c.lease_ms)),
            pins_per_participant: c.pins_per_participant,
            ..Default::default()
        };
        let access = c.access()?;
        let pool = Pool::create_on_with(&b, size, &cfg, &RegionOptions::default(), &access)
            .map_err(map_err)?;
        put_out(out, register(Box::new(cxlkv_pool { pool }), Kind::Pool));
        Ok(())
    })
}

/// Opens an existing pool on `spec`, validating it. On success stores a new handle in `*out`.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_open(spec: *const c_char, out: *mut *mut cxlkv_pool) -> cxlkv_result {
    guard(|| {
        need(out, "out")?;
        let b = backend(spec)?;
        let pool = Pool::open_on(&b, &RegionOptions::default()).map_err(map_err)?;
        put_out(out, register(Box::new(cxlkv_pool { pool }), Kind::Pool));
        Ok(())
    })
}

/// Releases a pool handle. Participants attached through it stay valid (they keep the mapping),
/// and so does a call on the handle already running on another thread, until it returns; calls
/// after this return `CXLKV_ERR_INVALID_HANDLE`. NULL is accepted and ignored. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_close(pool: *mut cxlkv_pool) -> cxlkv_result {
    guard(|| {
        if pool.is_null() {
            return Ok(());
        }
        unregister(pool, Kind::Pool).map(drop)
    })
}

/// Removes the backing file of a shm or file pool (the mapping of open handles stays valid).
/// Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_unlink(spec: *const c_char) -> cxlkv_result {
    guard(|| {
        let b = backend(spec)?;
        cxlkv_runtime::Region::unlink(&b).map_err(|e| map_err(e.into()))
    })
}

/// The pool's mapping in this process: base address and length, or (NULL, 0) for memory without
/// a stable address.
fn mapping(p: &cxlkv_pool) -> Result<(*mut c_void, u64), cxlkv_result> {
    let mem = p.pool.memory();
    match mem
        .raw_range(0, mem.size())
        .map_err(|e| map_err(e.into()))?
    {
        Some(base) => Ok((base.cast(), mem.size())),
        None => Ok((std::ptr::null_mut(), 0)),
    }
}

/// Stores the pool's geometry and mapping in `*info`, whose `struct_size` the caller sets (at
/// least the 40 bytes of the first layout; at most that many bytes are written, and their number
/// is stored in `struct_size`). Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_describe(
    pool: *const cxlkv_pool,
    info: *mut cxlkv_pool_info,
) -> cxlkv_result {
    guard(|| {
        let p = borrow(pool, Kind::Pool)?;
        check_out(info, "info")?;
        let sb = p.pool.superblock();
        let (map_base, map_len) = mapping(&p)?;
        write_out(
            info,
            cxlkv_pool_info {
                struct_size: 0,
                participants: sb.participants,
                pool_size: sb.pool_size,
                block_size: sb.block_size,
                partitions: sb.partitions,
                blocks_per_partition: sb.blocks_per_partition,
                version_major: sb.version_major,
                version_minor: sb.version_minor,
                reserved: 0,
                map_base,
                map_len,
                pins_per_participant: sb.pins(),
                reserved2: 0,
            },
        );
        Ok(())
    })
}

/// The pool's mapped address range in this process: `*base` and `*len` (the whole pool: every
/// block payload a pin or reservation hands out lies inside it). Register it once with a GPU
/// runtime or an RDMA NIC instead of registering each pinned block (docs/C-ABI.md, "Registering the
/// pool with a GPU"). The range stays mapped while any handle of this pool (pool, participant,
/// pin, reservation, device) is open. `CXLKV_ERR_UNAVAILABLE` when the memory has no stable
/// address. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_mapping(
    pool: *const cxlkv_pool,
    base: *mut *mut c_void,
    len: *mut usize,
) -> cxlkv_result {
    guard(|| {
        let p = borrow(pool, Kind::Pool)?;
        need(base, "base")?;
        need(len, "len")?;
        let (b, n) = mapping(&p)?;
        if b.is_null() {
            return Err(fail(
                CXLKV_ERR_UNAVAILABLE,
                "pool memory has no stable address",
            ));
        }
        put_out(base, b);
        put_out(len, n as usize);
        Ok(())
    })
}

/// Number of leading keys of `keys[0..n]` present in the pool (the cached prefix), in `*out`.
/// `n` must be positive. A pool handle reads as no tenant (format 3.2): it finds tenant 0's
/// blocks only; a tenant's participant finds its own with `cxlkv_participant_lookup_prefix`.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_lookup_prefix(
    pool: *const cxlkv_pool,
    keys: *const cxlkv_key,
    n: usize,
    found: *mut usize,
) -> cxlkv_result {
    guard(|| {
        let p = borrow(pool, Kind::Pool)?;
        need(found, "out")?;
        let chain = key_slice(keys, n)?;
        put_out(found, p.pool.lookup_prefix(&chain).map_err(map_err)?);
        Ok(())
    })
}

/// Declares the tenant `name` (1 to 40 bytes of UTF-8) in the pool's tenant table with a quota of
/// `quota` blocks (0 = unlimited), and stores its id (1-based) in `*id` (format 3.2;
/// docs/SECURITY.md, "Tenants inside one pool"). A tenant already declared keeps its quota (use
/// `cxlkv_pool_tenant_set_quota`). `CXLKV_ERR_FULL` when the table's 59 entries are taken. On a
/// software-coherent pool, declare tenants before anyone attaches. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_tenant_declare(
    pool: *const cxlkv_pool,
    name: *const c_char,
    quota: u64,
    id: *mut u32,
) -> cxlkv_result {
    guard(|| {
        let p = borrow(pool, Kind::Pool)?;
        let name = cstr(name, "name")?;
        need(id, "id")?;
        cxlkv_runtime::Tenant::new(name, b"").map_err(map_err)?;
        let t = cxlkv_runtime::tenant::declare(&p.pool, name, quota).map_err(map_err)?;
        put_out(id, t);
        Ok(())
    })
}

/// Sets the quota (blocks; 0 = unlimited) of the declared tenant `name`; its writers obey it from
/// their next put. `CXLKV_ERR_INVALID_ARG` if it is not declared. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_tenant_set_quota(
    pool: *const cxlkv_pool,
    name: *const c_char,
    quota: u64,
) -> cxlkv_result {
    guard(|| {
        let p = borrow(pool, Kind::Pool)?;
        let name = cstr(name, "name")?;
        cxlkv_runtime::tenant::set_quota(&p.pool, name, quota).map_err(map_err)?;
        Ok(())
    })
}
