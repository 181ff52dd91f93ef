//! hangwatch's programs around the agent's loop: one attempt of `hangwatch run` from its checked settings to its
//! exit code, the coordinator as a program of its own, `dump` and the demo, and what they share on a node. The
//! agent's loop (`hangwatch_agent`) decides; this crate is the I/O around it, so that `cli` only turns flags into
//! the settings these take.
//!
//! | module | owns |
//! |---|---|
//! | `attempt` | one attempt: the hosted coordinator, metrics, the storage wait, the loop, then requeue, alerts, shutdown |
//! | `coordinator` | `hangwatch coordinator`: serve one job's agents until every node has left |
//! | `dump`, `demo`, `doctor` | a roll call now; the seed incident staged on this machine; the host's facts gathered |
//! | `dirs` | where a run's files go on a node: the per-user report root, run directories, the state directory |
//! | `job_events` | the coordinator's events said, alerted, counted and kept (hosted or on its own) |
//! | `storage_wait`, `requeue` | an attempt after a storage hang waits for that storage; `--action requeue`'s wiring |
//! | `alerts`, `metrics` | alerts at a run's end (bounded wait, failures kept); the metrics' HTTP and textfile outlets |
//! | `log_sink`, `own_output` | the job's log and hangwatch's own stdout and stderr, never blocked by a frozen file |
//! | `secret` | secrets read from files that only their owner may read |

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
