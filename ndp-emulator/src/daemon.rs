//! Starting and finding `cxlkv-ndpd`: the one launcher that the decoder's `--device ndpd`, the
//! demo, the QEMU test bed and every test that needs the device as a separate process use.
//!
//! [`Daemon::spawn`] starts `cxlkv-ndpd --pool SPEC ARGS..` ([`Daemon::spawn_pools`]: one
//! `--pool` per pool of a daemon serving several) and returns once the daemon printed its
//! `serving` line, so every device area is live when the caller submits its first command. The
//! child is stopped with SIGTERM when the [`Daemon`] is dropped (an error path included) and told
//! by the kernel to stop if this process dies first (`PR_SET_PDEATHSIG`), so no daemon outlives
//! its run. [`Daemon::kill`] is the crash a test wants: SIGKILL, mid-command.
//!
//! [`find_ndpd`] finds the binary: `$CXLKV_NDPD`, else next to the running executable.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

/// Why a daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The binary could not be run.
    #[error("cannot start {path}: {source}")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// What `spawn` said.
        source: std::io::Error,
    },
    /// It exited or closed its output before saying it serves (its error is on its stderr).
    #[error("{path} did not start serving (it said {said:?}; its error is above)")]
    NotServing {
        /// The binary.
        path: PathBuf,
        /// Everything it printed on stdout before it stopped.
        said: String,
    },
    /// Its output could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The binary.
        path: PathBuf,
        /// The read error.
        source: std::io::Error,
    },
}

/// A running `cxlkv-ndpd`, stopped with SIGTERM when dropped.
pub struct Daemon {
    child: Child,
    path: PathBuf,
    /// The rest of its stdout: held open so that a later line (`--metrics`' address) never meets
    /// a closed pipe, and readable with [`Daemon::read_line`].
    stdout: BufReader<ChildStdout>,
    /// What it printed up to and including its `serving` line.
    said: String,
}

impl Daemon {
    /// Spawns `exe --pool POOL_SPEC ARGS..` and waits for its `serving` line (lines before it,
    /// such as `--locate`'s "pool found", are kept in [`Daemon::said`]).
    pub fn spawn(exe: &Path, pool_spec: &str, args: &[&str]) -> Result<Daemon, DaemonError> {
        Daemon::spawn_pools(exe, &[pool_spec], args)
    }

    /// Spawns `exe --pool SPEC.. ARGS..`, one `--pool` for each of `pool_specs`, and waits for its
    /// `serving` line (printed once every pool it can serve is live).
    pub fn spawn_pools(
        exe: &Path,
        pool_specs: &[&str],
        args: &[&str],
    ) -> Result<Daemon, DaemonError> {
        let mut cmd = Command::new(exe);
        for spec in pool_specs {
            cmd.args(["--pool", spec]);
        }
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped());
        // SAFETY: the closure runs in the child between fork and exec and calls only prctl(2),
        // which is async-signal-safe; it touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| DaemonError::Spawn {
            path: exe.to_path_buf(),
            source,
        })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        // From here on the child is ours to stop: dropping `d` on an error path stops it.
        let mut d = Daemon {
            child,
            path: exe.to_path_buf(),
            stdout: BufReader::new(stdout),
            said: String::new(),
        };
        loop {
            let line = d.read_line().map_err(|source| DaemonError::Read {
                path: d.path.clone(),
                source,
            })?;
            if line.is_empty() {
                return Err(DaemonError::NotServing {
                    path: d.path.clone(),
                    said: d.said.trim().to_string(),
                });
            }
            d.said.push_str(&line);
            if line.contains("serving") {
                return Ok(d);
            }
        }
    }

    /// The next line of its stdout (empty once it closed it).
    pub fn read_line(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        Ok(line)
    }

    /// What it printed before it served, its `serving` line last (which names the engine).
    pub fn said(&self) -> &str {
        &self.said
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The binary it runs.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Kills it with SIGKILL (no clean stop: a device that dies mid-command) and reaps it.
    pub fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill()?;
        self.child.wait().map(drop)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SAFETY: kill(2) of our own child, not reaped yet, so the pid still names it.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// The `cxlkv-ndpd` binary: `$CXLKV_NDPD`, else next to this executable (or one folder up, where
/// cargo puts binaries beside the test executables in `deps/`).
pub fn find_ndpd() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CXLKV_NDPD") {
        return Some(PathBuf::from(p));
    }
    let me = std::env::current_exe().ok()?;
    let dir = me.parent()?;
    [dir.join("cxlkv-ndpd"), dir.join("../cxlkv-ndpd")]
        .into_iter()
        .find(|p| p.is_file())
}
