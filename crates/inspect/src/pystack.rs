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
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hangwatch_model::{PythonFrame, PythonThread};
use hangwatch_proc::{parse_environ, RankEnv};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};

use hangwatch_child::AbandonedChild;

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
            program: hangwatch_child::self_exe()?,
            per_pid_timeout: Duration::from_secs(1),
            total_timeout: Duration::from_secs(4),
            parallelism: default_parallelism(),
        })
    }
}

/// Children that read stacks at a time: reading a cold stack is CPU-bound (py-spy parses the interpreter binary
/// of each rank, ~7 ms), so one per core.
pub fn default_parallelism() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 16)
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
    /// How many pids were read by readers prepared beforehand (`crate::prepared`).
    pub by_prepared: usize,
}

/// One line of the child's output protocol.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum ChildLine {
    /// The child starts on this pid (so that a hang is attributed to it).
    Begin { pid: i32, step: String },
    /// The child finished this pid (boxed: a report is much larger than the other lines).
    Done { report: Box<PythonProcessReport> },
    /// A serving child prepared (or failed to prepare) its reader of this pid.
    Prepared { pid: i32, error: Option<String> },
}

/// What a serving child (`__inspect-child --serve`) is asked, one JSON line on its stdin each.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum ServeRequest {
    /// Keep readers of exactly these pids ready (the interpreter found, its symbols parsed), dropping others.
    Prepare { pids: Vec<i32> },
    /// Read these pids now, with the prepared readers where there are.
    Read { pids: Vec<i32> },
    /// Find, check and decode the job's own Flight Recorder dumps (`crate::dump_files`): a throwaway child is
    /// asked this alone.
    OwnDumps(Box<crate::dump_files::OwnDumpsRequest>),
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
    read_with(pids, options, stacks, Vec::new()).0
}

