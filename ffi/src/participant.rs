//! The participant handle and the two handles a participant lends out: `cxlkv_participant`
//! (`cxlkv_participant_attach` / `cxlkv_participant_detach`), `cxlkv_pinned`
//! (`cxlkv_participant_pin` / `cxlkv_pinned_release`) and `cxlkv_reservation`
//! (`cxlkv_participant_reserve` / `cxlkv_reservation_commit` or `_abort`), with the block calls
//! (put, get, delete, stats). Pins and reservations hold an `Arc` of their participant, so a
//! detach while they are held leaves it attached until the last of them is released.

use crate::args::{bytes_in, bytes_out, cstr, need, put_out};
use crate::errors::cxlkv_result::{
    self, CXLKV_ERR_BUFFER_TOO_SMALL, CXLKV_ERR_INVALID_HANDLE, CXLKV_ERR_NOT_FOUND,
    CXLKV_ERR_UNAVAILABLE,
};
use crate::errors::{fail, guard, map_err};
use crate::handles::{borrow, register, take, unregister, Kind};
use crate::keys::{cxlkv_key, key_arg, key_slice};
use crate::pool::cxlkv_pool;
use crate::sized::{check_out, sized, write_out};
use cxlkv_runtime::{Key, Participant, PoolError, RawPin, RawReservation, Tenant};
use std::ffi::c_char;
use std::sync::Arc;

/// A participant's counters (`cxlkv_participant_stats`). First layout: all of it (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_stats {
    /// `sizeof(cxlkv_stats)` as the caller's header declares it; on return, the bytes written.
    pub struct_size: u32,
    /// Zero.
    pub reserved: u32,
    /// Successful puts.
    pub puts: u64,
    /// Gets that found the key.
    pub hits: u64,
    /// Gets that did not.
    pub misses: u64,
    /// Optimistic reads retried.
    pub retries: u64,
    /// Blocks evicted.
    pub evictions: u64,
    /// Blocks deleted.
    pub deletes: u64,
    /// Pins taken.
    pub pins: u64,
}

sized!(cxlkv_stats, 64);

/// An attached participant (opaque).
pub struct cxlkv_participant {
    pub(crate) inner: Arc<Participant>,
}

/// A pinned block (opaque).
pub struct cxlkv_pinned {
    participant: Arc<Participant>,
    pin: Option<RawPin>,
}

/// A reservation awaiting commit (opaque).
pub struct cxlkv_reservation {
    participant: Arc<Participant>,
    res: Option<RawReservation>,
}

/// Attaches a participant to `pool` (claims a slot and, if one is free or dead, a partition).
/// A holder is dead once this pool handle watched its heartbeat counter stand still for the
/// lease: the first attach through a fresh handle finds every holder alive, and a later one through
/// the same handle can take a dead holder's slot and partition over (retry on
/// `CXLKV_ERR_NO_PARTICIPANT_SLOT`). On success stores a handle in `*out`; release it with
/// `cxlkv_participant_detach`. A participant handle may be used from several threads at once.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_attach(
    pool: *const cxlkv_pool,
    out: *mut *mut cxlkv_participant,
) -> cxlkv_result {
    guard(|| {
        let p = borrow(pool, Kind::Pool)?;
        need(out, "out")?;
        let inner = Arc::new(p.pool.attach().map_err(map_err)?);
        put_out(
            out,
            register(Box::new(cxlkv_participant { inner }), Kind::Participant),
        );
        Ok(())
    })
}

