//! The per-node agent (`hangwatch run`): launches or adopts the ranks, drains their output, receives heartbeats,
//! detects the stall, takes the roll call, keeps the evidence, alerts and ends the job.

pub mod beats;
pub mod collectives;
pub mod container;
pub mod death;
pub mod events;
pub mod evidence;
pub mod heartbeat;
pub mod history;
pub mod human;
pub mod instrument;
mod investigation;
pub mod kernel_log;
pub mod launch;
pub mod link;
pub mod members;
pub mod metrics_feed;
pub mod output;
mod own_dumps;
pub mod policy;
pub mod progress;
pub mod reaper;
pub mod render;
mod run_config;
mod sampler;
mod sources;
pub mod stall_log;
pub mod supervise;
pub mod sys;
pub mod terminate;
pub mod timeline;
pub mod wire;
mod workers;
