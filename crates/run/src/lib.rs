//! What surrounds a watched run, shared by `hangwatch run`, `coordinator`, `node` and `demo`: where a run's files
//! go on a node (`dirs`), the wait for the storage that hung the attempt before (`storage_wait`), the requeue
//! (`requeue`), and the coordinator's events said, alerted, counted and kept (`job_events`). The agent's loop
//! (`hangwatch_agent`) decides; this crate is the I/O around one run that is not the loop's.

pub mod alerts;
pub mod attempt;
pub mod coordinator;
pub mod demo;
pub mod dirs;
pub mod doctor;
pub mod dump;
pub mod job_events;
pub mod log_sink;
pub mod metrics;
pub mod own_output;
pub mod requeue;
pub mod secret;
pub mod storage_wait;

/// An error in what the user asked for, ending the process with exit code 2 (`hangwatch_model::exit`).
pub(crate) fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(hangwatch_model::exit::UsageError(message.into()))
}