/// Attaches a participant to `pool` as the tenant named `name` (1 to 40 bytes of UTF-8) holding
/// the secret `salt[0..salt_len]` (format 3.2; docs/SECURITY.md, "Tenants inside one pool"): the
/// tenant declared in the pool, or, on a hardware-coherent pool, one registered now with the
/// pool's default quota (`CXLKV_ERR_INVALID_ARG` for an undeclared tenant of a software-coherent
/// pool, or a bad name). The participant claims only a partition of its tenant or one without live
/// blocks, puts under its tenant's quota (`CXLKV_ERR_FULL` with a "quota" message when it has
/// nothing of its own left to evict), and gets, pins and finds only its tenant's blocks and tenant
/// 0's. The salt stays in this process: form the tenant's keys with `cxlkv_key_chain_salted` and
/// `cxlkv_key_from_bytes_salted` and the same salt. Otherwise as `cxlkv_participant_attach`.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_attach_tenant(
    pool: *const cxlkv_pool,
    name: *const c_char,
    salt: *const u8,
    salt_len: usize,
    out: *mut *mut cxlkv_participant,
) -> cxlkv_result {
    guard(|| {
        let p = borrow(pool, Kind::Pool)?;
        let name = cstr(name, "name")?;
        let salt = bytes_in(salt, salt_len, "salt")?;
        need(out, "out")?;
        let tenant = Tenant::new(name, salt).map_err(map_err)?;
        let inner = Arc::new(Participant::attach_as(&p.pool, &tenant).map_err(map_err)?);
        put_out(
            out,
            register(Box::new(cxlkv_participant { inner }), Kind::Participant),
        );
        Ok(())
    })
}

/// The tenant id this participant attached as, in `*tenant` (0: none, the pool's public space).
/// Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_tenant(
    p: *const cxlkv_participant,
    tenant: *mut u32,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        need(tenant, "tenant")?;
        put_out(tenant, me.inner.tenant_id());
        Ok(())
    })
}

/// Number of leading keys of `keys[0..n]` this participant can read (the cached prefix), in
/// `*found`: for a tenant's participant, its tenant's blocks and tenant 0's; for a tenant-less
/// one, tenant 0's, as `cxlkv_pool_lookup_prefix`. `n` must be positive. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_lookup_prefix(
    p: *const cxlkv_participant,
    keys: *const cxlkv_key,
    n: usize,
    found: *mut usize,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        need(found, "found")?;
        let chain = key_slice(keys, n)?;
        put_out(found, me.inner.lookup_prefix(&chain).map_err(map_err)?);
        Ok(())
    })
}

/// Detaches a participant: its partition's blocks stay in the pool for others. Pins and
/// reservations still held keep it attached until they are released, and so does a call on the
/// handle already running on another thread, until it returns. Calls on the handle after this
/// return `CXLKV_ERR_INVALID_HANDLE`. NULL is accepted and ignored. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_detach(p: *mut cxlkv_participant) -> cxlkv_result {
    guard(|| {
        if p.is_null() {
            return Ok(());
        }
        unregister(p, Kind::Participant).map(drop)
    })
}

/// This participant's slot number (its host id) in `*id`, and its partition in `*partition`
/// (`UINT32_MAX` when it owns none). Either pointer may be NULL. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_id(
    p: *const cxlkv_participant,
    id: *mut u32,
    partition: *mut u32,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        if !id.is_null() {
            put_out(id, me.inner.id());
        }
        if !partition.is_null() {
            put_out(partition, me.inner.partition().unwrap_or(u32::MAX));
        }
        Ok(())
    })
}

/// Stores `data[0..len]` under `key` in the participant's partition (copying it), evicting least
/// recently used unpinned blocks if needed. A payload larger than a block is stored as a
/// multi-block object (its parts, then a manifest under `key`, published last): readers see it
/// only once whole, and get, delete and the batches treat it like a block;
/// `CXLKV_ERR_PAYLOAD_TOO_LARGE` beyond what one partition can hold. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_put(
    p: *const cxlkv_participant,
    key: *const cxlkv_key,
    data: *const u8,
    len: usize,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        let key = key_arg(key)?;
        let bytes = bytes_in(data, len, "data")?;
        put_one(&me, key, bytes)
    })
}

/// One put (the runtime counts it in the metrics).
pub(crate) fn put_one(me: &cxlkv_participant, key: Key, bytes: &[u8]) -> Result<(), cxlkv_result> {
    me.inner.put(key, bytes).map_err(map_err)?;
    Ok(())
}

