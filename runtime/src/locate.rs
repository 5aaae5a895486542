//! Finding a pool inside a larger window of memory by its superblock.
//!
//! A pool made inside a guest of a virtual machine lands somewhere in the host's backing file:
//! at offset 0 behind an ivshmem BAR, after the namespace info block (6 MiB) behind an emulated
//! NVDIMM's `/dev/daxX.Y`, at the device physical address behind a CXL type-3 region. Rather than
//! hard-coding those offsets, a peer maps the whole window and looks for a superblock that
//! validates (magic, version, CRC and a geometry that fits the rest of the window) at every
//! `align`-aligned offset, then maps the pool with [`Region::open_range`].

use crate::format::{Superblock, MAGIC, SUPERBLOCK_SIZE};
use crate::pool::{validate_superblock, Pool, PoolError};
use cxlkv_shm::mem::read_obj;
use cxlkv_shm::mem::SharedMemory;
use cxlkv_shm::region::{Backend, Region, RegionError, RegionOptions};
use std::sync::Arc;
use thiserror::Error;

/// Alignment of the scan: pools start on a page.
pub const SCAN_ALIGN: u64 = 4096;

/// A valid superblock found in a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Located {
    /// Offset of the superblock (the pool's start) in the window.
    pub offset: u64,
    /// The pool's size as its superblock records it.
    pub pool_size: u64,
}

/// Errors of [`scan`] and [`open_located`].
#[derive(Debug, Error)]
pub enum LocateError {
    /// The window could not be mapped.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// The pool found could not be opened.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// No valid superblock in the window.
    #[error(
        "no valid cxlkv pool superblock in {what} ({size} bytes scanned at {align}-byte steps)"
    )]
    NotFound {
        /// The window scanned.
        what: String,
        /// Its size.
        size: u64,
        /// Scan step.
        align: u64,
    },
}

/// Every offset of `mem` (a multiple of `align`, which must be a positive multiple of 8) holding
/// a superblock that validates against the memory after it, lowest first. A pool whose payloads
/// hold a copy of another pool's superblock yields both; callers normally take the first.
pub fn find_superblocks(mem: &dyn SharedMemory, align: u64) -> Vec<Located> {
    let align = align.max(8);
    let size = mem.size();
    let mut found = Vec::new();
    let mut off = 0u64;
    let mut magic = [0u8; 8];
    while off
        .checked_add(SUPERBLOCK_SIZE)
        .is_some_and(|end| end <= size)
    {
        // The magic alone first: one 8-byte read per step keeps the scan cheap on slow memory.
        if mem.read(off, &mut magic).is_ok() && magic == MAGIC {
            mem.acquire(off, SUPERBLOCK_SIZE);
            if let Ok(sb) = read_obj::<Superblock>(mem, off) {
                if validate_superblock(&sb, size - off).is_ok() {
                    found.push(Located {
                        offset: off,
                        pool_size: sb.pool_size,
                    });
                }
            }
        }
        off += align;
    }
    found
}

/// Maps all of `backend` and returns the pools found in it ([`find_superblocks`]).
pub fn scan(
    backend: &Backend,
    align: u64,
    opts: &RegionOptions,
) -> Result<Vec<Located>, LocateError> {
    let region = Region::open(backend, opts)?;
    Ok(find_superblocks(&region, align))
}

/// Finds the first pool in `backend` and opens it, mapped from its superblock to the end of its
/// pool (rounded up to `map_align`: 4096 for files, the device alignment for device DAX).
pub fn open_located(
    backend: &Backend,
    align: u64,
    map_align: u64,
    opts: &RegionOptions,
) -> Result<(Pool, Located), LocateError> {
    let (total, first) = {
        let region = Region::open(backend, opts)?;
        (
            region.size(),
            find_superblocks(&region, align).into_iter().next(),
        )
    };
    let Some(loc) = first else {
        return Err(LocateError::NotFound {
            what: backend.to_string(),
            size: total,
            align,
        });
    };
    let map_align = map_align.max(1);
    let len = loc
        .pool_size
        .div_ceil(map_align)
        .saturating_mul(map_align)
        .min(total - loc.offset);
    let region = Region::open_range(backend, loc.offset, len, opts)?;
    let pool = Pool::open(Arc::new(region))?;
    Ok((pool, loc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolConfig;

    #[test]
    fn finds_a_pool_at_an_offset_and_ignores_a_bad_crc() {
        let dir = std::env::temp_dir().join(format!("cxlkv-locate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("window");
        let total = 24u64 << 20;
        let off = 6u64 << 20;
        std::fs::File::create(&path)
            .unwrap()
            .set_len(total)
            .unwrap();
        let backend = Backend::File(path.clone());
        let cfg = PoolConfig {
            block_size: 64 << 10,
            participants: 2,
            ..PoolConfig::default()
        };
        {
            let inner =
                Region::open_range(&backend, off, 8 << 20, &RegionOptions::default()).unwrap();
            Pool::create(Arc::new(inner), &cfg).unwrap();
            // A decoy: the magic alone, with no valid superblock behind it.
            let whole = Region::open(&backend, &RegionOptions::default()).unwrap();
            whole.write(1 << 20, &MAGIC).unwrap();
        }
        let found = scan(&backend, SCAN_ALIGN, &RegionOptions::default()).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].offset, off);
        let (pool, loc) =
            open_located(&backend, SCAN_ALIGN, 4096, &RegionOptions::default()).unwrap();
        assert_eq!(loc.offset, off);
        assert_eq!(pool.superblock().pool_size, loc.pool_size);
        let p = pool.attach().unwrap();
        let key = crate::Key::from_bytes(b"locate");
        p.put(key, b"found").unwrap();
        assert_eq!(p.get(key).unwrap().unwrap().0, b"found");
        // Flip a byte of the superblock: it no longer validates.
        {
            let whole = Region::open(&backend, &RegionOptions::default()).unwrap();
            let mut b = [0u8; 1];
            whole.read(off + 40, &mut b).unwrap();
            whole.write(off + 40, &[b[0] ^ 0x5a]).unwrap();
        }
        assert!(matches!(
            open_located(&backend, SCAN_ALIGN, 4096, &RegionOptions::default()),
            Err(LocateError::NotFound { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
