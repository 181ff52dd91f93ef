//! The evidence bundle: everything a person needs after the fact, written to node-local disk (never only to the
//! shared filesystem that may be the culprit).
//!
//! ```text
//! <report-dir>/
//!   verdict.json        the verdict (SPEC "The verdict")
//!   verdict.txt         the same for people
//!   ranks.json          every rank's full observation (threads, wchan, syscall, stacks)
//!   probes.json         filesystem probes
//!   thresholds.json     the stall threshold in force and how it was learned
//!   progress.json       progress over time up to the roll call (the report's timeline)
//!   kernel-log.txt      kernel-log lines since the job started; kernel-report.json: what they say
//!   output/rank-N.txt   the last lines each rank printed
//!   run.json            command, node, start time, hangwatch version
//! ```

use std::path::{Path, PathBuf};

use std::time::Duration;

use hangwatch_diagnosis::{DetectorConfig, ProgressSource, Threshold};
pub use hangwatch_model::error_chain;
use hangwatch_model::{NodeObservations, ProbeResult, ProcessObservation, Verdict};
use hangwatch_safefs::{PrivateDir, SafeFsError};
use serde::Serialize;

/// Everything that goes into one bundle.
pub struct Evidence<'a> {
    pub verdict: &'a Verdict,
    pub observations: &'a [ProcessObservation],
    pub probes: &'a [ProbeResult],
    pub thresholds: &'a ThresholdsRecord,
    pub timeline: &'a hangwatch_model::ProgressTimeline,
    pub kernel_log: &'a str,
    pub kernel_log_unavailable: Option<&'a str>,
    pub tails: &'a [(String, Vec<String>)],
    pub run: &'a RunRecord,
}

/// The files of a bundle, for a report directory that must not hold planted links in their place.
pub const BUNDLE_FILES: &[&str] = &[
    "verdict.json",
    "verdict.txt",
    "ranks.json",
    "probes.json",
    "thresholds.json",
    "progress.json",
    "run.json",
    "kernel-log.txt",
    "kernel-report.json",
    "output",
];

/// `thresholds.json`: the stall threshold in force when the roll call was taken, and how it was learned.
#[derive(Debug, Clone, Serialize)]
pub struct ThresholdsRecord {
    pub stalled_for_s: f64,
    pub hard_s: f64,
    pub soft_s: f64,
    pub basis: String,
    pub phase: Option<String>,
    pub samples: usize,
    pub progress_source: Option<ProgressSource>,
    pub config: DetectorSettings,
}

/// The detector's settings, in seconds.
#[derive(Debug, Clone, Serialize)]
pub struct DetectorSettings {
    pub fixed_s: Option<f64>,
    pub floor_s: f64,
    pub ceiling_s: f64,
    pub warmup_s: f64,
    pub min_samples: usize,
    pub p95_factor: f64,
    pub max_factor: f64,
    pub soft_fraction: f64,
}

impl ThresholdsRecord {
    pub fn new(config: &DetectorConfig, threshold: &Threshold, stalled_for: Duration) -> Self {
        Self {
            stalled_for_s: stalled_for.as_secs_f64(),
            hard_s: threshold.hard.as_secs_f64(),
            soft_s: threshold.soft.as_secs_f64(),
            basis: threshold.basis.clone(),
            phase: threshold.phase.clone(),
            samples: threshold.samples,
            progress_source: threshold.source,
            config: DetectorSettings {
                fixed_s: config.fixed.map(|d| d.as_secs_f64()),
                floor_s: config.floor.as_secs_f64(),
                ceiling_s: config.ceiling.as_secs_f64(),
                warmup_s: config.warmup.as_secs_f64(),
                min_samples: config.min_samples,
                p95_factor: config.p95_factor,
                max_factor: config.max_factor,
                soft_fraction: config.soft_fraction,
            },
        }
    }
}

/// `run.json`: what ran, where, and the counters of what was received and dropped.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    pub hangwatch_version: String,
    pub node: Option<String>,
    pub command: Vec<String>,
    pub nproc: Option<u32>,
    pub pids: Vec<PidRecord>,
    pub running_for_s: f64,
    pub heartbeats: crate::heartbeat::HeartbeatCounts,
    pub console_lines_dropped: Option<u64>,
    /// hangwatch's own messages to stderr dropped because nobody read them.
    pub messages_dropped: u64,
    /// How the roll call behind this verdict went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollcall: Option<RollCallRecord>,
}

/// The roll call's own numbers: how long it took (probes included), its sampling window, what it saw.
#[derive(Debug, Clone, Serialize)]
pub struct RollCallRecord {
    pub took_ms: u64,
    pub window_ms: u64,
    pub processes: usize,
    /// Processes whose first sample was read while the job stalled, before the roll call (it waited no window
    /// for them).
    pub first_sampled_before: u32,
}

impl RollCallRecord {
    /// The numbers of the roll call that produced `observations` (none when it did not say how long it took).
    pub fn of(observations: &NodeObservations) -> Option<Self> {
        Some(Self {
            took_ms: observations.took_ms?,
            window_ms: observations.window_ms,
            processes: observations.processes().count(),
            first_sampled_before: observations.first_sampled_before.unwrap_or(0),
        })
    }
}

/// A process hangwatch started or found, with its rank.
#[derive(Debug, Clone, Serialize)]
pub struct PidRecord {
    pub pid: i32,
    pub rank: Option<u32>,
}

/// One file of the bundle: its name relative to the report directory and its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct EvidenceFile {
    pub name: String,
    pub text: String,
}

