//! The job's log file for `run`: a [`LogSink`] (writes in an abandonable child, memory then node-local spill,
//! ordered replay) behind the agent's [`LineSink`], and the closing report of what could not be delivered.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hangwatch_agent::output::LineSink;
use hangwatch_logsink::{LinePusher, LogSink, LogSinkOptions, OpenError, Rotation, WriterCommand};

/// The open log destination.
pub struct LogHandle {
    sink: LogSink,
}

struct Pusher(LinePusher);

impl LineSink for Pusher {
    fn push(&self, line: Vec<u8>) {
        self.0.push_owned(line);
    }
}

/// Opens `dest` for the job's output, rotated by size when `rotation` is set; spill files and undelivered lines go
/// under `report_dir` (node-local, made private by `run`). `private`: `dest` is hangwatch's own `output.log` in the
/// report directory (created 0600, a symlink there refused), not a `--log-file` the user named.
pub fn open(
    dest: &Path,
    report_dir: &Path,
    private: bool,
    rotation: Option<Rotation>,
) -> anyhow::Result<LogHandle> {
    let options = LogSinkOptions {
        spill_dir: report_dir.to_path_buf(),
        undelivered_path: report_dir.join("log-undelivered.txt"),
        writer: writer_command(),
        private_dest: private,
        rotation,
        ..LogSinkOptions::default()
    };
    let hint = if private {
        "(the report directory must be yours and hold no symlink named output.log)"
    } else {
        "(check --log-file: its directory must exist and be writable)"
    };
    match LogSink::open(dest, options) {
        Ok(sink) => Ok(LogHandle { sink }),
        Err(e @ OpenError::Destination { .. }) => Err(crate::usage(format!("{e} {hint}"))),
        Err(e) => Err(anyhow::Error::new(e)),
    }
}

/// The log writer is this binary, started the way every child of hangwatch is (see
/// [`hangwatch_child::self_exe`]: from memory when the binary lives on a remote filesystem).
pub fn writer_command() -> Option<WriterCommand> {
    hangwatch_child::self_exe()
        .ok()
        .map(WriterCommand::hangwatch)
}

impl LogHandle {
    pub fn line_sink(&self) -> Arc<dyn LineSink> {
        Arc::new(Pusher(self.sink.pusher()))
    }

    /// Waits up to `deadline` for every line to reach the destination; says where the rest went.
    pub fn finish(self, deadline: Duration) {
        let destination = self.sink.destination().to_path_buf();
        let report = self.sink.finish(deadline);
        match report.message() {
            Some(message) => eprintln!("hangwatch: {message}"),
            None => {
                tracing::debug!(lines = report.written_lines, dest = %destination.display(), "log complete")
            }
        }
    }
}
