//! How far a stall has gone: the one tier every part of hangwatch speaks of (the agent's policy, the link's
//! progress report, the coordinator's membership); the detector's state says it with its details, the gRPC
//! message and the metrics label say it in their own encodings, each converted from this.

use serde::{Deserialize, Serialize};

/// A node's (or a job's) stall tier.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum StallTier {
    /// Progress is recent enough.
    #[default]
    Healthy,
    /// Past the soft threshold: a roll call, evidence and an alert; nothing is ended for it alone.
    Soft,
    /// Past the hard threshold: time to act.
    Hard,
}
