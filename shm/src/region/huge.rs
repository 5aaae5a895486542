//! Explicit huge pages (`MAP_HUGETLB`): whether any are reserved, how long a mapping of whole huge
//! pages is, and what to say when the reserve runs out.

use super::error::{too_big, unavailable, RegionError, Result};

/// The huge page size in bytes, and the total and free huge pages, from `/proc/meminfo`.
fn huge_page_counts() -> (Option<u64>, Option<u64>, Option<u64>) {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    (
        field("Hugepagesize:").map(|kb| kb * 1024),
        field("HugePages_Total:"),
        field("HugePages_Free:"),
    )
}

/// Bytes to map for a region of `size` bytes in explicit huge pages: `size` rounded up to whole
/// huge pages, since munmap of a hugetlb mapping needs whole ones. Unavailable when the kernel has
/// no huge pages or none are reserved.
pub(super) fn explicit_map_len(backend: impl std::fmt::Display, size: u64) -> Result<usize> {
    let (Some(huge), total, _) = huge_page_counts() else {
        return Err(unavailable(
            backend,
            "this kernel has no huge pages (no Hugepagesize)",
        ));
    };
    if total == Some(0) {
        return Err(unavailable(
            backend,
            "no huge pages are reserved (HugePages_Total 0; reserve some with \
             `echo N > /proc/sys/vm/nr_hugepages`)",
        ));
    }
    let rounded = size
        .checked_next_multiple_of(huge)
        .ok_or_else(|| too_big(size))?;
    usize::try_from(rounded).map_err(|_| too_big(size))
}

/// The error of a `MAP_HUGETLB` mapping of `map_len` bytes that failed with ENOMEM: too few free
/// huge pages, with the counts that say so.
pub(super) fn exhausted(backend: impl std::fmt::Display, map_len: usize) -> RegionError {
    let (huge, total, free) = huge_page_counts();
    unavailable(
        backend,
        format!(
            "not enough free huge pages for {map_len} bytes ({} free of {} pages of {} bytes)",
            free.unwrap_or(0),
            total.unwrap_or(0),
            huge.unwrap_or(0)
        ),
    )
}
