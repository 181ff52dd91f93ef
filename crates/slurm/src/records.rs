//! What Slurm itself says of a job or a step (`squeue`), and the check a root service makes before it acts on a
//! job: that Slurm runs it on this node, as the user whose processes it found. The parsing and the check are pure;
//! [`ask_job`] and [`ask_step`] run `squeue` under a deadline.
//!
//! `squeue -o` with fixed fields is asked, not `scontrol show job -o`: there, a job's own name or comment can hold
//! `UserId=…` or `NodeList=…` and a `KEY=VALUE` reader could take it for Slurm's; every field asked here is
//! Slurm's (id, uid, state, node list, batch host), none is text a job chose. `scontrol --json` would do as well
//! but needs Slurm 23.02.

use std::time::Duration;

use hangwatch_child::{external_command, run_with_deadline, ChildOutcome};

use crate::ids::{JobId, NodeName, StepId};
use crate::step::expand_hosts;

/// How long Slurm may take to answer one question.
pub const SLURM_DEADLINE: Duration = Duration::from_secs(15);

/// A job as `squeue` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    pub job: String,
    pub uid: u32,
    /// `RUNNING`, `PENDING`, `COMPLETING`, ...
    pub state: String,
    pub nodes: Vec<String>,
    /// The node that runs the batch script.
    pub batch_host: Option<String>,
}

/// A step as `squeue --steps` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    /// `4242.0`
    pub step: String,
    pub uid: u32,
    pub nodes: Vec<String>,
}

/// The format asked of `squeue` for a job: the fields [`parse_job`] reads, in this order.
const JOB_FORMAT: &str = "%i|%U|%T|%N|%B";
/// The same for the steps of a job.
const STEP_FORMAT: &str = "%i|%U|%N";

/// `4242|1000|RUNNING|n[1-2]|n1` (one line; the first is taken: `squeue -j` of an array task lists only it).
pub fn parse_job(text: &str) -> Option<JobRecord> {
    let line = text.lines().find(|l| !l.trim().is_empty())?;
    let fields: Vec<&str> = line.trim().split('|').collect();
    let [job, uid, state, nodes, batch] = fields.as_slice() else {
        return None;
    };
    Some(JobRecord {
        job: job.to_string(),
        uid: uid.parse().ok()?,
        state: state.to_string(),
        nodes: expand_hosts(nodes),
        batch_host: Some(batch.to_string()).filter(|b| !b.is_empty() && *b != "(null)"),
    })
}

/// `4242.0|1000|n[1-2]` lines: the one of `job.step`.
pub fn parse_step(text: &str, job: &JobId, step: &StepId) -> Option<StepRecord> {
    let wanted = format!("{job}.{step}");
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.trim().split('|').collect();
        let [id, uid, nodes] = fields.as_slice() else {
            return None;
        };
        if *id != wanted {
            return None;
        }
        Some(StepRecord {
            step: id.to_string(),
            uid: uid.parse().ok()?,
            nodes: expand_hosts(nodes),
        })
    })
}

/// Why a root service will not act on a job (said, and counted, by the service).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotHere {
    #[error("Slurm does not know job {job}")]
    Unknown { job: String },
    #[error("Slurm says job {job} is {state}, not running")]
    NotRunning { job: String, state: String },
    #[error(
        "Slurm says job {job} belongs to uid {slurm}, but its processes here are uid {found}'s"
    )]
    OtherUser { job: String, slurm: u32, found: u32 },
    #[error("Slurm says job {job} runs on {nodes}, not on this node ({node})")]
    OtherNode {
        job: String,
        node: String,
        nodes: String,
    },
    #[error("Slurm did not answer about job {job}: {why}")]
    NoAnswer { job: String, why: String },
}

/// Whether Slurm's record of `job` says it runs on `node` as `uid`: what a root service checks before it writes a
/// job's comment, cancels it, or drains this node for it.
pub fn runs_here(record: &JobRecord, uid: u32, node: &NodeName) -> Result<(), NotHere> {
    let job = record.job.clone();
    if !matches!(record.state.as_str(), "RUNNING" | "COMPLETING") {
        return Err(NotHere::NotRunning {
            job,
            state: record.state.clone(),
        });
    }
    if record.uid != uid {
        return Err(NotHere::OtherUser {
            job,
            slurm: record.uid,
            found: uid,
        });
    }
    if !record.nodes.iter().any(|n| n == node.as_str()) {
        return Err(NotHere::OtherNode {
            job,
            node: node.to_string(),
            nodes: words(&record.nodes),
        });
    }
    Ok(())
}

/// Whether a step Slurm lists runs on `node` as `uid`.
pub fn step_runs_here(record: &StepRecord, uid: u32, node: &NodeName) -> Result<(), NotHere> {
    if record.uid != uid {
        return Err(NotHere::OtherUser {
            job: record.step.clone(),
            slurm: record.uid,
            found: uid,
        });
    }
    if !record.nodes.iter().any(|n| n == node.as_str()) {
        return Err(NotHere::OtherNode {
            job: record.step.clone(),
            node: node.to_string(),
            nodes: words(&record.nodes),
        });
    }
    Ok(())
}

fn words(nodes: &[String]) -> String {
    let mut text = nodes.iter().take(8).cloned().collect::<Vec<_>>().join(",");
    if nodes.len() > 8 {
        text.push_str(&format!(",… ({} nodes)", nodes.len()));
    }
    text
}

