//! The sink: takes lines from any thread without blocking, feeds them in order to a writer child through a
//! non-blocking pipe, keeps them (memory, then node-local spill) while the destination does not answer, and
//! saves the rest to a node-local file when it never does.
//!
//! ```text
//!  push() ──► hand-off queue ──► feeder thread ──► pipe (O_NONBLOCK, 1 MiB) ──► writer child ──► destination
//!  (any thread,  (mutex, µs)      │    ▲                                          │ write()
//!   never blocks)                 ▼    │ replay in order                          ▼
//!                            spill file (node-local)          ◄── "ack SEQ" on the child's stdout
//! ```
//!
//! The feeder thread only ever touches pipes and the node-local spill file, so it cannot be caught in D state by
//! the destination's filesystem; the writer child can, and is abandoned (killed, never waited for) if it is
//! still stuck when the sink finishes.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use tracing::{debug, error, warn};

use crate::ledger::{Counts, Ledger, Limits};
use crate::protocol::WriterMessage;
use crate::rotate::Rotation;
use crate::spill::{FileSpill, SpillReserve};

/// Records waiting to be written into the pipe at most (the pipe itself holds [`PIPE_SIZE`] more).
const WIRE_BUDGET: usize = 256 << 10;
/// What the sink asks the kernel for as the size of the writer's stdin pipe (`F_SETPIPE_SZ`).
const PIPE_SIZE: usize = 1 << 20;
/// The feeder wakes at least this often; everything it reacts to (pushes, acknowledgements, a dead writer,
/// `finish`) wakes it sooner.
const TICK: Duration = Duration::from_secs(1);
/// After taking lines from the hand-off queue the feeder lets more gather for this long before it looks again: a
/// job printing 1,000 lines a second then costs the feeder (and the writer child) tens of wake-ups a second, not a
/// thousand. A line reaches the log at most this much later; pushes never wait for it.
const BATCH: Duration = Duration::from_millis(25);
/// The hand-off queue between `push` and the feeder holds at least this much before it drops.
const MIN_HANDOFF: usize = 8 << 20;
/// After the spill failed (its disk full, below its reserve), how often to try it again.
const SPILL_RETRY: Duration = Duration::from_secs(5);

/// How to start the writer child; the destination is appended as `--dest PATH` (and the size cap as
/// `--max-size BYTES --keep N`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl WriterCommand {
    /// `PROGRAM __log-writer`: hangwatch's hidden subcommand in the given hangwatch binary.
    pub fn hangwatch(program: impl Into<PathBuf>) -> Self {
        WriterCommand {
            program: program.into(),
            args: vec!["__log-writer".into()],
        }
    }

    /// The running binary (it must be hangwatch).
    pub fn current_exe() -> std::io::Result<Self> {
        // The link, not the path: a binary replaced while a long job runs must not break the writer's restarts.
        let link = PathBuf::from("/proc/self/exe");
        // lstat, not stat: following the link would touch the binary's filesystem.
        if std::fs::symlink_metadata(&link).is_ok() {
            Ok(Self::hangwatch(link))
        } else {
            std::env::current_exe().map(Self::hangwatch)
        }
    }

    fn command(&self, dest: &Path, rotation: Option<Rotation>) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).arg("--dest").arg(dest);
        if let Some(r) = rotation {
            cmd.arg("--max-size")
                .arg(r.max_size.to_string())
                .arg("--keep")
                .arg(r.keep.to_string());
        }
        cmd
    }
}

/// How a sink behaves. `Default` is right for a real job; tests shrink the limits and times.
#[derive(Debug, Clone)]
pub struct LogSinkOptions {
    /// The writer child; `None`: this binary's `__log-writer`.
    pub writer: Option<WriterCommand>,
    /// Node-local directory for the spill file (never on the destination's filesystem).
    pub spill_dir: PathBuf,
    /// Payload bytes held in memory before lines spill.
    pub memory_limit: usize,
    /// Bytes the spill file may hold before new lines are dropped (counted, and marked in the log).
    pub spill_limit: u64,
    /// Free space the spill never takes from its filesystem.
    pub spill_reserve: SpillReserve,
    /// Size cap of the destination, rotated by the writer child; `None`: it grows without limit (and is never
    /// renamed: hangwatch's own stdout, `/proc/self/fd/1`, cannot be).
    pub rotation: Option<Rotation>,
    /// Lines pending with no acknowledgement for this long: the destination counts as stalled.
    pub stall_after: Duration,
    /// How long `open` waits for the writer to open the destination (a frozen one does not answer; then `open`
    /// succeeds anyway and lines wait).
    pub ready_timeout: Duration,
    /// After a writer died twice in a row without progress, how long to wait before starting another.
    pub retry_after: Duration,
    /// Node-local file that receives the lines never written when `finish` gives up. Created 0600, never
    /// through a symlink.
    pub undelivered_path: PathBuf,
    /// The destination is inside one of hangwatch's private directories (the default `output.log`): the writer
    /// creates it 0600 and refuses a symlink there. `false` for a log file the user named, which may be a link.
    pub private_dest: bool,
}

impl Default for LogSinkOptions {
    fn default() -> Self {
        let tmp = std::env::temp_dir();
        LogSinkOptions {
            writer: None,
            undelivered_path: tmp.join(format!(
                "hangwatch-log-undelivered-{}.txt",
                std::process::id()
            )),
            spill_dir: tmp,
            memory_limit: 64 << 20,
            spill_limit: 4 << 30,
            spill_reserve: SpillReserve::default(),
            rotation: None,
            stall_after: Duration::from_secs(2),
            ready_timeout: Duration::from_secs(2),
            retry_after: Duration::from_secs(10),
            private_dest: false,
        }
    }
}

