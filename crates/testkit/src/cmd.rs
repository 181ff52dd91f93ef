//! Running helper programs (mount, fsfreeze, mkfs) and owning child processes, never waiting on them forever.
//!
//! A helper can itself get stuck in the kernel (an `umount` behind a frozen filesystem), so every run has a
//! deadline after which the helper is killed and abandoned; clean-up code in `Drop` relies on that.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::error::{Result, TestkitError};

/// What a helper program printed, when it finished in time.
#[derive(Debug)]
pub struct ToolOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `program args...` with a deadline. A program that is not installed is [`TestkitError::Missing`] (a
/// skip); a non-zero exit is [`TestkitError::CommandFailed`] with its stderr.
pub fn run_tool(program: &str, args: &[&str], deadline: Duration) -> Result<ToolOutput> {
    let output = run_tool_unchecked(program, args, deadline)?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(TestkitError::CommandFailed {
            command: describe(program, args),
            status: output.status.to_string(),
            stderr: output.stderr.trim().to_string(),
        })
    }
}

/// Like [`run_tool`] but returns the output whatever the exit status.
pub fn run_tool_unchecked(program: &str, args: &[&str], deadline: Duration) -> Result<ToolOutput> {
    let command = describe(program, args);
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(TestkitError::Missing {
                tool: program.to_string(),
                hint: "install it (Debian: util-linux, e2fsprogs, fuse3, bindfs)",
            })
        }
        Err(source) => {
            return Err(TestkitError::Io {
                context: format!("could not start `{command}`"),
                source,
            })
        }
    };
    let stdout = read_in_background(child.stdout.take());
    let stderr = read_in_background(child.stderr.take());
    match wait_with_deadline(&mut child, deadline) {
        Some(status) => Ok(ToolOutput {
            status,
            stdout: collect(stdout),
            stderr: collect(stderr),
        }),
        None => {
            let _ = child.kill();
            Err(TestkitError::CommandTimedOut {
                command,
                after: deadline,
            })
        }
    }
}

/// Polls `child` until it exits or `deadline` passes; `None` on timeout (the child is left as it is).
pub fn wait_with_deadline(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + deadline;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A child process that is killed (SIGKILL, by pid) and reaped when the guard drops.
///
/// Reaping waits at most [`ChildGuard::REAP_TIMEOUT`]: a child in D state dies only when its system call returns
/// (after the thaw), so the guard gives up and leaves it rather than hang the test.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    label: String,
}

impl ChildGuard {
    /// How long `Drop` waits for a killed child to be reaped.
    pub const REAP_TIMEOUT: Duration = Duration::from_secs(3);

    /// Takes ownership of `child`; `label` names it in warnings.
    pub fn new(child: Child, label: impl Into<String>) -> Self {
        ChildGuard {
            child,
            label: label.into(),
        }
    }

    /// Spawns `command` and guards the child.
    pub fn spawn(command: &mut Command, label: impl Into<String>) -> Result<Self> {
        let label = label.into();
        let child = command
            .spawn()
            .map_err(TestkitError::io(format!("could not start {label}")))?;
        Ok(ChildGuard::new(child, label))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child itself (for its pipes or `try_wait`).
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Exit status if the child has exited (reaps it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends `signal` to the child by pid, unless it has already been reaped.
    pub fn signal(&mut self, signal: Signal) -> Result<()> {
        if self.try_wait().is_some() {
            return Err(TestkitError::Misuse(format!(
                "{} has already exited",
                self.label
            )));
        }
        send(self.pid(), signal).map_err(TestkitError::io(format!(
            "could not send {signal} to {}",
            self.label
        )))
    }

    /// Kills and reaps now; returns whether the child is gone (false: still there after the reap timeout).
    pub fn kill_and_reap(&mut self, timeout: Duration) -> bool {
        let child = &mut self.child;
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        let _ = send(child.id(), Signal::SIGCONT);
        let _ = child.kill();
        wait_with_deadline(child, timeout).is_some()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if !self.kill_and_reap(Self::REAP_TIMEOUT) {
            eprintln!(
                "testkit: {} (pid {}) did not die within {:?} after SIGKILL (D state?); leaving it",
                self.label,
                self.pid(),
                Self::REAP_TIMEOUT
            );
        }
    }
}

/// Sends a signal to one pid.
pub fn send(pid: u32, signal: Signal) -> std::io::Result<()> {
    let pid =
        i32::try_from(pid).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    kill(Pid::from_raw(pid), signal).map_err(std::io::Error::from)
}

fn describe(program: &str, args: &[&str]) -> String {
    std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

fn read_in_background<R: Read + Send + 'static>(
    pipe: Option<R>,
) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = tx.send(String::from_utf8_lossy(&bytes).into_owned());
        });
    }
    rx
}

fn collect(rx: std::sync::mpsc::Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(1)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_program_is_a_skip() {
        let err = run_tool("/nonexistent/hangwatch-tool", &[], Duration::from_secs(1)).unwrap_err();
        assert!(err.skip_reason().is_some(), "{err}");
    }

    #[test]
    fn failing_program_reports_its_stderr() {
        let err = run_tool(
            "sh",
            &["-c", "echo nope >&2; exit 4"],
            Duration::from_secs(5),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("nope") && text.contains('4'), "{text}");
        assert!(err.skip_reason().is_none());
    }

    #[test]
    fn slow_program_times_out_instead_of_blocking() {
        let started = Instant::now();
        let err = run_tool("sleep", &["30"], Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, TestkitError::CommandTimedOut { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn child_guard_kills_on_drop() {
        let guard = ChildGuard::spawn(Command::new("sleep").arg("30"), "sleep").unwrap();
        let pid = guard.pid();
        drop(guard);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}
