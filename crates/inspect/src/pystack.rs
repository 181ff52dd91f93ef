//! Python stacks and rank identity, read in throwaway children so that a read that blocks cannot hang hangwatch.
//!
//! `docs/inspecting-a-stuck-process.md`: py-spy's non-blocking reads (`process_vm_readv`) and `PythonSpy::new`
//! (which reads /proc/PID/maps) can block in D state when a rank holds its mmap lock across a page fault on a
//! frozen mount; so can reading /proc/PID/environ. The parent ([`read_python_processes`]) therefore starts children
//! (`hangwatch __inspect-child --pid ...`) that print one line per finished pid; a child that stops making progress
//! is abandoned, the pid it was on is reported as "timed out", and the pids after it are read by a new child.
//! Ranks are never ptrace-stopped: py-spy runs in non-blocking mode.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hangwatch_model::{PythonFrame, PythonThread};
use hangwatch_proc::{parse_environ, RankEnv};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};

use crate::child::AbandonedChild;

/// What a child found out about one process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PythonProcessReport {
    pub pid: i32,
    /// `RANK`, `LOCAL_RANK`, `WORLD_SIZE` and friends from the environment (the rest of the environment, which
    /// may hold secrets, is never copied out of the child).
    pub rank_env: Option<RankEnv>,
    pub cmdline: Option<Vec<String>>,
    /// `None` when the process is not Python or the stack could not be read (see `error`).
    pub threads: Option<Vec<PythonThread>>,
    /// Why something could not be read.
    pub errors: Vec<String>,
}

/// How the parent reads stacks.
#[derive(Debug, Clone)]
pub struct StackReadOptions {
    /// The hangwatch binary to re-execute as `__inspect-child`.
    pub program: PathBuf,
    /// A child that prints nothing for this long is stuck on the pid it was reading.
    pub per_pid_timeout: Duration,
    /// The whole read never takes longer than this.
    pub total_timeout: Duration,
    /// Children at a time.
    pub parallelism: usize,
}

impl StackReadOptions {
    /// Defaults for the running binary: 1 s per pid, 4 s in all, a child per core.
    pub fn for_self() -> std::io::Result<Self> {
        Ok(Self {
            program: crate::child::self_exe()?,
            per_pid_timeout: Duration::from_secs(1),
            total_timeout: Duration::from_secs(4),
            // Reading a stack is CPU-bound (py-spy parses the interpreter binary of each rank, ~7 ms): one child
            // per core.
            parallelism: std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .clamp(2, 16),
        })
    }
}

impl StackReadOptions {
    /// Sets the per-pid timeout and a total that grows with the number of processes (a roll call of 1,000 ranks
    /// on a busy node must not be cut short, and one of 4 must not wait long).
    pub fn with_timeouts(mut self, per_pid: Duration, pids: usize) -> Self {
        self.per_pid_timeout = per_pid;
        let pids = u32::try_from(pids).unwrap_or(u32::MAX);
        self.total_timeout = per_pid * 4 + Duration::from_millis(40).saturating_mul(pids);
        self
    }
}

/// The outcome of reading every pid: a report per pid (possibly with only errors), and the children that had to be
/// abandoned (each may still be stuck in D state).
#[derive(Debug, Default)]
pub struct StackReadOutcome {
    pub reports: HashMap<i32, PythonProcessReport>,
    pub abandoned: Vec<AbandonedChild>,
}

/// One line of the child's output protocol.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum ChildLine {
    /// The child starts on this pid (so that a hang is attributed to it).
    Begin { pid: i32, step: String },
    /// The child finished this pid.
    Done { report: PythonProcessReport },
}

/// Reads environment and Python stacks of `pids`, never blocking on a stuck one for longer than the options say.
pub fn read_python_processes(pids: &[i32], options: &StackReadOptions) -> StackReadOutcome {
    read_in_children(pids, options, true)
}

/// Reads only the rank environment of `pids` (to tell ranks from launchers), under the same deadlines.
pub fn read_environments(pids: &[i32], options: &StackReadOptions) -> StackReadOutcome {
    read_in_children(pids, options, false)
}