/// Stores `data[0..len]` under `key` unless some participant already holds `key` in any
/// partition: `*stored` = 1 when this call stored it, 0 when the key was present (nothing
/// written). Two participants putting the same new key at the same instant may both store it
/// (each in its own partition); a reader then finds one of them, whole. Large payloads are stored
/// as multi-block objects, as by `cxlkv_participant_put`. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_put_if_absent(
    p: *const cxlkv_participant,
    key: *const cxlkv_key,
    data: *const u8,
    len: usize,
    stored: *mut i32,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        let key = key_arg(key)?;
        let bytes = bytes_in(data, len, "data")?;
        need(stored, "stored")?;
        let r = me.inner.put_if_absent(key, bytes).map_err(map_err)?;
        put_out(stored, i32::from(r.stored()));
        Ok(())
    })
}

/// Copies the block under `key` into `buf` (capacity `cap`) and stores its length in `*len`.
/// `CXLKV_ERR_NOT_FOUND` on a miss; `CXLKV_ERR_BUFFER_TOO_SMALL` stores the needed size in `*len`.
/// Never returns torn or foreign bytes. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_get(
    p: *const cxlkv_participant,
    key: *const cxlkv_key,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        let key = key_arg(key)?;
        need(len, "len")?;
        let dst = bytes_out(buf, cap, "buf")?;
        get_one(&me, key, dst, len)
    })
}

/// One get into `dst`: the length goes to `len` on success, the needed size with
/// `CXLKV_ERR_BUFFER_TOO_SMALL`.
pub(crate) fn get_one(
    me: &cxlkv_participant,
    key: Key,
    dst: &mut [u8],
    len: *mut usize,
) -> Result<(), cxlkv_result> {
    match me.inner.get_into(key, dst) {
        Ok(Some(info)) => {
            put_out(len, info.len as usize);
            Ok(())
        }
        Ok(None) => Err(fail(CXLKV_ERR_NOT_FOUND, format!("key {key} not found"))),
        Err(PoolError::BufferTooSmall { needed, capacity }) => {
            put_out(len, needed as usize);
            Err(fail(
                CXLKV_ERR_BUFFER_TOO_SMALL,
                format!("block of {needed} bytes, buffer of {capacity}"),
            ))
        }
        Err(e) => Err(map_err(e)),
    }
}

/// Deletes `key` from the participant's partition. `CXLKV_ERR_NOT_FOUND` if absent,
/// `CXLKV_ERR_NOT_OWNER` if another participant owns it. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_delete(
    p: *const cxlkv_participant,
    key: *const cxlkv_key,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        let key = key_arg(key)?;
        match me.inner.delete(key).map_err(map_err)? {
            true => Ok(()),
            false => Err(fail(CXLKV_ERR_NOT_FOUND, format!("key {key} not found"))),
        }
    })
}

/// The participant's counters in `*stats`, whose `struct_size` the caller sets (at most that many
/// bytes are written; their number is stored back). Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_stats(
    p: *const cxlkv_participant,
    stats: *mut cxlkv_stats,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        check_out(stats, "stats")?;
        let s = me.inner.stats();
        write_out(
            stats,
            cxlkv_stats {
                struct_size: 0,
                reserved: 0,
                puts: s.puts,
                hits: s.hits,
                misses: s.misses,
                retries: s.retries,
                evictions: s.evictions,
                deletes: s.deletes,
                pins: s.pins,
            },
        );
        Ok(())
    })
}

/// Pins the block under `key`: stores a handle in `*out`, and the payload's read-only address
/// and length in `*data` and `*len`, valid until `cxlkv_pinned_release` (zero copy; suitable for
/// DMA registration). The owner will not reuse the block meanwhile. `CXLKV_ERR_NOT_FOUND` on a
/// miss. Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_pin(
    p: *const cxlkv_participant,
    key: *const cxlkv_key,
    out: *mut *mut cxlkv_pinned,
    data: *mut *const u8,
    len: *mut usize,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        let key = key_arg(key)?;
        need(out, "out")?;
        need(data, "data")?;
        need(len, "len")?;
        let Some(pinned) = me.inner.pin(key).map_err(map_err)? else {
            return Err(fail(CXLKV_ERR_NOT_FOUND, format!("key {key} not found")));
        };
        let raw = pinned.into_raw();
        let ptr = match me.inner.raw_pin_ptr(&raw) {
            Ok(Some(ptr)) => ptr,
            other => {
                me.inner.unpin_raw(raw);
                return Err(match other {
                    Err(e) => map_err(e),
                    _ => fail(CXLKV_ERR_UNAVAILABLE, "pool memory has no stable address"),
                });
            }
        };
        let n = raw.info().len as usize;
        let h = register(
            Box::new(cxlkv_pinned {
                participant: me.inner.clone(),
                pin: Some(raw),
            }),
            Kind::Pinned,
        );
        put_out(out, h);
        put_out(data, ptr);
        put_out(len, n);
        Ok(())
    })
}

