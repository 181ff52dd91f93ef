//! What alerting reports about itself, for the alert crate and the metrics alike: where an alert went and why one
//! was not sent.

use serde::Serialize;

/// Which kind of receiver an alert went to: `target` in `alerts.json` and in the alert metrics' labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    Webhook,
    Alertmanager,
    Command,
}

impl TargetKind {
    pub const ALL: [TargetKind; 3] = [
        TargetKind::Webhook,
        TargetKind::Alertmanager,
        TargetKind::Command,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Webhook => "webhook",
            TargetKind::Alertmanager => "alertmanager",
            TargetKind::Command => "command",
        }
    }
}

/// Why an alert was not sent: `reason` in the alert metrics' labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotSentReason {
    /// The same alert went out within the alerter's dedup window (`hangwatch_alert::DEDUP_WINDOW`).
    Repeat,
    /// The alerter's most deliveries in flight (`hangwatch_alert::Limits::max_in_flight`) were in flight.
    Dropped,
}

impl NotSentReason {
    pub const ALL: [NotSentReason; 2] = [NotSentReason::Repeat, NotSentReason::Dropped];

    pub fn as_str(self) -> &'static str {
        match self {
            NotSentReason::Repeat => "repeat",
            NotSentReason::Dropped => "dropped",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialized_names_are_the_label_values() {
        for kind in TargetKind::ALL {
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::from(kind.as_str())
            );
        }
        for reason in NotSentReason::ALL {
            assert_eq!(
                serde_json::to_value(reason).unwrap(),
                serde_json::Value::from(reason.as_str())
            );
        }
    }
}
