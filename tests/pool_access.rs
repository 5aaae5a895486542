//! The pool as trust boundary (issue #27): `cxlkv pool create` makes what it creates private by
//! default (mode 0600), a reader running as another uid cannot open it and gets a clear error (no
//! panic), `--mode 0640 --group G` lets a member of G inspect it read-only, the mode asked for is
//! applied whatever the umask, and bad options or a refused `fchown` leave no file behind.
//!
//! The readers run as another user through `setpriv` (util-linux). That needs root: run otherwise,
//! the tests that change uid say so and skip (CI runs as root).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Command, Output};

/// The user and group the other-uid readers run as.
const NOBODY: &str = "65534";
/// A group no one is in unless a reader is given it.
const POOL_GROUP: u32 = 42_427;

fn cxlkv() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cxlkv"))
}

/// True when this process can run commands as another uid (root, with setpriv installed); else
/// says why the test skips.
fn can_switch_user(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped {test}: running readers as another uid needs root (CI runs as root)");
        return false;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped {test}: setpriv (util-linux) is not installed");
        return false;
    }
    true
}

/// `cxlkv ARGS` as uid/gid 65534 with no supplementary groups but `groups`.
fn as_nobody(groups: Option<u32>, args: &[&str]) -> Output {
    let mut c = Command::new("setpriv");
    c.args(["--reuid", NOBODY, "--regid", NOBODY]);
    match groups {
        Some(g) => c.arg(format!("--groups={g}")),
        None => c.arg("--clear-groups"),
    };
    c.arg(env!("CARGO_BIN_EXE_cxlkv"))
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A pool spec of each creatable backend and the file behind it, removed on drop.
struct Pools(Vec<(String, PathBuf)>);

impl Pools {
    fn new(tag: &str) -> Pools {
        let id = format!("cxlkv-access-{tag}-{}", std::process::id());
        let tmp = std::env::temp_dir();
        let v = vec![
            (format!("shm:{id}"), PathBuf::from("/dev/shm").join(&id)),
            (
                format!("file:{}", tmp.join(format!("{id}.pool")).display()),
                tmp.join(format!("{id}.pool")),
            ),
            (
                format!("fakedax:{}", tmp.join(format!("{id}.dax")).display()),
                tmp.join(format!("{id}.dax")),
            ),
        ];
        for (_, p) in &v {
            let _ = std::fs::remove_file(p);
        }
        Pools(v)
    }
}

impl Drop for Pools {
    fn drop(&mut self) {
        for (_, p) in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// `cxlkv pool create` of a small pool on `spec` with `extra` options; panics unless it succeeds.
fn create(spec: &str, extra: &[&str]) {
    let o = cxlkv()
        .args([
            "pool",
            "create",
            "--backend",
            spec,
            "--size",
            "4M",
            "--block-size",
            "4K",
            "--participants",
            "2",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "create {spec} {extra:?}: {}", text(&o));
}

fn mode_of(p: &PathBuf) -> (u32, u32, u32) {
    let m = std::fs::metadata(p).unwrap();
    (m.mode() & 0o7777, m.uid(), m.gid())
}

#[test]
fn pools_are_private_by_default_and_another_uid_cannot_open_them() {
    let pools = Pools::new("private");
    let root = can_switch_user("pools_are_private_by_default_and_another_uid_cannot_open_them");
    for (spec, path) in &pools.0 {
        create(spec, &[]);
        let (mode, _, _) = mode_of(path);
        assert_eq!(mode, 0o600, "{spec}: created with mode {mode:o}");
        let own = cxlkv().args(["pool", "check", spec]).output().unwrap();
        assert!(own.status.success(), "the owner opens it: {}", text(&own));
        if !root {
            continue;
        }
        for cmd in ["stat", "info", "check"] {
            let o = as_nobody(None, &["pool", cmd, spec]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{spec} pool {cmd}: {}", text(&o));
            assert!(
                err.contains("Permission denied") && err.contains("docs/SECURITY.md"),
                "{spec} pool {cmd}: {}",
                text(&o)
            );
            assert!(!err.contains("panicked"), "{}", text(&o));
        }
    }
}

#[test]
fn a_group_with_read_permission_inspects_the_pool_and_others_cannot() {
    if !can_switch_user("a_group_with_read_permission_inspects_the_pool_and_others_cannot") {
        return;
    }
    let pools = Pools::new("group");
    let g = POOL_GROUP.to_string();
    for (spec, path) in &pools.0 {
        create(spec, &["--mode", "0640", "--group", &g]);
        assert_eq!(mode_of(path), (0o640, 0, POOL_GROUP), "{spec}");
        // A member of the group may read: it inspects the pool (read-only mapping).
        let member = as_nobody(Some(POOL_GROUP), &["pool", "check", spec]);
        assert!(member.status.success(), "{spec}: {}", text(&member));
        assert!(
            String::from_utf8_lossy(&member.stdout).contains("pool OK"),
            "{}",
            text(&member)
        );
        let stat = as_nobody(Some(POOL_GROUP), &["pool", "stat", spec, "--watch-ms", "0"]);
        assert!(stat.status.success(), "{spec}: {}", text(&stat));
        // Anyone else may not.
        let other = as_nobody(None, &["pool", "stat", spec, "--watch-ms", "0"]);
        assert_eq!(other.status.code(), Some(2), "{spec}: {}", text(&other));
        assert!(
            String::from_utf8_lossy(&other.stderr).contains("Permission denied"),
            "{}",
            text(&other)
        );
    }
}

#[test]
fn the_mode_asked_for_is_applied_whatever_the_umask() {
    let pools = Pools::new("umask");
    let (spec, path) = &pools.0[0];
    let o = Command::new("sh")
        .args([
            "-c",
            "umask 077 && exec \"$0\" pool create --backend \"$1\" --size 4M --block-size 4K \
             --participants 2 --mode 0660",
            env!("CARGO_BIN_EXE_cxlkv"),
            spec,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(mode_of(path).0, 0o660);
    // The owner and group of a file given away (root only).
    if can_switch_user("the_mode_asked_for_is_applied_whatever_the_umask (--owner)") {
        let (spec, path) = &pools.0[1];
        create(
            spec,
            &["--owner", NOBODY, "--group", "nogroup", "--mode", "0600"],
        );
        let nogroup = mode_of(path).2;
        assert_eq!(mode_of(path), (0o600, 65534, nogroup));
        // Its new owner opens it.
        let o = as_nobody(None, &["pool", "stat", spec, "--watch-ms", "0"]);
        assert!(o.status.success(), "{}", text(&o));
    }
}

#[test]
fn bad_access_options_create_nothing() {
    let pools = Pools::new("bad");
    let (spec, path) = &pools.0[0];
    for extra in [
        &["--mode", "0999"][..],
        &["--mode", "4755"],
        &["--mode", "rw"],
        &["--owner", "no-such-user-cxlkv"],
        &["--group", "no-such-group-cxlkv"],
    ] {
        let o = cxlkv()
            .args(["pool", "create", "--backend", spec, "--size", "4M"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o));
        assert!(!path.exists(), "{extra:?} left {}", path.display());
        assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    }
    // A refused fchown (an ordinary user giving the file to root) removes the file it made.
    if can_switch_user("bad_access_options_create_nothing (refused fchown)") {
        let o = as_nobody(
            None,
            &[
                "pool",
                "create",
                "--backend",
                spec,
                "--size",
                "4M",
                "--owner",
                "0",
            ],
        );
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("fchown"),
            "{}",
            text(&o)
        );
        assert!(!path.exists(), "the refused create left {}", path.display());
    }
}
