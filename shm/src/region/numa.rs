//! NUMA-bound regions: checking that a node exists and has memory, binding a mapping to it with
//! `mbind(MPOL_BIND)`, and verifying page by page (`move_pages(2)`, or `get_mempolicy(2)` where
//! that is refused) that the prefaulted mapping really lives there.

use super::error::{os, unavailable, RegionError, Result};
use super::spec::Backend;
use super::sys::{page_size, SYS};
use crate::mem::RawMemory;
use std::path::Path;

// mbind(2) / get_mempolicy(2) flags the libc crate does not export (linux/mempolicy.h).
const MPOL_MF_STRICT: libc::c_uint = 1 << 0;
const MPOL_MF_MOVE: libc::c_uint = 1 << 1;
const MPOL_F_NODE: libc::c_ulong = 1 << 0;
pub(super) const MPOL_F_ADDR: libc::c_ulong = 1 << 1;

/// Checks that NUMA node `node` exists and has memory; the reason when it does not.
pub(super) fn check_node(backend: &Backend, node: u32) -> Result<()> {
    let nodes = Path::new(SYS).join("devices/system/node");
    if !nodes.is_dir() {
        return Err(unavailable(
            backend,
            format!(
                "this kernel has no NUMA support ({} is missing)",
                nodes.display()
            ),
        ));
    }
    let dir = nodes.join(format!("node{node}"));
    if !dir.is_dir() {
        let online = std::fs::read_to_string(nodes.join("online")).unwrap_or_default();
        return Err(unavailable(
            backend,
            format!(
                "NUMA node {node} does not exist ({} missing; online nodes: {})",
                dir.display(),
                online.trim()
            ),
        ));
    }
    match crate::topo::node_memory_bytes(&dir) {
        Some(0) => Err(unavailable(
            backend,
            format!(
                "NUMA node {node} has no memory (MemTotal 0 in {}/meminfo)",
                dir.display()
            ),
        )),
        Some(_) => Ok(()),
        None => Err(unavailable(
            backend,
            format!(
                "cannot read MemTotal of NUMA node {node} from {}/meminfo",
                dir.display()
            ),
        )),
    }
}

/// Binds the whole mapping of `map_len` bytes at the base of `mem` to `node` (MPOL_BIND), moving
/// pages this process alone maps and failing (EIO) when existing pages cannot be moved.
pub(super) fn bind(mem: &RawMemory, map_len: usize, node: u32, backend: &Backend) -> Result<()> {
    let base = mem.raw_range(0, 0).expect("empty range at 0 is in bounds");
    let bits = u64::BITS as usize;
    let mut mask = vec![0 as libc::c_ulong; node as usize / bits + 1];
    mask[node as usize / bits] |= 1 << (node as usize % bits);
    // The kernel reads maxnode - 1 bits (a historical off-by-one that libnuma also follows).
    let maxnode = (mask.len() * bits + 1) as libc::c_ulong;
    // SAFETY: mbind on exactly the mapping of the caller's region (`map_len` bytes from `base`);
    // `mask` holds `maxnode - 1` bits and outlives the call. It changes placement only, never
    // contents.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            base,
            map_len as libc::c_ulong,
            libc::MPOL_BIND as libc::c_ulong,
            mask.as_ptr(),
            maxnode,
            (MPOL_MF_STRICT | MPOL_MF_MOVE) as libc::c_ulong,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) => Err(unavailable(
            backend,
            format!("mbind refused node {node} ({e}); is it outside this process's cpuset mems?"),
        )),
        Some(libc::ENOSYS) => Err(unavailable(
            backend,
            format!("this kernel has no mbind ({e})"),
        )),
        _ => Err(os("mbind(MPOL_BIND)", backend)(e)),
    }
}

/// Checks that every page of the (prefaulted) mapping `mem` lives on `node`.
pub(super) fn verify_node(mem: &RawMemory, node: u32, backend: &Backend) -> Result<()> {
    const BATCH: usize = 512;
    let page = page_size();
    let size = mem.size();
    let mut pages = Vec::with_capacity(BATCH);
    let mut status: Vec<libc::c_int> = vec![0; BATCH];
    let mut start = 0u64;
    while start < size {
        pages.clear();
        let mut off = start;
        while off < size && pages.len() < BATCH {
            let p = mem.raw_range(off, 0).expect("page offsets are in bounds");
            pages.push(p.cast::<libc::c_void>());
            off += page;
        }
        // SAFETY: move_pages with nodes == NULL only reports where each page is; `pages` and
        // `status` hold `pages.len()` entries and outlive the call; pid 0 is this process.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                0 as libc::c_long,
                pages.len() as libc::c_ulong,
                pages.as_ptr(),
                std::ptr::null::<libc::c_int>(),
                status.as_mut_ptr(),
                0 as libc::c_long,
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) {
                return verify_node_slow(mem, node, start, backend);
            }
            return Err(os("move_pages", backend)(e));
        }
        if let Some(i) = status[..pages.len()]
            .iter()
            .position(|&s| s != node as libc::c_int)
        {
            return Err(RegionError::Misplaced {
                node,
                offset: start + i as u64 * page,
                actual: status[i],
            });
        }
        start = off;
    }
    Ok(())
}

/// [`verify_node`] from offset `from` on, one page at a time with get_mempolicy, for sandboxes
/// that refuse move_pages.
pub(super) fn verify_node_slow(
    mem: &RawMemory,
    node: u32,
    from: u64,
    backend: &Backend,
) -> Result<()> {
    let page = page_size();
    for off in (from..mem.size()).step_by(page as usize) {
        let addr = mem.raw_range(off, 0).expect("page offsets are in bounds");
        let actual =
            mempolicy_at(addr, MPOL_F_NODE | MPOL_F_ADDR).map_err(os("get_mempolicy", backend))?;
        if actual != node as libc::c_int {
            return Err(RegionError::Misplaced {
                node,
                offset: off,
                actual,
            });
        }
    }
    Ok(())
}

/// `get_mempolicy(2)` of the page at `addr`, without a nodemask: with `MPOL_F_ADDR` the policy mode
/// of the mapping that holds it, with `MPOL_F_NODE | MPOL_F_ADDR` the node the page is on.
pub(super) fn mempolicy_at(addr: *mut u8, flags: libc::c_ulong) -> std::io::Result<libc::c_int> {
    let mut out: libc::c_int = -1;
    // SAFETY: get_mempolicy writes one int into `out`, a live local; no nodemask is passed
    // (maxnode 0). `addr` is only looked up, never written: an unmapped one is EFAULT.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut out as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            addr,
            flags,
        )
    };
    if rc == 0 {
        Ok(out)
    } else {
        Err(std::io::Error::last_os_error())
    }
}
