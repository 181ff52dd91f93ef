//! An alert receiver for tests: `tests/python/alert_receiver.py` serving HTTP or HTTPS on loopback (with a CA and
//! a server certificate made by `openssl` for the test), recording every POST it gets.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{python, run_tool, wait_until, ChildGuard, Result, TestkitError};

/// A running receiver; killed (by pid) when dropped.
#[derive(Debug)]
pub struct AlertReceiver {
    dir: tempfile::TempDir,
    host: String,
    port: u16,
    https: bool,
    _server: ChildGuard,
}

impl AlertReceiver {
    /// Plain HTTP.
    pub fn http(fail_first: u32) -> Result<Self> {
        Self::start(false, fail_first)
    }

    /// Plain HTTP on `host`, the receiver started by `python` (a command that runs the Python interpreter, e.g.
    /// in a network namespace: `TestNetwork::command(node, python)`).
    pub fn http_via(python: Command, host: &str) -> Result<Self> {
        Self::start_with(python, host, false, 0)
    }

    /// HTTPS with a certificate for 127.0.0.1 signed by a CA of its own ([`AlertReceiver::ca_file`]); the first
    /// `fail_first` requests are answered 503.
    pub fn https(fail_first: u32) -> Result<Self> {
        Self::start(true, fail_first)
    }

    fn start(https: bool, fail_first: u32) -> Result<Self> {
        Self::start_with(Command::new(python()?), "127.0.0.1", https, fail_first)
    }

    fn start_with(mut command: Command, host: &str, https: bool, fail_first: u32) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(TestkitError::io("cannot make a temp dir"))?;
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/alert_receiver.py");
        let port_file = dir.path().join("port");
        command
            .arg(&script)
            .arg("--host")
            .arg(host)
            .arg("--port-file")
            .arg(&port_file)
            .arg("--record")
            .arg(dir.path().join("record.jsonl"))
            .arg("--fail-first")
            .arg(fail_first.to_string());
        if https {
            make_certificates(dir.path())?;
            command
                .arg("--cert")
                .arg(dir.path().join("server.pem"))
                .arg("--key")
                .arg(dir.path().join("server.key"));
        }
        let server = ChildGuard::spawn(&mut command, "alert receiver")?;
        let mut port = None;
        wait_until(Duration::from_secs(20), Duration::from_millis(20), || {
            port = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.trim().parse().ok());
            port.is_some()
        });
        let port = port.ok_or_else(|| TestkitError::Timeout {
            what: "the alert receiver to listen".into(),
            after: Duration::from_secs(20),
        })?;
        Ok(Self {
            dir,
            host: host.to_string(),
            port,
            https,
            _server: server,
        })
    }

    /// `http[s]://HOST:PORT`.
    pub fn base_url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.port)
    }

    /// The CA certificate (PEM) that signed the server's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Every request so far: `{"path", "content_type", "answered", "body"}`.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("record.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits until `count` requests matching `pred` arrived; returns them.
    pub fn wait_for(
        &self,
        count: usize,
        timeout: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<serde_json::Value> {
        let mut found = Vec::new();
        wait_until(timeout, Duration::from_millis(50), || {
            found = self.requests().into_iter().filter(|r| pred(r)).collect();
            found.len() >= count
        });
        found
    }
}

/// A CA and a server certificate for 127.0.0.1 it signed, in `dir`: ca.pem, server.pem, server.key.
pub(crate) fn make_certificates(dir: &Path) -> Result<()> {
    let p = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let deadline = Duration::from_secs(30);
    let openssl = |args: &[&str]| -> Result<()> { run_tool("openssl", args, deadline).map(|_| ()) };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=hangwatch test CA",
        "-keyout",
        &p("ca.key"),
        "-out",
        &p("ca.pem"),
    ])?;
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        &p("server.key"),
        "-out",
        &p("server.csr"),
    ])?;
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(TestkitError::io("cannot write the certificate extensions"))?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p("server.csr"),
        "-CA",
        &p("ca.pem"),
        "-CAkey",
        &p("ca.key"),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &p("ext.cnf"),
        "-out",
        &p("server.pem"),
    ])
}
