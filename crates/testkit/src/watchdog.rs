//! A dead man's switch for fixtures: a small shell in its own process group that runs a clean-up script when the
//! test process dies without running its `Drop`s (killed by nextest's timeout, SIGKILL, abort).
//!
//! The shell blocks reading a pipe whose only writer is the test process (Rust creates pipes close-on-exec, so no
//! other child inherits it). When the test process dies, the kernel closes the pipe, `read` sees EOF and the
//! clean-up runs. A normal `Drop` disarms the watchdog first (SIGKILL) and cleans up itself.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use std::os::unix::process::CommandExt;

use crate::cmd::wait_with_deadline;
use crate::error::{Result, TestkitError};

/// A running watchdog; disarmed (killed) on drop.
#[derive(Debug)]
pub(crate) struct Watchdog {
    child: Child,
}

impl Watchdog {
    /// Starts `sh -c 'read _; <script>' watchdog ARGS...`; the script sees ARGS as `$1`, `$2`, ...
    pub(crate) fn arm(script: &str, args: &[&str]) -> Result<Self> {
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("read _ignored; {script}"))
            .arg("hangwatch-testkit-watchdog")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(TestkitError::io("could not start the clean-up watchdog"))?;
        Ok(Watchdog { child })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = wait_with_deadline(&mut self.child, Duration::from_secs(2));
    }
}