/// Why a sink could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("could not find the hangwatch binary to run the log writer")]
    CurrentExe {
        #[source]
        source: std::io::Error,
    },
    #[error("could not start the log writer {program}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the log file {dest}: {message}")]
    Destination { dest: PathBuf, message: String },
    #[error("the log writer {program} exited before opening {dest} ({status})")]
    WriterExited {
        program: PathBuf,
        dest: PathBuf,
        status: String,
    },
    #[error("could not set up the log sink")]
    Setup {
        #[source]
        source: std::io::Error,
    },
}

/// A snapshot of what the sink has done and holds.
///
/// Counts are of records: a line longer than 16 MiB counts as several, and a marker for dropped lines counts as
/// one written line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SinkStats {
    pub pushed_lines: u64,
    pub pushed_bytes: u64,
    /// Acknowledged by the writer: in the destination.
    pub written_lines: u64,
    pub written_bytes: u64,
    /// Not yet acknowledged and held in memory (queued, or sent to the writer and not acknowledged).
    pub in_memory_lines: u64,
    pub in_memory_bytes: u64,
    /// Held in the spill file now.
    pub spilled_lines: u64,
    pub spilled_bytes: u64,
    /// Lines that went through the spill file so far.
    pub spilled_total_lines: u64,
    /// Lost because memory and spill were full: the only way the sink loses a line.
    pub dropped_lines: u64,
    pub dropped_bytes: u64,
    /// When and why lines were dropped, once any were.
    pub not_kept: Option<NotKept>,
    /// Since when lines wait with no acknowledgement, once that lasts longer than `stall_after`.
    pub stalled_since: Option<Instant>,
    pub writer_restarts: u32,
    /// Why the last writer failed, until a writer makes progress again.
    pub writer_error: Option<String>,
    /// Why spilling stopped, while it is stopped.
    pub spill_error: Option<String>,
    pub writer_pid: Option<u32>,
}

impl SinkStats {
    /// Lines pushed and neither written nor dropped yet.
    pub fn pending_lines(&self) -> u64 {
        self.in_memory_lines + self.spilled_lines
    }
}

/// Lines the sink dropped: how many, between which times (when the sink saw them), and why (the first reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotKept {
    pub lines: u64,
    pub bytes: u64,
    pub first: SystemTime,
    pub last: SystemTime,
    pub reason: String,
}

impl NotKept {
    /// `N lines / B of rank output from T1 to T2 were not kept: REASON`.
    pub fn message(&self) -> String {
        format!(
            "{} lines / {} of rank output from {} to {} were not kept: {}",
            self.lines,
            crate::human_bytes(self.bytes),
            crate::utc_time(self.first),
            crate::utc_time(self.last),
            self.reason
        )
    }
}

/// Lines the sink could not deliver before `finish` gave up, and where they went instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undelivered {
    pub lines: u64,
    pub bytes: u64,
    pub path: PathBuf,
    /// Lines (and their bytes) that are completely in `path`: all of them unless `save_error` is set.
    pub saved_lines: u64,
    pub saved_bytes: u64,
    pub save_error: Option<String>,
}

/// What `finish` came to.
///
/// Overlap rule: every line acknowledged is in the destination; every line not acknowledged is in the
/// undelivered file, in order. The writer may have written some of the latter (its last `write()` returned, or
/// returns after the thaw, before it could acknowledge), so the end of the destination and the start of the
/// undelivered file can hold the same lines, at most one writer batch (about 1 MiB). No line is in neither.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishReport {
    pub destination: PathBuf,
    pub pushed_lines: u64,
    pub written_lines: u64,
    pub dropped_lines: u64,
    pub not_kept: Option<NotKept>,
    pub undelivered: Option<Undelivered>,
    pub writer_error: Option<String>,
    /// The writer that was still stuck, killed and left behind (it exits when its `write()` returns).
    pub abandoned_writer_pid: Option<u32>,
    pub elapsed: Duration,
}

impl FinishReport {
    /// Every pushed line is in the destination.
    pub fn is_complete(&self) -> bool {
        self.undelivered.is_none() && self.dropped_lines == 0
    }

