//! `--action requeue` on Slurm, at the edges: reading the record of earlier attempts at start, and after a hung
//! attempt was ended, submitting the next attempt with the bad nodes kept out (or giving up when the restart
//! budget is spent). The decision is `hangwatch_diagnosis::requeue`'s; this module only talks to Slurm.
//!
//! The next attempt is a new job, not a requeue of this one: Slurm starts a requeued job again only once it has
//! left COMPLETING on every node, which a rank stuck in D delays until the node gives up on it (KillWait +
//! UnkillableStepTimeout, 90 s by default), and then holds it another 121 s (the credential lifetime) before a
//! scheduler pass picks it up: 143 s on an idle test cluster, minutes on a real one. A new job with the same
//! batch script and options, `--exclude`ing the bad nodes, runs in seconds (docs/requeue.md).
//!
//! Every `scontrol`/`sbatch` runs as a child under a deadline: a slurmctld that does not answer must not hold
//! hangwatch's exit. What could not be done is told as the exact commands an operator would run. Nothing here
//! prints: the lines for a person go to the caller's [`Tell`].

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use hangwatch_child::{external_command, run_with_deadline, ChildOutcome};
use hangwatch_diagnosis::requeue::{decide_requeue, AttemptRecord, RequeueDecision, RequeueInput};
use hangwatch_model::exit::EXIT_HUNG;
use hangwatch_model::{ActionRecord, Verdict};

use crate::job_json::SlurmJobJson;

/// How long one Slurm command may take.
const SLURM_DEADLINE: Duration = Duration::from_secs(15);

/// Exit code of `run` when the job hung again and the restart budget is spent: no next attempt (SPEC "Exit
/// codes").
pub use hangwatch_model::exit::EXIT_BUDGET_SPENT;

/// The environment variables a restarted attempt's ranks get, so that the job can tell it is a restart.
pub const ENV_ATTEMPT: &str = "HANGWATCH_ATTEMPT";
pub const ENV_PREVIOUS_KIND: &str = "HANGWATCH_PREVIOUS_VERDICT";
pub const ENV_EXCLUDED: &str = "HANGWATCH_EXCLUDED_NODES";

/// Where the requeue's lines for a person go: composed here, printed by the binary.
pub trait Tell {
    /// One line (or a few) for the person watching the job.
    fn line(&mut self, line: String);
    /// This process is about to cancel its own job, which ends it: what was told must be out by then.
    fn before_ending_this_job(&mut self) {}
}

/// The job this attempt runs as.
#[derive(Debug, Clone)]
pub struct SlurmJob {
    pub id: String,
    /// `SLURM_RESTART_COUNT` (0 unless Slurm itself requeued the job).
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

    /// This attempt's number: one after the record's, else Slurm's restart count + 1.
    pub fn attempt(&self, previous: Option<&AttemptRecord>) -> u32 {
        previous.map_or(self.restart_count + 1, |p| p.attempt + 1)
    }
}

/// Why a Slurm command gave nothing.
#[derive(Debug)]
enum SlurmError {
    /// No answer within [`SLURM_DEADLINE`]: asking again (another way) would only wait as long again.
    NoAnswer,
    /// It ran and refused, or could not be started: its words.
    Failed(String),
}

impl std::fmt::Display for SlurmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlurmError::NoAnswer => write!(
                f,
                "no answer within {}s (is slurmctld reachable?)",
                SLURM_DEADLINE.as_secs()
            ),
            SlurmError::Failed(why) => f.write_str(why),
        }
    }
}

/// Runs a Slurm command under the deadline; its stdout, or what went wrong in words.
fn slurm(
    program: &str,
    args: &[String],
    env: Option<&[(String, String)]>,
) -> Result<String, String> {
    slurm_call(program, args, env).map_err(|e| e.to_string())
}

fn slurm_call(
    program: &str,
    args: &[String],
    env: Option<&[(String, String)]>,
) -> Result<String, SlurmError> {
    let mut command = external_command(program);
    command.args(args);
    if let Some(env) = env {
        command.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    }
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
                Err(SlurmError::Failed(if err.is_empty() {
                    format!("exited with {status}")
                } else {
                    err
                }))
            }
        }
        Ok(ChildOutcome::TimedOut { .. }) => Err(SlurmError::NoAnswer),
        Err(e) => Err(SlurmError::Failed(format!("{program}: {e}"))),
    }
}

