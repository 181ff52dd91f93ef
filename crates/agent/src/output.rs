//! Draining the ranks' stdout and stderr, all from one thread: every line is read within `LINGER` (so a rank
//! does not block on a full pipe), kept in a per-rank tail for the evidence, handed to the log sink, mirrored to
//! the console without blocking, and recorded as progress on the [`ProgressBoard`]. A carriage return counts as
//! progress too (a tqdm bar redraws itself with `\r` and may print no `\n` for minutes); lines are still split on
//! `\n` only, so the log file's bytes are the job's.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hangwatch_diagnosis::ProgressSource;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

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
            // Looked up before inserting: a line must not cost an allocation for the key.
            let tail = match map.get_mut(who) {
                Some(tail) => tail,
                None => map.entry(who.to_string()).or_default(),
            };
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

/// How long the drain thread waits after a wake that read less than a full buffer, so that the lines of many ranks
/// are taken in one wake: at 64 ranks printing 20 lines/s, one wake per line cost three times what everything else
/// the agent does costs (bench/agent.py). A pipe holds 64 KiB, so a rank writes on without blocking meanwhile
/// unless it writes more than that within the pause (over 1.3 MB/s); a read that fills the buffer skips the pause.
const LINGER: std::time::Duration = std::time::Duration::from_millis(50);

/// The bytes one read may take from one stream.
const READ_SIZE: usize = 64 * 1024;

/// Drains every rank's stdout and stderr from one thread (epoll over the pipes' read ends) until each is at EOF.
/// Streams are added with [`Drains::drain`]; the thread ends when the handle is dropped and every stream has ended.
pub struct Drains {
    epoll: Arc<Epoll>,
    tx: std::sync::mpsc::Sender<Drained>,
    next_token: u64,
    ctx: DrainContext,
}

impl Drains {
    /// Starts the drain thread. Fails only when the kernel gives no epoll instance or no thread: then no rank can
    /// be started (its pipe would fill and block it).
    pub fn start(ctx: DrainContext) -> std::io::Result<Self> {
        let epoll =
            Arc::new(Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(std::io::Error::from)?);
        let (tx, rx) = std::sync::mpsc::channel();
        let thread_epoll = Arc::clone(&epoll);
        let thread_ctx = ctx.clone();
        std::thread::Builder::new()
            .name("hw-drain".into())
            .spawn(move || drain_loop(&thread_epoll, &rx, &thread_ctx))?;
        Ok(Self {
            epoll,
            tx,
            next_token: 0,
            ctx,
        })
    }

    /// Drains `stream` of `rank` (a pipe's read end) until EOF.
    pub fn drain(&mut self, fd: impl Into<OwnedFd>, rank: Option<u32>, stream: Stream) {
        let file = std::fs::File::from(fd.into());
        let label = Tails::label(rank);
        self.ctx.open_streams.fetch_add(1, Ordering::SeqCst);
        self.ctx.tails.stream_opened(&label);
        let token = self.next_token;
        self.next_token += 1;
        let state = Drained {
            token,
            rank,
            stream,
            lines: Lines::new(MAX_LINE),
            last_reported: None,
            _closed: StreamClosed(Arc::clone(&self.ctx.open_streams)),
            _closed_for_rank: RankStreamClosed(Arc::clone(&self.ctx.tails), label.clone()),
            label,
            file,
        };
        // Non-blocking, so that one read never waits: the thread reads what epoll said is there.
        let registered = fcntl(state.file.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
            .and_then(|_| {
                self.epoll
                    .add(&state.file, EpollEvent::new(EpollFlags::EPOLLIN, token))
            });
        if let Err(e) = registered {
            // Dropping the state counts the stream closed; the rank gets EPIPE on writing, not a full pipe.
            tracing::error!(error = %e, "cannot watch a rank's output stream; its output is lost");
            return;
        }
        // Added before it is sent: the thread waits for a token it has not seen yet (see `drain_loop`).
        if self.tx.send(state).is_err() {
            tracing::error!("the drain thread has ended; a rank's output is lost");
        }
    }
}

/// One stream being drained, with what it has read of a line not yet complete.
struct Drained {
    token: u64,
    rank: Option<u32>,
    stream: Stream,
    label: String,
    file: std::fs::File,
    lines: Lines,
    last_reported: Option<Instant>,
    _closed: StreamClosed,
    _closed_for_rank: RankStreamClosed,
}

impl Drained {
    /// Records progress at most every [`PROGRESS_EVERY`] (4 Hz per stream is plenty for stall detection, and keeps
    /// the intervals the detector learns from output what they were).
    fn progress(&mut self, ctx: &DrainContext, now: Instant) {
        if self
            .last_reported
            .is_none_or(|t| now.duration_since(t) >= PROGRESS_EVERY)
        {
            self.last_reported = Some(now);
            ctx.board
                .record(self.rank, ProgressSource::Output, now, None);
        }
    }

