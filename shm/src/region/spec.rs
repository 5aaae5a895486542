//! What a region is asked to be: where its memory comes from ([`Backend`], parsed from and printed
//! as a spec string such as `shm:NAME`) and how it is mapped ([`RegionOptions`], [`HugePages`]).

use super::error::{RegionError, Result};
use std::path::{Path, PathBuf};

/// Where a region's memory comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Private anonymous memory (tests, scratch pools).
    Anonymous,
    /// A shared-memory file `/dev/shm/NAME`.
    Shm(String),
    /// A file on any filesystem (fsdax when the filesystem is DAX-mounted).
    File(PathBuf),
    /// A device-DAX character device (`/dev/daxX.Y`), or a regular file used as *fake DAX*; both
    /// demand 2 MiB-aligned ([`DAX_ALIGN`](super::DAX_ALIGN)) offsets and lengths.
    Dax(PathBuf),
    /// Shared memory bound to NUMA node `node` with `mbind(MPOL_BIND)`, backed by `/dev/shm/NAME`.
    Numa {
        /// The NUMA node the pages must land on.
        node: u32,
        /// Name of the backing shared-memory file.
        name: String,
    },
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Anonymous => write!(f, "anon"),
            Backend::Shm(n) => write!(f, "shm:{n}"),
            Backend::File(p) => write!(f, "file:{}", p.display()),
            Backend::Dax(p) => write!(f, "dax:{}", p.display()),
            Backend::Numa { node, name } => write!(f, "numa:{node}:{name}"),
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = RegionError;
    /// Parses `anon`, `shm:NAME`, `file:PATH`, `dax:PATH`, `fakedax:PATH`, `numa:N` or
    /// `numa:N:NAME`. A bare path (starting with `/` or `.`) is a file, except that
    /// `/dev/shm/NAME` is shm and `/dev/dax*` is device DAX.
    ///
    /// `dax:PATH` is device DAX when PATH is a character device, and *fake DAX* when PATH is a
    /// regular file (or, for `create`, does not exist and is not under `/dev`): a file-backed
    /// region held to the same 2 MiB alignment rules, so the DAX code path runs everywhere.
    /// `fakedax:PATH` says so explicitly and parses to the same [`Backend::Dax`]; it refuses paths
    /// under `/dev`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || RegionError::BadSpec(s.to_string());
        if s == "anon" {
            return Ok(Backend::Anonymous);
        }
        if let Some(name) = s.strip_prefix("shm:") {
            return shm_name(name)
                .map(|n| Backend::Shm(n.to_string()))
                .ok_or_else(bad);
        }
        if let Some(p) = s.strip_prefix("file:") {
            return if p.is_empty() {
                Err(bad())
            } else {
                Ok(Backend::File(p.into()))
            };
        }
        if let Some(p) = s.strip_prefix("dax:") {
            return if p.is_empty() {
                Err(bad())
            } else {
                Ok(Backend::Dax(p.into()))
            };
        }
        if let Some(p) = s.strip_prefix("fakedax:") {
            return if p.is_empty() || Path::new(p).starts_with("/dev") {
                Err(bad())
            } else {
                Ok(Backend::Dax(p.into()))
            };
        }
        if let Some(rest) = s.strip_prefix("numa:") {
            let (node, name) = match rest.split_once(':') {
                Some((n, name)) => (n, name.to_string()),
                None => (rest, format!("cxlkv-numa{rest}")),
            };
            let node = node.parse().map_err(|_| bad())?;
            shm_name(&name).ok_or_else(bad)?;
            return Ok(Backend::Numa { node, name });
        }
        if let Some(name) = s.strip_prefix("/dev/shm/") {
            return shm_name(name)
                .map(|n| Backend::Shm(n.to_string()))
                .ok_or_else(bad);
        }
        if s.starts_with("/dev/dax") {
            return Ok(Backend::Dax(s.into()));
        }
        if s.starts_with('/') || s.starts_with('.') {
            return Ok(Backend::File(s.into()));
        }
        Err(bad())
    }
}

fn shm_name(name: &str) -> Option<&str> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && !name.starts_with('.');
    ok.then_some(name)
}

impl Backend {
    /// The filesystem path behind this backend, if it has one.
    pub fn path(&self) -> Option<PathBuf> {
        match self {
            Backend::Anonymous => None,
            Backend::Shm(n) | Backend::Numa { name: n, .. } => Some(Path::new("/dev/shm").join(n)),
            Backend::File(p) | Backend::Dax(p) => Some(p.clone()),
        }
    }
}

/// Huge-page policy of a mapping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HugePages {
    /// Base pages only.
    #[default]
    None,
    /// Ask for transparent huge pages (`madvise(MADV_HUGEPAGE)`). Ignored for device DAX, whose
    /// faults already map the device's page size.
    Transparent,
    /// Explicit huge pages (`MAP_HUGETLB`, anonymous regions only): fails when none are reserved.
    /// The mapping is rounded up to whole huge pages; the region's size stays the one asked for.
    Explicit,
}

/// Mapping options.
#[derive(Clone, Copy, Debug, Default)]
pub struct RegionOptions {
    /// Fault every page in at map time (`MAP_POPULATE` for anonymous memory,
    /// `madvise(MADV_POPULATE_WRITE)` for shared mappings), so first touches on the hot path are
    /// cheap. NUMA-bound regions are always prefaulted, since their placement is checked.
    pub prefault: bool,
    /// Huge-page policy.
    pub huge_pages: HugePages,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_backend_specs() {
        assert_eq!("anon".parse::<Backend>().unwrap(), Backend::Anonymous);
        assert_eq!(
            "shm:pool0".parse::<Backend>().unwrap(),
            Backend::Shm("pool0".into())
        );
        assert_eq!(
            "/dev/shm/p".parse::<Backend>().unwrap(),
            Backend::Shm("p".into())
        );
        assert_eq!(
            "/tmp/x.pool".parse::<Backend>().unwrap(),
            Backend::File("/tmp/x.pool".into())
        );
        assert_eq!(
            "numa:2".parse::<Backend>().unwrap(),
            Backend::Numa {
                node: 2,
                name: "cxlkv-numa2".into()
            }
        );
        assert_eq!(
            "fakedax:/tmp/f".parse::<Backend>().unwrap(),
            Backend::Dax("/tmp/f".into())
        );
        assert!("fakedax:/dev/dax0.0".parse::<Backend>().is_err());
        assert_eq!(
            "/dev/dax1.2".parse::<Backend>().unwrap(),
            Backend::Dax("/dev/dax1.2".into())
        );
        assert!("shm:../etc".parse::<Backend>().is_err());
        assert!("numa:x".parse::<Backend>().is_err());
        assert!("bogus".parse::<Backend>().is_err());
    }
}
