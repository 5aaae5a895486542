//! A `cxlkv-ndpd` child process serving a pool's device area: started for a run, stopped with
//! SIGTERM when dropped (an error path included), and told by the kernel to stop if this process
//! dies first (`PR_SET_PDEATHSIG`), so no daemon outlives its run.

use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running `cxlkv-ndpd`.
pub(crate) struct Daemon {
    child: Child,
    path: PathBuf,
}

impl Daemon {
    /// Spawns `exe --pool SPEC` and waits for its "serving" line.
    pub(crate) fn spawn(exe: &Path, pool_spec: &str) -> Result<Daemon, String> {
        let mut cmd = Command::new(exe);
        cmd.args(["--pool", pool_spec])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
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
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        // From here on the child is ours to stop: dropping `d` on an error path kills it.
        let d = Daemon {
            child,
            path: exe.to_path_buf(),
        };
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("{}: {e}", exe.display()))?;
        if !line.contains("serving") {
            return Err(format!(
                "{} did not start serving (it said {:?}; its error is above)",
                exe.display(),
                line.trim()
            ));
        }
        Ok(d)
    }

    /// The daemon's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The binary it runs.
    pub(crate) fn path(&self) -> &Path {
        &self.path
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
