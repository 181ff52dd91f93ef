//! Pure decisions on rows read from the fleet database: which earlier verdicts a recurrence names (one per job),
//! and which nearby verdicts make a storage incident with a new one (another job, or other nodes, blocked on the
//! same mount within the window).
//!
//! In a multi-node job every node records the job-wide verdict, so the fleet database holds one row per node for
//! one hang: rows of one job with the same culprit nodes are one hang, never an incident of their own.

use hangwatch_history::PendingVerdict;
use hangwatch_model::{FleetIncident, IncidentMember, Sighting};

/// An earlier verdict with the same cause, as read.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlierRow {
    pub node: String,
    pub culprit_nodes: Vec<String>,
    pub job_id: Option<String>,
    pub at_unix_s: f64,
}

/// A verdict blocked on the same mount within the window, as read.
pub type NearbyRow = EarlierRow;

/// Where a verdict's hang was: its culprits' nodes, else the node that recorded it.
fn hang_nodes(row: &EarlierRow) -> Vec<String> {
    if row.culprit_nodes.is_empty() {
        vec![row.node.clone()]
    } else {
        row.culprit_nodes.clone()
    }
}

/// At most `max` sightings from `rows` (newest first): one per job (rows without a job id each count), named by
/// the node the hang was on.
pub fn sightings_from(rows: &[EarlierRow], max: usize) -> Vec<Sighting> {
    let mut seen_jobs: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for row in rows {
        if out.len() >= max {
            break;
        }
        if let Some(job) = row.job_id.as_deref() {
            if seen_jobs.contains(&job) {
                continue;
            }
            seen_jobs.push(job);
        }
        out.push(Sighting {
            node: hang_nodes(row).join(","),
            job_id: row.job_id.clone(),
            at_unix_s: row.at_unix_s,
        });
    }
    out
}

/// The incident `own` belongs to on `mount`, from the verdicts blocked on it within the window (oldest first):
/// those of another job, or of the same job on other nodes. `None` when there are none.
pub fn incident_from(
    own: &PendingVerdict,
    mount: &str,
    nearby: &[NearbyRow],
    window_s: f64,
) -> Option<FleetIncident> {
    let own_nodes = if own.culprit_nodes.is_empty() {
        vec![own.node.clone()]
    } else {
        own.culprit_nodes.clone()
    };
    let mut others: Vec<IncidentMember> = Vec::new();
    let mut seen: Vec<(Option<String>, Vec<String>)> = Vec::new();
    for row in nearby {
        let nodes = hang_nodes(row);
        let same_job = row.job_id == own.job_id;
        let same_nodes = nodes.iter().any(|n| own_nodes.contains(n));
        if same_job && same_nodes {
            continue;
        }
        let identity = (row.job_id.clone(), nodes.clone());
        if seen.contains(&identity) {
            continue;
        }
        seen.push(identity);
        others.push(IncidentMember {
            node: nodes.join(","),
            job_id: row.job_id.clone(),
            at_unix_s: row.at_unix_s,
        });
    }
    let first = others
        .iter()
        .map(|o| o.at_unix_s)
        .fold(own.at_unix_s, f64::min);
    (!others.is_empty()).then(|| FleetIncident {
        mount: mount.to_string(),
        fstype: own.fields.fstype.clone(),
        source: own.mount_source.clone(),
        others,
        first_at_unix_s: first,
        window_s,
    })
}

#[cfg(test)]
mod tests {
    use hangwatch_history::Fingerprint;
    use hangwatch_model::VerdictKind;

    use super::*;

    fn row(node: &str, culprits: &[&str], job: Option<&str>, at: f64) -> EarlierRow {
        EarlierRow {
            node: node.into(),
            culprit_nodes: culprits.iter().map(|c| c.to_string()).collect(),
            job_id: job.map(str::to_string),
            at_unix_s: at,
        }
    }

    fn own(node: &str, job: Option<&str>, at: f64) -> PendingVerdict {
        PendingVerdict {
            filesystem: None,
            id: 1,
            at_unix_s: at,
            fingerprint: "k".into(),
            fields: Fingerprint {
                kind: VerdictKind::BlockedInKernel,
                syscall: Some("write".into()),
                fstype: Some("gpfs".into()),
                mount: Some("/gpfs".into()),
                kernel_wait: None,
                python_frame: None,
                collective: None,
            },
            mount_point: Some("/gpfs".into()),
            mount_source: None,
            summary: "s".into(),
            node: node.into(),
            culprit_nodes: vec![node.into()],
            job_id: job.map(str::to_string),
            bundle: None,
            stalled_for_s: None,
        }
    }

    #[test]
    fn sightings_name_each_job_once_newest_first() {
        let rows = [
            row("n2", &["n7"], Some("1240"), 500.0),
            row("n7", &["n7"], Some("1240"), 499.0),
            row("n3", &[], Some("1234"), 100.0),
            row("n4", &["n4"], None, 90.0),
            row("n5", &["n5"], None, 80.0),
        ];
        let s = sightings_from(&rows, 3);
        let named: Vec<(&str, Option<&str>)> = s
            .iter()
            .map(|s| (s.node.as_str(), s.job_id.as_deref()))
            .collect();
        assert_eq!(
            named,
            [("n7", Some("1240")), ("n3", Some("1234")), ("n4", None)]
        );
    }

    #[test]
    fn another_job_on_the_same_mount_is_an_incident_and_the_same_hang_on_other_nodes_is_not() {
        let me = own("n1", Some("77"), 1000.0);
        let nearby = [
            // The same hang, recorded by the job's other node.
            row("n2", &["n1"], Some("77"), 999.0),
            row("n7", &["n7"], Some("1240"), 820.0),
            row("n8", &["n7"], Some("1240"), 821.0),
            // The same job, blocked on another node too.
            row("n3", &["n3"], Some("77"), 990.0),
        ];
        let incident = incident_from(&me, "/gpfs", &nearby, 900.0).expect("an incident");
        let members: Vec<(&str, Option<&str>)> = incident
            .others
            .iter()
            .map(|o| (o.node.as_str(), o.job_id.as_deref()))
            .collect();
        assert_eq!(members, [("n7", Some("1240")), ("n3", Some("77"))]);
        assert_eq!(incident.first_at_unix_s, 820.0);
        assert_eq!(incident.fstype.as_deref(), Some("gpfs"));
        assert!(incident_from(&me, "/gpfs", &nearby[..1], 900.0).is_none());
    }
}
