//! Asking the reader child (`__inspect-child --serve`) for the job's own Flight Recorder dumps and reading its
//! answer: the watcher never opens or decodes a dump itself. Which dumps are trusted, and why, is
//! `crate::dump_files`'s.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use hangwatch_child::{input_from_bytes, run_with_deadline_and_input, ChildOutcome};
use hangwatch_model::CollectiveRecord;

use crate::dump_files::DumpLine;
pub use crate::dump_files::{prefix_in_environment, OwnDumpsRequest, TORCH_DEFAULT_PREFIX};
use crate::pystack::ServeRequest;

/// What looking for the ranks' dumps came to.
#[derive(Debug, Default, PartialEq)]
pub struct OwnDumps {
    /// The records of the dumps read and decoded.
    pub records: Vec<CollectiveRecord>,
    /// What could not be read or was refused, in words (a file someone else owns, a link, a pickle too deep, a
    /// read that did not finish in time).
    pub problems: Vec<String>,
}

/// Reads the dumps `request` names in a reader child (`program __inspect-child --serve`), giving up at
/// `deadline`. The watcher never decodes a dump itself.
pub fn read_own_dumps(program: &Path, request: &OwnDumpsRequest, deadline: Duration) -> OwnDumps {
    let mut found = OwnDumps::default();
    let mut line = match serde_json::to_vec(&ServeRequest::OwnDumps(Box::new(request.clone()))) {
        Ok(line) => line,
        Err(e) => {
            found.problems.push(format!("cannot ask the reader: {e}"));
            return found;
        }
    };
    line.push(b'\n');
    let input = match input_from_bytes(c"hangwatch-own-dumps", &line) {
        Ok(input) => input,
        Err(e) => {
            found.problems.push(format!("cannot ask the reader: {e}"));
            return found;
        }
    };
    let mut command = Command::new(program);
    command.args(["__inspect-child", "--serve"]);
    let (stdout, ended) = match run_with_deadline_and_input(command, input, deadline) {
        Ok(ChildOutcome::Finished { stdout, status, .. }) => (stdout, format!("ended ({status})")),
        Ok(ChildOutcome::TimedOut { stdout, .. }) => (
            stdout,
            format!(
                "did not finish within {} (their filesystem may have stopped)",
                hangwatch_model::format_duration(deadline)
            ),
        ),
        Err(e) => (Vec::new(), format!("could not start: {e}")),
    };
    let mut done = false;
    for line in String::from_utf8_lossy(&stdout).lines() {
        match serde_json::from_str::<DumpLine>(line) {
            Ok(DumpLine::Record { record }) => found.records.push(*record),
            Ok(DumpLine::Problem { text }) => found.problems.push(text),
            Ok(DumpLine::Done) => done = true,
            Err(_) => {}
        }
    }
    if !done {
        found.problems.push(format!(
            "the reader of the dumps {ended} before it read them all"
        ));
    }
    found
}
