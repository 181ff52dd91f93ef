//! A log writer that never blocks the job and loses no line: lines go from any thread into memory, then to a
//! node-local spill file, and are written in order by a child process that hangwatch can abandon when the log's
//! filesystem freezes. See `docs/logging.md`.
//!
//! ```no_run
//! use std::time::Duration;
//! use hangwatch_logsink::{LogSink, LogSinkOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let sink = LogSink::open("/shared/run/log.txt".as_ref(), LogSinkOptions::default())?;
//! sink.push(b"[rank 0] step 1\n");
//! let report = sink.finish(Duration::from_secs(5));
//! if let Some(message) = report.message() {
//!     eprintln!("hangwatch: {message}");
//! }
//! # Ok(()) }
//! ```

pub mod ledger;
pub mod protocol;
pub mod rotate;
mod sink;
pub mod spill;
mod text;
pub mod writer;

pub use rotate::Rotation;
pub use spill::SpillReserve;
pub use text::{human_bytes, utc_time};

pub use sink::{
    FinishReport, LinePusher, LogSink, LogSinkOptions, NotKept, OpenError, SinkStats, Undelivered,
    WriterCommand,
};

/// How much lower than the job the log's feeder thread and writer child run (nice). After a thaw they replay
/// what was held back, as fast as they can; at the job's priority that replay took the CPU from the ranks it is
/// logging for (a rank's print p99 rose to a few hundred µs on 2 cores). Lines are never lost for it: the sink
/// holds them until they are written.
pub const NICE: i32 = 10;

/// Lowers the priority of this process (`thread: None`) or of one of its threads (Linux: nice is per thread) by
/// [`NICE`]. Best effort: a failure only costs latency.
pub fn yield_to_the_job(thread: Option<rustix::thread::Pid>) {
    let current = rustix::process::getpriority_process(thread).unwrap_or(0);
    if let Err(e) =
        rustix::process::setpriority_process(thread, current.saturating_add(NICE).min(19))
    {
        tracing::debug!(error = %e, "cannot lower the log writer's priority");
    }
}
