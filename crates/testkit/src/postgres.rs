//! A PostgreSQL server of the test's own (Debian's `postgresql` package): a fresh cluster in a temporary
//! directory, listening on 127.0.0.1 on a free port, stopped and removed when the guard drops (or by a watchdog
//! when the test process dies without unwinding), ending only the postmaster it started, by its pid.
//!
//! PostgreSQL refuses to run as root: as root, `initdb` and `postgres` run as `nobody` (through `setpriv`, which
//! execs, so the child is the postmaster itself), with the directory handed to that user.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, User};

use crate::cmd::{send, wait_with_deadline};
use crate::error::{Result, TestkitError};
use crate::watchdog::Watchdog;

const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
const HINT: &str = "install PostgreSQL (Debian: apt-get install postgresql)";

/// The superuser the cluster is made with.
pub const POSTGRES_USER: &str = "hangwatch";

/// A running (or stopped, see [`PostgresServer::stop`]) PostgreSQL cluster of the test's own.
#[derive(Debug)]
pub struct PostgresServer {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    password: String,
    /// The user the server runs as: `nobody` when the test runs as root, else the test's own.
    run_as: Option<(Uid, Gid)>,
    postmaster: Option<Child>,
    watchdog: Option<Watchdog>,
}

impl PostgresServer {
    /// Makes a cluster (superuser [`POSTGRES_USER`] with a password for TCP, trust on its Unix socket) and starts
    /// it. Missing binaries are [`TestkitError::Missing`] (a skip; a failure in strict mode).
    pub fn start() -> Result<PostgresServer> {
        let bin = find_bin_dir()?;
        let run_as =
            if nix::unistd::geteuid().is_root() {
                let nobody = User::from_name("nobody").ok().flatten().ok_or_else(|| {
                    TestkitError::Missing {
                        tool: "the user nobody".into(),
                        hint: "PostgreSQL refuses root; the fixture runs it as nobody",
                    }
                })?;
                Some((nobody.uid, nobody.gid))
            } else {
                None
            };
        let dir = tempfile::Builder::new()
            .prefix("hangwatch-pg-")
            .tempdir()
            .map_err(TestkitError::io(
                "could not create the PostgreSQL directory",
            ))?;
        let password = format!("pw-{}", std::process::id());
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, format!("{password}\n"))
            .map_err(TestkitError::io("could not write the password file"))?;
        if let Some((uid, gid)) = run_as {
            for path in [dir.path(), pwfile.as_path()] {
                nix::unistd::chown(path, Some(uid), Some(gid)).map_err(|e| TestkitError::Io {
                    context: format!("could not hand {} to nobody", path.display()),
                    source: e.into(),
                })?;
            }
        }
        let port = crate::free_tcp_port().map_err(TestkitError::io("no free TCP port"))?;
        let mut server = PostgresServer {
            bin,
            dir,
            port,
            password,
            run_as,
            postmaster: None,
            watchdog: None,
        };
        let data = server.data_dir();
        let output = server
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                POSTGRES_USER,
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .stdin(Stdio::null())
            .output()
            .map_err(TestkitError::io("could not run initdb"))?;
        if !output.status.success() {
            return Err(TestkitError::CommandFailed {
                command: "initdb".into(),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        server.start_again()?;
        Ok(server)
    }

    /// `postgresql://hangwatch@127.0.0.1:PORT/postgres`: no password in it (see [`PostgresServer::password`]).
    pub fn url(&self) -> String {
        format!(
            "postgresql://{POSTGRES_USER}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The superuser's password.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The postmaster's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.postmaster.as_ref().map(Child::id)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut cmd = match self.run_as {
            Some((uid, gid)) => {
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--clear-groups")
                    .arg("--")
                    .arg(path);
                cmd
            }
            None => Command::new(path),
        };
        // The cluster must not pick up the test's own PG* settings.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("PG") {
                cmd.env_remove(name);
            }
        }
        cmd.current_dir(self.dir.path());
        cmd
    }

    /// Starts the server again after [`PostgresServer::stop`] (same data, same port); waits until it accepts
    /// connections.
    pub fn start_again(&mut self) -> Result<()> {
        if self.postmaster.is_some() {
            return Err(TestkitError::Misuse(
                "the PostgreSQL server already runs".into(),
            ));
        }
        let log = std::fs::File::create(self.dir.path().join("server.log"))
            .map_err(TestkitError::io("could not create the server log"))?;
        if let Some((uid, gid)) = self.run_as {
            let _ = nix::unistd::chown(&self.dir.path().join("server.log"), Some(uid), Some(gid));
        }
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .args(["-c", "max_connections=200", "-c", "synchronous_commit=off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .map_err(TestkitError::io("could not start postgres"))?;
        let pid = child.id().to_string();
        self.postmaster = Some(child);
        self.watchdog = Some(Watchdog::arm(r#"kill -KILL "$1""#, &[&pid])?);
        let ready = crate::wait_until(START_TIMEOUT, Duration::from_millis(100), || {
            Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        if !ready {
            let log =
                std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
            return Err(TestkitError::Timeout {
                what: format!(
                    "PostgreSQL on port {} to accept connections; its log:\n{log}",
                    self.port
                ),
                after: START_TIMEOUT,
            });
        }
        Ok(())
    }

    /// Stops the server (fast shutdown: SIGINT to the postmaster, SIGKILL after a grace); the data stays.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.postmaster.take() else {
            return Ok(());
        };
        let _ = send(child.id(), Signal::SIGINT);
        if wait_with_deadline(&mut child, STOP_TIMEOUT).is_none() {
            let _ = child.kill();
            wait_with_deadline(&mut child, STOP_TIMEOUT);
        }
        self.watchdog = None;
        Ok(())
    }

    /// Runs `sql` through psql as the superuser; its unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> Result<String> {
        let output = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", POSTGRES_USER, "-d", "postgres", "-c", sql])
            .env("PGPASSWORD", &self.password)
            .env("PGCONNECT_TIMEOUT", "10")
            .stdin(Stdio::null())
            .output()
            .map_err(TestkitError::io("could not run psql"))?;
        if !output.status.success() {
            return Err(TestkitError::CommandFailed {
                command: format!("psql -c {sql:?}"),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    }

    /// A file holding the superuser's password, mode 0600, in the server's directory.
    pub fn password_file(&self) -> Result<PathBuf> {
        let path = self.dir.path().join("client-password");
        std::fs::write(&path, format!("{}\n", self.password))
            .map_err(TestkitError::io("could not write the client password file"))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(TestkitError::io("could not chmod the client password file"))?;
        Ok(path)
    }

    /// The server's directory (data, socket, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// `/usr/lib/postgresql/<newest>/bin`, or `HANGWATCH_POSTGRES_BIN`.
fn find_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("HANGWATCH_POSTGRES_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| TestkitError::Missing {
            tool: "PostgreSQL (/usr/lib/postgresql/*/bin/postgres)".into(),
            hint: HINT,
        })
}
