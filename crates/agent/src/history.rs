//! Recording a verdict in the node's history from `run`: through the `__record-history` child, which `run` can
//! abandon at a deadline, so that a stuck disk never holds the loop or the process's exit.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use hangwatch_history::{HistoryRequest, Recurrence};
use hangwatch_inspect::child::{input_from_bytes, run_with_deadline_and_input, ChildOutcome};

/// Records `request` in the database at `db` by running `program __record-history --db DB` (`program`: the
/// running hangwatch, [`hangwatch_inspect::child::self_exe`]); the child's answer is how often the verdict's cause
/// was seen before. Gives up after `deadline`: the child is then abandoned, and the error says so. Errors are one
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
        ChildOutcome::Finished { status, stdout, .. } if status.success() => {
            serde_json::from_slice(&stdout).map_err(|e| {
                format!(
                    "the history recorder answered something else than a recurrence ({e}): {}",
                    String::from_utf8_lossy(&stdout).trim()
                )
            })
        }
        ChildOutcome::Finished { status, stderr, .. } => Err(format!(
            "recording the verdict in {} failed ({status}): {}",
            db.display(),
            String::from_utf8_lossy(&stderr).trim()
        )),
        ChildOutcome::TimedOut { .. } => Err(format!(
            "recording the verdict in {} did not finish within {:.1}s: abandoned",
            db.display(),
            deadline.as_secs_f64()
        )),
    }
}