/// A job as `scontrol show job -o` prints it: KEY=VALUE fields on one line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ShownJob {
    fields: BTreeMap<String, String>,
}

impl ShownJob {
    /// Splits at each ` Key=` whose key starts with a capital letter (Slurm's field names); anything else is
    /// part of the value before it, so values with spaces (a command, a comment) stay whole.
    fn parse(line: &str) -> Self {
        let mut fields = BTreeMap::new();
        let mut current: Option<(String, String)> = None;
        for token in line.split_whitespace() {
            let starts_field = token
                .split_once('=')
                .is_some_and(|(k, _)| k.starts_with(|c: char| c.is_ascii_uppercase()));
            match (starts_field, current.as_mut()) {
                (false, Some((_, value))) => {
                    value.push(' ');
                    value.push_str(token);
                }
                (false, None) => {}
                (true, _) => {
                    if let Some((k, v)) = current.take() {
                        fields.insert(k, v);
                    }
                    let (k, v) = token.split_once('=').unwrap_or((token, ""));
                    current = Some((k.to_string(), v.to_string()));
                }
            }
        }
        if let Some((k, v)) = current {
            fields.insert(k, v);
        }
        Self { fields }
    }

    /// A field's value, `None` when absent or unset (`(null)`, `N/A`, empty).
    fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty() && *v != "(null)" && *v != "N/A")
    }

    fn comment(&self) -> &str {
        self.get("Comment").unwrap_or_default()
    }

    fn excluded(&self) -> Vec<String> {
        self.get("ExcNodeList")
            .map(crate::step::expand_hosts)
            .unwrap_or_default()
    }
}

fn show_job(id: &str) -> Result<ShownJob, String> {
    show_job_with(id, &mut ask_slurm)
}

/// Runs a Slurm command with hangwatch's environment: the edge that [`read_job_with`] is given.
fn ask_slurm(program: &str, args: &[String]) -> Result<String, SlurmError> {
    slurm_call(program, args, None)
}

/// How a reader asks Slurm: `program` with `args`, its stdout (tests answer as a given Slurm version would).
type Ask<'a> = dyn FnMut(&str, &[String]) -> Result<String, SlurmError> + 'a;

fn show_job_with(id: &str, ask: &mut Ask) -> Result<ShownJob, String> {
    let out = ask(
        "scontrol",
        &["show".into(), "job".into(), "-o".into(), id.into()],
    )
    .map_err(|e| e.to_string())?;
    Ok(ShownJob::parse(out.lines().next().unwrap_or_default()))
}

/// What the next attempt is submitted like: Slurm's JSON of this job, or, where this Slurm prints none, the text
/// of `scontrol show job` (which keeps fewer options: [`TEXT_LOSES`]).
#[derive(Debug, Clone)]
enum JobSource {
    Json(Box<SlurmJobJson>),
    Text(ShownJob),
}

/// What a submission from the text of `scontrol show job` may lose, said when it must be used.
const TEXT_LOSES: &str =
    "--constraint, --exclusive, --reservation, --gpus*, --mem-per-cpu, --array, --dependency, \
    --nodelist, --mail-*, --licenses and others";

impl JobSource {
    fn comment(&self) -> &str {
        match self {
            JobSource::Json(j) => j.comment(),
            JobSource::Text(t) => t.comment(),
        }
    }

    fn excluded(&self) -> Vec<String> {
        match self {
            JobSource::Json(j) => j.excluded(),
            JobSource::Text(t) => t.excluded(),
        }
    }
}

/// This job as Slurm's JSON says it, its warnings told.
fn read_job(id: &str, tell: &mut dyn Tell) -> Result<JobSource, String> {
    let (job, warnings) = read_job_with(id, &mut ask_slurm)?;
    for warning in warnings {
        tell.line(warning);
    }
    Ok(job)
}

