//! What a `dax:` path is on this machine: a device-DAX character device (its size and alignment as
//! sysfs describes them), a regular file used as fake DAX, or nothing yet; and [`DAX_ALIGN`], the
//! alignment both demand.

use super::error::{os, unavailable, Result};
use super::spec::Backend;
use super::sys::{read_sys_u64, SYS};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// Alignment that device DAX (and fake DAX) demands of mapping offsets and lengths: 2 MiB, the
/// smallest device-DAX page size used for memory expanders. A device whose `align` attribute is
/// larger (1 GiB) demands that instead.
pub const DAX_ALIGN: u64 = 2 << 20;

/// A device-DAX character device as sysfs describes it.
#[derive(Clone, Copy, Debug)]
pub(super) struct DaxDeviceInfo {
    /// Bytes of the device.
    pub(super) size: u64,
    /// Alignment of mapping offsets and lengths (at least [`DAX_ALIGN`]).
    pub(super) align: u64,
}

/// What a [`Backend::Dax`] path is on this machine.
pub(super) enum DaxTarget {
    /// A device-DAX character device.
    Device(DaxDeviceInfo),
    /// A regular file used as fake DAX.
    Fake,
    /// Nothing exists at the path yet (fake DAX to be created).
    Missing,
}

/// Looks the character device `rdev` up in sysfs; `None` when it is not a device-DAX device.
fn dax_device_info(sys: &Path, path: &Path, rdev: u64) -> Option<DaxDeviceInfo> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let mut dirs = vec![sys.join(format!("dev/char/{major}:{minor}"))];
    if let Some(name) = path.file_name() {
        dirs.push(sys.join("bus/dax/devices").join(name));
        dirs.push(sys.join("class/dax").join(name).join("device"));
    }
    dirs.into_iter().find_map(|dir| {
        let subsystem = std::fs::read_link(dir.join("subsystem")).ok()?;
        if subsystem.file_name()? != "dax" {
            return None;
        }
        let size = read_sys_u64(&dir.join("size"))?;
        let align = read_sys_u64(&dir.join("align"))
            .unwrap_or(DAX_ALIGN)
            .max(DAX_ALIGN);
        Some(DaxDeviceInfo { size, align })
    })
}

/// What `path` of the DAX backend `backend` is; why it is unavailable when it is neither a
/// device-DAX device nor a regular file (nor, outside `/dev`, missing).
pub(super) fn dax_target(backend: &Backend, path: &Path) -> Result<DaxTarget> {
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_char_device() => dax_device_info(Path::new(SYS), path, m.rdev())
            .map(DaxTarget::Device)
            .ok_or_else(|| {
                unavailable(
                    backend,
                    format!(
                        "{} is a character device but not device DAX (no dax subsystem \
                             entry with a size under {SYS}/dev/char)",
                        path.display()
                    ),
                )
            }),
        Ok(m) if m.file_type().is_file() => Ok(DaxTarget::Fake),
        Ok(_) => Err(unavailable(
            backend,
            format!(
                "{} is neither a device-DAX character device nor a regular file",
                path.display()
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if path.starts_with("/dev") {
                let found = std::fs::read_dir(Path::new(SYS).join("bus/dax/devices"))
                    .map(|d| {
                        d.filter_map(|e| {
                            e.ok().map(|e| e.file_name().to_string_lossy().into_owned())
                        })
                        .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                let found = if found.is_empty() {
                    "no DAX device found".into()
                } else {
                    found.join(", ")
                };
                Err(unavailable(
                    backend,
                    format!(
                        "no DAX device at {} ({SYS}/bus/dax/devices: {found})",
                        path.display()
                    ),
                ))
            } else {
                Ok(DaxTarget::Missing)
            }
        }
        Err(e) => Err(os("stat", path.display())(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::error::{check_aligned, check_window, RegionError};

    #[test]
    fn window_and_alignment_checks() {
        assert!(check_window(0, 8, 8).is_ok());
        assert!(matches!(
            check_window(u64::MAX, 2, 8),
            Err(RegionError::OutOfRange { .. })
        ));
        assert!(check_aligned("x", 4 << 20, DAX_ALIGN).is_ok());
        assert!(matches!(
            check_aligned("x", 4096, DAX_ALIGN),
            Err(RegionError::Misaligned {
                value: 4096,
                align: DAX_ALIGN,
                ..
            })
        ));
    }
}
