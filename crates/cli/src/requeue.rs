//! `--action requeue` on Slurm, at the edges: reading the job's record of earlier attempts at start, and after a
//! hung attempt was ended, keeping the bad nodes out of the job, leaving the record for the next attempt and
//! requeueing it (or giving up when the restart budget is spent). The decision is
//! `hangwatch_diagnosis::requeue`'s; this module only talks to Slurm.
//!
//! Every `scontrol`/`squeue` runs as a child under a deadline: a slurmctld that does not answer must not hold
//! hangwatch's exit. What could not be done is printed as the exact command an operator would run.

use std::process::Command;
use std::time::Duration;

use hangwatch_agent::human::say;
use hangwatch_diagnosis::requeue::{decide_requeue, AttemptRecord, RequeueDecision, RequeueInput};
use hangwatch_inspect::child::{run_with_deadline, ChildOutcome};
use hangwatch_model::Verdict;

/// How long one Slurm command may take.
const SLURM_DEADLINE: Duration = Duration::from_secs(15);

/// Exit code of `run` when the job hung again and the restart budget is spent: not requeued (SPEC "Exit codes").
pub const EXIT_BUDGET_SPENT: i32 = 76;

/// The environment variables a restarted attempt's ranks get, so that the job can tell it is a restart.
pub const ENV_ATTEMPT: &str = "HANGWATCH_ATTEMPT";
pub const ENV_PREVIOUS_KIND: &str = "HANGWATCH_PREVIOUS_VERDICT";
pub const ENV_EXCLUDED: &str = "HANGWATCH_EXCLUDED_NODES";

/// The job this attempt runs as.
#[derive(Debug, Clone)]
pub struct SlurmJob {
    pub id: String,
    /// `SLURM_RESTART_COUNT` (0 for the first attempt).
    pub restart_count: u32,
}

impl SlurmJob {
    /// The Slurm job around this process, if there is one.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let id = get("SLURM_JOB_ID").filter(|v| !v.is_empty())?;
        let restart_count = get("SLURM_RESTART_COUNT")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        Some(Self { id, restart_count })
    }
}

/// The job's fields that matter here, as Slurm has them now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct JobFields {
    comment: String,
    excluded: Vec<String>,
}

