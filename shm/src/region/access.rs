//! Who may open what a region creates: [`Access`] (mode, owner, group), how a backing file gets it
//! with no moment where it is open to more than asked, and the check that a device-DAX device
//! (which cxlkv never creates) is no more open than asked.
//!
//! A backing file (shm, file, fake DAX, NUMA) is created with `O_CREAT | O_EXCL` and mode 0600, so
//! that from the moment it has a name only its creator may open it (the process umask can only
//! narrow that). Then, still before it has a size and long before a pool's superblock is written,
//! `fchown` gives it the owner and group asked for, and `fchmod` the mode asked for, on the open
//! descriptor: there is no window where it is readable by anyone the final mode excludes. If either
//! fails, the file is removed and the error returned. The mode asked for is applied as is: the
//! umask does not narrow an explicit mode (use [`Access::default`] for a private pool).
//!
//! A device-DAX character device (`/dev/daxX.Y`) belongs to the system: its owner, group and mode
//! come from udev (a rule such as `SUBSYSTEM=="dax", KERNEL=="dax0.0", OWNER="cxlkv",
//! GROUP="cxlkv", MODE="0660"`) or a `chown`/`chmod` of the node, not from cxlkv. Creating a pool
//! on one checks instead that the device grants no one more than [`Access`] asks: mode bits
//! beyond it, or another owner or group than the one asked for, refuse the creation with
//! [`RegionError::Unavailable`] saying so (docs/SECURITY.md).

use super::error::{os, unavailable, RegionError, Result};
use super::spec::Backend;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Mode of a file a region creates unless asked otherwise: read and write for its owner only.
pub const PRIVATE_MODE: u32 = 0o600;

/// Owner, group and permission bits of what a region creates (module docs). The default is
/// private: mode 0600, owned by the creating process's user and group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Permission bits (`0o000..=0o777`; set-id and sticky bits are refused).
    pub mode: u32,
    /// Owning user id (`None`: the creating process's effective uid). Giving a file away takes
    /// `CAP_CHOWN` (root).
    pub owner: Option<u32>,
    /// Owning group id (`None`: the creating process's effective gid, or the directory's under a
    /// set-group-id directory). Without `CAP_CHOWN` the creator must be a member of the group.
    pub group: Option<u32>,
}

impl Default for Access {
    fn default() -> Self {
        Access {
            mode: PRIVATE_MODE,
            owner: None,
            group: None,
        }
    }
}

impl Access {
    /// Private access (mode 0600) with `mode` instead; refuses bits outside `0o777`.
    pub fn with_mode(mode: u32) -> Result<Access> {
        let a = Access {
            mode,
            ..Access::default()
        };
        a.check()?;
        Ok(a)
    }

    /// Refuses bits outside the nine permission bits.
    pub fn check(&self) -> Result<()> {
        if self.mode & !0o777 != 0 {
            return Err(RegionError::BadAccess(format!(
                "mode {:#o} has bits outside 0777 (set-id and sticky bits are refused)",
                self.mode
            )));
        }
        Ok(())
    }

    /// True when the mode lets users outside the owner and group read or write.
    pub fn world_accessible(&self) -> bool {
        self.mode & 0o006 != 0
    }

