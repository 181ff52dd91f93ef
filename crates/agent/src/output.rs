//! Draining the ranks' stdout and stderr: every line is read at once (so a rank never blocks on a full pipe),
//! kept in a per-rank tail for the evidence, handed to the log sink, mirrored to the console without blocking,
//! and reported to the supervisor as progress.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::supervise::Event;

/// The least time between two progress events from one stream.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Lines longer than this are cut into pieces (a binary blob without newlines must not grow memory unbounded).
const MAX_LINE: usize = 1 << 20;

/// Which stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Where finished lines go besides the console: the log file writer (it must never block).
pub trait LineSink: Send + Sync {
    fn push(&self, line: Vec<u8>);
}

/// The last lines of each rank, for the evidence bundle.
#[derive(Debug, Default)]
pub struct Tails {
    per_rank: Mutex<std::collections::BTreeMap<String, VecDeque<String>>>,
    keep: usize,
}

impl Tails {
    pub fn new(keep: usize) -> Self {
        Self {
            per_rank: Mutex::default(),
            keep,
        }
    }

    fn push(&self, who: &str, line: &str) {
        if let Ok(mut map) = self.per_rank.lock() {
            let tail = map.entry(who.to_string()).or_default();
            if tail.len() >= self.keep {
                tail.pop_front();
            }
            tail.push_back(line.to_string());
        }
    }

    /// A copy of every tail, by rank label (`rank-0`, `job`).
    pub fn snapshot(&self) -> Vec<(String, Vec<String>)> {
        self.per_rank
            .lock()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.iter().cloned().collect()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Mirrors lines to hangwatch's own stdout/stderr from one thread; when the console cannot keep up, lines are
/// dropped (and counted) here rather than blocking a rank. The log file keeps every line.
#[derive(Debug, Clone)]
pub struct Console {
    tx: SyncSender<(Stream, Vec<u8>)>,
    dropped: Arc<AtomicU64>,
}

impl Console {
    /// `stdout_to_stderr`: with `--json`, stdout carries only the JSON document.
    pub fn start(stdout_to_stderr: bool) -> Self {
        let (tx, rx) = sync_channel::<(Stream, Vec<u8>)>(16_384);
        let dropped = Arc::new(AtomicU64::new(0));
        std::thread::Builder::new()
            .name("hw-console".into())
            .spawn(move || console_loop(rx, stdout_to_stderr))
            .ok();
        Self { tx, dropped }
    }

    pub fn write(&self, stream: Stream, line: Vec<u8>) {
        match self.tx.try_send((stream, line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

fn console_loop(rx: Receiver<(Stream, Vec<u8>)>, stdout_to_stderr: bool) {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    while let Ok((stream, line)) = rx.recv() {
        let result = if stream == Stream::Stdout && !stdout_to_stderr {
            let mut out = stdout.lock();
            out.write_all(&line).and_then(|_| out.flush())
        } else {
            let mut err = stderr.lock();
            err.write_all(&line).and_then(|_| err.flush())
        };
        if result.is_err() {
            // A closed console must not stop the drain threads; the log file still has everything.
            continue;
        }
    }
}

/// Everything a drain thread needs.
#[derive(Clone)]
pub struct DrainContext {
    pub events: std::sync::mpsc::Sender<Event>,
    pub sink: Option<Arc<dyn LineSink>>,
    pub console: Option<Console>,
    pub tails: Arc<Tails>,
    /// Prefix each line with `[rank N] ` (like torchrun's `--tee` with rank labels).
    pub prefix: bool,
    /// Streams not yet at EOF, so that the end of the job waits for its last lines.
    pub open_streams: Arc<AtomicU64>,
}

/// Starts a thread that drains one stream until EOF.
pub fn drain<R: Read + Send + 'static>(
    reader: R,
    rank: Option<u32>,
    stream: Stream,
    ctx: DrainContext,
) {
    let name = format!(
        "hw-drain-{}",
        rank.map(|r| r.to_string()).unwrap_or_else(|| "job".into())
    );
    let open_streams = Arc::clone(&ctx.open_streams);
    open_streams.fetch_add(1, Ordering::SeqCst);
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let _closed = StreamClosed(Arc::clone(&ctx.open_streams));
        let label = rank
            .map(|r| format!("rank-{r}"))
            .unwrap_or_else(|| "job".into());
        let mut reader = BufReader::with_capacity(64 * 1024, reader);
        let mut buf = Vec::with_capacity(256);
        let mut last_reported: Option<Instant> = None;
        loop {
            buf.clear();
            let n = match (&mut reader)
                .take(MAX_LINE as u64)
                .read_until(b'\n', &mut buf)
            {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            if buf.last() != Some(&b'\n') {
                buf.push(b'\n');
            }
            let _ = n;
            let text = String::from_utf8_lossy(&buf[..buf.len() - 1]).into_owned();
            ctx.tails.push(&label, &text);
            let line = match (ctx.prefix, rank) {
                (true, Some(r)) => {
                    let mut l = format!("[rank {r}] ").into_bytes();
                    l.extend_from_slice(&buf);
                    l
                }
                _ => buf.clone(),
            };
            if let Some(console) = &ctx.console {
                console.write(stream, line.clone());
            }
            if let Some(sink) = &ctx.sink {
                sink.push(line);
            }
            // Progress at 4 Hz per stream is plenty for stall detection; one event per line would wake the
            // supervisor for every line of a chatty job.
            let now = Instant::now();
            if last_reported.is_none_or(|t| now.duration_since(t) >= PROGRESS_EVERY) {
                last_reported = Some(now);
                if ctx.events.send(Event::Output { rank, at: now }).is_err() {
                    break;
                }
            }
        }
    });
    if let Err(e) = spawned {
        open_streams.fetch_sub(1, Ordering::SeqCst);
        tracing::error!(error = %e, "cannot start a thread to drain a rank's output");
    }
}

/// Counts a stream as closed when its drain thread ends, however it ends.
struct StreamClosed(Arc<AtomicU64>);

impl Drop for StreamClosed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
