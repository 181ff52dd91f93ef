//! The fleet database's rows as the terminal tables `hangwatch history --fleet` prints, and its URL as a message may
//! show it.

use hangwatch_history::table::render_table;
use hangwatch_history::utc_time;

use crate::{FleetCause, FleetEntry, FleetMount};

/// The URL for a message: only what comes before its user part's password is never printed.
pub fn redacted(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((user, host)) => {
                let user = user.split(':').next().unwrap_or_default();
                format!("{scheme}://{user}@{host}")
            }
            None => url.to_string(),
        },
        None => "the URL given".to_string(),
    }
}

/// The fleet's verdicts, as given.
pub fn verdict_table(entries: &[FleetEntry]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let nodes = if e.culprit_nodes.is_empty() {
                e.node.clone()
            } else {
                e.culprit_nodes.join(",")
            };
            vec![
                e.at.clone(),
                nodes,
                e.job_id.clone().unwrap_or_else(|| "-".into()),
                e.kind.as_str().to_string(),
                e.cause.clone(),
                format!("x{}", e.count),
            ]
        })
        .collect();
    render_table(&["WHEN", "NODE", "JOB", "KIND", "CAUSE", "SEEN"], &rows)
}

/// Each cause with how often and in how many jobs it was seen, where, first and last.
pub fn cause_table(causes: &[FleetCause]) -> String {
    let rows: Vec<Vec<String>> = causes
        .iter()
        .map(|c| {
            vec![
                format!("x{}", c.count),
                c.jobs.to_string(),
                c.fields.kind.as_str().to_string(),
                c.cause.clone(),
                c.nodes.join(","),
                utc_time(c.first_at_unix_s),
                utc_time(c.last_at_unix_s),
            ]
        })
        .collect();
    render_table(
        &["SEEN", "JOBS", "KIND", "CAUSE", "NODES", "FIRST", "LAST"],
        &rows,
    )
}

/// Each mount that held ranks, with how often, in how many jobs, where, first and last.
pub fn mount_table(mounts: &[FleetMount]) -> String {
    let rows: Vec<Vec<String>> = mounts
        .iter()
        .map(|m| {
            vec![
                m.mount_point.clone(),
                m.fstype.clone().unwrap_or_else(|| "-".into()),
                format!("x{}", m.count),
                m.jobs.to_string(),
                m.nodes.join(","),
                utc_time(m.first_at_unix_s),
                utc_time(m.last_at_unix_s),
            ]
        })
        .collect();
    render_table(
        &[
            "MOUNT", "FSTYPE", "BLOCKED", "JOBS", "NODES", "FIRST", "LAST",
        ],
        &rows,
    )
}
