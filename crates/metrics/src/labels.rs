//! The label values hangwatch's metrics use: enums written as the snake_case words of docs/metrics.md.

/// Where an alert went (`target` label of `hangwatch_alerts_sent_total` and `..._failed_total`): the alert
/// kind (`hangwatch_model::TargetKind`), as a label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Target(pub hangwatch_model::TargetKind);

impl Target {
    fn as_str(&self) -> &'static str {
        self.0.as_str()
    }
}

/// `VerdictKind` as a label value (the kind's own `as_str`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Kind(pub hangwatch_model::VerdictKind);

/// Implements `EncodeLabelValue` through the type's `as_str`.
macro_rules! label_value_by_name {
    ($($t:ty),*) => {$(
        impl prometheus_client::encoding::EncodeLabelValue for $t {
            fn encode(
                &self,
                encoder: &mut prometheus_client::encoding::LabelValueEncoder,
            ) -> Result<(), std::fmt::Error> {
                std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    )*};
}
pub(crate) use label_value_by_name;

impl Kind {
    fn as_str(&self) -> &'static str {
        self.0.as_str()
    }
}

/// Why an alert was not sent (`reason` label of `hangwatch_alerts_not_sent_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Reason(pub hangwatch_model::NotSentReason);

impl Reason {
    fn as_str(&self) -> &'static str {
        self.0.as_str()
    }
}

label_value_by_name!(Target, Kind, Reason);
