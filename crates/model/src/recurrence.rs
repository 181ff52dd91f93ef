//! How often a verdict's cause was seen before on this machine: the answer of the node's verdict history
//! (`hangwatch history`), carried in the verdict.

use serde::Serialize;

use crate::utc_time;

/// How often the cause of a new verdict was recorded before it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Recurrence {
    /// The fingerprint's key (`hangwatch_history::Fingerprint::key`).
    pub fingerprint: String,
    pub seen_before: u64,
    /// The culprits' nodes of the latest earlier verdict with this cause.
    pub last_nodes: Vec<String>,
    pub last_at_unix_s: Option<f64>,
    pub first_at_unix_s: Option<f64>,
}

impl Recurrence {
    /// `seen 2 times before (first 2026-11-30 08:10:00 UTC), last on nodes n1, n3 on 2026-12-01 14:02:00 UTC`, or
    /// `first time this cause is seen on this machine`.
    pub fn sentence(&self) -> String {
        let (Some(last), true) = (self.last_at_unix_s, self.seen_before > 0) else {
            return "first time this cause is seen on this machine".to_string();
        };
        let on_nodes = match self.last_nodes.as_slice() {
            [] => String::new(),
            [one] => format!(" on node {one}"),
            many => format!(" on nodes {}", many.join(", ")),
        };
        if self.seen_before == 1 {
            return format!("seen 1 time before,{on_nodes} on {}", utc_time(last));
        }
        let first = self
            .first_at_unix_s
            .map(|f| format!(" (first {})", utc_time(f)))
            .unwrap_or_default();
        format!(
            "seen {} times before{first}, last{on_nodes} on {}",
            self.seen_before,
            utc_time(last)
        )
    }
}