/// This job as Slurm's JSON says it: `scontrol --json show job` (Slurm 23.02+), else `squeue --json` (21.08+),
/// else the text of `scontrol show job`, with a warning naming what may be lost. A Slurm that does not answer is
/// asked once, not three times. Returns the job and the warnings to say.
fn read_job_with(id: &str, ask: &mut Ask) -> Result<(JobSource, Vec<String>), String> {
    let mut why = Vec::new();
    let mut warnings = Vec::new();
    let asks: [(&str, Vec<String>); 2] = [
        (
            "scontrol",
            vec!["--json".into(), "show".into(), "job".into(), id.into()],
        ),
        ("squeue", vec!["--json".into(), format!("--jobs={id}")]),
    ];
    for (program, args) in asks {
        match ask(program, &args) {
            Ok(out) => match SlurmJobJson::parse(&out, id) {
                Ok(job) => {
                    if job.is_heterogeneous() {
                        warnings.push(format!(
                            "hangwatch: warning: job {id} is part of a heterogeneous job: the next attempt is \
                             submitted with this part's options only"
                        ));
                    }
                    let job = if job.lacks_mail() {
                        // 22.05's JSON has no mail settings; its text does.
                        match show_job_with(id, ask) {
                            Ok(shown) => {
                                job.with_mail(shown.get("MailUser"), shown.get("MailType"))
                            }
                            Err(_) => job,
                        }
                    } else {
                        job
                    };
                    return Ok((JobSource::Json(Box::new(job)), warnings));
                }
                Err(e) => why.push(format!("{program} --json: {e}")),
            },
            Err(SlurmError::NoAnswer) => return Err(SlurmError::NoAnswer.to_string()),
            Err(SlurmError::Failed(e)) => why.push(format!(
                "{program} --json: {}",
                e.lines().next().unwrap_or_default()
            )),
        }
    }
    let shown = show_job_with(id, ask)?;
    warnings.push(format!(
        "hangwatch: warning: Slurm gives no JSON of job {id} here ({}); the next attempt is submitted from `scontrol \
         show job` and may lose {TEXT_LOSES}: put those in the batch script as #SBATCH lines",
        why.join("; ")
    ));
    Ok((JobSource::Text(shown), warnings))
}

/// While an attempt waits for the storage that hung the one before: the job's comment says so (`still`: the
/// mounts that do not answer yet, `None` once they do), so that `squeue -o %k` shows why the job does nothing.
pub fn note_storage_wait(
    job: &SlurmJob,
    record: &AttemptRecord,
    still: Option<&[String]>,
    waited: Duration,
) {
    let Ok(shown) = show_job(&job.id) else {
        return;
    };
    let note = AttemptRecord {
        waiting: still.map(|m| {
            format!(
                "{} (silent for {})",
                m.join(","),
                hangwatch_model::format_duration(waited)
            )
        }),
        ..record.clone()
    };
    let comment = note.into_comment(shown.comment());
    if let Err(e) = slurm(
        "scontrol",
        &[
            "update".into(),
            format!("JobId={}", job.id),
            format!("Comment={comment}"),
        ],
        None,
    ) {
        tracing::warn!(job = %job.id, error = %e, "cannot note the storage wait in the job's comment");
    }
}

/// At the start of an attempt: what the previous one left in the job's comment (`None`: nothing, a first
/// attempt), or why the job could not be read.
pub fn previous_attempt(job: &SlurmJob) -> Result<Option<AttemptRecord>, String> {
    Ok(AttemptRecord::from_comment(show_job(&job.id)?.comment()))
}

/// The variables that tell an attempt's ranks what came before it: what a next attempt is submitted with, so
/// that every node of it has them (only node rank 0 reads the record).
fn attempt_env(record: &AttemptRecord) -> [(String, String); 3] {
    [
        (ENV_ATTEMPT.to_string(), (record.attempt + 1).to_string()),
        (
            ENV_PREVIOUS_KIND.to_string(),
            record.kind.as_str().to_string(),
        ),
        (ENV_EXCLUDED.to_string(), record.excluded.join(",")),
    ]
}

/// What this attempt's ranks get besides the job's own environment: `HANGWATCH_ATTEMPT` on a first attempt (or
/// one Slurm requeued by itself); a next attempt hangwatch submitted has all of `attempt_env` already.
pub fn restart_env(job: &SlurmJob, get: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    if get(ENV_ATTEMPT).is_some() {
        return Vec::new();
    }
    vec![(ENV_ATTEMPT.to_string(), job.attempt(None).to_string())]
}

