//! The coordinator's metrics: the job's nodes (expected, joined, unreachable, left; when each was last heard
//! from), roll calls, verdicts and alerts. Names start with `hangwatch_coordinator_`, so that an agent that hosts
//! the coordinator serves both sets on one endpoint.

use std::borrow::Cow;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use hangwatch_model::VerdictKind;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::agent::TargetLabels;
use hangwatch_alert::TargetKind;

use crate::labels::{label_value_by_name, Kind, Target};

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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: Kind,
}

/// The coordinator's metrics; every series carries `job_id` when the job's id is known.
#[derive(Debug)]
pub struct CoordinatorMetrics {
    registry: Registry,
    nodes_expected: Gauge,
    nodes: Family<StateLabels, Gauge>,
    node_silent: Family<NodeLabels, Gauge<f64, AtomicU64>>,
    roll_calls: Counter,
    verdicts: Family<KindLabels, Counter>,
    alerts_sent: Family<TargetLabels, Counter>,
    alerts_failed: Family<TargetLabels, Counter>,
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
            verdicts: Family::default(),
            alerts_sent: Family::default(),
            alerts_failed: Family::default(),
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
        r.register(
            "hangwatch_coordinator_verdicts",
            "Job-wide verdicts, by kind",
            m.verdicts.clone(),
        );
        r.register(
            "hangwatch_coordinator_alerts_sent",
            "Alerts delivered, by target",
            m.alerts_sent.clone(),
        );
        r.register(
            "hangwatch_coordinator_alerts_failed",
            "Alerts that could not be delivered, by target",
            m.alerts_failed.clone(),
        );
        for state in NodeState::ALL {
            let _ = m.nodes.get_or_create(&StateLabels { state });
        }
        for kind in VerdictKind::ALL {
            let _ = m.verdicts.get_or_create(&KindLabels { kind: Kind(kind) });
        }
        for target in TargetKind::ALL {
            let _ = m.alerts_sent.get_or_create(&TargetLabels {
                target: Target(target),
            });
            let _ = m.alerts_failed.get_or_create(&TargetLabels {
                target: Target(target),
            });
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
        self.verdicts
            .get_or_create(&KindLabels { kind: Kind(kind) })
            .inc();
    }

    pub fn alert_sent(&self, target: TargetKind) {
        self.alerts_sent
            .get_or_create(&TargetLabels {
                target: Target(target),
            })
            .inc();
    }

    pub fn alert_failed(&self, target: TargetKind) {
        self.alerts_failed
            .get_or_create(&TargetLabels {
                target: Target(target),
            })
            .inc();
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