/// Runs a Slurm command under the deadline; its stdout, or what went wrong in words.
fn slurm(program: &str, args: &[String]) -> Result<String, String> {
    let mut command = Command::new(program);
    command.args(args);
    match run_with_deadline(command, SLURM_DEADLINE) {
        Ok(ChildOutcome::Finished {
            status,
            stdout,
            stderr,
            ..
        }) => {
            if status.success() {
                Ok(String::from_utf8_lossy(&stdout).into_owned())
            } else {
                let err = String::from_utf8_lossy(&stderr).trim().to_string();
                Err(if err.is_empty() {
                    format!("exited with {status}")
                } else {
                    err
                })
            }
        }
        Ok(ChildOutcome::TimedOut { .. }) => Err(format!(
            "no answer within {}s (is slurmctld reachable?)",
            SLURM_DEADLINE.as_secs()
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// `squeue`'s view of the job: its excluded nodes and its comment (`%x|%k`: the comment last, since it may hold
/// anything).
fn read_job(id: &str) -> Result<JobFields, String> {
    let out = slurm(
        "squeue",
        &[
            "-h".into(),
            "-j".into(),
            id.into(),
            "-o".into(),
            "%x|%k".into(),
        ],
    )?;
    Ok(parse_job_line(out.lines().next().unwrap_or_default()))
}

fn parse_job_line(line: &str) -> JobFields {
    let (excluded, comment) = line.split_once('|').unwrap_or((line, ""));
    let none = |v: &str| v.is_empty() || v == "(null)";
    JobFields {
        comment: if none(comment.trim()) {
            String::new()
        } else {
            comment.trim().to_string()
        },
        excluded: if none(excluded.trim()) {
            Vec::new()
        } else {
            expand_nodes(excluded.trim())
        },
    }
}

/// Node names from Slurm's host-list syntax (`n[1-3],gpu7`).
fn expand_nodes(list: &str) -> Vec<String> {
    crate::slurm::expand_hosts(list)
}

/// At the start of an attempt: what the previous one left, said in one line and exported to the ranks.
pub fn previous_attempt(job: &SlurmJob) -> Option<AttemptRecord> {
    if job.restart_count == 0 {
        return None;
    }
    match read_job(&job.id) {
        Ok(fields) => {
            let record = AttemptRecord::from_comment(&fields.comment)?;
            say(format!(
                "hangwatch: attempt {} of job {}: {}",
                job.restart_count + 1,
                job.id,
                record.summary()
            ));
            Some(record)
        }
        Err(e) => {
            say(format!(
                "hangwatch: attempt {} of job {}: could not read what the previous attempt left: {e}",
                job.restart_count + 1,
                job.id
            ));
            None
        }
    }
}

/// The environment for a restarted attempt's ranks.
pub fn restart_env(job: &SlurmJob, previous: Option<&AttemptRecord>) -> Vec<(String, String)> {
    let mut env = vec![(ENV_ATTEMPT.to_string(), (job.restart_count + 1).to_string())];
    if let Some(p) = previous {
        env.push((ENV_PREVIOUS_KIND.to_string(), p.kind.as_str().to_string()));
        env.push((ENV_EXCLUDED.to_string(), p.excluded.join(",")));
    }
    env
}

/// One Slurm command to carry out, with what it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Step {
    args: Vec<String>,
    what: String,
}

impl Step {
    fn scontrol(what: impl Into<String>, args: &[&str]) -> Self {
        Self {
            args: args.iter().map(|a| a.to_string()).collect(),
            what: what.into(),
        }
    }

    /// As an operator would type it.
    fn shell(&self) -> String {
        let quoted: Vec<String> = self
            .args
            .iter()
            .map(|a| {
                if a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "=,-_/.[]:".contains(c))
                {
                    a.clone()
                } else {
                    format!("'{}'", a.replace('\'', "'\\''"))
                }
            })
            .collect();
        format!("scontrol {}", quoted.join(" "))
    }
}

/// The commands for `decision`, in order: the record and the exclusions first (they must be on the job before
/// it can be scheduled again), the requeue last (it ends this step, hangwatch included).
fn steps(job: &SlurmJob, fields: &JobFields, decision: &RequeueDecision, drain: bool) -> Vec<Step> {
    let record = match decision {
        RequeueDecision::Requeue { record, .. } | RequeueDecision::GiveUp { record } => record,
    };
    let mut out = vec![Step::scontrol(
        "leave the record of this attempt on the job",
        &[
            "update",
            &format!("JobId={}", job.id),
            &format!("Comment={}", record.into_comment(&fields.comment)),
        ],
    )];
    let RequeueDecision::Requeue { newly_excluded, .. } = decision else {
        return out;
    };
    let mut excluded = fields.excluded.clone();
    for n in &record.excluded {
        if !excluded.contains(n) {
            excluded.push(n.clone());
        }
    }
    if excluded != fields.excluded {
        out.push(Step::scontrol(
            format!(
                "keep {} out of the next attempt",
                record.excluded.join(", ")
            ),
            &[
                "update",
                &format!("JobId={}", job.id),
                &format!("ExcNodeList={}", excluded.join(",")),
            ],
        ));
    }
    if drain {
        for node in newly_excluded {
            out.push(Step::scontrol(
                format!("drain {node}"),
                &[
                    "update",
                    &format!("NodeName={node}"),
                    "State=DRAIN",
                    &format!("Reason=hangwatch: {}", record.cause),
                ],
            ));
        }
    }
    out.push(Step::scontrol("requeue the job", &["requeue", &job.id]));
    out
}

/// After hangwatch ended a hung attempt: decides, and carries out what it can. Returns the exit code of `run`
/// (75 when requeued or when requeueing failed, [`EXIT_BUDGET_SPENT`] when the budget is spent).
pub fn after_hang(
    job: &SlurmJob,
    verdict: &Verdict,
    previous: Option<AttemptRecord>,
    last_step: Option<u64>,
    max_requeues: u32,
    drain: bool,
) -> i32 {
    let fields = match read_job(&job.id) {
        Ok(fields) => fields,
        Err(e) => {
            say(format!(
                "hangwatch: cannot read job {} from Slurm ({e}); requeueing with what this attempt knows",
                job.id
            ));
            JobFields::default()
        }
    };
    let decision = decide_requeue(&RequeueInput {
        verdict,
        restart_count: job.restart_count,
        previous,
        last_step,
        max_requeues,
    });
    let steps = steps(job, &fields, &decision, drain);
    let mut failed: Vec<&Step> = Vec::new();
    for step in &steps {
        if !failed.is_empty() {
            // A later step without the earlier ones would requeue onto the bad node: leave them to the operator.
            failed.push(step);
            continue;
        }
        match slurm("scontrol", &step.args) {
            Ok(_) => {
                say(format!("hangwatch: {}: done ({})", step.what, step.shell()));
            }
            Err(e) => {
                say(format!("hangwatch: {} failed: {e}", step.what));
                failed.push(step);
            }
        }
    }
    if !failed.is_empty() {
        let commands: Vec<String> = failed.iter().map(|s| format!("  {}", s.shell())).collect();
        say(format!(
            "hangwatch: not everything could be done; an operator can run:\n{}",
            commands.join("\n")
        ));
    }
    match decision {
        RequeueDecision::GiveUp { record } => {
            say(format!(
                "hangwatch: job {} hung {} times in a row without progress (--max-requeues {max_requeues}): not \
                 requeueing it again (exit {EXIT_BUDGET_SPENT})",
                job.id, record.without_progress
            ));
            EXIT_BUDGET_SPENT
        }
        RequeueDecision::Requeue { .. } => hangwatch_agent::supervise::EXIT_HUNG,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::VerdictKind;

    #[test]
    fn squeue_lines_parse_with_and_without_exclusions_and_comments() {
        assert_eq!(parse_job_line("(null)|(null)"), JobFields::default());
        assert_eq!(
            parse_job_line("n[2-3]|my run | with pipes"),
            JobFields {
                comment: "my run | with pipes".into(),
                excluded: vec!["n2".into(), "n3".into()],
            }
        );
    }

    #[test]
    fn requeue_steps_put_the_record_and_exclusions_before_the_requeue() {
        let job = SlurmJob {
            id: "42".into(),
            restart_count: 0,
        };
        let record = AttemptRecord {
            attempt: 1,
            kind: VerdictKind::BlockedInKernel,
            last_step: Some(7),
            without_progress: 1,
            excluded: vec!["n2".into()],
            cause: "rank 0 on n2 in write()".into(),
        };
        let fields = JobFields {
            comment: String::new(),
            excluded: vec!["n9".into()],
        };
        let decision = RequeueDecision::Requeue {
            record: record.clone(),
            newly_excluded: vec!["n2".into()],
        };
        let shells: Vec<String> = steps(&job, &fields, &decision, true)
            .iter()
            .map(Step::shell)
            .collect();
        assert_eq!(shells.len(), 4, "{shells:#?}");
        assert!(shells[0].starts_with("scontrol update JobId=42 'Comment=hangwatch: attempt=1 "));
        assert_eq!(shells[1], "scontrol update JobId=42 ExcNodeList=n9,n2");
        assert_eq!(
            shells[2],
            "scontrol update NodeName=n2 State=DRAIN 'Reason=hangwatch: rank 0 on n2 in write()'"
        );
        assert_eq!(shells[3], "scontrol requeue 42");

        let give_up = RequeueDecision::GiveUp { record };
        let shells: Vec<String> = steps(&job, &fields, &give_up, true)
            .iter()
            .map(Step::shell)
            .collect();
        assert_eq!(
            shells.len(),
            1,
            "giving up only leaves the record: {shells:#?}"
        );
    }
}
