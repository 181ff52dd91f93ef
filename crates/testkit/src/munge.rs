//! A munged of the test's own (Debian's `munge` package): a fresh key in a temporary directory, its socket there,
//! run in the foreground as the test's child and ended by its pid when the guard drops (or by a watchdog when the
//! test process dies without unwinding). Several daemons started with [`MungeDaemon::sharing_key_with`] stand for
//! the nodes of one cluster; a daemon with a key of its own stands for a stranger's cluster.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::cmd::{send, wait_with_deadline};
use crate::error::{Result, TestkitError};
use crate::watchdog::Watchdog;

const START_TIMEOUT: Duration = Duration::from_secs(10);
const HINT: &str = "install MUNGE (Debian: apt-get install munge)";

/// A running munged; `socket()` is where `munge --socket` and `unmunge --socket` reach it.
#[derive(Debug)]
pub struct MungeDaemon {
    dir: tempfile::TempDir,
    daemon: Option<Child>,
    watchdog: Option<Watchdog>,
}

impl MungeDaemon {
    /// A munged with a new key (a cluster of its own).
    pub fn start() -> Result<Self> {
        Self::start_with(None)
    }

    /// A munged with `other`'s key: another node of the same cluster.
    pub fn sharing_key_with(other: &MungeDaemon) -> Result<Self> {
        Self::start_with(Some(&other.key()))
    }

    fn start_with(key: Option<&Path>) -> Result<Self> {
        let tool = |name: &str| -> Result<PathBuf> {
            ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
                .iter()
                .map(|d| Path::new(d).join(name))
                .find(|p| p.exists())
                .ok_or_else(|| TestkitError::Missing {
                    tool: name.into(),
                    hint: HINT,
                })
        };
        let munged = tool("munged")?;
        let dir = tempfile::Builder::new()
            .prefix("hangwatch-munge-")
            .tempdir()
            .map_err(TestkitError::io("could not create munged's directory"))?;
        // Open to every user, as /run/munge is (the key itself is 0600): a test may make credentials as another.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(TestkitError::io("could not open munged's directory"))?;
        let own_key = dir.path().join("munge.key");
        match key {
            Some(key) => {
                std::fs::copy(key, &own_key).map_err(TestkitError::io("could not copy the key"))?;
            }
            None => {
                let out = Command::new(tool("mungekey")?)
                    .args(["--create", "--keyfile"])
                    .arg(&own_key)
                    .output()
                    .map_err(TestkitError::io("could not run mungekey"))?;
                if !out.status.success() {
                    return Err(TestkitError::CommandFailed {
                        command: "mungekey --create".into(),
                        status: out.status.to_string(),
                        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                    });
                }
            }
        }
        std::fs::set_permissions(&own_key, std::fs::Permissions::from_mode(0o600))
            .map_err(TestkitError::io("could not protect the key"))?;
        let root = dir.path().to_path_buf();
        let path = |name: &str| root.join(name);
        let daemon = Command::new(munged)
            .arg("--foreground")
            .arg(format!("--socket={}", path("socket").display()))
            .arg(format!("--key-file={}", own_key.display()))
            .arg(format!("--pid-file={}", path("munged.pid").display()))
            .arg(format!("--log-file={}", path("munged.log").display()))
            .arg(format!("--seed-file={}", path("munged.seed").display()))
            // Root may run it (a test machine's munged user is not ours to use).
            .arg("--force")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(TestkitError::io("could not start munged"))?;
        let pid = daemon.id().to_string();
        let mut fixture = Self {
            dir,
            daemon: Some(daemon),
            watchdog: None,
        };
        fixture.watchdog = Some(Watchdog::arm(r#"kill -KILL "$1""#, &[&pid])?);
        let socket = fixture.socket();
        if !crate::wait_until(START_TIMEOUT, Duration::from_millis(20), || socket.exists()) {
            let log = std::fs::read_to_string(path("munged.log")).unwrap_or_default();
            fixture.stop();
            return Err(TestkitError::Timeout {
                what: format!("munged's socket {} (log: {log})", socket.display()),
                after: START_TIMEOUT,
            });
        }
        Ok(fixture)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("socket")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.path().join("munge.key")
    }

    fn stop(&mut self) {
        drop(self.watchdog.take());
        if let Some(mut daemon) = self.daemon.take() {
            let _ = send(daemon.id(), Signal::SIGTERM);
            if wait_with_deadline(&mut daemon, Duration::from_secs(5)).is_none() {
                let _ = daemon.kill();
                let _ = daemon.wait();
            }
        }
    }
}

impl Drop for MungeDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}