fn read_in_children(pids: &[i32], options: &StackReadOptions, stacks: bool) -> StackReadOutcome {
    let started = Instant::now();
    let mut outcome = StackReadOutcome::default();
    let mut pending: VecDeque<i32> = pids.iter().copied().collect();
    let parallelism = options.parallelism.max(1);
    let chunk_size = pids.len().div_ceil(parallelism).max(1);
    let mut running: Vec<Reader> = Vec::new();

    loop {
        while running.len() < parallelism && !pending.is_empty() {
            let chunk: Vec<i32> = pending.drain(..chunk_size.min(pending.len())).collect();
            match Reader::start(&options.program, chunk.clone(), stacks) {
                Ok(reader) => running.push(reader),
                Err(e) => {
                    for pid in chunk {
                        outcome.reports.insert(
                            pid,
                            report_with_error(pid, format!("could not start reader: {e}")),
                        );
                    }
                }
            }
        }
        if running.is_empty() {
            break;
        }
        let out_of_time = started.elapsed() >= options.total_timeout;
        let mut still_running = Vec::with_capacity(running.len());
        for mut reader in running {
            reader.pump(Duration::from_millis(20));
            for report in reader.take_done() {
                outcome.reports.insert(report.pid, report);
            }
            if reader.finished() {
                for pid in reader.unfinished() {
                    outcome
                        .reports
                        .entry(pid)
                        .or_insert_with(|| report_with_error(pid, reader.failure()));
                }
                reader.reap();
                continue;
            }
            if out_of_time || reader.idle_for() >= options.per_pid_timeout {
                let waited = reader.idle_for();
                let stuck_here = waited >= options.per_pid_timeout;
                let (stuck, rest, child) = reader.abandon();
                if let Some((pid, step)) = stuck {
                    let why = if stuck_here {
                        format!(
                            "{step} did not return within {} ms (the process's memory map is probably locked by \
                             a thread stuck on a frozen filesystem)",
                            waited.as_millis()
                        )
                    } else {
                        format!("{step} was cut short: the roll call ran out of time")
                    };
                    outcome.reports.insert(pid, report_with_error(pid, why));
                }
                if out_of_time {
                    for pid in rest {
                        outcome.reports.insert(
                            pid,
                            report_with_error(
                                pid,
                                "not read: the roll call ran out of time".into(),
                            ),
                        );
                    }
                } else {
                    pending.extend(rest);
                }
                outcome.abandoned.push(child);
                continue;
            }
            still_running.push(reader);
        }
        running = still_running;
        if out_of_time && running.is_empty() {
            for pid in pending.drain(..) {
                outcome.reports.insert(
                    pid,
                    report_with_error(pid, "not read: the roll call ran out of time".into()),
                );
            }
        }
    }
    outcome
}

fn report_with_error(pid: i32, error: String) -> PythonProcessReport {
    PythonProcessReport {
        pid,
        errors: vec![error],
        ..Default::default()
    }
}

/// One running `__inspect-child` and what it printed so far.
struct Reader {
    child: Child,
    started: Instant,
    pids: Vec<i32>,
    buf: Vec<u8>,
    done: Vec<PythonProcessReport>,
    finished_pids: Vec<i32>,
    current: Option<(i32, String)>,
    last_progress: Instant,
    eof: bool,
    error: Option<String>,
}

impl Reader {
    fn start(program: &PathBuf, pids: Vec<i32>, stacks: bool) -> std::io::Result<Reader> {
        let mut command = Command::new(program);
        command.arg("__inspect-child");
        if !stacks {
            command.arg("--env-only");
        }
        for pid in &pids {
            command.arg("--pid").arg(pid.to_string());
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let now = Instant::now();
        Ok(Reader {
            child,
            started: now,
            pids,
            buf: Vec::new(),
            done: Vec::new(),
            finished_pids: Vec::new(),
            current: None,
            last_progress: now,
            eof: false,
            error: None,
        })
    }

    /// Reads whatever the child printed within `wait`.
    fn pump(&mut self, wait: Duration) {
        if self.eof {
            return;
        }
        let Some(stdout) = self.child.stdout.as_mut() else {
            self.eof = true;
            return;
        };
        let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(wait.as_millis() as u32).unwrap_or(PollTimeout::ZERO);
        match poll(&mut fds, timeout) {
            Ok(n) if n > 0 => {}
            Ok(_) | Err(nix::errno::Errno::EINTR) => return,
            Err(e) => {
                self.error = Some(format!("poll failed: {e}"));
                self.eof = true;
                return;
            }
        }
        let mut chunk = [0u8; 64 * 1024];
        match stdout.read(&mut chunk) {
            Ok(0) => self.eof = true,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                self.parse_lines();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                self.error = Some(format!("reading the reader's output failed: {e}"));
                self.eof = true;
            }
        }
    }

