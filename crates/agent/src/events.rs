//! The supervision loop's events and what they carry: every source (heartbeat socket, coordinator link, signals,
//! workers) reports to the loop as one [`Event`] on its bounded channel. The senders import this module; it imports
//! none of them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hangwatch_inspect::ranks::Discovery;
use hangwatch_model::{NodeObservations, Verdict};

use crate::policy::Trigger;
use crate::terminate::TerminationReport;

/// One thing that happened. Progress (beats, output) is not an event: it waits on the
/// progress board (`ProgressBoard`), which the loop reads at each tick, so a flood of it never
/// fills the channel.
#[derive(Debug)]
pub enum Event {
    Phase(PhaseMessage),
    Signal(i32),
    /// The roll call worker finished (the evidence is written or given up on, the alert is on its way).
    Investigated(Box<Investigation>),
    /// The termination worker finished.
    Terminated(TerminationReport),
    /// A look for ranks below the launcher finished (tree mode).
    Discovered(Discovery),
    /// A process of the job said which rank it is (its client, once `torch.distributed` is initialized).
    ClientRank(ClientRank),
    /// The coordinator link: joined, lost, an order.
    Link(LinkEvent),
    /// This node's observations for a roll call the coordinator ordered (answered already; kept for the
    /// evidence).
    Observed(Box<NodeObservations>),
    /// The job's container was found, or could not be (`crate::container`: the command is a container client).
    Container(crate::container::ContainerEvent),
}

/// The event channel's capacity: phases, signals and worker results are rare; a full channel drops phases
/// (counted by the heartbeat receiver).
pub const EVENT_CAPACITY: usize = 1024;

/// What a roll call worker brings back.
#[derive(Debug)]
pub struct Investigation {
    pub trigger: Trigger,
    pub verdict: Verdict,
    /// Where the evidence went, or why it could not be written; `None` when none was kept (a recheck that found
    /// the ranks still computing).
    pub evidence: Option<Result<PathBuf, String>>,
}

/// A rank entered or left a `hangwatch.phase(name)`: the one kind of message the supervision loop gets as an
/// event (its order against the rank's progress matters; it is rare).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseMessage {
    pub rank: Option<u32>,
    pub begin: bool,
    pub name: String,
    pub at: Instant,
}

/// A process of the job said which rank it is (wire type `rank`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientRank {
    /// The sender, as the kernel gives it.
    pub pid: i32,
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
}

/// What the link tells the supervision loop.
#[derive(Debug)]
pub enum LinkEvent {
    /// Registered and attached; `rejoined`: not the first time (the coordinator restarted, or the link healed).
    Joined { session_id: String, rejoined: bool },
    /// The coordinator went away (or the link broke): decide alone until it is back.
    Lost { why: String },
    /// The coordinator refused this node (another job, a duplicate node, a late join, another version).
    Refused { why: String },
    /// What listens at the coordinator's address did not prove the job's key (another job's coordinator, another
    /// token file, or someone else on the port): nothing was sent to it.
    NotTheJobs { why: String },
    /// Take a roll call of this node and answer with `Answers::answer` (the link) within
    /// `deadline`.
    RollCallOrdered {
        roll_call_id: u64,
        deadline: Duration,
        /// Mounts to probe besides those this node's stuck ranks use.
        probe_mounts: Vec<String>,
    },
    /// End the job's ranks on this node; the verdict is the job's, from every node's observations.
    TerminateOrdered {
        reason: String,
        verdict: Option<Box<Verdict>>,
    },
}
