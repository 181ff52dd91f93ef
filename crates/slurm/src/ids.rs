//! The grammar of Slurm's names that reach root's commands and paths: job ids, step ids and node names. A string
//! that does not parse never becomes an argument of `scontrol`/`scancel`, a file name or a socket name, so `/`,
//! `..`, a leading `-` or a control character cannot reach them, whatever a job wrote into its environment.
//!
//! The shapes are Slurm's own: a job id is a number (an array task shows its own number in `slurmstepd`'s title
//! and in `scontrol`; `123_4` is accepted where a person types it), a step is a number or one of Slurm's named
//! steps, and a node name is a host-name-like word (`NodeName=` in slurm.conf).

use std::fmt;

/// The longest node name accepted: a host name's limit.
pub const MAX_NODE_NAME: usize = 255;

/// Why a name was refused; the message says which name and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{0:?} is not a Slurm job id (digits, optionally `_` and an array index)")]
    Job(String),
    #[error("{0:?} is not a Slurm step id (digits, or batch, extern, interactive)")]
    Step(String),
    #[error(
        "{0:?} is not a node name (letters, digits, `-`, `_`, `.`; at most {MAX_NODE_NAME} bytes, not starting with \
         `-` or `.`)"
    )]
    Node(String),
}

/// A job id as Slurm prints it: `4242`, or an array task `4242_7`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(String);

impl JobId {
    pub fn parse(text: &str) -> Result<JobId, IdError> {
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
        let ok = match text.split_once('_') {
            Some((job, task)) => digits(job) && digits(task),
            None => digits(text),
        };
        if ok {
            Ok(JobId(text.to_string()))
        } else {
            Err(IdError::Job(shorten(text)))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The number that orders jobs (an array task after its job's number).
    pub fn number(&self) -> u64 {
        self.0
            .split('_')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX)
    }
}

/// A step id: a number, or one of the steps Slurm names (`batch`, `extern`, `interactive`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StepId(String);

impl StepId {
    pub fn parse(text: &str) -> Result<StepId, IdError> {
        let ok = matches!(text, "batch" | "extern" | "interactive")
            || (!text.is_empty() && text.len() <= 10 && text.bytes().all(|b| b.is_ascii_digit()));
        if ok {
            Ok(StepId(text.to_string()))
        } else {
            Err(IdError::Step(shorten(text)))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The placeholder step that holds a job's resources (`sleep`, no task of the job's).
    pub fn is_extern(&self) -> bool {
        self.0 == "extern"
    }
}

/// A node name: a host-name-like word, safe in a file name and on a command line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeName(String);

impl NodeName {
    pub fn parse(text: &str) -> Result<NodeName, IdError> {
        let ok = !text.is_empty()
            && text.len() <= MAX_NODE_NAME
            && !text.starts_with(['-', '.'])
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if ok {
            Ok(NodeName(text.to_string()))
        } else {
            Err(IdError::Node(shorten(text)))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    )*};
}
display_as_str!(JobId, StepId, NodeName);

/// A refused name, cut for a message (a job may have written megabytes there).
fn shorten(text: &str) -> String {
    text.chars().take(80).collect()
}

/// `slurmstepd: [4242.0]`, `slurmstepd: [4242.batch]`: the title Slurm's step daemon gives itself. It is written
/// by the daemon (root), so unlike a task's environment no job can change it.
pub fn parse_step_daemon_title(cmdline: &[String]) -> Option<(JobId, StepId)> {
    let title = cmdline.join(" ");
    let inner = title
        .trim()
        .strip_prefix("slurmstepd:")?
        .trim()
        .strip_prefix('[')?
        .split(']')
        .next()?;
    let (job, step) = inner.rsplit_once('.')?;
    Some((JobId::parse(job).ok()?, StepId::parse(step).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_numbers_or_array_tasks_and_nothing_else() {
        for good in ["1", "4242", "4242_7"] {
            assert_eq!(JobId::parse(good).map(|j| j.to_string()), Ok(good.into()));
        }
        for bad in [
            "", "-1", "--help", "1;rm", "1 2", "../1", "1/2", "1_", "_1", "1.0", "a1", "1\n",
        ] {
            assert!(JobId::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(JobId::parse("4242_7").map(|j| j.number()), Ok(4242));
    }

    #[test]
    fn step_ids_are_numbers_or_slurms_named_steps() {
        for good in ["0", "12", "batch", "extern", "interactive"] {
            assert!(StepId::parse(good).is_ok(), "{good:?}");
        }
        for bad in ["", "..", "0/..", "-0", "batch2", "BATCH", "0 1"] {
            assert!(StepId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn node_names_are_host_names_safe_in_paths_and_command_lines() {
        for good in ["n1", "gpu-001", "rack3.node_7"] {
            assert!(NodeName::parse(good).is_ok(), "{good:?}");
        }
        let long = "n".repeat(MAX_NODE_NAME + 1);
        for bad in [
            "",
            "..",
            ".hidden",
            "-N",
            "n1/..",
            "a b",
            "n1\0",
            long.as_str(),
        ] {
            assert!(NodeName::parse(bad).is_err(), "{bad:?}");
        }
        let err = NodeName::parse(&"x/".repeat(10_000)).expect_err("refused");
        assert!(err.to_string().len() < 300, "the message is short: {err}");
    }

    #[test]
    fn the_step_daemons_title_names_its_job_and_step() {
        let title = |s: &str| vec![s.to_string()];
        assert_eq!(
            parse_step_daemon_title(&title("slurmstepd: [7.0]   ")),
            Some((JobId::parse("7").unwrap(), StepId::parse("0").unwrap()))
        );
        assert_eq!(
            parse_step_daemon_title(&title("slurmstepd: [7.batch]")).map(|(_, s)| s.to_string()),
            Some("batch".into())
        );
        for bad in [
            "slurmstepd",
            "slurmstepd: [7]",
            "slurmstepd: [../7.0]",
            "python slurmstepd: [7.0]",
            "slurmstepd: [7.0/..]",
        ] {
            assert_eq!(parse_step_daemon_title(&title(bad)), None, "{bad:?}");
        }
    }
}
