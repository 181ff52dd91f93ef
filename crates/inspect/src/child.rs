//! Throwaway child processes with a deadline: the way hangwatch runs any call that may block in the kernel.
//!
//! A thread of ours stuck in D state would keep hangwatch from exiting (exit waits for every thread), so reads of a
//! rank's memory and probes of a watched filesystem run in a child process. The parent polls the child's pipes
//! under a deadline and, when the deadline passes, sends SIGKILL and *abandons* the child: it never waits for it.
//! A child in D state dies when its call returns; until then it is a harmless orphan.

use std::io::Read;
use std::os::fd::AsFd;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

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

/// A child that did not finish in time. It may be stuck in D state; poll [`AbandonedChild::try_reap`] later
/// instead of waiting for it.
#[derive(Debug)]
pub struct AbandonedChild {
    /// Taken by `Drop` for the orphan reaper.
    child: Option<Child>,
    /// When the child was started.
    pub started: Instant,
}

impl AbandonedChild {
    /// Wraps a child that was already sent SIGKILL and will not be waited for.
    pub fn new(child: Child, started: Instant) -> Self {
        Self {
            child: Some(child),
            started,
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Reaps the child if it has exited by now; `true` when it is gone.
    pub fn try_reap(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(Some(_)) | Err(_)),
            None => true,
        }
    }
}

/// Dropped, an abandoned child that has not exited yet goes to the orphan reaper: it is reaped when its call
/// returns (after a thaw), so a long job does not collect zombies, one per probe or stack read that timed out.
impl Drop for AbandonedChild {
    fn drop(&mut self) {
        if !self.try_reap() {
            if let Some(child) = self.child.take() {
                adopt_orphan(child);
            }
        }
    }
}

/// Children abandoned and not yet exited, polled by one reaper thread.
static ORPHANS: std::sync::Mutex<Vec<Child>> = std::sync::Mutex::new(Vec::new());

/// How often the orphan reaper looks: a child stuck in D exits only after a thaw, minutes later.
const ORPHAN_POLL: Duration = Duration::from_millis(500);

/// Hands `child` to the orphan reaper (started on first use). `waitpid` on its pid alone, so it never takes
/// another waiter's child.
fn adopt_orphan(child: Child) {
    static REAPER: std::sync::Once = std::sync::Once::new();
    ORPHANS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(child);
    REAPER.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("hw-orphans".into())
            .spawn(|| loop {
                std::thread::sleep(ORPHAN_POLL);
                ORPHANS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain_mut(|c| matches!(c.try_wait(), Ok(None)));
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the orphan reaper: abandoned children stay zombies until exit");
        }
    });
}

