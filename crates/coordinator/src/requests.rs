//! What the coordinator reads from an agent's requests: each gRPC message turned into the membership's types, pure
//! (the time is passed in), so that the service stays a thin shell and the decoding is fuzzed without a server
//! (fuzz/fuzz_targets/coordinator.rs).

use std::time::{Duration, Instant};

use hangwatch_model::NodeObservations;
use hangwatch_rpc::pb;
use hangwatch_rpc::{decode_observations, ObservationsError};

use crate::{NodeReport, NodeStall, RankExit, RankProgress, Registration};

/// A Register call's request.
pub fn registration(r: pb::RegisterRequest) -> Registration {
    Registration {
        protocol_version: r.protocol_version,
        job_id: r.job_id,
        node: r.node,
        node_rank: r.node_rank,
        ranks: r.ranks,
    }
}

/// A progress report as it arrived at `at`.
pub fn node_report(report: &pb::ProgressReport, at: Instant) -> NodeReport {
    let ranks = report
        .ranks
        .iter()
        .map(|p| RankProgress {
            rank: p.rank,
            step: p.step,
            age: Duration::from_millis(p.last_progress_age_ms),
            reported_at: at,
        })
        .collect();
    let tier = hangwatch_rpc::stall_tier_from_wire(report.stall);
    NodeReport {
        ranks,
        stall: NodeStall {
            tier,
            stalled_for: Duration::from_millis(report.stalled_for_ms),
            fs_stuck: report.fs_stuck,
        },
        leaving: report.leaving.then_some(report.exit_code),
        exits: report
            .exits
            .iter()
            .map(|e| RankExit {
                rank: e.rank,
                pid: e.pid,
                exit_code: e.exit_code,
                exited_at_unix_s: (e.exited_at_unix_s.is_finite() && e.exited_at_unix_s > 0.0)
                    .then_some(e.exited_at_unix_s),
            })
            .collect(),
    }
}

/// A roll-call answer from the session of `node`.
#[derive(Debug)]
pub struct RollCallAnswer {
    /// Every process placed on `node`, whatever the payload said.
    pub observations: NodeObservations,
    /// The payload named another node (for itself or a process): logged, never believed.
    pub named_another_node: bool,
}

/// Reads a roll-call answer's observations and puts them on the session's node.
pub fn roll_call_answer(
    node: &str,
    observations_json: &[u8],
) -> Result<RollCallAnswer, ObservationsError> {
    let mut observations = decode_observations(observations_json)?;
    let named_another_node = observations.node.as_deref() != Some(node)
        || observations
            .processes()
            .any(|p| p.node.as_deref().is_some_and(|n| n != node));
    observations.assign_node(node);
    Ok(RollCallAnswer {
        observations,
        named_another_node,
    })
}