    fn take(&mut self, chunk: &[u8], ctx: &DrainContext) {
        let mut complete = Vec::new();
        let carriage_return = self.lines.feed(chunk, |line| complete.push(line));
        let now = Instant::now();
        for line in complete {
            self.deliver(line, ctx);
            self.progress(ctx, now);
        }
        if carriage_return {
            self.progress(ctx, now);
        }
    }

    fn finish(&mut self, ctx: &DrainContext) {
        if let Some(line) = self.lines.finish() {
            self.deliver(line, ctx);
            self.progress(ctx, Instant::now());
        }
    }

    /// Hands one line (its bytes as the job wrote them; `\n` added to a cut or last line) to the tail, the
    /// console and the log sink.
    fn deliver(&self, mut line: Vec<u8>, ctx: &DrainContext) {
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        ctx.tails.push(
            &self.label,
            &String::from_utf8_lossy(&line[..line.len() - 1]),
        );
        let line = match (ctx.prefix, self.rank) {
            (true, Some(r)) => {
                let mut l = format!("[rank {r}] ").into_bytes();
                l.extend_from_slice(&line);
                l
            }
            _ => line,
        };
        match (&ctx.console, &ctx.sink) {
            (Some(console), Some(sink)) => {
                console.write(self.stream, line.clone());
                sink.push(line);
            }
            (Some(console), None) => console.write(self.stream, line),
            (None, Some(sink)) => sink.push(line),
            (None, None) => {}
        }
    }
}

fn drain_loop(epoll: &Epoll, rx: &std::sync::mpsc::Receiver<Drained>, ctx: &DrainContext) {
    let mut streams: std::collections::HashMap<u64, Drained> = std::collections::HashMap::new();
    let mut adding = true;
    let mut buf = vec![0u8; READ_SIZE];
    let mut events = vec![EpollEvent::empty(); 128];
    loop {
        loop {
            match rx.try_recv() {
                Ok(s) => {
                    streams.insert(s.token, s);
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    adding = false;
                    break;
                }
            }
        }
        if streams.is_empty() && !adding {
            return;
        }
        // The timeout only notices a dropped handle while no stream is open.
        let ready = match epoll.wait(&mut events, EpollTimeout::from(1000u16)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::error!(error = %e, "waiting for the ranks' output failed; output is no longer drained");
                return;
            }
        };
        let mut filled = false;
        for event in &events[..ready] {
            let token = event.data();
            // A stream is added to epoll before it is sent here, so its first event can come first.
            while !streams.contains_key(&token) {
                match rx.recv() {
                    Ok(s) => {
                        streams.insert(s.token, s);
                    }
                    Err(_) => break,
                }
            }
            let Some(stream) = streams.get_mut(&token) else {
                continue;
            };
            let ended = match (&stream.file).read(&mut buf) {
                Ok(0) => true,
                Ok(n) => {
                    filled |= n == buf.len();
                    stream.take(&buf[..n], ctx);
                    false
                }
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ),
            };
            if ended {
                if let Some(mut stream) = streams.remove(&token) {
                    stream.finish(ctx);
                    // Closing the file takes it out of epoll too; deleting first says so plainly.
                    let _ = epoll.delete(&stream.file);
                }
            }
        }
        if ready > 0 && !filled {
            std::thread::sleep(LINGER);
        }
    }
}

/// Cuts a stream's bytes into lines as they arrive: through each `\n`, or [`MAX_LINE`] bytes of a line without
/// one, or what is left at EOF. The bytes are the job's, unchanged.
#[derive(Debug)]
struct Lines {
    partial: Vec<u8>,
    max: usize,
}

impl Lines {
    fn new(max: usize) -> Self {
        Self {
            partial: Vec::new(),
            max,
        }
    }

    /// Takes `chunk`, hands each completed line to `line`, and says whether a `\r` arrived in the line still
    /// incomplete (a progress bar redrawing itself).
    fn feed(&mut self, mut chunk: &[u8], mut line: impl FnMut(Vec<u8>)) -> bool {
        let mut carriage_return = false;
        while !chunk.is_empty() {
            let room = self.max - self.partial.len();
            let window = &chunk[..chunk.len().min(room)];
            let (take, done) = match window.iter().position(|b| *b == b'\n') {
                Some(i) => (i + 1, true),
                None => (window.len(), window.len() == room),
            };
            self.partial.extend_from_slice(&window[..take]);
            chunk = &chunk[take..];
            if done {
                line(std::mem::take(&mut self.partial));
                carriage_return = false;
            } else {
                carriage_return |= window[..take].contains(&b'\r');
            }
        }
        carriage_return
    }

