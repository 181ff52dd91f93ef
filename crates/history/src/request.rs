//! The request `run` sends to the `__record-history` child (typed JSON on its stdin), and what that child does
//! with it: shared by the agent (which sends it) and the CLI (which runs the child).

use std::path::{Path, PathBuf};

use hangwatch_model::{error_chain, Verdict};
use serde::{Deserialize, Serialize};

use crate::db::{HistoryDb, NewEntry, Recorded};
use crate::fingerprint::Fingerprint;
use hangwatch_model::Recurrence;

/// One verdict to record, as the child reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryRequest {
    pub verdict: Verdict,
    /// The node that records it (its hostname).
    pub node: String,
    pub job_id: Option<String>,
    /// The evidence bundle's directory.
    pub bundle: Option<PathBuf>,
    pub at_unix_s: f64,
    /// Where to ship it and look its cause up across the fleet; `None`: this node's history only.
    #[serde(default)]
    pub fleet: Option<FleetTarget>,
}

/// The fleet database, as `run` hands it to the recording child (`hangwatch_fleet` connects to it). The URL
/// carries no password: that comes from the password file or libpq's usual places in the child.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetTarget {
    /// `postgresql://user@host:port/dbname`.
    pub url: String,
    /// A file (0600) holding the password (`--history-password-file`).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Verdicts on the same mount within this many seconds of each other are one incident.
    pub incident_window_s: f64,
    /// How long the verdict waits for the fleet database's answer before it takes the node's own.
    pub deadline_s: f64,
}

impl HistoryRequest {
    /// A request for `verdict`, without its roll-call table (most of its size in a large job, and not recorded).
    pub fn new(
        verdict: &Verdict,
        node: impl Into<String>,
        job_id: Option<String>,
        bundle: Option<PathBuf>,
        at_unix_s: f64,
    ) -> HistoryRequest {
        HistoryRequest {
            verdict: verdict.without_ranks(),
            node: node.into(),
            job_id,
            bundle,
            at_unix_s,
            fleet: None,
        }
    }

    /// The same request, shipped to `fleet` too.
    pub fn with_fleet(mut self, fleet: Option<FleetTarget>) -> HistoryRequest {
        self.fleet = fleet;
        self
    }

    /// Records it in the database at `db` (opened, and created when missing).
    pub fn record(&self, db: &Path) -> Result<Recurrence, crate::HistoryError> {
        self.record_entry(db).map(|r| r.recurrence)
    }

    /// [`HistoryRequest::record`], with the new row's id.
    pub fn record_entry(&self, db: &Path) -> Result<Recorded, crate::HistoryError> {
        let mut db = HistoryDb::open(db)?;
        db.record_entry(&NewEntry {
            verdict: &self.verdict,
            fingerprint: Fingerprint::of(&self.verdict),
            node: self.node.clone(),
            job_id: self.job_id.clone(),
            bundle: self.bundle.clone(),
            at_unix_s: self.at_unix_s,
        })
    }
}

/// The `__record-history --db PATH` child: a [`HistoryRequest`] as JSON on `input`, recorded; the
/// [`Recurrence`] is returned for the caller to print on stdout. Errors are one line for the parent's report.
pub fn record_child_main(db: &Path, input: impl std::io::Read) -> Result<Recurrence, String> {
    let request: HistoryRequest =
        serde_json::from_reader(input).map_err(|e| format!("bad history request on stdin: {e}"))?;
    request.record(db).map_err(|e| error_chain(&e))
}