    /// What to tell the user when not every line reached the destination.
    pub fn message(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(u) = &self.undelivered {
            let why = match &self.writer_error {
                Some(e) => format!("the writer failed: {e}"),
                None => "its filesystem does not respond".to_owned(),
            };
            let dest = self.destination.display();
            let file = u.path.display();
            parts.push(match &u.save_error {
                None => format!("{} lines could not be written to {dest} ({why}); they are in {file}", u.lines),
                Some(e) if u.saved_lines == 0 => format!(
                    "{} lines could not be written to {dest} ({why}), nor saved to {file}: all {} lines / {} of rank \
                     output were not kept: {e}",
                    u.lines,
                    u.lines,
                    crate::human_bytes(u.bytes)
                ),
                Some(e) => format!(
                    "{} lines could not be written to {dest} ({why}); only the first {} are in {file}: the other {} \
                     lines / {} of rank output were not kept: {e}",
                    u.lines,
                    u.saved_lines,
                    u.lines - u.saved_lines,
                    crate::human_bytes(u.bytes.saturating_sub(u.saved_bytes))
                ),
            });
        }
        if let Some(n) = &self.not_kept {
            parts.push(n.message());
        } else if self.dropped_lines > 0 {
            parts.push(format!("{} log lines were not kept", self.dropped_lines));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// Pushes lines into a sink from any thread; cheap to clone.
#[derive(Debug, Clone)]
pub struct LinePusher {
    shared: Arc<Shared>,
}

impl LinePusher {
    /// See [`LogSink::push`].
    pub fn push(&self, line: &[u8]) {
        self.shared.push(line.to_vec());
    }

    /// See [`LogSink::push_owned`].
    pub fn push_owned(&self, line: Vec<u8>) {
        self.shared.push(line);
    }
}

/// A log destination that never blocks the caller. See the module documentation.
#[derive(Debug)]
pub struct LogSink {
    shared: Arc<Shared>,
    dest: PathBuf,
    undelivered_path: PathBuf,
    thread: Option<JoinHandle<FeederExit>>,
}

impl LogSink {
    /// Starts the writer child for `dest` and the feeder thread.
    ///
    /// Waits up to `ready_timeout` for the writer to open `dest`: an error the writer reports then (no such
    /// directory, permission denied) fails `open`. A destination that does not answer in time is not an error:
    /// lines are kept until it does.
    pub fn open(dest: &Path, options: LogSinkOptions) -> Result<LogSink, OpenError> {
        let mut command = match options.writer.clone() {
            Some(c) => c,
            None => {
                WriterCommand::current_exe().map_err(|source| OpenError::CurrentExe { source })?
            }
        };
        if options.private_dest {
            command.args.push("--private".into());
        }
        let mut writer = Writer::spawn(&command, dest, options.rotation, 0).map_err(|source| {
            OpenError::Spawn {
                program: command.program.clone(),
                source,
            }
        })?;
        match writer.wait_ready(options.ready_timeout) {
            Ready::Yes => {}
            Ready::Failed(message) => {
                writer.abandon();
                return Err(OpenError::Destination {
                    dest: dest.to_owned(),
                    message,
                });
            }
            Ready::Exited(status) => {
                writer.abandon();
                return Err(OpenError::WriterExited {
                    program: command.program.clone(),
                    dest: dest.to_owned(),
                    status,
                });
            }
            Ready::NotYet => warn!(
                dest = %dest.display(),
                waited_s = options.ready_timeout.as_secs_f64(),
                "the log destination has not answered yet; lines are kept until it does"
            ),
        }

        let setup = |source| OpenError::Setup { source };
        let (wake_rx, wake_tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| setup(e.into()))?;
        let shared = Arc::new(Shared {
            handoff: Mutex::new(Handoff::default()),
            handoff_limit: options.memory_limit.max(MIN_HANDOFF),
            wake_pending: AtomicBool::new(false),
            wake_rx,
            wake_tx,
            finishing: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            done: Mutex::new(false),
            done_cv: Condvar::new(),
            published: Mutex::new(Published::new(Instant::now())),
            stall_after: options.stall_after,
        });
        let feeder = Feeder {
            shared: Arc::clone(&shared),
            ledger: Ledger::new(
                FileSpill::new(&options.spill_dir, options.spill_reserve),
                Limits {
                    memory: options.memory_limit,
                    spill: options.spill_limit,
                },
            ),
            command,
            dest: dest.to_owned(),
            rotation: options.rotation,
            writer: Some(writer),
            abandoned: Vec::new(),
            retry_after: options.retry_after,
            next_attempt: None,
            failures_in_a_row: 0,
            restarts: 0,
            error: None,
            last_progress: Instant::now(),
            was_idle: true,
            finish_retry_done: false,
            next_spill_retry: None,
            seen_dropped: 0,
            seen_dropped_bytes: 0,
            handoff_dropped: false,
            not_kept: None,
            last_taken: None,
        };
        let thread = std::thread::Builder::new()
            .name("hangwatch-logsink".into())
            .spawn(move || {
                crate::yield_to_the_job(Some(rustix::thread::gettid()));
                feeder.run()
            })
            .map_err(setup)?;
        Ok(LogSink {
            shared,
            dest: dest.to_owned(),
            undelivered_path: options.undelivered_path,
            thread: Some(thread),
        })
    }

    /// Queues one line (bytes as they should appear, newline included). Never blocks on the destination and
    /// never fails: a mutex held for microseconds, a copy, and at most one write to a wake-up pipe.
    pub fn push(&self, line: &[u8]) {
        self.shared.push(line.to_vec());
    }

    /// [`LogSink::push`] for a line the caller already owns (saves the copy).
    pub fn push_owned(&self, line: Vec<u8>) {
        self.shared.push(line);
    }

    /// A handle for other threads (the rank output drains, the heartbeat receiver).
    pub fn pusher(&self) -> LinePusher {
        LinePusher {
            shared: Arc::clone(&self.shared),
        }
    }

    pub fn destination(&self) -> &Path {
        &self.dest
    }

    pub fn stats(&self) -> SinkStats {
        self.shared.stats(Instant::now())
    }

    /// Waits up to `deadline` for every line to be written. If the destination is still stuck then, saves every
    /// unacknowledged line in order to the undelivered file, kills the writer and leaves it behind. Returns within
    /// `deadline` plus the time to save those lines to node-local disk. Lines pushed (through a [`LinePusher`])
    /// after `finish` returns go nowhere.
    pub fn finish(mut self, deadline: Duration) -> FinishReport {
        self.shutdown(deadline)
    }

    fn shutdown(&mut self, deadline: Duration) -> FinishReport {
        let started = Instant::now();
        let end = started + deadline;
        self.shared.finishing.store(true, Ordering::Release);
        self.shared.wake();
        {
            let mut done = lock(&self.shared.done);
            while !*done {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                done = self
                    .shared
                    .done_cv
                    .wait_timeout(done, end - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        self.shared.abort.store(true, Ordering::Release);
        self.shared.wake();
        let stats = self.shared.stats(Instant::now());
        let Some(exit) = self.thread.take().and_then(|t| t.join().ok()) else {
            error!(dest = %self.dest.display(), "the log sink's thread panicked; the lines it held are lost");
            return FinishReport {
                destination: self.dest.clone(),
                pushed_lines: stats.pushed_lines,
                written_lines: stats.written_lines,
                dropped_lines: stats.dropped_lines + stats.pending_lines(),
                not_kept: stats.not_kept,
                undelivered: None,
                writer_error: Some("the log sink's thread panicked".into()),
                abandoned_writer_pid: None,
                elapsed: started.elapsed(),
            };
        };
        let FeederExit {
            mut ledger,
            writer,
            mut abandoned,
            error,
            mut not_kept,
        } = exit;
        let dropped_before = ledger.counts();
        let (late, late_dropped, late_dropped_bytes) = self.shared.take_handoff();
        for line in late {
            ledger.accept(line);
        }
        ledger.note_dropped(late_dropped, late_dropped_bytes, HANDOFF_FULL);
        let after = ledger.counts();
        if after.dropped > dropped_before.dropped {
            note_not_kept(
                &mut not_kept,
                after.dropped - dropped_before.dropped,
                after.dropped_bytes - dropped_before.dropped_bytes,
                SystemTime::now(),
                || ledger.drop_reason(),
            );
        }

        let undelivered = (!ledger.is_idle()).then(|| {
            let c = ledger.counts();
            let lines = c.in_flight + c.spilled + c.queued;
            let bytes = c.in_flight_bytes + c.spilled_bytes + c.queued_bytes;
            save_undelivered(&mut ledger, &self.undelivered_path, lines, bytes)
        });
        let mut abandoned_writer_pid = None;
        if let Some(mut w) = writer {
            if undelivered.is_some() {
                abandoned_writer_pid = Some(w.child.id());
                w.abandon();
            } else {
                let until = Instant::now()
                    + Duration::from_millis(200).min(end.saturating_duration_since(Instant::now()));
                while !w.try_reap() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(2));
                }
                w.abandon();
            }
        }
        abandoned.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));

        let counts = ledger.counts();
        let report = FinishReport {
            destination: self.dest.clone(),
            pushed_lines: stats.pushed_lines,
            written_lines: counts.acked,
            dropped_lines: counts.dropped,
            not_kept,
            undelivered,
            writer_error: error,
            abandoned_writer_pid,
            elapsed: started.elapsed(),
        };
        if let Some(message) = report.message() {
            warn!(dest = %self.dest.display(), "{message}");
        }
        report
    }
}

impl Drop for LogSink {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown(Duration::ZERO);
        }
    }
}

