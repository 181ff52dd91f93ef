//! How often a verdict's cause was seen before: the answer of the node's verdict history or of the fleet database
//! (`hangwatch history`, docs/history.md), carried in the verdict; and the storage incident the fleet database
//! saw around it (other jobs blocked on the same mount at about the same time).

use serde::{Deserialize, Serialize};

use crate::utc_time;

/// Where a [`Recurrence`] was looked up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecurrenceSource {
    /// The node's own history (no fleet database set, or it did not answer in time). Documents written before
    /// the fleet database existed read as this.
    #[default]
    Local,
    /// The fleet database: every node's verdicts.
    Fleet,
}

impl RecurrenceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RecurrenceSource::Local => "local",
            RecurrenceSource::Fleet => "fleet",
        }
    }
}

/// How often the cause of a new verdict was recorded before it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recurrence {
    /// The fingerprint's key (`hangwatch_history::Fingerprint::key`).
    pub fingerprint: String,
    pub seen_before: u64,
    /// Local: the culprits' nodes of the latest earlier verdict with this cause. Fleet: every node of the
    /// [`Recurrence::sightings`], newest first, each once.
    pub last_nodes: Vec<String>,
    pub last_at_unix_s: Option<f64>,
    pub first_at_unix_s: Option<f64>,
    /// Which history answered.
    #[serde(default)]
    pub source: RecurrenceSource,
    /// Fleet: the latest earlier verdicts with this cause (at most a few, newest first), for "n3 (job 1234,
    /// 2 days ago)".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sightings: Vec<Sighting>,
    /// The node that recorded this verdict, so that the sentence can say "on other nodes".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When this verdict was recorded: the ages in the sentence ("5 h ago") are counted from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_unix_s: Option<f64>,
    /// The cause's mount (normalized, as in the fingerprint), for "same mount".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<String>,
    /// Other jobs or nodes blocked on the same mount within the incident window (fleet only): one storage
    /// incident, not several job bugs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incident: Option<FleetIncident>,
    /// Why the fleet database did not answer when one is set (the recurrence is then the node's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_unavailable: Option<String>,
    /// The verdict names no place of its culprit (no file, mount, meaningful kernel wait, own Python frame or
    /// collective): it was recorded, but compared with no earlier verdict (`seen_before` is 0), since a bare
    /// `futex()` wait is not a cause.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub placeless: bool,
}

/// One earlier verdict with the same cause, somewhere in the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sighting {
    /// The node that recorded it.
    pub node: String,
    pub job_id: Option<String>,
    pub at_unix_s: f64,
}

/// Verdicts of other jobs or nodes blocked on the same mount (mount point, filesystem type and source where
/// recorded) within the incident window: together, one storage incident.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetIncident {
    /// The mount point as the culprit saw it (not normalized: an incident is one filesystem).
    pub mount: String,
    pub fstype: Option<String>,
    /// The mount's source (device, server:/export), when recorded.
    #[serde(default)]
    pub source: Option<String>,
    /// The other verdicts, oldest first.
    pub others: Vec<IncidentMember>,
    /// The earliest verdict of the incident (this one included).
    pub first_at_unix_s: f64,
    /// The window the others were looked for in, back from this verdict.
    pub window_s: f64,
}

/// One other verdict of a storage incident.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IncidentMember {
    /// The node that recorded it.
    pub node: String,
    pub job_id: Option<String>,
    pub at_unix_s: f64,
}

impl Recurrence {
    /// The recurrence in words, and the incident after it when there is one:
    ///
    /// - local: `seen 2 times before (first 2026-11-30 08:10:00 UTC), last on nodes n1, n3 on 2026-12-01
    ///   14:02:00 UTC`, or `first time this cause is seen on this machine`;
    /// - fleet: `seen 2 times before on other nodes: n3 (job 1234, 2 days ago), n7 (job 1240, 5 h ago), same
    ///   mount /gpfs`, or `first time this cause is seen in the fleet`.
    pub fn sentence(&self) -> String {
        let mut text = match self.source {
            RecurrenceSource::Local => self.local_sentence(),
            RecurrenceSource::Fleet => self.fleet_sentence(),
        };
        if let Some(incident) = &self.incident {
            text.push_str("; ");
            text.push_str(&incident.sentence(self.at_unix_s));
        }
        text
    }

