//! Following a live kernel log: `/dev/kmsg` (or any reader) read on a thread, lines parsed as they come, each event
//! handed out as soon as it is complete; a hung-task report still open is finished after a quiet interval.

use std::fs::File;
use std::io::{self, BufRead, BufReader, ErrorKind, Read};
use std::ops::ControlFlow;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::parser::{Event, Parser};

/// The live kernel log.
pub const DEV_KMSG: &str = "/dev/kmsg";

/// A hung-task report with no new line for this long is complete (reports are printed in one burst).
pub const DEFAULT_IDLE: Duration = Duration::from_millis(1500);

/// Why the kernel log could not be followed.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error(
        "cannot read {path}: permission denied (reading the kernel log needs root or CAP_SYSLOG when \
         kernel.dmesg_restrict=1). Run as root, or `sysctl kernel.dmesg_restrict=0`, or read a saved log: \
         `dmesg | hangwatch kmsg -`"
    )]
    PermissionDenied { path: PathBuf },
    #[error("cannot open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading the kernel log failed after {lines} lines")]
    Read {
        lines: u64,
        #[source]
        source: io::Error,
    },
}

/// Opens `/dev/kmsg` (or a stand-in path) for reading from its oldest buffered record. `nonblocking`: reads end
/// with `WouldBlock` once the buffer is drained, instead of waiting for new records.
pub fn open_kmsg(path: &Path, nonblocking: bool) -> Result<File, FollowError> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    if nonblocking {
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path).map_err(|source| {
        if source.kind() == ErrorKind::PermissionDenied {
            FollowError::PermissionDenied {
                path: path.to_path_buf(),
            }
        } else {
            FollowError::Open {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

/// Boot time in Unix seconds from `/proc/uptime`'s text and the current time (what `dmesg -T` does).
pub fn boot_time_from_uptime(uptime_text: &str, now_unix_s: f64) -> Option<f64> {
    let up: f64 = uptime_text.split_whitespace().next()?.parse().ok()?;
    (up.is_finite() && up >= 0.0).then_some(now_unix_s - up)
}

/// This machine's boot time, to put wall-clock times (UTC) on `/dev/kmsg` records.
pub fn boot_time_unix_s() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/uptime").ok()?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    boot_time_from_uptime(&text, now)
}

/// Reads lines from a kernel-log source: lossy UTF-8, `EPIPE` (records overwritten before they were read,
/// `/dev/kmsg`) skipped and counted, `WouldBlock` (a drained non-blocking `/dev/kmsg`) is the end.
pub struct LineReader<R> {
    reader: R,
    buf: Vec<u8>,
    /// How many times records were lost because the kernel's ring buffer wrapped before they were read.
    pub overruns: u64,
}

impl<R: BufRead> LineReader<R> {
    pub fn new(reader: R) -> LineReader<R> {
        LineReader {
            reader,
            buf: Vec::with_capacity(1024),
            overruns: 0,
        }
    }

    pub fn next_line(&mut self) -> io::Result<Option<String>> {
        loop {
            self.buf.clear();
            match self.reader.read_until(b'\n', &mut self.buf) {
                Ok(0) => return Ok(None),
                Ok(_) => return Ok(Some(String::from_utf8_lossy(&self.buf).into_owned())),
                Err(e) if e.kind() == ErrorKind::BrokenPipe => self.overruns += 1,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }
}

/// How a follow ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FollowSummary {
    pub lines: u64,
    pub events: u64,
    /// Times the ring buffer wrapped before records were read (records lost).
    pub overruns: u64,
    /// `on_event` asked to stop.
    pub stopped: bool,
}

enum Msg {
    Line(String),
    End {
        overruns: u64,
        error: Option<io::Error>,
    },
}

/// Follows the kernel log on `reader`: every line is parsed as it arrives and each finished event is passed to
/// `on_event` (return `ControlFlow::Break(())` to stop). A report that waits for more lines is finished after
/// `idle` without any. Returns at the end of the input; `/dev/kmsg` opened blocking never ends.
///
/// The reader runs on its own thread: when `on_event` stops the follow, that thread is left blocked in its
/// read until the next line or the process exits.
pub fn follow<R, F>(
    reader: R,
    idle: Duration,
    boot_unix_s: Option<f64>,
    on_event: F,
) -> Result<FollowSummary, FollowError>
where
    R: Read + Send + 'static,
    F: FnMut(Event) -> ControlFlow<()>,
{
    let (tx, rx) = mpsc::sync_channel::<Msg>(4096);
    std::thread::Builder::new()
        .name("kmsg-reader".into())
        .spawn(move || {
            let mut lines = LineReader::new(BufReader::with_capacity(16 * 1024, reader));
            let error = loop {
                match lines.next_line() {
                    Ok(Some(line)) => {
                        if tx.send(Msg::Line(line)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                }
            };
            let _ = tx.send(Msg::End {
                overruns: lines.overruns,
                error,
            });
        })
        .map_err(|source| FollowError::Read { lines: 0, source })?;
    Follower::new(Parser::with_boot_time(boot_unix_s)).run(rx, idle, on_event)
}

/// The consuming half of [`follow`]: a parser and the idle rule.
struct Follower {
    parser: Parser,
    events: Vec<Event>,
    summary: FollowSummary,
}

impl Follower {
    fn new(parser: Parser) -> Follower {
        Follower {
            parser,
            events: Vec::new(),
            summary: FollowSummary::default(),
        }
    }

    fn run<F>(
        mut self,
        rx: mpsc::Receiver<Msg>,
        idle: Duration,
        mut on_event: F,
    ) -> Result<FollowSummary, FollowError>
    where
        F: FnMut(Event) -> ControlFlow<()>,
    {
        loop {
            let msg = if self.parser.has_pending() {
                match rx.recv_timeout(idle) {
                    Ok(msg) => Some(msg),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => Some(Msg::End {
                        overruns: 0,
                        error: None,
                    }),
                }
            } else {
                Some(rx.recv().unwrap_or(Msg::End {
                    overruns: 0,
                    error: None,
                }))
            };
            match msg {
                Some(Msg::Line(line)) => {
                    self.summary.lines += 1;
                    self.parser.push_line(&line, &mut self.events);
                }
                None => self.parser.flush(&mut self.events),
                Some(Msg::End { overruns, error }) => {
                    self.summary.overruns += overruns;
                    self.parser.flush(&mut self.events);
                    if self.deliver(&mut on_event).is_break() {
                        return Ok(self.summary);
                    }
                    return match error {
                        None => Ok(self.summary),
                        Some(source) => Err(FollowError::Read {
                            lines: self.summary.lines,
                            source,
                        }),
                    };
                }
            }
            if self.deliver(&mut on_event).is_break() {
                return Ok(self.summary);
            }
        }
    }

    fn deliver<F: FnMut(Event) -> ControlFlow<()>>(&mut self, on_event: &mut F) -> ControlFlow<()> {
        for event in self.events.drain(..) {
            self.summary.events += 1;
            if on_event(event).is_break() {
                self.summary.stopped = true;
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    use super::*;

    const REPORT: &str = "\
6,10,1000000,-;INFO: task python:42 blocked for more than 120 seconds.
6,11,1000001,-;task:python state:D stack:0 pid:42 ppid:1 flags:0x00000000
6,12,1000002,-;Call trace:
6,13,1000003,-; schedule+0x1/0x2
6,14,1000004,-; nfs_file_write+0x1/0x2 [nfs]
";

    #[test]
    fn events_of_a_finite_reader() {
        let text = format!("{REPORT}6,15,2000000,-;nfs: server a OK\n");
        let mut seen = Vec::new();
        let summary = follow(
            io::Cursor::new(text.into_bytes()),
            DEFAULT_IDLE,
            None,
            |e| {
                seen.push(e);
                ControlFlow::Continue(())
            },
        )
        .unwrap();
        assert_eq!(summary.lines, 6);
        assert_eq!(summary.events, 2);
        assert!(matches!(&seen[0], Event::HungTask(r) if r.pid == 42));
        assert!(matches!(&seen[1], Event::FsComplaint(_)));
    }

    #[test]
    fn an_open_report_is_finished_after_the_idle_interval() {
        let (mut writer, reader) = UnixStream::pair().unwrap();
        writer.write_all(REPORT.as_bytes()).unwrap();
        let start = Instant::now();
        let mut elapsed = None;
        let summary = follow(reader, Duration::from_millis(100), None, |e| {
            assert!(matches!(e, Event::HungTask(_)));
            elapsed = Some(start.elapsed());
            ControlFlow::Break(())
        })
        .unwrap();
        assert!(summary.stopped);
        let elapsed = elapsed.unwrap();
        assert!(
            elapsed < Duration::from_secs(5),
            "report delivered while the writer stays open: {elapsed:?}"
        );
        drop(writer);
    }

    #[test]
    fn overwritten_records_are_skipped_and_counted() {
        struct Flaky(u32);
        impl Read for Flaky {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.0 += 1;
                match self.0 {
                    1 => Err(io::Error::from(ErrorKind::BrokenPipe)),
                    2 => {
                        let line = b"6,1,1,-;nfs: server a OK\n";
                        buf[..line.len()].copy_from_slice(line);
                        Ok(line.len())
                    }
                    _ => Err(io::Error::from(ErrorKind::WouldBlock)),
                }
            }
        }
        let mut lines = LineReader::new(BufReader::new(Flaky(0)));
        assert_eq!(
            lines.next_line().unwrap().as_deref(),
            Some("6,1,1,-;nfs: server a OK\n")
        );
        assert_eq!(lines.next_line().unwrap(), None);
        assert_eq!(lines.overruns, 1);
    }

    #[test]
    fn permission_denied_says_what_to_do() {
        let err = FollowError::PermissionDenied {
            path: PathBuf::from(DEV_KMSG),
        };
        let text = err.to_string();
        assert!(
            text.contains("dmesg_restrict=0") && text.contains("dmesg | hangwatch kmsg -"),
            "{text}"
        );
    }

    #[test]
    fn boot_time_from_proc_uptime() {
        assert_eq!(
            boot_time_from_uptime("350735.47 234388.90\n", 1_000_000.0),
            Some(1_000_000.0 - 350735.47)
        );
        assert_eq!(boot_time_from_uptime("garbage", 1.0), None);
    }
}
