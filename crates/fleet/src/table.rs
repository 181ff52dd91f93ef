//! The fleet database's rows as `hangwatch history --fleet` shows them: its JSON document, terminal tables, and its
//! URL as a message may show it.

use hangwatch_history::table::render_table;
use hangwatch_history::utc_time;

use std::time::Duration;

use serde::Serialize;

use crate::{
    ConnectError, FleetCause, FleetDb, FleetEntry, FleetMount, FleetQuery, FleetTarget, ProcessEnv,
    QueryError,
};

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

/// Which rows of the fleet database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetRows {
    Verdicts,
    Causes,
    Mounts,
}

/// `history --fleet --json`: the fleet database (without its password) and its rows.
#[derive(Debug, Serialize)]
pub struct FleetDocument {
    pub database: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdicts: Option<Vec<FleetEntry>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub causes: Option<Vec<FleetCause>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mounts: Option<Vec<FleetMount>>,
}

impl FleetDocument {
    /// Reads `rows` from the fleet database; connecting and reading run under `deadline`: a database that accepts
    /// and never answers is named (without its password), not waited for.
    pub fn read(
        target: FleetTarget,
        rows: FleetRows,
        query: FleetQuery,
        deadline: Duration,
    ) -> Result<Self, FleetReadError> {
        let url = redacted(&target.url);
        let read = move || -> Result<FleetDocument, FleetReadError> {
            let mut db = FleetDb::connect(&target, &ProcessEnv, deadline)?;
            let mut doc = FleetDocument {
                database: db.database().to_string(),
                verdicts: None,
                causes: None,
                mounts: None,
            };
            match rows {
                FleetRows::Causes => doc.causes = Some(db.by_cause(&query)?),
                FleetRows::Mounts => doc.mounts = Some(db.by_mount(&query)?),
                FleetRows::Verdicts => doc.verdicts = Some(db.list(&query)?),
            }
            Ok(doc)
        };
        crate::within(deadline, read).unwrap_or(Err(FleetReadError::NoAnswer {
            url,
            secs: deadline.as_secs(),
        }))
    }
}

/// Why the fleet database's rows could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FleetReadError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error("the fleet database ({url}) did not answer within {secs}s")]
    NoAnswer { url: String, secs: u64 },
}
