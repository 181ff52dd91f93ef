//! A PostgreSQL server of the test's own (Debian's `postgresql` package): a fresh cluster in a temporary
//! directory, listening on 127.0.0.1 on a free port, stopped and removed when the guard drops (or by a watchdog
//! when the test process dies without unwinding), ending only the postmaster it started, by its pid.
//!
//! PostgreSQL refuses to run as root: as root, `initdb` and `postgres` run as `nobody` (through `setpriv`, which
//! execs, so the child is the postmaster itself), with the directory handed to that user.
//!
//! [`PostgresServer::start`] serves TLS only: its own CA and a server certificate for `127.0.0.1` and `localhost`
//! are made with `openssl` at start, `ssl = on`, and every TCP line of `pg_hba.conf` is `hostssl`, so that an
//! unencrypted connection cannot get in at all. [`PostgresServer::start_without_tls`] is the server a site
//! without certificates runs.

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
    /// Whether the server has a certificate and takes TCP connections only through TLS.
    tls: bool,
}

impl PostgresServer {
    /// Makes a cluster (superuser [`POSTGRES_USER`] with a password for TCP, trust on its Unix socket) that takes
    /// TCP connections through TLS only, its certificate signed by [`PostgresServer::ca_file`], and starts it.
    /// Missing binaries (PostgreSQL, openssl) are [`TestkitError::Missing`] (a skip; a failure in strict mode).
    pub fn start() -> Result<PostgresServer> {
        PostgresServer::start_with(true)
    }

    /// The same cluster without TLS: it answers "no" to a client's TLS request, and TCP connections are
    /// unencrypted.
    pub fn start_without_tls() -> Result<PostgresServer> {
        PostgresServer::start_with(false)
    }

    fn start_with(tls: bool) -> Result<PostgresServer> {
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
            tls,
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
        if tls {
            server.make_certificate()?;
            server.set_host_lines("hostssl", "scram-sha-256")?;
        }
        server.start_again()?;
        Ok(server)
    }

    /// The CA and the server's certificate and key (readable by the server's user only), in the server's
    /// directory.
    fn make_certificate(&self) -> Result<()> {
        let dir = self.dir.path();
        crate::receiver::make_certificates(dir)?;
        let key = dir.join("server.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
            .map_err(TestkitError::io("could not chmod the server key"))?;
        if let Some((uid, gid)) = self.run_as {
            for path in [key.as_path(), &dir.join("server.pem")] {
                nix::unistd::chown(path, Some(uid), Some(gid)).map_err(|e| TestkitError::Io {
                    context: format!("could not hand {} to nobody", path.display()),
                    source: e.into(),
                })?;
            }
        }
        Ok(())
    }

    /// Rewrites every TCP line of `pg_hba.conf` to `kind` (`host`, `hostssl`, `hostnossl`) and `method`
    /// (`scram-sha-256`, `trust`, ...); the Unix socket's lines stay. A running server reloads it.
    pub fn set_host_lines(&self, kind: &str, method: &str) -> Result<()> {
        let path = self.data_dir().join("pg_hba.conf");
        let text = std::fs::read_to_string(&path)
            .map_err(TestkitError::io("could not read pg_hba.conf"))?;
        let lines: Vec<String> = text
            .lines()
            .map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                match fields.as_slice() {
                    [first, database, user, address, _method, ..]
                        if first.starts_with("host") && !line.trim_start().starts_with('#') =>
                    {
                        format!("{kind} {database} {user} {address} {method}")
                    }
                    _ => line.to_string(),
                }
            })
            .collect();
        std::fs::write(&path, lines.join("\n") + "\n")
            .map_err(TestkitError::io("could not write pg_hba.conf"))?;
        if self.postmaster.is_some() {
            self.psql("SELECT pg_reload_conf()")?;
            // The postmaster reloads on the signal, a moment after the call returns.
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(())
    }

    /// `postgresql://hangwatch@127.0.0.1:PORT/postgres`, with `?sslrootcert=` this server's CA when it serves
    /// TLS (libpq's parameter: a client that verifies the certificate finds its CA there); no password in it (see
    /// [`PostgresServer::password`]).
    pub fn url(&self) -> String {
        match self.ca_file() {
            Some(ca) => format!("{}?sslrootcert={}", self.bare_url(), ca.display()),
            None => self.bare_url(),
        }
    }

    /// `postgresql://hangwatch@127.0.0.1:PORT/postgres`: no password and no TLS parameter in it.
    pub fn bare_url(&self) -> String {
        format!(
            "postgresql://{POSTGRES_USER}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    /// The PEM file of the CA that signed the server's certificate; `None` for a server without TLS.
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls.then(|| self.dir.path().join("ca.pem"))
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
            // "connection authorized: ... application_name=hangwatch SSL enabled (protocol=...)" for each
            // connection: what the server saw, for tests whose client was a child process.
            .args(["-c", "log_connections=on"])
            .args(self.tls_settings())
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

    /// `-c ssl=on` and the certificate's files, for a server with TLS.
    fn tls_settings(&self) -> Vec<String> {
        if !self.tls {
            return vec!["-c".into(), "ssl=off".into()];
        }
        let file = |name: &str| self.dir.path().join(name).display().to_string();
        vec![
            "-c".into(),
            "ssl=on".into(),
            "-c".into(),
            format!("ssl_cert_file={}", file("server.pem")),
            "-c".into(),
            format!("ssl_key_file={}", file("server.key")),
        ]
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

    /// The server's log so far: with a line per connection that says whether it was encrypted
    /// (`connection authorized: user=... application_name=hangwatch SSL enabled (protocol=TLSv1.3, ...)`).
    pub fn log(&self) -> Result<String> {
        std::fs::read_to_string(self.dir.path().join("server.log"))
            .map_err(TestkitError::io("could not read the server log"))
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