/// Why lines were dropped before they reached the ledger.
const HANDOFF_FULL: &str = "the log sink's hand-off queue was full (its thread could not keep up)";

/// Adds dropped lines to what is said about them; the first reason is the one kept.
fn note_not_kept(
    not_kept: &mut Option<NotKept>,
    lines: u64,
    bytes: u64,
    now: SystemTime,
    reason: impl FnOnce() -> String,
) {
    match not_kept {
        Some(n) => {
            n.lines += lines;
            n.bytes += bytes;
            n.last = now;
        }
        None => {
            *not_kept = Some(NotKept {
                lines,
                bytes,
                first: now,
                last: now,
                reason: reason(),
            })
        }
    }
}

/// Bytes of undelivered lines written to their file per `write()`.
const SAVE_CHUNK: usize = 1 << 20;

/// Writes every unacknowledged line to `path`, counting exactly the lines that are completely in it: on a full
/// disk the file is cut back to the last whole line and the rest is counted as not kept.
fn save_undelivered(
    ledger: &mut Ledger<FileSpill>,
    path: &Path,
    lines: u64,
    bytes: u64,
) -> Undelivered {
    let mut undelivered = Undelivered {
        lines,
        bytes,
        path: path.to_owned(),
        saved_lines: 0,
        saved_bytes: 0,
        save_error: None,
    };
    // 0600 and never through a planted symlink: the lines are the job's output.
    let file = match hangwatch_safefs::open_file_in_dir(path, hangwatch_safefs::WriteMode::Truncate)
    {
        Ok(f) => f,
        Err(e) => {
            undelivered.save_error = Some(hangwatch_model::error_chain(&e));
            return undelivered;
        }
    };
    let mut out = SaveFile {
        file,
        buf: Vec::with_capacity(SAVE_CHUNK),
        ends: Vec::new(),
        saved_lines: 0,
        saved_bytes: 0,
    };
    let drained = ledger.drain_unacked(|line| out.push(&line.bytes));
    let flushed = out.flush();
    undelivered.saved_lines = out.saved_lines;
    undelivered.saved_bytes = out.saved_bytes;
    match (drained, flushed) {
        (Ok(_), Ok(())) => {}
        (Ok(_), Err(e)) => undelivered.save_error = Some(e.to_string()),
        (Err(e), flushed) => {
            undelivered.save_error = Some(match flushed {
                Err(f) if matches!(e, crate::ledger::DrainError::Spill { .. }) => {
                    format!("{}; then: {f}", hangwatch_model::error_chain(&e))
                }
                _ => match &e {
                    crate::ledger::DrainError::Output { source, .. } => source.to_string(),
                    crate::ledger::DrainError::Spill { .. } => hangwatch_model::error_chain(&e),
                },
            });
        }
    }
    if undelivered.save_error.is_some() {
        // A line cut by the full disk would read as a whole one: the file ends at the last complete line.
        let _ = out.file.set_len(out.saved_bytes);
    }
    undelivered
}