/// Slurm's record of `job` (`squeue -h -j JOB -o …`, under [`SLURM_DEADLINE`]).
pub fn ask_job(job: &JobId) -> Result<JobRecord, NotHere> {
    let mut command = external_command("squeue");
    command.args(["--noheader", "--jobs", job.as_str(), "--format", JOB_FORMAT]);
    let text = squeue(command, job.as_str())?;
    parse_job(&text).ok_or_else(|| NotHere::Unknown {
        job: job.to_string(),
    })
}

/// Slurm's record of step `job.step` (`squeue -h --steps -j JOB -o …`, under [`SLURM_DEADLINE`]).
pub fn ask_step(job: &JobId, step: &StepId) -> Result<StepRecord, NotHere> {
    let mut command = external_command("squeue");
    command.args([
        "--noheader",
        "--steps",
        "--jobs",
        job.as_str(),
        "--format",
        STEP_FORMAT,
    ]);
    let text = squeue(command, job.as_str())?;
    parse_step(&text, job, step).ok_or_else(|| NotHere::Unknown {
        job: format!("{job}.{step}"),
    })
}

fn squeue(command: std::process::Command, job: &str) -> Result<String, NotHere> {
    let no_answer = |why: String| NotHere::NoAnswer {
        job: job.to_string(),
        why,
    };
    match run_with_deadline(command, SLURM_DEADLINE) {
        Ok(ChildOutcome::Finished { status, stdout, .. }) if status.success() => {
            Ok(String::from_utf8_lossy(&stdout).into_owned())
        }
        // squeue says "Invalid job id specified" for a job that has left the queue.
        Ok(ChildOutcome::Finished { stderr, .. })
            if String::from_utf8_lossy(&stderr).contains("Invalid job id") =>
        {
            Err(NotHere::Unknown {
                job: job.to_string(),
            })
        }
        Ok(ChildOutcome::Finished { status, stderr, .. }) => Err(no_answer(format!(
            "squeue failed ({status}): {}",
            String::from_utf8_lossy(&stderr).trim()
        ))),
        Ok(ChildOutcome::TimedOut { .. }) => Err(no_answer(format!(
            "squeue did not answer within {} s",
            SLURM_DEADLINE.as_secs()
        ))),
        Err(e) => Err(no_answer(format!("cannot run squeue: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: &str) -> NodeName {
        NodeName::parse(n).expect("node name")
    }

    #[test]
    fn a_job_as_squeue_lists_it() {
        // What the test cluster's Slurm 22.05 printed.
        let record = parse_job("2|1000|RUNNING|n[1-2]|n1\n").expect("parsed");
        assert_eq!(
            record,
            JobRecord {
                job: "2".into(),
                uid: 1000,
                state: "RUNNING".into(),
                nodes: vec!["n1".into(), "n2".into()],
                batch_host: Some("n1".into()),
            }
        );
        assert_eq!(parse_job(""), None);
        assert_eq!(parse_job("2|x|RUNNING|n1|n1"), None);
        assert_eq!(parse_job("2|1000|RUNNING|n1"), None, "a field missing");
    }

    #[test]
    fn a_step_is_found_among_its_jobs_steps() {
        let text = "2.0|1000|n[1-2]\n2.batch|1000|n1\n";
        let job = JobId::parse("2").unwrap();
        let step = parse_step(text, &job, &StepId::parse("batch").unwrap()).expect("batch");
        assert_eq!(step.nodes, ["n1"]);
        let step = parse_step(text, &job, &StepId::parse("0").unwrap()).expect("step 0");
        assert_eq!(step.nodes, ["n1", "n2"]);
        assert_eq!(parse_step(text, &job, &StepId::parse("1").unwrap()), None);
        assert_eq!(
            parse_step(
                text,
                &JobId::parse("20").unwrap(),
                &StepId::parse("0").unwrap()
            ),
            None,
            "job 20's step 0 is not job 2's"
        );
    }

    #[test]
    fn root_acts_only_on_a_job_slurm_runs_here_as_the_user_it_found() {
        let record = parse_job("2|1000|RUNNING|n[1-2]|n1").unwrap();
        assert_eq!(runs_here(&record, 1000, &node("n2")), Ok(()));
        assert!(matches!(
            runs_here(&record, 1001, &node("n2")),
            Err(NotHere::OtherUser {
                slurm: 1000,
                found: 1001,
                ..
            })
        ));
        let err = runs_here(&record, 1000, &node("n3")).expect_err("not on n3");
        assert_eq!(
            err.to_string(),
            "Slurm says job 2 runs on n1,n2, not on this node (n3)"
        );
        let done = parse_job("2|1000|COMPLETED|n[1-2]|n1").unwrap();
        assert!(matches!(
            runs_here(&done, 1000, &node("n1")),
            Err(NotHere::NotRunning { .. })
        ));
        let step = parse_step(
            "2.0|1000|n[1-2]",
            &JobId::parse("2").unwrap(),
            &StepId::parse("0").unwrap(),
        )
        .unwrap();
        assert_eq!(step_runs_here(&step, 1000, &node("n1")), Ok(()));
        assert!(step_runs_here(&step, 1000, &node("n3")).is_err());
        assert!(step_runs_here(&step, 0, &node("n1")).is_err());
    }
}