    /// What is left at EOF, as the last line.
    fn finish(&mut self) -> Option<Vec<u8>> {
        (!self.partial.is_empty()).then(|| std::mem::take(&mut self.partial))
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

    /// Feeds `input` in chunks of `chunk` bytes; the lines and how many feeds saw a carriage return.
    fn lines(input: &[u8], max: usize, chunk: usize) -> (Vec<Vec<u8>>, usize) {
        let mut split = Lines::new(max);
        let mut out = Vec::new();
        let mut returns = 0;
        for piece in input.chunks(chunk) {
            if split.feed(piece, |l| out.push(l)) {
                returns += 1;
            }
        }
        out.extend(split.finish());
        (out, returns)
    }

    #[test]
    fn lines_keep_their_bytes_and_carriage_returns_are_progress() {
        let input = b"epoch 1\n 10%|#  \r 20%|##  \r 30%|### \r100%|####\nend";
        let (got, returns) = lines(input, 1 << 20, 7);
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
        // One read with the whole bar and its end: the line itself is the progress.
        let (got, returns) = lines(input, 1 << 20, input.len());
        assert_eq!(got.len(), 3);
        assert_eq!(returns, 0);
    }

    #[test]
    fn a_line_longer_than_the_limit_is_cut() {
        for chunk in [1, 3, 12] {
            let (got, _) = lines(b"abcdefghij\nk", 4, chunk);
            assert_eq!(
                got,
                vec![
                    b"abcd".to_vec(),
                    b"efgh".to_vec(),
                    b"ij\n".to_vec(),
                    b"k".to_vec()
                ],
                "chunks of {chunk}"
            );
        }
    }

    fn context() -> (DrainContext, Arc<LinesKept>) {
        let kept = Arc::new(LinesKept::default());
        let sink: Arc<dyn LineSink> = kept.clone();
        let ctx = DrainContext {
            board: Arc::new(ProgressBoard::new()),
            sink: Some(sink),
            console: None,
            tails: Arc::new(Tails::new(100)),
            prefix: true,
            open_streams: Arc::new(AtomicU64::new(0)),
        };
        (ctx, kept)
    }

    #[derive(Default)]
    struct LinesKept(Mutex<Vec<Vec<u8>>>);

    impl LineSink for LinesKept {
        fn push(&self, line: Vec<u8>) {
            self.0.lock().unwrap().push(line);
        }
    }

    #[test]
    fn many_pipes_are_drained_by_one_thread_to_their_end_in_order() {
        let (ctx, kept) = context();
        let mut drains = Drains::start(ctx.clone()).unwrap();
        let mut writers = Vec::new();
        for rank in 0..16u32 {
            let (read, write) = std::io::pipe().unwrap();
            drains.drain(read, Some(rank), Stream::Stdout);
            writers.push((rank, write));
        }
        drop(drains);
        assert_eq!(ctx.open_streams.load(Ordering::SeqCst), 16);
        // More than a pipe holds from one rank, so the drain must keep up while it writes.
        let big = std::thread::spawn({
            let (_, mut w) = writers.remove(0);
            move || {
                for i in 0..20_000 {
                    writeln!(w, "line {i} {}", "x".repeat(40)).unwrap();
                }
                write!(w, "no newline at the end").unwrap();
            }
        });
        for (rank, mut w) in writers {
            writeln!(w, "hello from {rank}").unwrap();
        }
        big.join().unwrap();
        assert!(
            hangwatch_testkit::wait_until(
                std::time::Duration::from_secs(10),
                std::time::Duration::from_millis(5),
                || ctx.open_streams.load(Ordering::SeqCst) == 0
            ),
            "every stream at its end"
        );
        let lines = kept.0.lock().unwrap().clone();
        let rank0: Vec<&Vec<u8>> = lines
            .iter()
            .filter(|l| l.starts_with(b"[rank 0] "))
            .collect();
        assert_eq!(rank0.len(), 20_001);
        assert_eq!(
            rank0[17],
            &format!("[rank 0] line 17 {}\n", "x".repeat(40)).into_bytes()
        );
        assert_eq!(rank0[20_000], &b"[rank 0] no newline at the end\n".to_vec());
        for rank in 1..16 {
            let want = format!("[rank {rank}] hello from {rank}\n").into_bytes();
            assert!(lines.contains(&want), "rank {rank}'s line");
            assert!(!ctx.tails.streams_open(&Tails::label(Some(rank))));
        }
        assert_eq!(
            ctx.tails.lines_of("rank-0").last().map(String::as_str),
            Some("no newline at the end")
        );
    }
}