/// Releases a pin; the payload address must not be used afterwards. NULL is accepted and ignored.
/// Thread-safe (a second release of the same pin returns `CXLKV_ERR_INVALID_HANDLE`).
#[no_mangle]
pub extern "C" fn cxlkv_pinned_release(pinned: *mut cxlkv_pinned) -> cxlkv_result {
    guard(|| {
        if pinned.is_null() {
            return Ok(());
        }
        let mut b = take(pinned, Kind::Pinned)?;
        if let Some(raw) = b.pin.take() {
            b.participant.unpin_raw(raw);
        }
        Ok(())
    })
}

/// Reserves a block of `len` bytes under `key` for an in-place write: stores a handle in `*out`
/// and the writable payload address in `*data`. Write exactly `len` bytes there, then call
/// `cxlkv_reservation_commit` (or `_abort`). Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_participant_reserve(
    p: *const cxlkv_participant,
    key: *const cxlkv_key,
    len: usize,
    out: *mut *mut cxlkv_reservation,
    data: *mut *mut u8,
) -> cxlkv_result {
    guard(|| {
        let me = borrow(p, Kind::Participant)?;
        let key = key_arg(key)?;
        need(out, "out")?;
        need(data, "data")?;
        let r = me
            .inner
            .reserve(key, len as u64, cxlkv_runtime::Codec::Raw)
            .map_err(map_err)?
            .into_raw();
        let ptr = match me.inner.raw_reservation_ptr(&r) {
            Ok(Some(ptr)) => ptr,
            other => {
                me.inner.abort_raw(r);
                return Err(match other {
                    Err(e) => map_err(e),
                    _ => fail(CXLKV_ERR_UNAVAILABLE, "pool memory has no stable address"),
                });
            }
        };
        put_out(
            out,
            register(
                Box::new(cxlkv_reservation {
                    participant: me.inner.clone(),
                    res: Some(r),
                }),
                Kind::Reservation,
            ),
        );
        put_out(data, ptr);
        Ok(())
    })
}

/// Checksums the written payload and publishes the block; releases the handle (also on error).
/// Thread-safe (a second commit or abort of the same reservation returns
/// `CXLKV_ERR_INVALID_HANDLE`).
#[no_mangle]
pub extern "C" fn cxlkv_reservation_commit(r: *mut cxlkv_reservation) -> cxlkv_result {
    guard(|| {
        let mut b = take(r, Kind::Reservation)?;
        let res = b.res.take().ok_or(CXLKV_ERR_INVALID_HANDLE)?;
        b.participant.commit_raw(res).map_err(map_err)?;
        Ok(())
    })
}

/// Abandons a reservation and frees its block; releases the handle. NULL is accepted and ignored.
#[no_mangle]
pub extern "C" fn cxlkv_reservation_abort(r: *mut cxlkv_reservation) -> cxlkv_result {
    guard(|| {
        if r.is_null() {
            return Ok(());
        }
        let mut b = take(r, Kind::Reservation)?;
        if let Some(res) = b.res.take() {
            b.participant.abort_raw(res);
        }
        Ok(())
    })
}

impl Drop for cxlkv_pinned {
    fn drop(&mut self) {
        if let Some(raw) = self.pin.take() {
            self.participant.unpin_raw(raw);
        }
    }
}

impl Drop for cxlkv_reservation {
    fn drop(&mut self) {
        if let Some(r) = self.res.take() {
            self.participant.abort_raw(r);
        }
    }
}
