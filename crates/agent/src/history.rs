//! Recording a verdict in the node's history from `run`: through the `__record-history` child, which `run` can
//! abandon at a deadline, so that a stuck disk or a fleet database that does not answer never holds the loop or
//! the process's exit; and shipping what waited to the fleet database at `run` start (`__ship-history`, in the
//! background, under its own deadline).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hangwatch_child::{input_from_bytes, run_with_deadline_and_input, ChildOutcome};
use hangwatch_history::{FleetTarget, HistoryRequest, Recurrence};

/// How long the background shipping at `run` start may take before its child is abandoned.
pub const SHIP_DEADLINE: Duration = Duration::from_secs(60);

/// The causes this run has recorded, by fingerprint, with what recording each said. A run that looks at one hang
/// twice (past the soft threshold, then the hard one) keeps one row in the history, and its later verdict says what
/// the first said: a run's own earlier look is not a recurrence.
#[derive(Debug, Clone, Default)]
pub struct RecordedThisRun(Arc<Mutex<HashMap<String, Recurrence>>>);

impl RecordedThisRun {
    /// What recording `fingerprint` said, when this run recorded it.
    pub fn get(&self, fingerprint: &str) -> Option<Recurrence> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(fingerprint)
            .cloned()
    }

    pub fn insert(&self, fingerprint: String, recurrence: Recurrence) {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(fingerprint, recurrence);
    }
}

/// Records `request` in the database at `db` by running `program __record-history --db DB` (`program`: the
/// running hangwatch, [`hangwatch_child::self_exe`]); the child's answer is how often the verdict's cause
/// was seen before. The child prints one answer a line, the node's own first and the fleet database's after it
/// when there is one: the last complete line wins, also from a child abandoned at `deadline`. Errors are one
/// line, for a warning; a verdict is never held back by its history.
pub fn record_abandonable(
    program: &Path,
    db: &Path,
    request: &HistoryRequest,
    deadline: Duration,
) -> Result<Recurrence, String> {
    let input = serde_json::to_vec(request)
        .map_err(std::io::Error::other)
        .and_then(|bytes| input_from_bytes(c"hangwatch-history", &bytes))
        .map_err(|e| format!("cannot prepare the history request: {e}"))?;
    let mut command = Command::new(program);
    command.arg("__record-history").arg("--db").arg(db);
    let outcome = run_with_deadline_and_input(command, input, deadline).map_err(|e| {
        format!(
            "cannot start the history recorder: {}",
            hangwatch_model::error_chain(&e)
        )
    })?;
    match outcome {
        ChildOutcome::Finished { status, stdout, .. } if status.success() => last_answer(&stdout)
            .ok_or_else(|| {
                format!(
                    "the history recorder answered something else than a recurrence: {}",
                    String::from_utf8_lossy(&stdout).trim()
                )
            }),
        ChildOutcome::Finished { status, stderr, .. } => Err(format!(
            "recording the verdict in {} failed ({status}): {}",
            db.display(),
            String::from_utf8_lossy(&stderr).trim()
        )),
        ChildOutcome::TimedOut { stdout, .. } => match last_answer(&stdout) {
            Some(mut recurrence) => {
                if request.fleet.is_some() && recurrence.fleet_unavailable.is_none() {
                    recurrence.fleet_unavailable = Some(format!(
                        "the recorder did not finish within {:.1}s",
                        deadline.as_secs_f64()
                    ));
                }
                Ok(recurrence)
            }
            None => Err(format!(
                "recording the verdict in {} did not finish within {:.1}s: abandoned",
                db.display(),
                deadline.as_secs_f64()
            )),
        },
    }
}

/// The last complete line of the child's output that is a recurrence (or the whole output, one document).
fn last_answer(stdout: &[u8]) -> Option<Recurrence> {
    let complete = match stdout.iter().rposition(|&b| b == b'\n') {
        Some(end) => &stdout[..end],
        None => stdout,
    };
    complete
        .split(|&b| b == b'\n')
        .rev()
        .find_map(|line| serde_json::from_slice(line).ok())
        .or_else(|| serde_json::from_slice(complete).ok())
}

/// Ships what waits in the history at `db` to `fleet` in the background: `program __ship-history --db DB` on a
/// thread of its own, the child abandoned after [`SHIP_DEADLINE`]. Never blocks the caller; the outcome is logged.
pub fn ship_in_background(program: PathBuf, db: PathBuf, fleet: FleetTarget) {
    let spawned = std::thread::Builder::new()
        .name("hw-ship".into())
        .spawn(move || {
            let input = match serde_json::to_vec(&fleet)
                .map_err(std::io::Error::other)
                .and_then(|bytes| input_from_bytes(c"hangwatch-fleet", &bytes))
            {
                Ok(input) => input,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot prepare the fleet shipping");
                    return;
                }
            };
            let mut command = Command::new(&program);
            command.arg("__ship-history").arg("--db").arg(&db);
            match run_with_deadline_and_input(command, input, SHIP_DEADLINE) {
                Ok(ChildOutcome::Finished { status, stdout, .. }) if status.success() => {
                    tracing::debug!(report = %String::from_utf8_lossy(&stdout).trim(), "verdicts shipped to the fleet database");
                }
                Ok(ChildOutcome::Finished { stderr, .. }) => {
                    tracing::warn!(error = %String::from_utf8_lossy(&stderr).trim(), "verdicts wait in this node's history: the fleet database did not take them");
                }
                Ok(ChildOutcome::TimedOut { .. }) => {
                    tracing::warn!(after_s = SHIP_DEADLINE.as_secs(), "shipping verdicts to the fleet database did not finish: abandoned, they wait in this node's history");
                }
                Err(e) => tracing::warn!(error = %hangwatch_model::error_chain(&e), "cannot start the fleet shipping"),
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the fleet shipping thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_complete_answer_wins() {
        let local = r#"{"fingerprint":"k","seen_before":1,"last_nodes":[],"last_at_unix_s":null,"first_at_unix_s":null}"#;
        let fleet = r#"{"fingerprint":"k","seen_before":3,"last_nodes":["n3"],"last_at_unix_s":null,"first_at_unix_s":null,"source":"fleet"}"#;
        let both = format!("{local}\n{fleet}\n");
        assert_eq!(last_answer(both.as_bytes()).map(|r| r.seen_before), Some(3));
        let cut = format!("{local}\n{}", &fleet[..20]);
        assert_eq!(last_answer(cut.as_bytes()).map(|r| r.seen_before), Some(1));
        assert_eq!(last_answer(b""), None);
        // A pretty-printed document from an older child is one answer without a line end.
        let pretty = "{\n  \"fingerprint\": \"k\",\n  \"seen_before\": 2,\n  \"last_nodes\": [],\n  \"last_at_unix_s\": null,\n  \"first_at_unix_s\": null\n}\n";
        assert_eq!(
            last_answer(pretty.as_bytes()).map(|r| r.seen_before),
            Some(2)
        );
    }
}