/// Reads `pids`: those that a `warm` reader was asked for by it, the rest (and whatever a warm reader that had
/// to be abandoned did not reach) by throwaway children. Returns the outcome and the warm readers that answered
/// in full, to keep.
pub(crate) fn read_with(
    pids: &[i32],
    options: &StackReadOptions,
    stacks: bool,
    warm: Vec<Reader>,
) -> (StackReadOutcome, Vec<Reader>) {
    let started = Instant::now();
    let mut outcome = StackReadOutcome::default();
    let covered: std::collections::HashSet<i32> =
        warm.iter().flat_map(|r| r.pids.iter().copied()).collect();
    let mut pending: VecDeque<i32> = pids
        .iter()
        .copied()
        .filter(|p| !covered.contains(p))
        .collect();
    let parallelism = options.parallelism.max(1);
    let chunk_size = pending.len().div_ceil(parallelism).max(1);
    let mut running: Vec<Reader> = warm;
    let mut kept: Vec<Reader> = Vec::new();

    loop {
        while running.iter().filter(|r| !r.serving()).count() < parallelism && !pending.is_empty() {
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
        // The wait is shared: with many readers, each gets a slice of it.
        let slice = Duration::from_millis((20 / running.len().max(1)).max(1) as u64);
        for mut reader in running {
            reader.pump(slice);
            for report in reader.take_done() {
                outcome.by_prepared += usize::from(reader.serving());
                outcome.reports.insert(report.pid, report);
            }
            if reader.answered() {
                if reader.serving() && !reader.eof {
                    kept.push(reader);
                } else {
                    reader.reap();
                }
                continue;
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
    (outcome, kept)
}

pub(crate) fn report_with_error(pid: i32, error: String) -> PythonProcessReport {
    PythonProcessReport {
        pid,
        errors: vec![error],
        ..Default::default()
    }
}

/// One running `__inspect-child` and what it printed so far: a throwaway one started for some pids, or a serving
/// one (`--serve`) kept between roll calls and asked for pids on its stdin.
pub(crate) struct Reader {
    child: Child,
    /// A serving child's stdin (non-blocking); `None` for a throwaway child.
    stdin: Option<std::process::ChildStdin>,
    started: Instant,
    /// The pids of the current request.
    pids: Vec<i32>,
    buf: Vec<u8>,
    done: Vec<PythonProcessReport>,
    finished_pids: Vec<i32>,
    current: Option<(i32, String)>,
    last_progress: Instant,
    pub(crate) eof: bool,
    error: Option<String>,
    /// What the serving child said about preparing each pid: `None` ready, `Some(why)` not.
    pub(crate) prepared: HashMap<i32, Option<String>>,
    /// Pids the serving child was asked to prepare and has not answered for yet.
    pub(crate) preparing: Vec<i32>,
    /// The pids a serving child keeps readers of, and when it was last asked to prepare them (how many times).
    pub(crate) assigned: Vec<i32>,
    pub(crate) last_prepare: Option<Instant>,
    pub(crate) prepares: u32,
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
        Ok(Reader::new(child, None, pids))
    }

    /// Starts a serving child, idle until asked.
    pub(crate) fn serve(program: &PathBuf) -> std::io::Result<Reader> {
        let mut child = Command::new(program)
            .arg("__inspect-child")
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdin = child.stdin.take();
        if let Some(stdin) = &stdin {
            // A child stuck in the kernel stops reading: a full pipe must fail the write, not block us.
            let flags = nix::fcntl::fcntl(stdin.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)?;
            let flags =
                nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
            nix::fcntl::fcntl(stdin.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(flags))?;
        }
        Ok(Reader::new(child, stdin, Vec::new()))
    }

    fn new(child: Child, stdin: Option<std::process::ChildStdin>, pids: Vec<i32>) -> Reader {
        let now = Instant::now();
        Reader {
            child,
            stdin,
            started: now,
            pids,
            buf: Vec::new(),
            done: Vec::new(),
            finished_pids: Vec::new(),
            current: None,
            last_progress: now,
            eof: false,
            error: None,
            prepared: HashMap::new(),
            preparing: Vec::new(),
            assigned: Vec::new(),
            last_prepare: None,
            prepares: 0,
        }
    }

    /// A serving child, kept between roll calls (it has a stdin to take requests on).
    pub(crate) fn serving(&self) -> bool {
        self.stdin.is_some()
    }

    /// Sends a request to a serving child. Fails when the child does not take it (exited, or stuck with its
    /// pipe full): the caller gives up on the child.
    pub(crate) fn send(&mut self, request: &ServeRequest) -> std::io::Result<()> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(std::io::Error::other("not a serving reader"));
        };
        let mut line = serde_json::to_vec(request)?;
        line.push(b'\n');
        // One short line: a pipe with room takes it whole; without room the child is not reading.
        let written = stdin.write(&line)?;
        if written != line.len() {
            return Err(std::io::Error::other("the reader took part of a request"));
        }
        let now = Instant::now();
        match request {
            ServeRequest::Read { pids } => {
                self.pids = pids.clone();
                self.finished_pids.clear();
                self.done.clear();
                self.last_progress = now;
            }
            ServeRequest::Prepare { pids } => {
                if self.assigned != *pids {
                    self.prepares = 0;
                }
                self.assigned = pids.clone();
                self.prepares += 1;
                self.last_prepare = Some(now);
                self.preparing = pids.clone();
                self.prepared.retain(|p, _| pids.contains(p));
                self.last_progress = now;
            }
            ServeRequest::OwnDumps(_) => {}
        }
        Ok(())
    }

    /// Reads whatever the child printed within `wait`.
    pub(crate) fn pump(&mut self, wait: Duration) {
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
                    self.done.push(*report);
                }
                Ok(ChildLine::Prepared { pid, error }) => {
                    self.current = None;
                    self.preparing.retain(|p| *p != pid);
                    self.prepared.insert(pid, error);
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

    /// Every pid of the current request has its report.
    fn answered(&self) -> bool {
        self.pids.iter().all(|p| self.finished_pids.contains(p))
    }

    pub(crate) fn idle_for(&self) -> Duration {
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
        self.stdin = None;
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = self.child.kill();
        let started = self.started;
        drop(AbandonedChild::new(self.child, started));
    }

    /// Gives up on the child: returns the pid it was stuck on (with the step), the pids it did not reach, and the
    /// child to reap later.
    pub(crate) fn abandon(mut self) -> (Option<(i32, String)>, Vec<i32>, AbandonedChild) {
        self.stdin = None;
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
    let mut readers = PreparedReaders::default();
    for &pid in pids {
        readers.read(pid, stacks, out)?;
    }
    Ok(())
}

/// The serving child's side (`__inspect-child --serve`): takes `ServeRequest` lines from `input` until it
/// closes. `prepare` finds each rank's interpreter and parses its symbols once, while the job is healthy (the
/// slow part of a stack read: ~7 ms a process); a `read` then costs only the reads of the stacks themselves.
pub fn serve_main(input: impl std::io::BufRead, out: &mut impl Write) -> std::io::Result<()> {
    let mut readers = PreparedReaders::default();
    for line in input.lines() {
        match serde_json::from_str::<ServeRequest>(&line?) {
            Ok(ServeRequest::Prepare { pids }) => {
                readers.keep_only(&pids);
                for pid in pids {
                    readers.prepare(pid, out)?;
                }
            }
            Ok(ServeRequest::Read { pids }) => {
                for pid in pids {
                    readers.read(pid, true, out)?;
                }
            }
            Ok(ServeRequest::OwnDumps(request)) => crate::dump_files::answer(&request, out)?,
            // The parent writes these lines; one it did not mean is skipped, not fatal.
            Err(_) => continue,
        }
    }
    Ok(())
}

/// One process's reader, ready: its interpreter found and symbols parsed, its rank identity read.
struct PreparedReader {
    /// The process's start time: a pid reused by another process is not read with this reader.
    start_time: u64,
    rank_env: Option<RankEnv>,
    cmdline: Option<Vec<String>>,
    spy: py_spy::PythonSpy,
}

/// The readers a child keeps, by pid.
#[derive(Default)]
struct PreparedReaders {
    by_pid: HashMap<i32, PreparedReader>,
}

impl PreparedReaders {
    fn keep_only(&mut self, pids: &[i32]) {
        self.by_pid.retain(|pid, _| pids.contains(pid));
    }

    /// Prepares a reader of `pid` (unless one for the same process is ready) and says how that went.
    fn prepare(&mut self, pid: i32, out: &mut impl Write) -> std::io::Result<()> {
        let start_time = start_time_of(pid);
        if start_time.is_some() && self.by_pid.get(&pid).map(|r| r.start_time) == start_time {
            return emit(out, &ChildLine::Prepared { pid, error: None });
        }
        self.by_pid.remove(&pid);
        let mut report = PythonProcessReport {
            pid,
            ..Default::default()
        };
        identity(pid, &mut report, out)?;
        emit(
            out,
            &ChildLine::Begin {
                pid,
                step: "preparing the Python stack reader".into(),
            },
        )?;
        let error = match (start_time, python_spy(pid)) {
            (Some(start_time), Ok(spy)) => {
                self.by_pid.insert(
                    pid,
                    PreparedReader {
                        start_time,
                        rank_env: report.rank_env,
                        cmdline: report.cmdline,
                        spy,
                    },
                );
                None
            }
            (None, _) => Some("the process is gone".to_string()),
            (_, Err(e)) => Some(e),
        };
        emit(out, &ChildLine::Prepared { pid, error })
    }

    /// Reads `pid` (its stack too when `stacks`), with its prepared reader when there is one for this process.
    fn read(&mut self, pid: i32, stacks: bool, out: &mut impl Write) -> std::io::Result<()> {
        let mut report = PythonProcessReport {
            pid,
            ..Default::default()
        };
        let prepared = self
            .by_pid
            .get_mut(&pid)
            .filter(|r| Some(r.start_time) == start_time_of(pid));
        match prepared {
            Some(ready) => {
                report.rank_env = ready.rank_env.clone();
                report.cmdline = ready.cmdline.clone();
                if stacks {
                    stack_step(pid, out)?;
                    match stack_traces(&mut ready.spy) {
                        Ok(threads) => report.threads = Some(threads),
                        Err(e) => {
                            report.errors.push(e);
                            // The interpreter may have been torn down: prepare afresh next time.
                            self.by_pid.remove(&pid);
                        }
                    }
                }
            }
            None => {
                self.by_pid.remove(&pid);
                identity(pid, &mut report, out)?;
                if stacks {
                    stack_step(pid, out)?;
                    match python_spy(pid) {
                        Ok(mut spy) => match stack_traces(&mut spy) {
                            Ok(threads) => report.threads = Some(threads),
                            Err(e) => report.errors.push(e),
                        },
                        Err(e) => report.errors.push(e),
                    }
                }
            }
        }
        emit(
            out,
            &ChildLine::Done {
                report: Box::new(report),
            },
        )
    }
}

/// Reads the rank environment and command line of `pid` into `report`, announcing each step.
fn identity(
    pid: i32,
    report: &mut PythonProcessReport,
    out: &mut impl Write,
) -> std::io::Result<()> {
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
    emit(
        out,
        &ChildLine::Begin {
            pid,
            step: "reading the command line".into(),
        },
    )?;
    if let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) {
        report.cmdline = Some(hangwatch_proc::parse_cmdline(&raw));
    }
    Ok(())
}

fn stack_step(pid: i32, out: &mut impl Write) -> std::io::Result<()> {
    emit(
        out,
        &ChildLine::Begin {
            pid,
            step: "reading the Python stack".into(),
        },
    )
}

/// The start time of `pid` (from /proc/PID/stat, which takes no lock the process can hold).
fn start_time_of(pid: i32) -> Option<u64> {
    hangwatch_proc::ProcFs::new("/proc")
        .stat(pid)
        .ok()
        .map(|s| s.starttime)
}

fn emit(out: &mut impl Write, line: &ChildLine) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, line)?;
    out.write_all(b"\n")?;
    out.flush()
}

fn python_spy(pid: i32) -> Result<py_spy::PythonSpy, String> {
    let config = py_spy::Config {
        blocking: py_spy::config::LockingStrategy::NonBlocking,
        native: false,
        full_filenames: true,
        ..py_spy::Config::default()
    };
    py_spy::PythonSpy::new(pid, &config).map_err(|e| format!("not a readable Python process: {e}"))
}

fn stack_traces(spy: &mut py_spy::PythonSpy) -> Result<Vec<PythonThread>, String> {
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
                    function: hangwatch_model::intern(&f.name),
                    filename: hangwatch_model::intern(&f.filename),
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
