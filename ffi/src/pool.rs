//! The pool handle: `cxlkv_pool` (from `cxlkv_pool_create` or `cxlkv_pool_open`, released by
//! `cxlkv_pool_close`), its configuration and geometry structs, and the calls that need only a
//! pool (describe, prefix lookup, unlink).

use crate::args::{cstr, need, put_out};
use crate::errors::cxlkv_result::{self, CXLKV_ERR_INVALID_ARG};
use crate::errors::{fail, guard, map_err};
use crate::handles::{borrow, register, unregister, Kind};
use crate::keys::{cxlkv_key, key_slice};
use cxlkv_runtime::region::{Backend, RegionError, RegionOptions};
use cxlkv_runtime::{Pool, PoolConfig};
use std::ffi::c_char;
use std::time::Duration;

/// Parameters of `cxlkv_pool_create`; start from `cxlkv_pool_config_default`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_pool_config {
    /// Payload capacity of a block (a multiple of 4096).
    pub block_size: u64,
    /// Participant slots (and partitions).
    pub participants: u32,
    /// Lease in milliseconds: a participant whose heartbeat counter an observer watched stand
    /// still for longer than this, on the observer's own clock, is dead.
    pub lease_ms: u32,
}

/// What `cxlkv_pool_info` reports.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_pool_info {
    /// Pool bytes.
    pub pool_size: u64,
    /// Payload capacity of a block.
    pub block_size: u64,
    /// Participant slots.
    pub participants: u32,
    /// Partitions.
    pub partitions: u32,
    /// Blocks per partition.
    pub blocks_per_partition: u32,
    /// Format major version.
    pub version_major: u16,
    /// Format minor version.
    pub version_minor: u16,
}

/// An open pool (opaque).
pub struct cxlkv_pool {
    pub(crate) pool: Pool,
}

/// Default pool parameters (256 KiB blocks, 8 participants, 2 s lease). Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_config_default() -> cxlkv_pool_config {
    let d = PoolConfig::default();
    cxlkv_pool_config {
        block_size: d.block_size,
        participants: d.participants,
        lease_ms: d.lease.as_millis() as u32,
    }
}

fn backend(spec: *const c_char) -> Result<Backend, cxlkv_result> {
    cstr(spec, "spec")?
        .parse()
        .map_err(|e: RegionError| fail(CXLKV_ERR_INVALID_ARG, e.to_string()))
}

/// Creates a pool of `size` bytes on `spec` (`shm:NAME`, `file:PATH`, `dax:PATH`, `numa:N[:NAME]`).
/// `config` may be NULL for defaults. On success stores a new handle in `*out`; release it with
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
            // SAFETY: non-null; the caller promises a valid config for the call.
            unsafe { config.read_unaligned() }
        };
        let cfg = PoolConfig {
            block_size: c.block_size,
            participants: c.participants,
            lease: Duration::from_millis(u64::from(c.lease_ms)),
            ..Default::default()
        };
        let pool = Pool::create_on(&b, size, &cfg, &RegionOptions::default()).map_err(map_err)?;
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

/// Releases a pool handle. Participants attached through it stay valid (they keep the mapping).
/// NULL is accepted and ignored. Not thread-safe with other calls on the same handle.
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

/// Stores the pool's geometry in `*out`. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_pool_describe(
    pool: *const cxlkv_pool,
    info: *mut cxlkv_pool_info,
) -> cxlkv_result {
    guard(|| {
        let p = borrow(pool, Kind::Pool)?;
        need(info, "info")?;
        let sb = p.pool.superblock();
        put_out(
            info,
            cxlkv_pool_info {
                pool_size: sb.pool_size,
                block_size: sb.block_size,
                participants: sb.participants,
                partitions: sb.partitions,
                blocks_per_partition: sb.blocks_per_partition,
                version_major: sb.version_major,
                version_minor: sb.version_minor,
            },
        );
        Ok(())
    })
}

/// Number of leading keys of `keys[0..n]` present in the pool (the cached prefix), in `*out`.
/// `n` must be positive. Thread-safe.
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