/// `sbatch` options that submit the next attempt as this one was: what Slurm's JSON (or, without it, `scontrol show
/// job`) keeps of the original command line (the batch script's own `#SBATCH` lines come with the script), plus
/// the exclusions, the record, and appending to the same output files.
fn next_attempt_options(job: &JobSource, excluded: &[String], comment: &str) -> Vec<String> {
    let mut args = vec!["--parsable".to_string()];
    let shown = match job {
        JobSource::Json(j) => {
            args.extend(j.options(excluded));
            return finish_options(args, excluded, comment);
        }
        JobSource::Text(shown) => shown,
    };
    let mut opt = |flag: &str, value: Option<&str>| {
        if let Some(v) = value {
            args.push(format!("{flag}={v}"));
        }
    };
    opt("--job-name", shown.get("JobName"));
    opt("--partition", shown.get("Partition"));
    opt("--account", shown.get("Account"));
    opt("--qos", shown.get("QOS"));
    opt("--nodes", shown.get("NumNodes"));
    opt(
        "--ntasks-per-node",
        shown
            .get("NtasksPerN:B:S:C")
            .and_then(|v| v.split(':').next())
            .filter(|n| *n != "0"),
    );
    opt(
        "--cpus-per-task",
        shown.get("CPUs/Task").filter(|n| *n != "1"),
    );
    opt(
        "--time",
        shown.get("TimeLimit").filter(|t| *t != "UNLIMITED"),
    );
    opt("--mem", shown.get("MinMemoryNode").filter(|m| *m != "0"));
    opt(
        "--gres",
        shown
            .get("TresPerNode")
            .map(|t| t.strip_prefix("gres:").unwrap_or(t)),
    );
    opt("--chdir", shown.get("WorkDir"));
    opt("--output", shown.get("StdOut"));
    opt("--error", shown.get("StdErr"));
    if shown.get("Requeue") == Some("1") {
        args.push("--requeue".into());
    }
    finish_options(args, excluded, comment)
}

/// What every next attempt gets besides the job's own options: the same output files appended to, the nodes kept
/// out, the record.
fn finish_options(mut args: Vec<String>, excluded: &[String], comment: &str) -> Vec<String> {
    args.push("--open-mode=append".into());
    if !excluded.is_empty() {
        args.push(format!("--exclude={}", excluded.join(",")));
    }
    args.push(format!("--comment={comment}"));
    args
}

/// The environment `sbatch` is run with: this process's, which is the job's, without the old job's Slurm
/// variables (sbatch would read `SBATCH_*` as options, and `SLURM_*` would describe the wrong job; the
/// cluster's configuration is kept), with the next attempt's [`attempt_env`].
fn submission_env(record: &AttemptRecord) -> Vec<(String, String)> {
    let next = attempt_env(record);
    std::env::vars()
        .filter(|(k, _)| {
            k == "SLURM_CONF"
                || !(k.starts_with("SLURM_") || k.starts_with("SBATCH_") || k.starts_with("SRUN_"))
        })
        .filter(|(k, _)| !next.iter().any(|(n, _)| n == k))
        .chain(next.iter().cloned())
        .collect()
}

/// What a step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepKind {
    /// `scontrol write batch_script`: the script the next attempt runs.
    KeepScript,
    /// `sbatch`: the next attempt (needs the kept script).
    Submit,
    /// `scontrol update NodeName=... State=DRAIN`.
    Drain,
    /// `scancel` of this attempt's job, last: it ends this process too.
    EndThisJob,
}

impl StepKind {
    fn program(self) -> &'static str {
        match self {
            StepKind::KeepScript | StepKind::Drain => "scontrol",
            StepKind::Submit => "sbatch",
            StepKind::EndThisJob => "scancel",
        }
    }
}

/// One command to carry out, with what it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Step {
    kind: StepKind,
    args: Vec<String>,
    what: String,
}

impl Step {
    /// As an operator would type it.
    fn shell(&self) -> String {
        let quoted: Vec<String> = self
            .args
            .iter()
            .map(|a| {
                if !a.is_empty()
                    && a.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "=,-_/.[]:%".contains(c))
                {
                    a.clone()
                } else {
                    format!("'{}'", a.replace('\'', "'\\''"))
                }
            })
            .collect();
        format!("{} {}", self.kind.program(), quoted.join(" "))
    }
}

