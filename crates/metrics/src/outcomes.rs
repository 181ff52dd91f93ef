//! What the agent and the coordinator both count: verdicts by kind, alerts delivered and failed by target, alerts
//! not sent by reason.

use hangwatch_model::{NotSentReason, TargetKind, VerdictKind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::labels::{Kind, Reason, Target};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: Kind,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    target: Target,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: Reason,
}

/// The counters; every kind, target and reason present at 0 from the start (so `increase()` sees the first one).
#[derive(Debug, Default)]
pub(crate) struct Outcomes {
    verdicts: Family<KindLabels, Counter>,
    alerts_sent: Family<TargetLabels, Counter>,
    alerts_failed: Family<TargetLabels, Counter>,
    alerts_not_sent: Family<ReasonLabels, Counter>,
}

impl Outcomes {
    /// Registers `{prefix}_verdicts`, `{prefix}_alerts_sent`, `{prefix}_alerts_failed` and
    /// `{prefix}_alerts_not_sent` (each `_total`).
    pub(crate) fn register(&self, registry: &mut Registry, prefix: &str, verdicts_help: &str) {
        registry.register(
            format!("{prefix}_verdicts"),
            verdicts_help,
            self.verdicts.clone(),
        );
        registry.register(
            format!("{prefix}_alerts_sent"),
            "Alerts delivered, by target",
            self.alerts_sent.clone(),
        );
        registry.register(
            format!("{prefix}_alerts_failed"),
            "Alerts that could not be delivered, by target",
            self.alerts_failed.clone(),
        );
        registry.register(
            format!("{prefix}_alerts_not_sent"),
            "Alerts not sent, by reason: repeat (the same one went out within 10 minutes), dropped (too many in flight)",
            self.alerts_not_sent.clone(),
        );
        for reason in NotSentReason::ALL {
            let _ = self.alerts_not_sent.get_or_create(&ReasonLabels {
                reason: Reason(reason),
            });
        }
        for kind in VerdictKind::ALL {
            let _ = self
                .verdicts
                .get_or_create(&KindLabels { kind: Kind(kind) });
        }
        for target in TargetKind::ALL {
            let labels = TargetLabels {
                target: Target(target),
            };
            let _ = self.alerts_sent.get_or_create(&labels);
            let _ = self.alerts_failed.get_or_create(&labels);
        }
    }

    pub(crate) fn verdict(&self, kind: VerdictKind) {
        self.verdicts
            .get_or_create(&KindLabels { kind: Kind(kind) })
            .inc();
    }

    pub(crate) fn alert(&self, target: TargetKind, delivered: bool) {
        let family = if delivered {
            &self.alerts_sent
        } else {
            &self.alerts_failed
        };
        family
            .get_or_create(&TargetLabels {
                target: Target(target),
            })
            .inc();
    }

    pub(crate) fn alert_not_sent(&self, reason: NotSentReason) {
        self.alerts_not_sent
            .get_or_create(&ReasonLabels {
                reason: Reason(reason),
            })
            .inc();
    }
}