/// Abandoned children not reaped yet (they are still running, most likely stuck in D).
pub fn orphans_pending() -> usize {
    ORPHANS.lock().map_or(0, |o| o.len())
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

/// What a reader child (`__read-strings`, `__read-maps`) printed before it ended or was abandoned: one JSON line
/// per item it got to, and why the items it did not get to are missing. `reader` names it in that reason ("the
/// memory reader"); `blocked` what did not return at the deadline ("reading the rank's memory") and `cause` why
/// that happens.
pub fn read_json_lines<T: serde::de::DeserializeOwned>(
    command: Command,
    deadline: Duration,
    reader: &str,
    (blocked, cause): (&str, &str),
) -> (Vec<T>, String) {
    let (stdout, why_missing) = match run_with_deadline(command, deadline) {
        Ok(ChildOutcome::Finished { stdout, status, .. }) => (
            stdout,
            format!("{reader} ended ({status}) before reading it"),
        ),
        Ok(ChildOutcome::TimedOut { stdout, .. }) => (
            stdout,
            format!(
                "{blocked} did not return within {:.1}s ({cause})",
                deadline.as_secs_f64()
            ),
        ),
        Err(e) => (Vec::new(), format!("cannot start {reader}: {e}")),
    };
    let items = String::from_utf8_lossy(&stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    (items, why_missing)
}

/// A reader child's answer for one item: its text, or why it could not be read.
pub fn text_or_error(text: Option<String>, error: Option<String>) -> Result<String, String> {
    match (text, error) {
        (Some(text), _) => Ok(text),
        (None, Some(e)) => Err(e),
        (None, None) => Err("nothing read".to_string()),
    }
}

/// Set once by the hangwatch binary, which implements `hangwatch __exec`: see [`external_command`].
static EXEC_THROUGH_HANGWATCH: std::sync::OnceLock<()> = std::sync::OnceLock::new();

/// Starts every [`external_command`] through `hangwatch __exec` from now on. Called by the hangwatch binary only
/// (a library test's binary has no `__exec`).
pub fn start_external_programs_through_hangwatch() {
    let _ = EXEC_THROUGH_HANGWATCH.set(());
}

/// A command for an external program (`scontrol`, `sbatch`, `sh` for an alert command) that cannot hold
/// hangwatch: `Command::spawn` returns only once the child has exec'd, and finding the program through a `PATH`
/// whose first directory is on a stopped filesystem (the job's venv), or reading it from one (Slurm on NFS), never
/// returns. So the child is hangwatch itself (`hangwatch __exec -- PROGRAM`, started from memory or
/// `/proc/self/exe`, never through `PATH`), which then execs the program; a child stuck in that exec is abandoned at
/// the caller's deadline like any other ([`run_with_deadline`]). Arguments, environment and standard streams set on
/// the returned command reach the program unchanged.
pub fn external_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    if EXEC_THROUGH_HANGWATCH.get().is_some() {
        if let Ok(exe) = self_exe() {
            let mut command = Command::new(exe);
            command.arg("__exec").arg("--").arg(program);
            return command;
        }
    }
    Command::new(program)
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

/// The running hangwatch binary, for re-executing it as a child (`__probe-child`, `__inspect-child`).
///
/// Not the binary's path: a job runs for days, and a hangwatch upgraded (or rebuilt) in the meantime replaces the
/// file there; `/proc/self/exe` keeps pointing at the binary that runs. And when that binary lives on a network or
/// FUSE filesystem (a shared venv on GPFS), starting a child would read it from the filesystem that may be the one
/// frozen, and `spawn` waits for the child's exec: the first call copies the binary into memory (a memfd) while
/// things are healthy, and children are executed from there.
pub fn self_exe() -> std::io::Result<std::path::PathBuf> {
    static SELF_EXE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    let chosen = SELF_EXE.get_or_init(|| {
        // lstat, not stat: following the link would touch the binary's filesystem.
        let link = std::path::Path::new("/proc/self/exe");
        std::fs::symlink_metadata(link).ok()?;
        Some(match in_memory_copy() {
            Ok(Some(path)) => path,
            Ok(None) => link.to_path_buf(),
            Err(e) => {
                tracing::warn!(error = %e, "hangwatch's binary is on a remote filesystem and could not be copied to memory");
                link.to_path_buf()
            }
        })
    });
    match chosen {
        Some(path) => Ok(path.clone()),
        None => std::env::current_exe(),
    }
}

/// Whether the running binary lives on a network or FUSE filesystem.
fn binary_is_remote() -> std::io::Result<bool> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(hangwatch_proc::parse_mountinfo(&mounts)
        .ok()
        .and_then(|t| {
            t.containing(&exe.to_string_lossy())
                .map(hangwatch_proc::Mount::is_remote)
        })
        .unwrap_or(false))
}

/// Keeps a long-running hangwatch independent of the filesystem its binary lives on: when that is a network or
/// FUSE filesystem, every page mapped now (the binary's code included) is locked in memory, so that running code
/// for the first time (the roll call, hours into a job) never page-faults on a filesystem that stopped answering;
/// and the copy that children are started from is made. Call once at start, while things are healthy. Returns
/// what it did, for a log line.
pub fn detach_from_binary_filesystem() -> Option<String> {
    if !binary_is_remote().unwrap_or(false) {
        return None;
    }
    let locked = nix::sys::mman::mlockall(nix::sys::mman::MlockAllFlags::MCL_CURRENT);
    let copied = self_exe();
    Some(format!(
        "hangwatch's binary is on a remote filesystem: code {}, children run from {}",
        match locked {
            Ok(()) => "locked in memory".to_string(),
            Err(e) => format!("NOT locked in memory ({e}: raise `ulimit -l`)"),
        },
        copied
            .map(|p| p.display().to_string())
            .unwrap_or_else(|e| format!("nowhere ({e})"))
    ))
}

/// Copies the running binary into a memfd when it lives on a remote filesystem; `None` when it does not.
fn in_memory_copy() -> std::io::Result<Option<std::path::PathBuf>> {
    if !binary_is_remote()? {
        return Ok(None);
    }
    let fd =
        nix::sys::memfd::memfd_create(c"hangwatch", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)?;
    let mut copy = std::fs::File::from(fd);
    std::io::copy(&mut std::fs::File::open("/proc/self/exe")?, &mut copy)?;
    // Children exec it through our fd table (their own copy of the fd closes at exec): kept open for the life of
    // the process on purpose.
    let path = std::path::PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        std::os::fd::AsRawFd::as_raw_fd(&copy)
    ));
    std::mem::forget(copy);
    Ok(Some(path))
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
    fn self_exe_runs_this_binary_even_if_its_file_is_replaced() {
        let exe = self_exe().unwrap();
        assert_eq!(exe, std::path::PathBuf::from("/proc/self/exe"));
        let mut cmd = Command::new(&exe);
        cmd.arg("--list");
        match run_with_deadline(cmd, Duration::from_secs(20)).unwrap() {
            ChildOutcome::Finished { status, stdout, .. } => {
                assert!(status.success());
                assert!(String::from_utf8_lossy(&stdout).contains("self_exe_runs_this_binary"));
            }
            other => panic!("expected Finished, got {other:?}"),
        }
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
