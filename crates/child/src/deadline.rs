//! Running a child under a deadline: its input from memory, its output drained from polled pipes, the child
//! abandoned (never waited for) when the deadline passes.

use std::io::Read;
use std::os::fd::AsFd;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::abandon::AbandonedChild;

/// What a child run under a deadline came to.
#[derive(Debug)]
pub enum ChildOutcome {
    /// The child exited within the deadline.
    Finished {
        status: ExitStatus,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        elapsed: Duration,
    },
    /// The deadline passed; the child was sent SIGKILL and left behind. What it printed so far is kept.
    TimedOut {
        child: AbandonedChild,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    },
}
/// Errors starting or talking to a child.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    #[error("could not start {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not read the output of child {pid}")]
    Io {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// A child's standard input holding `bytes`: a sealed-off memfd, written and rewound before the child starts, so
/// that handing it over can never block (see [`run_with_deadline_and_input`]). `name` shows in /proc/PID/fd.
pub fn input_from_bytes(name: &std::ffi::CStr, bytes: &[u8]) -> std::io::Result<Stdio> {
    use std::io::{Seek, Write};
    let fd = nix::sys::memfd::memfd_create(name, nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)?;
    let mut memfd = std::fs::File::from(fd);
    memfd.write_all(bytes)?;
    memfd.rewind()?;
    Ok(Stdio::from(memfd))
}
/// Runs `command` with piped stdout/stderr (stdin closed) and gives up on it after `deadline`.
///
/// Never blocks longer than `deadline` (plus scheduling noise): the pipes are polled, never read blockingly, and
/// the child is never waited for after the deadline.
pub fn run_with_deadline(command: Command, deadline: Duration) -> Result<ChildOutcome, ChildError> {
    run_with_deadline_and_input(command, Stdio::null(), deadline)
}

/// [`run_with_deadline`] with `stdin` as the child's standard input: a memfd or a file already written, never a
/// pipe the parent would have to feed (feeding it could block on a child that stopped reading).
pub fn run_with_deadline_and_input(
    mut command: Command,
    stdin: Stdio,
    deadline: Duration,
) -> Result<ChildOutcome, ChildError> {
    let started = Instant::now();
    let program = command.get_program().to_string_lossy().into_owned();
    command
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|source| ChildError::Spawn { program, source })?;
    let pid = child.id();
    let io_err = |source| ChildError::Io { pid, source };

    let mut stdout_pipe = child.stdout.take();
    let mut stderr_pipe = child.stderr.take();
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let end = started + deadline;

    loop {
        let now = Instant::now();
        if stdout_pipe.is_none() && stderr_pipe.is_none() {
            match child.try_wait().map_err(io_err)? {
                Some(status) => {
                    return Ok(ChildOutcome::Finished {
                        status,
                        stdout,
                        stderr,
                        elapsed: started.elapsed(),
                    })
                }
                None if now >= end => break,
                None => std::thread::sleep(Duration::from_millis(1).min(end - now)),
            }
            continue;
        }
        if now >= end {
            break;
        }
        let remaining = end - now;
        let timeout = PollTimeout::try_from(remaining.as_millis().clamp(1, 60_000) as u32)
            .unwrap_or(PollTimeout::MAX);
        let (out_ready, err_ready) = {
            let mut fds = Vec::with_capacity(2);
            if let Some(p) = &stdout_pipe {
                fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
            }
            if let Some(p) = &stderr_pipe {
                fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, timeout) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io_err(e.into())),
            }
            let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
            let mut it = fds.iter();
            let out = stdout_pipe
                .as_ref()
                .map(|_| it.next().is_some_and(ready))
                .unwrap_or(false);
            let err = stderr_pipe
                .as_ref()
                .map(|_| it.next().is_some_and(ready))
                .unwrap_or(false);
            (out, err)
        };
        if out_ready {
            drain_once(&mut stdout_pipe, &mut stdout).map_err(io_err)?;
        }
        if err_ready {
            drain_once(&mut stderr_pipe, &mut stderr).map_err(io_err)?;
        }
    }

    let _ = child.kill();
    Ok(ChildOutcome::TimedOut {
        child: AbandonedChild::new(child, started),
        stdout,
        stderr,
    })
}

/// Reads what one ready pipe holds (a single `read`, which does not block after POLLIN); drops the pipe at EOF.
fn drain_once<R: Read>(pipe: &mut Option<R>, into: &mut Vec<u8>) -> std::io::Result<()> {
    let Some(reader) = pipe.as_mut() else {
        return Ok(());
    };
    let mut buf = [0u8; 64 * 1024];
    match reader.read(&mut buf) {
        Ok(0) => *pipe = None,
        Ok(n) => into.extend_from_slice(&buf[..n]),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
        Err(e) => return Err(e),
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_child_returns_output_and_status() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        match run_with_deadline(cmd, Duration::from_secs(5)).unwrap() {
            ChildOutcome::Finished {
                status,
                stdout,
                stderr,
                ..
            } => {
                assert_eq!(status.code(), Some(3));
                assert_eq!(stdout, b"out\n");
                assert_eq!(stderr, b"err\n");
            }
            other => panic!("expected Finished, got {other:?}"),
        }
    }
    #[test]
    fn slow_child_is_abandoned_at_the_deadline() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo early; exec sleep 30"]);
        let started = Instant::now();
        let outcome = run_with_deadline(cmd, Duration::from_millis(300)).unwrap();
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(3), "waited {waited:?}");
        match outcome {
            ChildOutcome::TimedOut {
                mut child, stdout, ..
            } => {
                assert_eq!(stdout, b"early\n");
                let until = Instant::now() + Duration::from_secs(5);
                while !child.try_reap() {
                    assert!(Instant::now() < until, "SIGKILLed sleep was not reaped");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            other => panic!("expected TimedOut, got {other:?}"),
        }
    }
    #[test]
    fn child_that_closes_pipes_but_lingers_still_times_out() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exec >/dev/null 2>&1; sleep 30"]);
        let outcome = run_with_deadline(cmd, Duration::from_millis(200)).unwrap();
        assert!(matches!(outcome, ChildOutcome::TimedOut { .. }));
    }
    #[test]
    fn missing_program_is_a_spawn_error_naming_it() {
        let cmd = Command::new("/nonexistent/hangwatch-test-program");
        let err = run_with_deadline(cmd, Duration::from_secs(1)).unwrap_err();
        assert!(err
            .to_string()
            .contains("/nonexistent/hangwatch-test-program"));
    }
}
