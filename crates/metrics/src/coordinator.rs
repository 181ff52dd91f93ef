//! The coordinator's metrics: the job's nodes (expected, joined, unreachable, left; when each was last heard
//! from), roll calls, verdicts and alerts. Names start with `hangwatch_coordinator_`, so that an agent that hosts
//! the coordinator serves both sets on one endpoint.

use std::borrow::Cow;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use hangwatch_model::{TargetKind, VerdictKind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::labels::label_value_by_name;
use crate::outcomes::Outcomes;

/// Where a node of the job stands with the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeState {
    /// Joined and heard from recently.
    Joined,
    /// Joined, then silent past the coordinator's `--silence`.
    Unreachable,
    /// Said goodbye: its ranks ended.
    Left,
}

impl NodeState {
    pub const ALL: [NodeState; 3] = [NodeState::Joined, NodeState::Unreachable, NodeState::Left];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Joined => "joined",
            NodeState::Unreachable => "unreachable",
            NodeState::Left => "left",
        }
    }
}

label_value_by_name!(NodeState);

/// One node as the coordinator's membership has it now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeSeen<'a> {
    pub node: &'a str,
    pub state: NodeState,
    /// Since the node was last heard from.
    pub silent_for: Duration,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: NodeState,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

/// The coordinator's metrics; every series carries `job_id` when the job's id is known.
#[derive(Debug)]
pub struct CoordinatorMetrics {
    registry: Registry,
    nodes_expected: Gauge,
    nodes: Family<StateLabels, Gauge>,
    node_silent: Family<NodeLabels, Gauge<f64, AtomicU64>>,
    roll_calls: Counter,
    outcomes: Outcomes,
}

impl CoordinatorMetrics {
    pub fn new(job_id: Option<&str>) -> Self {
        let labels = job_id.map(|id| (Cow::Borrowed("job_id"), Cow::Owned(id.to_string())));
        let mut registry = Registry::with_labels(labels.into_iter());
        let m = CoordinatorMetrics {
            registry: Registry::default(),
            nodes_expected: Gauge::default(),
            nodes: Family::default(),
            node_silent: Family::default(),
            roll_calls: Counter::default(),
            outcomes: Outcomes::default(),
        };
        let r = &mut registry;
        r.register(
            "hangwatch_coordinator_nodes_expected",
            "Nodes the job has (--nnodes); 0 when not given",
            m.nodes_expected.clone(),
        );
        r.register(
            "hangwatch_coordinator_nodes",
            "Nodes that joined, by state: joined (heard from), unreachable (silent past --silence), left",
            m.nodes.clone(),
        );
        r.register(
            "hangwatch_coordinator_node_last_seen_seconds",
            "Seconds since the node's agent was last heard from",
            m.node_silent.clone(),
        );
        r.register(
            "hangwatch_coordinator_roll_calls",
            "Job-wide roll calls ordered",
            m.roll_calls.clone(),
        );
        m.outcomes
            .register(r, "hangwatch_coordinator", "Job-wide verdicts, by kind");
        for state in NodeState::ALL {
            let _ = m.nodes.get_or_create(&StateLabels { state });
        }
        CoordinatorMetrics { registry, ..m }
    }

    /// The membership now: every node that ever joined, and the node count the job expects.
    pub fn set_nodes<'a>(
        &self,
        expected: Option<usize>,
        nodes: impl IntoIterator<Item = NodeSeen<'a>>,
    ) {
        let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.nodes_expected.set(expected.map_or(0, as_i64));
        let mut counts = [0usize; 3];
        for seen in nodes {
            counts[seen.state as usize] += 1;
            self.node_silent
                .get_or_create(&NodeLabels {
                    node: seen.node.to_string(),
                })
                .set(seen.silent_for.as_secs_f64());
        }
        for state in NodeState::ALL {
            self.nodes
                .get_or_create(&StateLabels { state })
                .set(as_i64(counts[state as usize]));
        }
    }

    pub fn roll_call(&self) {
        self.roll_calls.inc();
    }

    pub fn verdict(&self, kind: VerdictKind) {
        self.outcomes.verdict(kind);
    }

    pub fn alert_sent(&self, target: TargetKind) {
        self.outcomes.alert(target, true);
    }

    pub fn alert_failed(&self, target: TargetKind) {
        self.outcomes.alert(target, false);
    }

    /// An alert was not sent: a repeat within the window, or dropped with too many in flight.
    pub fn alert_not_sent(&self, reason: hangwatch_model::NotSentReason) {
        self.outcomes.alert_not_sent(reason);
    }

    /// Everything, in the Prometheus text exposition format (0.0.4).
    pub fn encode(&self) -> String {
        crate::text::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_roll_calls_and_verdicts_show() {
        let m = CoordinatorMetrics::new(Some("7"));
        m.set_nodes(
            Some(3),
            [
                NodeSeen {
                    node: "a",
                    state: NodeState::Joined,
                    silent_for: Duration::from_millis(250),
                },
                NodeSeen {
                    node: "b",
                    state: NodeState::Unreachable,
                    silent_for: Duration::from_secs(9),
                },
            ],
        );
        m.roll_call();
        m.verdict(VerdictKind::NodeUnreachable);
        let t = m.encode();
        for line in [
            "hangwatch_coordinator_nodes_expected{job_id=\"7\"} 3",
            "hangwatch_coordinator_nodes{job_id=\"7\",state=\"joined\"} 1",
            "hangwatch_coordinator_nodes{job_id=\"7\",state=\"unreachable\"} 1",
            "hangwatch_coordinator_nodes{job_id=\"7\",state=\"left\"} 0",
            "hangwatch_coordinator_node_last_seen_seconds{job_id=\"7\",node=\"b\"} 9.0",
            "hangwatch_coordinator_roll_calls_total{job_id=\"7\"} 1",
            "hangwatch_coordinator_verdicts_total{job_id=\"7\",kind=\"node_unreachable\"} 1",
            "# TYPE hangwatch_coordinator_roll_calls_total counter",
        ] {
            assert!(t.lines().any(|l| l == line), "no {line:?} in\n{t}");
        }
    }
}