    /// Gives the freshly created, still empty file `file` at `path` its owner, group and mode
    /// (module docs: owner and group first, then the mode).
    pub(super) fn apply(&self, file: &File, path: &Path) -> Result<()> {
        let fd = file.as_raw_fd();
        if self.owner.is_some() || self.group.is_some() {
            let uid = self.owner.unwrap_or(u32::MAX);
            let gid = self.group.unwrap_or(u32::MAX);
            // SAFETY: fchown on a descriptor this process owns; (uid_t)-1 / (gid_t)-1 leave that
            // id unchanged. No memory is passed.
            if unsafe { libc::fchown(fd, uid, gid) } != 0 {
                return Err(os("fchown", path.display())(std::io::Error::last_os_error()));
            }
        }
        // SAFETY: fchmod on a descriptor this process owns; no memory is passed.
        if unsafe { libc::fchmod(fd, self.mode as libc::mode_t) } != 0 {
            return Err(os("fchmod", path.display())(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Checks that the existing device node at `path` grants no more than this access (module
    /// docs); `backend` is named in the refusal.
    pub(super) fn check_device(&self, backend: &Backend, path: &Path) -> Result<()> {
        let m = std::fs::metadata(path).map_err(os("stat", path.display()))?;
        let mode = m.mode() & 0o777;
        let extra = mode & !self.mode;
        let how = "set it with a udev rule or chown/chmod of the device node (docs/SECURITY.md)";
        if extra != 0 {
            return Err(unavailable(
                backend,
                format!(
                    "{} has mode {mode:04o}, which grants {extra:04o} beyond the {:04o} asked \
                     for: {how}",
                    path.display(),
                    self.mode
                ),
            ));
        }
        for (what, want, have) in [
            ("owner", self.owner, m.uid()),
            ("group", self.group, m.gid()),
        ] {
            if want.is_some_and(|w| w != have) {
                return Err(unavailable(
                    backend,
                    format!(
                        "{} has {what} {have}, not the {} asked for: {how}",
                        path.display(),
                        want.unwrap_or_default()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The uid of user `name` (a name from the user database, or a number).
pub fn user_id(name: &str) -> Result<u32> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    let c = c_name(name, "user")?;
    // SAFETY: an all-zero passwd (integers and null pointers) is a valid value to be overwritten.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let found = with_buffer(|buf, result: &mut *mut libc::passwd| {
        // SAFETY: getpwnam_r writes the record into `pwd` and its strings into `buf` (of the
        // length passed), and `result` to `&pwd` or null; all outlive the call.
        unsafe { libc::getpwnam_r(c.as_ptr(), &mut pwd, buf.as_mut_ptr(), buf.len(), result) }
    })
    .map_err(os("getpwnam_r", name))?;
    found
        .then_some(pwd.pw_uid)
        .ok_or_else(|| RegionError::BadAccess(format!("no user named {name:?}")))
}

/// The gid of group `name` (a name from the group database, or a number).
pub fn group_id(name: &str) -> Result<u32> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    let c = c_name(name, "group")?;
    // SAFETY: an all-zero group (integers and null pointers) is a valid value to be overwritten.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let found = with_buffer(|buf, result: &mut *mut libc::group| {
        // SAFETY: as in `user_id`, for getgrnam_r and `grp`.
        unsafe { libc::getgrnam_r(c.as_ptr(), &mut grp, buf.as_mut_ptr(), buf.len(), result) }
    })
    .map_err(os("getgrnam_r", name))?;
    found
        .then_some(grp.gr_gid)
        .ok_or_else(|| RegionError::BadAccess(format!("no group named {name:?}")))
}

fn c_name(name: &str, what: &str) -> Result<CString> {
    CString::new(name)
        .map_err(|_| RegionError::BadAccess(format!("{what} name {name:?} contains a NUL byte")))
}

/// Runs a reentrant database lookup (`getpwnam_r`, `getgrnam_r`) with a string buffer that grows
/// while the lookup says it is too small; true when an entry was found.
fn with_buffer<T>(
    mut call: impl FnMut(&mut [libc::c_char], &mut *mut T) -> libc::c_int,
) -> std::io::Result<bool> {
    let mut buf: Vec<libc::c_char> = vec![0; 1024];
    loop {
        let mut result: *mut T = std::ptr::null_mut();
        match call(&mut buf, &mut result) {
            0 => return Ok(!result.is_null()),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            e => return Err(std::io::Error::from_raw_os_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_names() {
        assert_eq!(Access::default().mode, 0o600);
        assert!(!Access::default().world_accessible());
        assert!(Access::with_mode(0o640).is_ok());
        assert!(Access::with_mode(0o644).unwrap().world_accessible());
        assert!(matches!(
            Access::with_mode(0o4600),
            Err(RegionError::BadAccess(_))
        ));
        assert_eq!(user_id("root").unwrap(), 0);
        assert_eq!(user_id("1234").unwrap(), 1234);
        assert_eq!(group_id("0").unwrap(), 0);
        assert!(user_id("no-such-user-cxlkv").is_err());
        assert!(group_id("no\0group").is_err());
    }

    #[test]
    fn a_device_node_wider_than_asked_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let p = std::env::temp_dir().join(format!("cxlkv-access-node-{}", std::process::id()));
        std::fs::write(&p, b"").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let b = Backend::Dax(p.clone());
        let e = Access::default().check_device(&b, &p).unwrap_err();
        assert!(e.to_string().contains("grants 0044"), "{e}");
        assert!(Access::with_mode(0o644)
            .unwrap()
            .check_device(&b, &p)
            .is_ok());
        let owner = std::fs::metadata(&p).unwrap().uid();
        let other = Access {
            owner: Some(owner.wrapping_add(1)),
            ..Access::with_mode(0o644).unwrap()
        };
        assert!(other
            .check_device(&b, &p)
            .unwrap_err()
            .to_string()
            .contains("owner"));
        std::fs::remove_file(&p).unwrap();
    }
}
