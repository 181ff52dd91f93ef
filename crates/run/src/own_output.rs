//! hangwatch's own stdout and stderr when they are files: under Slurm a batch script's output is a file, often on
//! the very shared filesystem that freezes. A `write()` of ours there would put hangwatch in D state — the
//! incident, repeated by the tool meant to catch it. So when fd 1 or 2 is a regular file, it is replaced by a pipe
//! that a thread drains into a [`LogSink`], whose writer child (abandonable) writes to the file.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use hangwatch_logsink::{LogSink, LogSinkOptions};
use nix::sys::stat::{fstat, SFlag};

/// One redirected stream.
struct Redirected {
    fd: i32,
    sink: LogSink,
    reader: std::thread::JoinHandle<()>,
}

/// Restores nothing (the file may be frozen): on [`OwnOutput::finish`] the streams point at /dev/null and what
/// was written is delivered or saved in the report directory.
pub struct OwnOutput {
    streams: Vec<Redirected>,
}

/// A failed fstat means "not a file we need to protect".
fn is_regular_file(fd: i32) -> bool {
    fstat(fd)
        .map(|st| SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG)
        .unwrap_or(false)
}

/// Protects fd 1 and 2 when they are regular files. `report_dir` (node-local) receives lines that could not be
/// delivered. Returns `None` when neither needs it (a terminal, a pipe) or protection could not be set up.
pub fn protect(report_dir: &Path) -> Option<OwnOutput> {
    let mut streams = Vec::new();
    for fd in [1, 2] {
        if !is_regular_file(fd) {
            continue;
        }
        let name = if fd == 1 { "stdout" } else { "stderr" };
        let dest = std::path::PathBuf::from(format!("/proc/{}/fd/{fd}", std::process::id()));
        let options = LogSinkOptions {
            spill_dir: report_dir.to_path_buf(),
            undelivered_path: report_dir.join(format!("hangwatch-{name}-undelivered.txt")),
            writer: crate::log_sink::writer_command(),
            ..LogSinkOptions::default()
        };
        let sink = match LogSink::open(&dest, options) {
            Ok(sink) => sink,
            Err(e) => {
                tracing::warn!(fd, error = %e, "cannot protect hangwatch's own output");
                continue;
            }
        };
        // Close-on-exec: the ranks and every other child must not inherit the read end (dup2 clears the flag
        // on fd 1/2, which children are meant to share).
        let Ok((read_end, write_end)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) else {
            continue;
        };
        if nix::unistd::dup2(write_end.as_raw_fd(), fd).is_err() {
            continue;
        }
        drop(write_end);
        let pusher = sink.pusher();
        let reader = std::thread::Builder::new()
            .name(format!("hw-own-{name}"))
            .spawn(move || {
                let mut pipe = std::fs::File::from(read_end);
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => pusher.push(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => return,
                    }
                }
            });
        match reader {
            Ok(reader) => streams.push(Redirected { fd, sink, reader }),
            Err(e) => {
                tracing::warn!(fd, error = %e, "cannot start the reader of hangwatch's own output")
            }
        }
    }
    (!streams.is_empty()).then_some(OwnOutput { streams })
}

impl OwnOutput {
    /// Points fd 1/2 at /dev/null (ending the pipes), then delivers what was written within `deadline` (both streams
    /// together); the rest
    /// is saved in the report directory.
    pub fn finish(self, deadline: Duration) {
        let until = std::time::Instant::now() + deadline;
        let devnull = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .map(OwnedFd::from);
        for stream in self.streams {
            if let Ok(null) = &devnull {
                let _ = nix::unistd::dup2(null.as_raw_fd(), stream.fd);
            }
            // The pipe ends only when every writer is gone, and a child (an alert command, a restarted log
            // writer) may still hold it: wait for the reader within the deadline, not for EOF.
            while !stream.reader.is_finished() && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            let left = until.saturating_duration_since(std::time::Instant::now());
            let _ = stream.sink.finish(left.max(Duration::from_millis(100)));
        }
    }
}