/// The commands for the next attempt, in order.
fn steps(
    job: &SlurmJob,
    shown: &JobSource,
    record: &AttemptRecord,
    newly_excluded: &[String],
    drain: bool,
    script: &Path,
    release_now: bool,
) -> Vec<Step> {
    let mut excluded = shown.excluded();
    for n in &record.excluded {
        if !excluded.contains(n) {
            excluded.push(n.clone());
        }
    }
    let mut sbatch = next_attempt_options(shown, &excluded, &record.into_comment(shown.comment()));
    sbatch.push(script.display().to_string());
    let mut out = vec![
        Step {
            kind: StepKind::KeepScript,
            args: vec![
                "write".into(),
                "batch_script".into(),
                job.id.clone(),
                script.display().to_string(),
            ],
            what: "keep this job's batch script for the next attempt".into(),
        },
        Step {
            kind: StepKind::Submit,
            args: sbatch,
            what: if excluded.is_empty() {
                "submit the next attempt".into()
            } else {
                format!("submit the next attempt without {}", excluded.join(", "))
            },
        },
    ];
    if drain {
        for node in newly_excluded {
            out.push(Step {
                kind: StepKind::Drain,
                args: vec![
                    "update".into(),
                    format!("NodeName={node}"),
                    "State=DRAIN".into(),
                    format!("Reason=hangwatch: {}", record.cause),
                ],
                what: format!("drain {node}"),
            });
        }
    }
    if release_now {
        // A rank that cannot be killed holds its step, so the batch script's srun, so this whole job (and its
        // healthy nodes) until Slurm gives up on that rank. Cancelled, the job gives its other nodes back at
        // once; only the stuck node stays COMPLETING. Last: it ends this process too.
        out.push(Step {
            kind: StepKind::EndThisJob,
            args: vec![job.id.clone()],
            what: format!(
                "end job {} now, so that its healthy nodes are free for the next attempt",
                job.id
            ),
        });
    }
    out
}

/// After hangwatch ended a hung attempt: decides, and carries out what it can. Returns the exit code of `run`:
/// 75 (this attempt hung; the next one is submitted, or could not be), [`EXIT_BUDGET_SPENT`] when the budget is
/// spent, with what was done. `dir` is node-local and private: the batch script is kept there. What happens is
/// told to `tell` as it happens.
#[expect(
    clippy::too_many_arguments,
    reason = "the requeue's inputs, each its own fact"
)]
pub fn after_hang(
    job: &SlurmJob,
    verdict: &Verdict,
    previous: Option<AttemptRecord>,
    last_step: Option<u64>,
    max_requeues: u32,
    drain: bool,
    dir: &Path,
    tell: &mut dyn Tell,
) -> (i32, ActionRecord) {
    let shown = match read_job(&job.id, tell) {
        Ok(shown) => shown,
        Err(e) => {
            tell.line(format!(
                "hangwatch: cannot read job {} from Slurm ({e}); the next attempt cannot be submitted like it",
                job.id
            ));
            return (
                EXIT_HUNG,
                requeue_action(false, format!("cannot read job {} from Slurm: {e}", job.id)),
            );
        }
    };
    let attempt = job.attempt(previous.as_ref());
    let decision = decide_requeue(&RequeueInput {
        verdict,
        attempt,
        previous,
        last_step,
        max_requeues,
    });
    let (record, newly_excluded) = match decision {
        RequeueDecision::GiveUp { record } => {
            tell.line(format!(
                "hangwatch: job {} hung {} times in a row without progress (--max-requeues {max_requeues}): no \
                 next attempt (exit {EXIT_BUDGET_SPENT})",
                job.id, record.without_progress
            ));
            return (
                EXIT_BUDGET_SPENT,
                requeue_action(
                    true,
                    format!(
                        "not requeued: hung {} times in a row without progress (--max-requeues {max_requeues})",
                        record.without_progress
                    ),
                ),
            );
        }
        RequeueDecision::Requeue {
            record,
            newly_excluded,
        } => (record, newly_excluded),
    };
    let script = dir.join(format!("batch-script-{}.sh", job.id));
    let env = submission_env(&record);
    let release_now = verdict.kind == hangwatch_model::VerdictKind::NodeUnreachable
        || verdict.culprits.iter().any(|c| c.killable == Some(false));
    let steps = steps(
        job,
        &shown,
        &record,
        &newly_excluded,
        drain,
        &script,
        release_now,
    );
    let mut failed: Vec<&Step> = Vec::new();
    let mut submitted = None;
    for step in &steps {
        if step.kind == StepKind::Submit && failed.iter().any(|f| f.kind == StepKind::KeepScript) {
            // Without the script there is nothing to submit: the operator gets it to run by hand.
            failed.push(step);
            continue;
        }
        if step.kind == StepKind::EndThisJob {
            tell.line(format!(
                "hangwatch: ending job {} (exit 75 for this attempt; the stuck rank's node stays COMPLETING until \
                 Slurm gives up on it)",
                job.id
            ));
            tell.before_ending_this_job();
        }
        let env = (step.kind == StepKind::Submit).then_some(env.as_slice());
        match slurm(step.kind.program(), &step.args, env) {
            Ok(out) if step.kind == StepKind::Submit => {
                let new_id = out.trim().split(';').next().unwrap_or_default().to_string();
                submitted = Some(new_id.clone());
                tell.line(format!(
                    "hangwatch: attempt {} submitted as job {new_id}{}",
                    attempt + 1,
                    if record.excluded.is_empty() {
                        String::new()
                    } else {
                        format!(" (without {})", record.excluded.join(", "))
                    }
                ));
            }
            Ok(_) => tracing::debug!(command = %step.shell(), "done"),
            Err(e) => {
                tell.line(format!("hangwatch: cannot {}: {e}", step.what));
                failed.push(step);
            }
        }
    }
    if !failed.is_empty() {
        let commands: Vec<String> = failed.iter().map(|s| format!("  {}", s.shell())).collect();
        tell.line(format!(
            "hangwatch: not everything could be done; an operator can run:\n{}",
            commands.join("\n")
        ));
    }
    let without = if record.excluded.is_empty() {
        String::new()
    } else {
        format!(" without {}", record.excluded.join(", "))
    };
    let detail = match submitted {
        Some(id) => format!("attempt {} submitted as job {id}{without}", attempt + 1),
        None => format!("attempt {} could not be submitted", attempt + 1),
    };
    let detail = if failed.is_empty() {
        detail
    } else {
        let what: Vec<&str> = failed.iter().map(|s| s.what.as_str()).collect();
        format!("{detail}; failed: {}", what.join("; "))
    };
    (EXIT_HUNG, requeue_action(failed.is_empty(), detail))
}

