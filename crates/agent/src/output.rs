//! Draining the ranks' stdout and stderr: every line is read at once (so a rank never blocks on a full pipe),
//! kept in a per-rank tail for the evidence, handed to the log sink, mirrored to the console without blocking,
//! and recorded as progress on the [`ProgressBoard`]. A carriage return counts as progress too (a tqdm bar
//! redraws itself with `\r` and may print no `\n` for minutes); lines are still split on `\n` only, so the log
//! file's bytes are the job's.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hangwatch_diagnosis::ProgressSource;

use crate::progress::ProgressBoard;

/// The least time between two progress units from one stream.
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
    /// Streams of each rank not yet at EOF: a dead rank's last lines are all in once its count is zero.
    open: Mutex<std::collections::BTreeMap<String, usize>>,
    keep: usize,
}

impl Tails {
    pub fn new(keep: usize) -> Self {
        Self {
            per_rank: Mutex::default(),
            open: Mutex::default(),
            keep,
        }
    }

    /// The label a rank's lines are kept under (`rank-3`; `job` for output of no known rank).
    pub fn label(rank: Option<u32>) -> String {
        rank.map(|r| format!("rank-{r}"))
            .unwrap_or_else(|| "job".into())
    }

    /// A copy of one rank's tail.
    pub fn lines_of(&self, label: &str) -> Vec<String> {
        self.per_rank
            .lock()
            .map(|m| m.get(label).map(|t| t.iter().cloned().collect()))
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Whether a stream of this rank is still being read.
    pub fn streams_open(&self, label: &str) -> bool {
        self.open
            .lock()
            .map(|m| m.get(label).is_some_and(|n| *n > 0))
            .unwrap_or(false)
    }

    fn stream_opened(&self, label: &str) {
        if let Ok(mut m) = self.open.lock() {
            *m.entry(label.to_string()).or_default() += 1;
        }
    }

    fn stream_closed(&self, label: &str) {
        if let Ok(mut m) = self.open.lock() {
            if let Some(n) = m.get_mut(label) {
                *n = n.saturating_sub(1);
            }
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
    pub board: Arc<ProgressBoard>,
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
    let label = Tails::label(rank);
    ctx.tails.stream_opened(&label);
    let tails = Arc::clone(&ctx.tails);
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let _closed = StreamClosed(Arc::clone(&ctx.open_streams));
        let _closed_for_rank = RankStreamClosed(Arc::clone(&ctx.tails), label.clone());
        let mut reader = BufReader::with_capacity(64 * 1024, reader);
        let mut buf = Vec::with_capacity(256);
        let mut last_reported: Option<Instant> = None;
        let mut progress = |ctx: &DrainContext| {
            // 4 Hz per stream is plenty for stall detection, and keeps the intervals the detector learns from
            // output what they were.
            let now = Instant::now();
            if last_reported.is_none_or(|t| now.duration_since(t) >= PROGRESS_EVERY) {
                last_reported = Some(now);
                ctx.board.record(rank, ProgressSource::Output, now, None);
            }
        };
        loop {
            buf.clear();
            match read_line(&mut reader, &mut buf, MAX_LINE, || progress(&ctx)) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            if buf.last() != Some(&b'\n') {
                buf.push(b'\n');
            }
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
            progress(&ctx);
        }
    });
    if let Err(e) = spawned {
        open_streams.fetch_sub(1, Ordering::SeqCst);
        tails.stream_closed(&Tails::label(rank));
        tracing::error!(error = %e, "cannot start a thread to drain a rank's output");
    }
}

/// Reads one line (through `\n`, or `max` bytes, or to EOF) into `buf`, calling `on_carriage_return` whenever a
/// read brings a `\r` before the line is complete. Returns the bytes read (0 at EOF).
fn read_line<R: BufRead>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
    mut on_carriage_return: impl FnMut(),
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(total);
        }
        let room = max - total;
        let window = &available[..available.len().min(room)];
        let (take, done) = match window.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (window.len(), window.len() == room),
        };
        buf.extend_from_slice(&window[..take]);
        if !done && window[..take].contains(&b'\r') {
            on_carriage_return();
        }
        reader.consume(take);
        total += take;
        if done {
            return Ok(total);
        }
    }
}

/// Counts a stream as closed when its drain thread ends, however it ends.
struct StreamClosed(Arc<AtomicU64>);

impl Drop for StreamClosed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts a rank's stream as closed in its [`Tails`] when its drain thread ends.
struct RankStreamClosed(Arc<Tails>, String);

impl Drop for RankStreamClosed {
    fn drop(&mut self) {
        self.0.stream_closed(&self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> (Vec<Vec<u8>>, usize) {
        let mut reader = BufReader::with_capacity(7, input);
        let mut out = Vec::new();
        let mut returns = 0;
        loop {
            let mut buf = Vec::new();
            let n = read_line(&mut reader, &mut buf, max, || returns += 1).unwrap();
            if n == 0 {
                return (out, returns);
            }
            out.push(buf);
        }
    }

    #[test]
    fn lines_keep_their_bytes_and_carriage_returns_are_progress() {
        let input = b"epoch 1\n 10%|#  \r 20%|##  \r 30%|### \r100%|####\nend";
        let (got, returns) = lines(input, 1 << 20);
        assert_eq!(got.concat(), input.to_vec(), "bytes as they were");
        assert_eq!(
            got,
            vec![
                b"epoch 1\n".to_vec(),
                b" 10%|#  \r 20%|##  \r 30%|### \r100%|####\n".to_vec(),
                b"end".to_vec()
            ]
        );
        assert!(
            returns >= 2,
            "the bar's redraws were seen before its line ended: {returns}"
        );
    }

    #[test]
    fn a_line_longer_than_the_limit_is_cut() {
        let (got, _) = lines(b"abcdefghij\nk", 4);
        assert_eq!(
            got,
            vec![
                b"abcd".to_vec(),
                b"efgh".to_vec(),
                b"ij\n".to_vec(),
                b"k".to_vec()
            ]
        );
    }
}