/// The undelivered file while it is written: whole lines counted as they reach the disk.
struct SaveFile {
    file: std::fs::File,
    buf: Vec<u8>,
    /// End offset in `buf` of each line in it.
    ends: Vec<usize>,
    saved_lines: u64,
    saved_bytes: u64,
}

impl SaveFile {
    fn push(&mut self, line: &[u8]) -> std::io::Result<()> {
        if !self.buf.is_empty() && self.buf.len() + line.len() > SAVE_CHUNK {
            self.flush()?;
        }
        self.buf.extend_from_slice(line);
        self.ends.push(self.buf.len());
        if self.buf.len() >= SAVE_CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut written = 0;
        let result = loop {
            if written == self.buf.len() {
                break Ok(());
            }
            match self.file.write(&self.buf[written..]) {
                Ok(0) => break Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let whole = self.ends.partition_point(|&end| end <= written);
        self.saved_lines += whole as u64;
        self.saved_bytes += if whole == 0 {
            0
        } else {
            self.ends[whole - 1] as u64
        };
        self.buf.clear();
        self.ends.clear();
        result
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Default)]
struct Handoff {
    lines: VecDeque<Vec<u8>>,
    bytes: usize,
    pushed_lines: u64,
    pushed_bytes: u64,
    /// Dropped since the feeder last took the queue; once one line is dropped, the rest of the batch is too, so
    /// that the gap is one run at its end.
    dropped: u64,
    dropped_bytes: u64,
}

/// What the feeder last reported, for `stats` on other threads.
#[derive(Debug)]
struct Published {
    counts: Counts,
    idle: bool,
    last_progress: Instant,
    restarts: u32,
    error: Option<String>,
    spill_error: Option<String>,
    writer_pid: Option<u32>,
    not_kept: Option<NotKept>,
}

impl Published {
    fn new(now: Instant) -> Self {
        Published {
            counts: Counts::default(),
            idle: true,
            last_progress: now,
            restarts: 0,
            error: None,
            spill_error: None,
            writer_pid: None,
            not_kept: None,
        }
    }
}

#[derive(Debug)]
struct Shared {
    handoff: Mutex<Handoff>,
    handoff_limit: usize,
    wake_pending: AtomicBool,
    /// Both ends live as long as any pusher, so a wake-up never writes into a pipe without a reader (SIGPIPE).
    wake_rx: OwnedFd,
    wake_tx: OwnedFd,
    finishing: AtomicBool,
    abort: AtomicBool,
    done: Mutex<bool>,
    done_cv: Condvar,
    published: Mutex<Published>,
    stall_after: Duration,
}

impl Shared {
    fn push(&self, line: Vec<u8>) {
        {
            let mut h = lock(&self.handoff);
            h.pushed_lines += 1;
            h.pushed_bytes += line.len() as u64;
            if h.dropped > 0 || (h.bytes > 0 && h.bytes + line.len() > self.handoff_limit) {
                h.dropped += 1;
                h.dropped_bytes += line.len() as u64;
                return;
            }
            h.bytes += line.len();
            h.lines.push_back(line);
        }
        self.wake();
    }

    fn wake(&self) {
        if !self.wake_pending.swap(true, Ordering::AcqRel) {
            let _ = nix::unistd::write(&self.wake_tx, &[1]);
        }
    }

    fn take_handoff(&self) -> (VecDeque<Vec<u8>>, u64, u64) {
        let mut h = lock(&self.handoff);
        h.bytes = 0;
        let dropped = std::mem::take(&mut h.dropped);
        let dropped_bytes = std::mem::take(&mut h.dropped_bytes);
        (std::mem::take(&mut h.lines), dropped, dropped_bytes)
    }

    fn stats(&self, now: Instant) -> SinkStats {
        let (
            pushed_lines,
            pushed_bytes,
            handoff_lines,
            handoff_bytes,
            handoff_dropped,
            handoff_dropped_bytes,
        ) = {
            let h = lock(&self.handoff);
            (
                h.pushed_lines,
                h.pushed_bytes,
                h.lines.len() as u64,
                h.bytes as u64,
                h.dropped,
                h.dropped_bytes,
            )
        };
        let p = lock(&self.published);
        let c = p.counts;
        let stalled = !p.idle && now.saturating_duration_since(p.last_progress) > self.stall_after;
        SinkStats {
            pushed_lines,
            pushed_bytes,
            written_lines: c.acked,
            written_bytes: c.acked_bytes,
            in_memory_lines: c.queued + c.in_flight + handoff_lines,
            in_memory_bytes: c.queued_bytes + c.in_flight_bytes + handoff_bytes,
            spilled_lines: c.spilled,
            spilled_bytes: c.spilled_bytes,
            spilled_total_lines: c.spilled_total,
            dropped_lines: c.dropped + handoff_dropped,
            dropped_bytes: c.dropped_bytes + handoff_dropped_bytes,
            not_kept: p.not_kept.clone(),
            stalled_since: stalled.then_some(p.last_progress),
            writer_restarts: p.restarts,
            writer_error: p.error.clone(),
            spill_error: p.spill_error.clone(),
            writer_pid: p.writer_pid,
        }
    }
}

enum Ready {
    Yes,
    Failed(String),
    Exited(String),
    NotYet,
}

/// One writer child and our ends of its pipes (both non-blocking).
#[derive(Debug)]
struct Writer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<ChildStdout>,
    buf: Vec<u8>,
    error: Option<String>,
    acked_at_start: u64,
}

impl Writer {
    fn spawn(
        command: &WriterCommand,
        dest: &Path,
        rotation: Option<Rotation>,
        acked: u64,
    ) -> std::io::Result<Writer> {
        let mut cmd = command.command(dest, rotation);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0);
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let writer = Writer {
            child,
            stdin,
            stdout,
            buf: Vec::new(),
            error: None,
            acked_at_start: acked,
        };
        let setup = (|| {
            if let Some(s) = &writer.stdin {
                set_nonblocking(s)?;
                if let Err(e) = fcntl(s.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as i32)) {
                    debug!(error = %e, "could not enlarge the log writer's pipe");
                }
            }
            if let Some(s) = &writer.stdout {
                set_nonblocking(s)?;
            }
            Ok::<(), std::io::Error>(())
        })();
        if let Err(e) = setup {
            writer.abandon();
            return Err(e);
        }
        Ok(writer)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads what the child said; `true` at end of its output (it exited or is exiting).
    fn read_messages(&mut self, into: &mut Vec<WriterMessage>) -> bool {
        let Some(out) = self.stdout.as_mut() else {
            return true;
        };
        let mut chunk = [0u8; 4096];
        let eof = loop {
            match out.read(&mut chunk) {
                Ok(0) => break true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                Err(_) => break true,
            }
        };
        let mut start = 0;
        while let Some(nl) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&self.buf[start..start + nl]);
            match WriterMessage::parse(&line) {
                Some(m) => into.push(m),
                None => debug!(line = %line, "ignoring an unknown message from the log writer"),
            }
            start += nl + 1;
        }
        self.buf.drain(..start);
        if eof {
            self.stdout = None;
        }
        eof
    }

    fn wait_ready(&mut self, timeout: Duration) -> Ready {
        let end = Instant::now() + timeout;
        let mut messages = Vec::new();
        loop {
            let eof = self.read_messages(&mut messages);
            for m in messages.drain(..) {
                match m {
                    WriterMessage::Ready => return Ready::Yes,
                    WriterMessage::Error(e) => return Ready::Failed(e),
                    WriterMessage::Ack(_) => {}
                }
            }
            if eof {
                let status = match self.child.try_wait() {
                    Ok(Some(s)) => s.to_string(),
                    _ => "closed its output".to_owned(),
                };
                return Ready::Exited(status);
            }
            let now = Instant::now();
            if now >= end {
                return Ready::NotYet;
            }
            let Some(out) = &self.stdout else {
                return Ready::NotYet;
            };
            let ms = (end - now).as_millis().clamp(1, u16::MAX as u128) as u16;
            let mut fds = [PollFd::new(out.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => return Ready::NotYet,
            }
        }
    }

    fn try_reap(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)) | Err(_))
    }

    /// SIGKILL and let go: never waits (a child in D state dies only when its call returns).
    fn abandon(mut self) {
        self.stdin = None;
        self.stdout = None;
        if !self.try_reap() {
            let _ = self.child.kill();
            let _ = self.try_reap();
        }
    }
}