    /// Whether there is anything worth telling a person: an earlier verdict with this cause, or an incident.
    pub fn is_news(&self) -> bool {
        self.seen_before > 0 || self.incident.is_some()
    }

    /// What the verdict's text says about it, `None` when there is nothing to tell: `this cause was seen 2 times
    /// before ...[; storage incident: ...]`, or only the incident when the cause is new.
    pub fn news(&self) -> Option<String> {
        if self.seen_before > 0 {
            return Some(format!("this cause was {}", self.sentence()));
        }
        self.incident
            .as_ref()
            .map(|incident| incident.sentence(self.at_unix_s))
    }

    fn local_sentence(&self) -> String {
        if self.placeless {
            return PLACELESS_SENTENCE.to_string();
        }
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

    fn fleet_sentence(&self) -> String {
        if self.placeless {
            return PLACELESS_SENTENCE.to_string();
        }
        if self.seen_before == 0 {
            return "first time this cause is seen in the fleet".to_string();
        }
        let times = if self.seen_before == 1 {
            "1 time".to_string()
        } else {
            format!("{} times", self.seen_before)
        };
        let elsewhere = !self.sightings.is_empty()
            && self
                .node
                .as_ref()
                .is_some_and(|me| self.sightings.iter().all(|s| &s.node != me));
        let mut text = format!(
            "seen {times} before {}",
            if elsewhere {
                "on other nodes"
            } else {
                "in the fleet"
            }
        );
        let listed: Vec<String> = self
            .sightings
            .iter()
            .map(|s| {
                let mut about = Vec::new();
                if let Some(job) = &s.job_id {
                    about.push(format!("job {job}"));
                }
                about.push(when(s.at_unix_s, self.at_unix_s));
                format!("{} ({})", s.node, about.join(", "))
            })
            .collect();
        if !listed.is_empty() {
            text.push_str(": ");
            text.push_str(&listed.join(", "));
            let more = self.seen_before.saturating_sub(listed.len() as u64);
            if more > 0 {
                text.push_str(&format!(" and {more} more"));
            }
        }
        if let Some(mount) = &self.mount {
            text.push_str(&format!(", same mount {mount}"));
        }
        text
    }
}

impl FleetIncident {
    /// Each other verdict in a few words (`job 1240 on n7, 3 min ago`), the facts a storage-incident scope rests
    /// on.
    pub fn sightings(&self, now_unix_s: Option<f64>) -> Vec<String> {
        self.others
            .iter()
            .map(|o| format!("{}, {}", o.who(), when(o.at_unix_s, now_unix_s)))
            .collect()
    }

