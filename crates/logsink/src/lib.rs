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
