//! `progress.json` in an evidence bundle: how the job progressed up to the hang, for people (the report's
//! timeline). Written by the agent, read by `hangwatch report`.

use serde::{Deserialize, Serialize};

/// One second (or longer span) of the job's progress: what the ranks reported in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressPoint {
    /// Seconds since the Unix epoch at the end of the span.
    pub at_unix_s: f64,
    /// The furthest step any rank had reported (`hangwatch.beat(step)`) by then; `null` without beats.
    pub step: Option<u64>,
    /// Units of progress (beats, output lines, phases) seen in the span, all ranks together.
    pub units: u64,
    /// How many ranks showed progress in the span.
    pub ranks_progressing: u32,
}

/// The timeline of `progress.json`: oldest point first, at most [`ProgressTimeline::MAX_POINTS`] of them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgressTimeline {
    /// Seconds since the Unix epoch when the job started.
    pub started_at_unix_s: f64,
    /// How many ranks the job has on this node.
    pub ranks: u32,
    pub points: Vec<ProgressPoint>,
    /// The stall threshold (hard tier) in force when the timeline was written, in seconds.
    #[serde(default)]
    pub threshold_s: Option<f64>,
    /// When the stall was detected (seconds since the Unix epoch); `null` if the job did not hang.
    #[serde(default)]
    pub stall_detected_at_unix_s: Option<f64>,
}

impl ProgressTimeline {
    /// The timeline keeps this many points (the last ~hour at one a second, coarser before): enough to see the
    /// rhythm before the hang, small enough for any bundle.
    pub const MAX_POINTS: usize = 3600;
}