/// What `--action requeue` did, for the verdict's actions and the acted alert.
fn requeue_action(ok: bool, detail: String) -> ActionRecord {
    ActionRecord {
        action: "requeue".into(),
        ranks: Vec::new(),
        ok,
        detail: Some(detail),
        outcomes: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::VerdictKind;

    const SHOWN: &str = "JobId=7 JobName=train job UserId=root(0) Priority=1 Account=(null) QOS=(null) \
        JobState=RUNNING Requeue=1 Restarts=0 TimeLimit=01:00:00 Partition=debug ExcNodeList=n9 \
        NodeList=n[1-2] NumNodes=2 NumCPUs=2 CPUs/Task=1 NtasksPerN:B:S:C=1:0:*:* MinMemoryNode=0 \
        TresPerNode=gres:gpu:8 Command=/home/u/job.sh --lr 3e-4 WorkDir=/home/u \
        Comment=my run hangwatch: attempt=1 kind=busy step=3 without_progress=1 excluded=- cause=rank 0 \
        StdErr=/home/u/slurm-7.out StdOut=/home/u/slurm-7.out Power=";

    #[test]
    fn scontrol_show_job_parses_with_spaces_in_values() {
        let shown = ShownJob::parse(SHOWN);
        assert_eq!(shown.get("JobName"), Some("train job"));
        assert_eq!(shown.get("Command"), Some("/home/u/job.sh --lr 3e-4"));
        assert_eq!(
            shown.comment(),
            "my run hangwatch: attempt=1 kind=busy step=3 without_progress=1 excluded=- cause=rank 0"
        );
        assert_eq!(shown.get("Account"), None);
        assert_eq!(shown.excluded(), vec!["n9"]);
        assert_eq!(
            AttemptRecord::from_comment(shown.comment()).map(|r| r.attempt),
            Some(1)
        );
    }

    #[test]
    fn the_next_attempt_is_submitted_like_this_one_without_the_bad_nodes() {
        let shown = JobSource::Text(ShownJob::parse(SHOWN));
        let job = SlurmJob {
            id: "7".into(),
            restart_count: 0,
        };
        let record = AttemptRecord {
            attempt: 2,
            kind: VerdictKind::BlockedInKernel,
            last_step: Some(7),
            without_progress: 1,
            excluded: vec!["n2".into()],
            cause: "rank 1 on n2 in write()".into(),
            scope: None,
            mounts: Vec::new(),
            waiting: None,
        };
        let shells: Vec<String> = steps(
            &job,
            &shown,
            &record,
            &["n2".to_string()],
            true,
            Path::new("/var/tmp/hw/batch-script-7.sh"),
            true,
        )
        .iter()
        .map(Step::shell)
        .collect();
        assert_eq!(shells.len(), 4, "{shells:#?}");
        assert_eq!(shells[3], "scancel 7", "the stuck job is ended last");
        assert_eq!(
            shells[0],
            "scontrol write batch_script 7 /var/tmp/hw/batch-script-7.sh"
        );
        assert_eq!(
            shells[1],
            "sbatch --parsable '--job-name=train job' --partition=debug --nodes=2 --ntasks-per-node=1 \
             --time=01:00:00 --gres=gpu:8 --chdir=/home/u --output=/home/u/slurm-7.out \
             --error=/home/u/slurm-7.out --requeue --open-mode=append --exclude=n9,n2 \
             '--comment=my run hangwatch: attempt=2 kind=blocked_in_kernel step=7 without_progress=1 \
             excluded=n2 cause=rank 1 on n2 in write()' /var/tmp/hw/batch-script-7.sh"
        );
        assert_eq!(
            shells[2],
            "scontrol update NodeName=n2 State=DRAIN 'Reason=hangwatch: rank 1 on n2 in write()'"
        );
    }

    #[test]
    fn from_slurms_json_the_next_attempt_keeps_the_options_the_text_loses() {
        let json = include_str!("../tests/fixtures/squeue-json-slurm-22.05.8.json");
        let shown = JobSource::Json(Box::new(SlurmJobJson::parse(json, "5").expect("job 5")));
        let job = SlurmJob {
            id: "5".into(),
            restart_count: 0,
        };
        let record = AttemptRecord::from_comment(
            "hangwatch: attempt=1 kind=blocked_in_kernel step=7 without_progress=1 excluded=n2 cause=rank 1",
        )
        .expect("record");
        let shells: Vec<String> = steps(
            &job,
            &shown,
            &record,
            &["n2".to_string()],
            false,
            Path::new("/var/tmp/hw/batch-script-5.sh"),
            false,
        )
        .iter()
        .map(Step::shell)
        .collect();
        assert_eq!(
            shells[1],
            "sbatch --parsable '--job-name=train job' --partition=debug '--constraint=fast&ib' \
             --reservation=hwres --chdir=/tmp/rqj --output=/tmp/rqj/a-4_3.out --nodes=1 --ntasks=1 \
             --ntasks-per-node=1 --time=30 --array=3 --mem-per-cpu=100M --nice=5 --exclusive --requeue \
             --open-mode=append --exclude=n3,n2 '--comment=my run hangwatch: attempt=1 \
             kind=blocked_in_kernel step=7 without_progress=1 excluded=n2 cause=rank 1' \
             /var/tmp/hw/batch-script-5.sh"
        );
    }

    /// A Slurm of one version, as `read_job_with` asks it: what each command answers, and what was asked.
    struct FakeSlurm {
        scontrol_json: Result<String, &'static str>,
        squeue_json: Result<String, &'static str>,
        text: Result<String, &'static str>,
        asked: Vec<String>,
    }

    impl FakeSlurm {
        fn ask(&mut self, program: &str, args: &[String]) -> Result<String, SlurmError> {
            let line = format!("{program} {}", args.join(" "));
            self.asked.push(line.clone());
            let answer = match (program, args.first().map(String::as_str)) {
                ("scontrol", Some("--json")) => &self.scontrol_json,
                ("squeue", Some("--json")) => &self.squeue_json,
                ("scontrol", Some("show")) => &self.text,
                _ => panic!("unexpected {line}"),
            };
            match answer {
                Ok(out) => Ok(out.clone()),
                Err("timeout") => Err(SlurmError::NoAnswer),
                Err(e) => Err(SlurmError::Failed(e.to_string())),
            }
        }

        fn read(&mut self, id: &str) -> Result<(JobSource, Vec<String>), String> {
            read_job_with(id, &mut |p: &str, a: &[String]| self.ask(p, a))
        }
    }

    const SQUEUE_JSON: &str = include_str!("../tests/fixtures/squeue-json-slurm-22.05.8.json");
    const SCONTROL_JSON: &str = include_str!("../tests/fixtures/scontrol-json-slurm-23-shape.json");

    #[test]
    fn slurm_23_answers_scontrol_json_and_nothing_else_is_asked() {
        let mut slurm = FakeSlurm {
            scontrol_json: Ok(SCONTROL_JSON.into()),
            squeue_json: Err("not asked"),
            text: Err("not asked"),
            asked: Vec::new(),
        };
        let (job, warnings) = slurm.read("5").expect("job");
        assert!(matches!(job, JobSource::Json(_)));
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(slurm.asked, ["scontrol --json show job 5"]);
    }

    #[test]
    fn slurm_22_05_answers_squeue_json_and_the_text_for_mail() {
        let mut slurm = FakeSlurm {
            scontrol_json: Err("scontrol: unrecognized option '--json'"),
            squeue_json: Ok(SQUEUE_JSON.into()),
            text: Ok("JobId=5 JobName=x MailUser=a@b MailType=END".into()),
            asked: Vec::new(),
        };
        let (job, warnings) = slurm.read("5").expect("job");
        assert!(warnings.is_empty(), "{warnings:?}");
        let JobSource::Json(job) = job else {
            panic!("not from JSON");
        };
        assert!(job.options(&[]).contains(&"--mail-type=END".to_string()));
        assert_eq!(
            slurm.asked,
            [
                "scontrol --json show job 5",
                "squeue --json --jobs=5",
                "scontrol show job -o 5"
            ]
        );
    }

    #[test]
    fn without_json_the_text_is_used_and_the_warning_names_what_may_be_lost() {
        let mut slurm = FakeSlurm {
            scontrol_json: Err("scontrol: unrecognized option '--json'\nTry scontrol --help"),
            squeue_json: Err("squeue: unrecognized option '--json'"),
            text: Ok(SHOWN.into()),
            asked: Vec::new(),
        };
        let (job, warnings) = slurm.read("7").expect("job");
        assert!(matches!(job, JobSource::Text(_)));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        for said in [
            "Slurm gives no JSON of job 7",
            "scontrol --json: scontrol: unrecognized option '--json';",
            "--constraint, --exclusive, --reservation, --gpus*, --mem-per-cpu, --array, --dependency",
            "#SBATCH",
        ] {
            assert!(warnings[0].contains(said), "{said:?} not in {}", warnings[0]);
        }
    }

    #[test]
    fn a_slurm_that_does_not_answer_is_asked_once() {
        let mut slurm = FakeSlurm {
            scontrol_json: Err("timeout"),
            squeue_json: Ok(SQUEUE_JSON.into()),
            text: Ok(SHOWN.into()),
            asked: Vec::new(),
        };
        let err = slurm.read("5").map(|_| ()).expect_err("no answer");
        assert!(err.contains("no answer within 15s"), "{err}");
        assert_eq!(slurm.asked.len(), 1, "{:?}", slurm.asked);
    }

    #[test]
    fn the_attempt_number_follows_the_record_else_slurms_restarts() {
        let job = SlurmJob {
            id: "7".into(),
            restart_count: 2,
        };
        assert_eq!(job.attempt(None), 3);
        let record = AttemptRecord::from_comment("hangwatch: attempt=4 kind=busy").unwrap();
        assert_eq!(job.attempt(Some(&record)), 5);
    }

    #[test]
    fn a_first_attempt_is_numbered_and_a_submitted_one_keeps_its_numbers() {
        let job = SlurmJob {
            id: "7".into(),
            restart_count: 0,
        };
        assert_eq!(
            restart_env(&job, |_| None),
            vec![(ENV_ATTEMPT.to_string(), "1".to_string())]
        );
        assert!(restart_env(&job, |k| (k == ENV_ATTEMPT).then(|| "3".to_string())).is_empty());
    }

    #[test]
    fn the_submission_keeps_the_slurm_config_and_drops_the_old_jobs_variables() {
        let record =
            AttemptRecord::from_comment("hangwatch: attempt=2 kind=stopped excluded=n2,n5")
                .unwrap();
        let env = submission_env(&record);
        assert!(env
            .iter()
            .all(|(k, _)| k == "SLURM_CONF" || !k.starts_with("SLURM_")));
        let get = |k: &str| {
            let mut values = env.iter().filter(|(n, _)| n == k).map(|(_, v)| v.as_str());
            let value = values.next();
            assert!(values.next().is_none(), "{k} twice");
            value
        };
        // Every node of the next attempt gets them from the job's environment.
        assert_eq!(get(ENV_ATTEMPT), Some("3"));
        assert_eq!(get(ENV_PREVIOUS_KIND), Some("stopped"));
        assert_eq!(get(ENV_EXCLUDED), Some("n2,n5"));
    }
}