fn set_nonblocking(fd: &impl AsRawFd) -> std::io::Result<()> {
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// What the feeder thread hands back when it stops.
struct FeederExit {
    ledger: Ledger<FileSpill>,
    writer: Option<Writer>,
    abandoned: Vec<Child>,
    error: Option<String>,
    not_kept: Option<NotKept>,
}

/// The sink's thread: moves lines from the hand-off queue into the ledger, spills, writes to the writer's pipe,
/// reads acknowledgements, restarts a dead writer. Touches only pipes and the node-local spill file.
struct Feeder {
    shared: Arc<Shared>,
    ledger: Ledger<FileSpill>,
    command: WriterCommand,
    dest: PathBuf,
    rotation: Option<Rotation>,
    writer: Option<Writer>,
    /// Writers that were killed while possibly stuck; reaped when they are gone.
    abandoned: Vec<Child>,
    retry_after: Duration,
    next_attempt: Option<Instant>,
    failures_in_a_row: u32,
    restarts: u32,
    error: Option<String>,
    last_progress: Instant,
    was_idle: bool,
    finish_retry_done: bool,
    /// When to try the spill again after it failed.
    next_spill_retry: Option<Instant>,
    /// `dropped` of the ledger when last looked at.
    seen_dropped: u64,
    seen_dropped_bytes: u64,
    /// The hand-off queue dropped lines since the drops were last noted.
    handoff_dropped: bool,
    not_kept: Option<NotKept>,
    /// When lines were last taken from the hand-off queue, until the feeder waited after it ([`BATCH`]).
    last_taken: Option<Instant>,
}

impl Feeder {
    fn run(mut self) -> FeederExit {
        let mut messages = Vec::new();
        loop {
            self.take_handoff();
            if self.shared.abort.load(Ordering::Acquire) {
                break;
            }
            let now = Instant::now();
            self.retry_spill(now);
            self.ledger.rebalance();
            self.note_drops();
            let idle = self.ledger.is_idle();
            if self.was_idle && !idle {
                self.last_progress = now;
            }
            self.was_idle = idle;
            let finishing = self.shared.finishing.load(Ordering::Acquire);
            if finishing && idle {
                if let Some(w) = &mut self.writer {
                    w.stdin = None;
                }
                self.publish();
                *lock(&self.shared.done) = true;
                self.shared.done_cv.notify_all();
                break;
            }
            self.ensure_writer(now, finishing);
            self.pump();
            self.publish();
            self.wait(now);
            self.read_writer(&mut messages);
            self.abandoned
                .retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));
        }
        self.publish();
        FeederExit {
            ledger: self.ledger,
            writer: self.writer,
            abandoned: self.abandoned,
            error: self.error,
            not_kept: self.not_kept,
        }
    }

    fn retry_spill(&mut self, now: Instant) {
        if self.ledger.spill_error().is_none() {
            self.next_spill_retry = None;
            return;
        }
        match self.next_spill_retry {
            None => self.next_spill_retry = Some(now + SPILL_RETRY),
            Some(at) if now >= at => {
                self.next_spill_retry = Some(now + SPILL_RETRY);
                self.ledger.retry_spill();
            }
            Some(_) => {}
        }
    }

    /// Says when lines start being dropped (once per episode) and keeps what the final report says of them.
    fn note_drops(&mut self) {
        let c = self.ledger.counts();
        if c.dropped == self.seen_dropped {
            return;
        }
        let lines = c.dropped - self.seen_dropped;
        let bytes = c.dropped_bytes - self.seen_dropped_bytes;
        self.seen_dropped = c.dropped;
        self.seen_dropped_bytes = c.dropped_bytes;
        let first = self.not_kept.is_none();
        let reason = if std::mem::take(&mut self.handoff_dropped) {
            HANDOFF_FULL.to_owned()
        } else {
            self.ledger.drop_reason()
        };
        if first {
            error!(
                dest = %self.dest.display(),
                reason = %reason,
                "rank output is being dropped: the log destination does not take it and there is no room to keep it"
            );
        }
        note_not_kept(&mut self.not_kept, lines, bytes, SystemTime::now(), || {
            reason
        });
    }

    fn take_handoff(&mut self) {
        let (lines, dropped, dropped_bytes) = self.shared.take_handoff();
        if !lines.is_empty() {
            self.last_taken = Some(Instant::now());
        }
        for line in lines {
            self.ledger.accept(line);
        }
        if dropped > 0 {
            self.handoff_dropped = true;
            self.ledger
                .note_dropped(dropped, dropped_bytes, HANDOFF_FULL);
            error!(
                dest = %self.dest.display(),
                lines = dropped,
                "log lines dropped: the log sink's hand-off queue was full"
            );
        }
    }

    fn ensure_writer(&mut self, now: Instant, finishing: bool) {
        if self.writer.is_some() {
            return;
        }
        if finishing && !self.finish_retry_done {
            self.finish_retry_done = true;
            self.next_attempt = Some(now);
        }
        match self.next_attempt {
            Some(at) if now >= at => {}
            _ => return,
        }
        match Writer::spawn(
            &self.command,
            &self.dest,
            self.rotation,
            self.ledger.acked(),
        ) {
            Ok(w) => {
                debug!(dest = %self.dest.display(), pid = w.pid(), "started a log writer");
                self.writer = Some(w);
                self.restarts += 1;
                self.next_attempt = None;
            }
            Err(e) => {
                self.error = Some(format!(
                    "could not start the log writer {}: {e}",
                    self.command.program.display()
                ));
                self.failures_in_a_row += 1;
                self.next_attempt = Some(now + self.retry_after);
            }
        }
    }

    fn pump(&mut self) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let Some(stdin) = w.stdin.as_mut() else {
            return;
        };
        loop {
            self.ledger.stage(WIRE_BUDGET);
            let chunk = self.ledger.unwritten();
            if chunk.is_empty() {
                break;
            }
            let n = chunk.len().min(PIPE_SIZE);
            match stdin.write(&chunk[..n]) {
                Ok(0) => break,
                Ok(n) => self.ledger.wrote(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    debug!(error = %e, "the log writer's pipe closed; reading what it said last");
                    w.stdin = None;
                    let _ = w.child.kill();
                    break;
                }
            }
        }
    }

    fn wait(&mut self, now: Instant) {
        // Lines were just taken: let the next ones gather (the wake-up a push sends stays pending meanwhile, so
        // pushes write nothing to the wake pipe either). `finish` and an abort are seen after the batch.
        let linger = self
            .last_taken
            .take()
            .map_or(Duration::ZERO, |t| BATCH.saturating_sub(t.elapsed()));
        if !linger.is_zero()
            && !self.shared.finishing.load(Ordering::Acquire)
            && !self.shared.abort.load(Ordering::Acquire)
        {
            std::thread::sleep(linger);
            return;
        }
        let mut timeout = TICK;
        if self.writer.is_none() {
            if let Some(at) = self.next_attempt {
                timeout = timeout.min(at.saturating_duration_since(now));
            }
        }
        let want_out = !self.ledger.unwritten().is_empty();
        let mut fds = vec![PollFd::new(self.shared.wake_rx.as_fd(), PollFlags::POLLIN)];
        if let Some(w) = &self.writer {
            if let Some(out) = &w.stdout {
                fds.push(PollFd::new(out.as_fd(), PollFlags::POLLIN));
            }
            if let (Some(stdin), true) = (&w.stdin, want_out) {
                fds.push(PollFd::new(stdin.as_fd(), PollFlags::POLLOUT));
            }
        }
        let ms = timeout.as_millis().min(u16::MAX as u128) as u16;
        let _ = poll(&mut fds, PollTimeout::from(ms));
        drop(fds);
        let mut buf = [0u8; 256];
        while let Ok(n) = nix::unistd::read(self.shared.wake_rx.as_raw_fd(), &mut buf) {
            if n == 0 {
                break;
            }
        }
        self.shared.wake_pending.store(false, Ordering::Release);
    }

    fn read_writer(&mut self, messages: &mut Vec<WriterMessage>) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let eof = w.read_messages(messages);
        for m in messages.drain(..) {
            match m {
                WriterMessage::Ready => {}
                WriterMessage::Error(e) => w.error = Some(e),
                WriterMessage::Ack(seq) => match self.ledger.ack(seq) {
                    Ok(0) => {}
                    Ok(_) => {
                        self.last_progress = Instant::now();
                        self.failures_in_a_row = 0;
                        self.error = None;
                    }
                    Err(e) => {
                        error!(dest = %self.dest.display(), error = %e, "log writer out of step; restarting it");
                        w.error = Some(e.to_string());
                        w.stdin = None;
                        let _ = w.child.kill();
                    }
                },
            }
        }
        if eof {
            self.writer_lost();
        }
    }

    fn writer_lost(&mut self) {
        let Some(mut w) = self.writer.take() else {
            return;
        };
        let exited = match w.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        };
        let reason = w.error.take().unwrap_or_else(|| match &exited {
            Some(status) => format!("the log writer exited ({status})"),
            None => "the log writer closed its output".to_owned(),
        });
        let made_progress = self.ledger.acked() > w.acked_at_start;
        let pid = w.pid();
        if exited.is_none() {
            let _ = w.child.kill();
            w.stdin = None;
            w.stdout = None;
            self.abandoned.push(w.child);
        }
        self.ledger.connection_lost();
        if self.shared.finishing.load(Ordering::Acquire) && self.ledger.is_idle() {
            return;
        }
        if made_progress {
            self.failures_in_a_row = 0;
        }
        self.failures_in_a_row += 1;
        let now = Instant::now();
        if self.failures_in_a_row == 1 {
            warn!(dest = %self.dest.display(), pid, error = %reason, "the log writer stopped; starting another");
            self.next_attempt = Some(now);
        } else {
            error!(
                dest = %self.dest.display(),
                pid,
                error = %reason,
                retry_in_s = self.retry_after.as_secs_f64(),
                "the log destination keeps failing; lines are kept (memory, then spill) and retried"
            );
            self.next_attempt = Some(now + self.retry_after);
        }
        self.error = Some(reason);
    }

    fn publish(&self) {
        let mut p = lock(&self.shared.published);
        p.counts = self.ledger.counts();
        p.idle = self.ledger.is_idle();
        p.last_progress = self.last_progress;
        p.restarts = self.restarts;
        if p.error != self.error {
            p.error.clone_from(&self.error);
        }
        let spill_error = self.ledger.spill_error();
        if p.spill_error.as_deref() != spill_error {
            p.spill_error = spill_error.map(str::to_owned);
        }
        p.writer_pid = self.writer.as_ref().map(Writer::pid);
        if p.not_kept != self.not_kept {
            p.not_kept.clone_from(&self.not_kept);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> FinishReport {
        FinishReport {
            destination: "/shared/run/log.txt".into(),
            pushed_lines: 10,
            written_lines: 10,
            dropped_lines: 0,
            not_kept: None,
            undelivered: None,
            writer_error: None,
            abandoned_writer_pid: None,
            elapsed: Duration::ZERO,
        }
    }

    fn undelivered(save_error: Option<&str>) -> Undelivered {
        Undelivered {
            lines: 7,
            bytes: 70,
            path: "/var/tmp/hw/log-undelivered.txt".into(),
            saved_lines: if save_error.is_some() { 3 } else { 7 },
            saved_bytes: if save_error.is_some() { 30 } else { 70 },
            save_error: save_error.map(str::to_owned),
        }
    }

    #[test]
    fn complete_report_has_nothing_to_say() {
        assert!(report().is_complete());
        assert_eq!(report().message(), None);
    }

    #[test]
    fn frozen_destination_message_names_both_files() {
        let r = FinishReport {
            undelivered: Some(undelivered(None)),
            ..report()
        };
        assert!(!r.is_complete());
        assert_eq!(
            r.message().unwrap(),
            "7 lines could not be written to /shared/run/log.txt (its filesystem does not respond); \
             they are in /var/tmp/hw/log-undelivered.txt"
        );
    }

    #[test]
    fn failing_writer_and_failed_save_and_drops_are_all_said() {
        let t0 = std::time::UNIX_EPOCH + Duration::from_secs(1_795_988_366);
        let r = FinishReport {
            undelivered: Some(undelivered(Some("No space left on device (os error 28)"))),
            writer_error: Some("No space left on device (os error 28)".into()),
            dropped_lines: 2,
            not_kept: Some(NotKept {
                lines: 2,
                bytes: 2048,
                first: t0,
                last: t0 + Duration::from_secs(61),
                reason: "memory is full and spilling stopped: the spill directory /var/tmp/hw has only 10.0 MiB \
                         free (hangwatch leaves 1.0 GiB free for the node)"
                    .into(),
            }),
            ..report()
        };
        let m = r.message().unwrap();
        assert!(
            m.contains("(the writer failed: No space left on device"),
            "{m}"
        );
        assert!(
            m.contains(
                "only the first 3 are in /var/tmp/hw/log-undelivered.txt: the other 4 lines / 40 B of rank output \
                 were not kept: No space left on device"
            ),
            "{m}"
        );
        assert!(
            m.contains(
                "2 lines / 2.0 KiB of rank output from 2026-11-29 21:39:26 UTC to 2026-11-29 21:40:27 UTC were not \
                 kept: memory is full and spilling stopped: the spill directory /var/tmp/hw has only 10.0 MiB free"
            ),
            "{m}"
        );
    }
}
