//! hangwatch's own messages to people (stderr) and its one JSON document (stdout), written so that the caller never
//! waits: a bounded queue drained by one writer thread per stream, which alone may block.
//!
//! Why: stderr is often a pipe nobody reads any more (`| tee` onto a frozen mount, an ssh session that stalled), and
//! `eprintln!` then blocks the thread that decides, or panics on EPIPE. Here a message that does not fit the queue
//! is dropped and counted, and the exit waits for the writer only up to a deadline.

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Messages held for a writer that cannot keep up; more are dropped (and counted).
const QUEUE: usize = 1024;

/// Which of hangwatch's own streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One stream's queue and its writer thread.
#[derive(Debug)]
struct Writer {
    tx: SyncSender<Vec<u8>>,
    dropped: AtomicU64,
    /// Messages queued and not yet written (or failed).
    pending: Arc<AtomicUsize>,
}

impl Writer {
    fn start(stream: Stream) -> Option<Self> {
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE);
        let pending = Arc::new(AtomicUsize::new(0));
        let theirs = Arc::clone(&pending);
        std::thread::Builder::new()
            .name(match stream {
                Stream::Stdout => "hw-stdout".into(),
                Stream::Stderr => "hw-stderr".into(),
            })
            .spawn(move || write_loop(stream, &rx, &theirs))
            .ok()?;
        Some(Self {
            tx,
            dropped: AtomicU64::new(0),
            pending,
        })
    }

    fn push(&self, bytes: Vec<u8>) -> bool {
        self.pending.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send(bytes) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.pending.fetch_sub(1, Ordering::SeqCst);
                self.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }
}

fn write_loop(stream: Stream, rx: &Receiver<Vec<u8>>, pending: &AtomicUsize) {
    let mut out: Box<dyn Write> = match stream {
        Stream::Stdout => Box::new(std::io::stdout()),
        Stream::Stderr => Box::new(std::io::stderr()),
    };
    for bytes in rx {
        // A failed write (EPIPE: the reader went away) loses this message and nothing else.
        let _ = out.write_all(&bytes).and_then(|()| out.flush());
        pending.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The process-wide writers, started on first use.
fn writer(stream: Stream) -> Option<&'static Writer> {
    static STDOUT: OnceLock<Option<Writer>> = OnceLock::new();
    static STDERR: OnceLock<Option<Writer>> = OnceLock::new();
    match stream {
        Stream::Stdout => STDOUT.get_or_init(|| Writer::start(Stream::Stdout)),
        Stream::Stderr => STDERR.get_or_init(|| Writer::start(Stream::Stderr)),
    }
    .as_ref()
}

/// Queues `text` for stderr, adding a newline if it has none. Never blocks; `false` when it was dropped.
pub fn say(text: impl Into<String>) -> bool {
    let mut text = printable(text.into());
    if !text.ends_with('\n') {
        text.push('\n');
    }
    write(Stream::Stderr, text.into_bytes())
}

/// `text` with every control character but newline and tab written out (`\u{1b}`): hangwatch's messages quote
/// what jobs chose (paths, file names, frames), and an escape sequence in one must not drive the reader's terminal
/// (retitle it, hide lines, fake a prompt). The job's own output is relayed as it is; only hangwatch's words pass
/// here.
pub fn printable(text: String) -> String {
    if !text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Queues raw bytes for one of hangwatch's streams. Never blocks; `false` when they were dropped.
pub fn write(stream: Stream, bytes: Vec<u8>) -> bool {
    match writer(stream) {
        Some(w) => w.push(bytes),
        None => false,
    }
}

/// Why a JSON document did not reach stdout.
#[derive(Debug, thiserror::Error)]
pub enum PrintJsonError {
    #[error("cannot encode the JSON document: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("stdout is not being read: the JSON document was dropped")]
    NotRead,
}

/// Prints one JSON document (pretty, one trailing newline) on stdout through the never-blocking writer; the
/// process's exit waits for it, bounded.
pub fn print_json<T: serde::Serialize>(value: &T) -> Result<(), PrintJsonError> {
    let mut doc = serde_json::to_vec_pretty(value)?;
    doc.push(b'\n');
    if !write(Stream::Stdout, doc) {
        return Err(PrintJsonError::NotRead);
    }
    Ok(())
}

/// Messages dropped so far on `stream` because its reader did not keep up.
pub fn dropped(stream: Stream) -> u64 {
    writer(stream).map_or(0, |w| w.dropped.load(Ordering::Relaxed))
}

/// Waits until everything queued on both streams is written, or `deadline` has passed. `true` when all was written.
pub fn flush(deadline: Duration) -> bool {
    let until = Instant::now() + deadline;
    loop {
        let pending: usize = [Stream::Stdout, Stream::Stderr]
            .into_iter()
            .filter_map(writer)
            .map(|w| w.pending.load(Ordering::SeqCst))
            .sum();
        if pending == 0 {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A `tracing` writer that goes through the stderr queue (one event, one message).
#[derive(Debug, Default, Clone, Copy)]
pub struct LogWriter;

/// One log event being formatted; queued when dropped.
#[derive(Debug, Default)]
pub struct LogEvent(Vec<u8>);

impl Write for LogEvent {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogEvent {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            write(Stream::Stderr, std::mem::take(&mut self.0));
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogEvent;

    fn make_writer(&'a self) -> Self::Writer {
        LogEvent::default()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_escape_sequence_in_a_job_path_reaches_the_terminal_as_text() {
        let path = "rank 0 in write() on /data/\u{1b}]0;pwned\u{7}\u{1b}[2Jlog.txt\tx\n";
        let shown = printable(path.to_string());
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\u{7}'),
            "{shown:?}"
        );
        assert!(shown.contains("\\u{1b}]0;pwned"), "{shown:?}");
        assert!(
            shown.ends_with("log.txt\tx\n"),
            "newline and tab stay: {shown:?}"
        );
        assert_eq!(printable("plain".into()), "plain");
    }

    use super::*;

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let (tx, _rx) = sync_channel::<Vec<u8>>(2);
        let w = Writer {
            tx,
            dropped: AtomicU64::new(0),
            pending: Arc::new(AtomicUsize::new(0)),
        };
        let started = Instant::now();
        let accepted = (0..10).filter(|_| w.push(b"x\n".to_vec())).count();
        assert_eq!(accepted, 2);
        assert_eq!(w.dropped.load(Ordering::Relaxed), 8);
        assert_eq!(w.pending.load(Ordering::SeqCst), 2);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
