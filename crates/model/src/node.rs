//! A node's observations: everything one roll call saw on one node, before any decision. This is what crosses the
//! wire from an agent to whoever decides (`hangwatch-diagnosis`), so it carries no verdict.

use serde::{Deserialize, Serialize};

use crate::{ProbeResult, ProcessObservation};

/// The version of [`NodeObservations`]; bumped only on incompatible changes.
pub const NODE_OBSERVATIONS_VERSION: u32 = 1;

/// What one node saw during one roll call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeObservations {
    /// [`NODE_OBSERVATIONS_VERSION`] of the sender.
    pub version: u32,
    /// The node's name (its hostname); `None` when it could not be read.
    pub node: Option<String>,
    /// Seconds since the Unix epoch when the observations were complete.
    pub observed_at_unix_s: Option<f64>,
    /// Milliseconds between the two /proc samples: a thread that did not run in it "is not running".
    pub window_ms: u64,
    /// How long the roll call took on this node, probes included (absent from older agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_ms: Option<u64>,
    /// How many processes' first sample was read before the roll call began (by `run` while the job stalled)
    /// rather than during it: with all of them, the roll call waited no window of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_sampled_before: Option<u32>,
    /// The rank processes (`worker_of` unset), in the order they were named.
    pub ranks: Vec<ProcessObservation>,
    /// The ranks' descendants (`worker_of` set): never ranks themselves.
    #[serde(default)]
    pub workers: Vec<ProcessObservation>,
    /// Probes of the mounts that stuck threads use (`hangwatch_diagnosis::mounts_to_probe`).
    #[serde(default)]
    pub probes: Vec<ProbeResult>,
    /// What the node's kernel log said since the job started, when it was followed.
    #[serde(default)]
    pub kernel_log: Option<crate::kernel_log::Report>,
    /// What could not be read on this node as a whole, in words (per-process failures are in each process's
    /// `read_issues`).
    #[serde(default)]
    pub unreadable: Vec<String>,
    /// Whose pids these are: the node's, or a container's when the agent runs inside one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<crate::PidView>,
    /// The ranks asked for their Flight Recorder at this roll call (those whose client can answer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collectives_asked: Vec<u32>,
    /// What the ranks that answered in time said of their collectives.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collectives: Vec<crate::CollectiveRecord>,
}

impl NodeObservations {
    /// Observations of `node` with nothing seen yet.
    pub fn new(node: Option<String>, window_ms: u64) -> Self {
        Self {
            version: NODE_OBSERVATIONS_VERSION,
            node,
            observed_at_unix_s: None,
            window_ms,
            took_ms: None,
            first_sampled_before: None,
            ranks: Vec::new(),
            workers: Vec::new(),
            probes: Vec::new(),
            kernel_log: None,
            unreadable: Vec::new(),
            pids: None,
            collectives_asked: Vec::new(),
            collectives: Vec::new(),
        }
    }

    /// Every process observed: the ranks, then the workers.
    pub fn processes(&self) -> impl Iterator<Item = &ProcessObservation> {
        self.ranks.iter().chain(&self.workers)
    }

    /// Puts every observation on `node`: the node's own name and each process's. A receiver that knows which node
    /// sent the observations (the coordinator, by the sender's session) calls this, so that a sender can only
    /// speak of its own processes and never place a rank, a culprit, on another node.
    pub fn assign_node(&mut self, node: &str) {
        self.node = Some(node.to_string());
        for p in self.ranks.iter_mut().chain(&mut self.workers) {
            p.node = Some(node.to_string());
        }
    }
}
