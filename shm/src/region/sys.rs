//! What the kernel reports that the backends read: the sysfs root and the page size.

use std::path::Path;

/// Root of the sysfs tree the backends read (node existence and memory, device-DAX attributes).
pub(super) const SYS: &str = "/sys";

/// The base page size (4 KiB where the kernel does not say).
pub(super) fn page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// A number in a sysfs attribute, decimal or `0x` hexadecimal.
pub(super) fn read_sys_u64(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}