    fn parse_lines(&mut self) {
        while let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            self.last_progress = Instant::now();
            match serde_json::from_slice::<ChildLine>(&line) {
                Ok(ChildLine::Begin { pid, step }) => self.current = Some((pid, step)),
                Ok(ChildLine::Done { report }) => {
                    self.current = None;
                    self.finished_pids.push(report.pid);
                    self.done.push(report);
                }
                Err(e) => self.error = Some(format!("reader printed something unexpected: {e}")),
            }
        }
    }

    fn take_done(&mut self) -> Vec<PythonProcessReport> {
        std::mem::take(&mut self.done)
    }

    fn finished(&self) -> bool {
        self.eof
    }

    fn idle_for(&self) -> Duration {
        self.last_progress.elapsed()
    }

    fn unfinished(&self) -> Vec<i32> {
        self.pids
            .iter()
            .copied()
            .filter(|p| !self.finished_pids.contains(p))
            .collect()
    }

    fn failure(&self) -> String {
        self.error
            .clone()
            .unwrap_or_else(|| "the reader exited before reading this process".to_string())
    }

    /// Waits briefly for an exited child (it closed stdout, so it is exiting); abandons it if it lingers.
    fn reap(mut self) {
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = self.child.kill();
    }

    /// Gives up on the child: returns the pid it was stuck on (with the step), the pids it did not reach, and the
    /// child to reap later.
    fn abandon(mut self) -> (Option<(i32, String)>, Vec<i32>, AbandonedChild) {
        let _ = self.child.kill();
        let stuck = self.current.take();
        let rest = self
            .unfinished()
            .into_iter()
            .filter(|p| stuck.as_ref().map(|(s, _)| s != p).unwrap_or(true))
            .collect();
        let started = self.started;
        (stuck, rest, AbandonedChild::new(self.child, started))
    }
}

/// The child's side: reads each pid in turn and prints one `begin` line before each step and one `done` line per
/// pid. Runs in `hangwatch __inspect-child`; may block forever, which is why it is a child.
pub fn child_main(pids: &[i32], stacks: bool, out: &mut impl Write) -> std::io::Result<()> {
    for &pid in pids {
        let mut report = PythonProcessReport {
            pid,
            ..Default::default()
        };
        emit(
            out,
            &ChildLine::Begin {
                pid,
                step: "reading the environment".into(),
            },
        )?;
        match std::fs::read(format!("/proc/{pid}/environ")) {
            Ok(raw) => report.rank_env = Some(RankEnv::from_environ(&parse_environ(&raw))),
            Err(e) => report.errors.push(format!("environment not readable: {e}")),
        }
        if !stacks {
            emit(out, &ChildLine::Done { report })?;
            continue;
        }
        emit(
            out,
            &ChildLine::Begin {
                pid,
                step: "reading the command line".into(),
            },
        )?;
        if let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            report.cmdline = Some(
                raw.split(|b| *b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            );
        }
        emit(
            out,
            &ChildLine::Begin {
                pid,
                step: "reading the Python stack".into(),
            },
        )?;
        match python_stacks(pid) {
            Ok(threads) => report.threads = Some(threads),
            Err(e) => report.errors.push(e),
        }
        emit(out, &ChildLine::Done { report })?;
    }
    Ok(())
}

fn emit(out: &mut impl Write, line: &ChildLine) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, line)?;
    out.write_all(b"\n")?;
    out.flush()
}

fn python_stacks(pid: i32) -> Result<Vec<PythonThread>, String> {
    let config = py_spy::Config {
        blocking: py_spy::config::LockingStrategy::NonBlocking,
        native: false,
        full_filenames: true,
        ..py_spy::Config::default()
    };
    let mut spy = py_spy::PythonSpy::new(pid, &config)
        .map_err(|e| format!("not a readable Python process: {e}"))?;
    let traces = spy
        .get_stack_traces()
        .map_err(|e| format!("Python stack not readable: {e}"))?;
    Ok(traces
        .into_iter()
        .map(|t| PythonThread {
            os_tid: t.os_thread_id.and_then(|t| i32::try_from(t).ok()),
            thread_id: t.thread_id,
            name: t.thread_name,
            frames: t
                .frames
                .into_iter()
                .map(|f| PythonFrame {
                    function: f.name,
                    filename: f.filename,
                    line: f.line,
                })
                .collect(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_protocol_round_trips() {
        let mut out = Vec::new();
        child_main(&[i32::MAX], true, &mut out).unwrap();
        let lines: Vec<ChildLine> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert!(matches!(lines.first(), Some(ChildLine::Begin { pid, .. }) if *pid == i32::MAX));
        match lines.last() {
            Some(ChildLine::Done { report }) => {
                assert_eq!(report.pid, i32::MAX);
                assert!(report.threads.is_none());
                assert!(!report.errors.is_empty());
            }
            other => panic!("expected done, got {other:?}"),
        }
    }
}