    /// `storage incident: /gpfs (gpfs) also blocked job 1240 on n7 (3 min ago) and n8 (1 min ago) within 15 min`
    /// (ages from `now_unix_s`, else times).
    pub fn sentence(&self, now_unix_s: Option<f64>) -> String {
        let fstype = self
            .fstype
            .as_ref()
            .map(|f| format!(" ({f})"))
            .unwrap_or_default();
        let others: Vec<String> = self
            .others
            .iter()
            .map(|o| format!("{} ({})", o.who(), when(o.at_unix_s, now_unix_s)))
            .collect();
        let others = match others.as_slice() {
            [] => "nothing else".to_string(),
            [one] => one.clone(),
            [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
        };
        format!(
            "storage incident: {}{fstype} also blocked {others} within {}",
            self.mount,
            age(self.window_s)
        )
    }
}

impl IncidentMember {
    /// `job 1240 on n7`, or `n7` when the job is not known.
    fn who(&self) -> String {
        match &self.job_id {
            Some(job) => format!("job {job} on {}", self.node),
            None => self.node.clone(),
        }
    }
}

/// What the sentence says of a verdict without a place.
const PLACELESS_SENTENCE: &str =
    "not compared with earlier hangs: the culprit has no place (no file, mount, collective or stack frame)";

/// `5 h ago` counted from `now`, else the UTC time.
fn when(at_unix_s: f64, now_unix_s: Option<f64>) -> String {
    match now_unix_s {
        Some(now) if now >= at_unix_s => format!("{} ago", age(now - at_unix_s)),
        _ => utc_time(at_unix_s),
    }
}

/// `40 s`, `3 min`, `5 h`, `2 days`: coarse on purpose (a sentence, not a timestamp).
fn age(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 90.0 {
        format!("{} s", s.round())
    } else if s < 90.0 * 60.0 {
        format!("{} min", (s / 60.0).round())
    } else if s < 36.0 * 3600.0 {
        format!("{} h", (s / 3600.0).round())
    } else {
        format!("{} days", (s / 86_400.0).round())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-30 08:10:00 UTC
    const T0: f64 = 1_796_026_200.0;

    fn fleet(seen: u64, sightings: Vec<Sighting>) -> Recurrence {
        Recurrence {
            fingerprint: "k".into(),
            seen_before: seen,
            last_nodes: sightings.iter().map(|s| s.node.clone()).collect(),
            source: RecurrenceSource::Fleet,
            sightings,
            node: Some("n1".into()),
            at_unix_s: Some(T0),
            mount: Some("/gpfs".into()),
            ..Recurrence::default()
        }
    }

    fn seen(node: &str, job: &str, ago_s: f64) -> Sighting {
        Sighting {
            node: node.into(),
            job_id: Some(job.into()),
            at_unix_s: T0 - ago_s,
        }
    }

    #[test]
    fn a_fleet_recurrence_names_the_other_nodes_their_jobs_and_ages() {
        let r = fleet(
            2,
            vec![
                seen("n3", "1234", 2.0 * 86_400.0),
                seen("n7", "1240", 5.0 * 3600.0),
            ],
        );
        assert_eq!(
            r.sentence(),
            "seen 2 times before on other nodes: n3 (job 1234, 2 days ago), n7 (job 1240, 5 h ago), same mount /gpfs"
        );
        let mut more = fleet(5, vec![seen("n1", "9", 60.0)]);
        more.mount = None;
        assert_eq!(
            more.sentence(),
            "seen 5 times before in the fleet: n1 (job 9, 60 s ago) and 4 more"
        );
        assert_eq!(
            fleet(0, Vec::new()).sentence(),
            "first time this cause is seen in the fleet"
        );
    }

    #[test]
    fn an_incident_follows_the_recurrence() {
        let mut r = fleet(0, Vec::new());
        r.incident = Some(FleetIncident {
            mount: "/gpfs".into(),
            fstype: Some("gpfs".into()),
            source: None,
            others: vec![
                IncidentMember {
                    node: "n7".into(),
                    job_id: Some("1240".into()),
                    at_unix_s: T0 - 180.0,
                },
                IncidentMember {
                    node: "n8".into(),
                    job_id: None,
                    at_unix_s: T0 - 60.0,
                },
            ],
            first_at_unix_s: T0 - 180.0,
            window_s: 900.0,
        });
        assert!(r.is_news());
        assert_eq!(
            r.sentence(),
            "first time this cause is seen in the fleet; storage incident: /gpfs (gpfs) also blocked job 1240 on n7 \
             (3 min ago) and n8 (60 s ago) within 15 min"
        );
    }

    #[test]
    fn a_verdict_without_a_place_is_compared_with_nothing_and_tells_nothing() {
        let local = Recurrence {
            fingerprint: "noplace-0123456789abcdef".into(),
            placeless: true,
            ..Recurrence::default()
        };
        assert!(local
            .sentence()
            .starts_with("not compared with earlier hangs"));
        assert_eq!(local.news(), None);
        let fleet = Recurrence {
            placeless: true,
            ..fleet(0, Vec::new())
        };
        assert!(fleet
            .sentence()
            .starts_with("not compared with earlier hangs"));
        let json = serde_json::to_value(&local).expect("json");
        assert_eq!(json["placeless"], true);
        let placed = serde_json::to_value(Recurrence::default()).expect("json");
        assert!(placed.get("placeless").is_none(), "{placed}");
    }

    #[test]
    fn an_old_document_reads_as_a_local_recurrence() {
        let old = r#"{"fingerprint":"k","seen_before":1,"last_nodes":["n1"],"last_at_unix_s":1796026200.0,
            "first_at_unix_s":1796026200.0}"#;
        let r: Recurrence = serde_json::from_str(old).expect("an old recurrence");
        assert_eq!(r.source, RecurrenceSource::Local);
        assert_eq!(r.incident, None);
        assert!(!r.placeless);
        assert_eq!(
            r.sentence(),
            "seen 1 time before, on node n1 on 2026-11-30 08:10:00 UTC"
        );
    }
}