impl EvidenceFile {
    /// `value` as pretty JSON under `name`.
    pub fn json<T: Serialize + ?Sized>(name: impl Into<String>, value: &T) -> Self {
        Self::new(name, json(value))
    }

    fn new(name: impl Into<String>, bytes: Vec<u8>) -> Self {
        Self {
            name: name.into(),
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }
}

impl Evidence<'_> {
    /// The bundle's files, in memory (pure: nothing is written).
    pub fn files(&self) -> Vec<EvidenceFile> {
        let mut files = vec![
            EvidenceFile::new("verdict.json", json(self.verdict)),
            EvidenceFile::new(
                "verdict.txt",
                crate::render::verdict_text(self.verdict).into_bytes(),
            ),
            EvidenceFile::new("ranks.json", json(&self.observations)),
            EvidenceFile::new("probes.json", json(&self.probes)),
            EvidenceFile::new("thresholds.json", json(self.thresholds)),
            EvidenceFile::new("progress.json", json(self.timeline)),
            EvidenceFile::new("run.json", json(self.run)),
        ];
        let kernel = match self.kernel_log_unavailable {
            Some(why) => format!("# kernel log not collected: {why}\n"),
            None => self.kernel_log.to_string(),
        };
        files.push(EvidenceFile::new("kernel-log.txt", kernel.into_bytes()));
        let report = hangwatch_kmsg::report_from_text(self.kernel_log);
        files.push(EvidenceFile::new("kernel-report.json", json(&report)));
        for (who, lines) in self.tails {
            let mut text = lines.join("\n");
            text.push('\n');
            files.push(EvidenceFile::new(
                format!("output/{who}.txt"),
                text.into_bytes(),
            ));
        }
        files
    }
}

/// The verdict files alone (after the job was ended, the verdict gains its actions).
pub fn verdict_files(verdict: &Verdict) -> Vec<EvidenceFile> {
    vec![
        EvidenceFile::new("verdict.json", json(verdict)),
        EvidenceFile::new(
            "verdict.txt",
            crate::render::verdict_text(verdict).into_bytes(),
        ),
    ]
}

/// Writes `files` into `dir`, in this process (the `__write-evidence` child's work). Every file is created
/// through [`hangwatch_safefs`]: mode 0600, never through a symlink planted in the report directory; files written
/// at an earlier tier are replaced in place.
pub fn write_files(dir: &Path, files: &[EvidenceFile]) -> Result<Vec<PathBuf>, SafeFsError> {
    let private = PrivateDir::open_or_create(dir)?;
    let mut output: Option<PrivateDir> = None;
    let mut written = Vec::new();
    for file in files {
        let path = match file.name.strip_prefix("output/") {
            Some(name) => {
                if output.is_none() {
                    output = Some(private.subdir("output")?);
                }
                match &output {
                    Some(out) => out.write(name, file.text.as_bytes())?,
                    None => continue,
                }
            }
            None => private.write(&file.name, file.text.as_bytes())?,
        };
        written.push(path);
    }
    Ok(written)
}

/// Why the evidence could not be written.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    #[error("cannot hand the evidence to a writer process")]
    Prepare(#[source] std::io::Error),
    #[error("cannot start the evidence writer")]
    Start(#[source] hangwatch_child::ChildError),
    #[error("the report directory {dir} did not answer within {timeout_s:.0}s (a frozen filesystem?); the evidence there is incomplete")]
    TimedOut { dir: PathBuf, timeout_s: f64 },
    #[error("writing the evidence into {dir} failed: {message}")]
    Failed { dir: PathBuf, message: String },
}

/// Writes `files` into `dir` from a child process that is abandoned at `deadline`: a report directory on a
/// filesystem that froze costs this evidence, never a thread of hangwatch stuck in D (which would keep it from
/// exiting).
pub fn write_abandonable(
    program: &Path,
    dir: &Path,
    files: &[EvidenceFile],
    deadline: std::time::Duration,
) -> Result<(), EvidenceError> {
    let input = serde_json::to_vec(files)
        .map_err(|e| EvidenceError::Prepare(std::io::Error::other(e)))
        .and_then(|bytes| {
            hangwatch_child::input_from_bytes(c"hangwatch-evidence", &bytes)
                .map_err(EvidenceError::Prepare)
        })?;
    let mut command = std::process::Command::new(program);
    command.arg("__write-evidence").arg(dir);
    let outcome = hangwatch_child::run_with_deadline_and_input(command, input, deadline)
        .map_err(EvidenceError::Start)?;
    match outcome {
        hangwatch_child::ChildOutcome::Finished { status, .. } if status.success() => Ok(()),
        hangwatch_child::ChildOutcome::Finished { stderr, .. } => Err(EvidenceError::Failed {
            dir: dir.to_path_buf(),
            message: String::from_utf8_lossy(&stderr).trim().to_string(),
        }),
        hangwatch_child::ChildOutcome::TimedOut { .. } => Err(EvidenceError::TimedOut {
            dir: dir.to_path_buf(),
            timeout_s: deadline.as_secs_f64(),
        }),
    }
}

/// The `__write-evidence DIR` child: the files as JSON on stdin, written into DIR.
pub fn writer_child_main(dir: &Path, input: impl std::io::Read) -> Result<usize, String> {
    let files: Vec<EvidenceFile> =
        serde_json::from_reader(input).map_err(|e| format!("bad evidence on stdin: {e}"))?;
    let written = write_files(dir, &files).map_err(|e| error_chain(&e))?;
    Ok(written.len())
}

fn json<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}").into_bytes());
    bytes.push(b'\n');
    bytes
}
