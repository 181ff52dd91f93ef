//! Children that are hangwatch itself, re-executed to read what may block (`__read-strings`, `__read-maps`):
//! their JSON-line answers, and the judge of whether the binary they run from lives on a remote filesystem.
//! Running them under a deadline is `hangwatch_child`'s.

use std::process::Command;
use std::time::Duration;

use hangwatch_child::{run_with_deadline, ChildOutcome};

/// What a reader child (`__read-strings`, `__read-maps`) printed before it ended or was abandoned: one JSON line
/// per item it got to, and why the items it did not get to are missing. `reader` names it in that reason ("the
/// memory reader"); `blocked` what did not return at the deadline ("reading the rank's memory") and `cause` why
/// that happens.
pub fn read_json_lines<T: serde::de::DeserializeOwned>(
    command: Command,
    deadline: Duration,
    reader: &str,
    (blocked, cause): (&str, &str),
) -> (Vec<T>, String) {
    let (stdout, why_missing) = match run_with_deadline(command, deadline) {
        Ok(ChildOutcome::Finished { stdout, status, .. }) => (
            stdout,
            format!("{reader} ended ({status}) before reading it"),
        ),
        Ok(ChildOutcome::TimedOut { stdout, .. }) => (
            stdout,
            format!(
                "{blocked} did not return within {:.1}s ({cause})",
                deadline.as_secs_f64()
            ),
        ),
        Err(e) => (Vec::new(), format!("cannot start {reader}: {e}")),
    };
    let items = String::from_utf8_lossy(&stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    (items, why_missing)
}

/// A reader child's answer for one item: its text, or why it could not be read.
pub fn text_or_error(text: Option<String>, error: Option<String>) -> Result<String, String> {
    match (text, error) {
        (Some(text), _) => Ok(text),
        (None, Some(e)) => Err(e),
        (None, None) => Err("nothing read".to_string()),
    }
}
/// Whether the running binary lives on a network or FUSE filesystem: the judge the hangwatch binary gives
/// [`hangwatch_child::judge_binary_filesystem_with`] at start.
pub fn binary_is_remote() -> std::io::Result<bool> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(hangwatch_proc::parse_mountinfo(&mounts)
        .ok()
        .and_then(|t| {
            t.containing(&exe.to_string_lossy())
                .map(hangwatch_proc::Mount::is_remote)
        })
        .unwrap_or(false))
}
