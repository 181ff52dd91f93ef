//! The evidence bundle: everything a person needs after the fact, written to node-local disk (never only to the
//! shared filesystem that may be the culprit).
//!
//! ```text
//! <report-dir>/
//!   verdict.json        the verdict (SPEC "The verdict")
//!   verdict.txt         the same for people
//!   ranks.json          every rank's full observation (threads, wchan, syscall, stacks)
//!   probes.json         filesystem probes
//!   thresholds.json     the stall threshold in force and how it was learned; the run's holds (stalls not ended
//!                       because the ranks worked) and why a verdict that came late waited
//!   progress.json       progress over time up to the roll call (the report's timeline)
//!   kernel-log.txt      kernel-log lines since the job started (only those about the job when a root watcher
//!                       keeps another user's evidence); kernel-report.json: what they say
//!   kernel-log.root.txt every line, beside a cut kernel-log.txt, when the site asks (--keep-kernel-log): 0600,
//!                       root's, never handed to the job's owner
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
    /// Keep only the kernel-log lines about this job (a root watcher of another user's job); `None`: every line.
    pub kernel_log_scope: Option<&'a hangwatch_kmsg::JobScope>,
    /// With a scope: every line too, in [`crate::kernel_log::ROOT_KERNEL_LOG`].
    pub keep_whole_kernel_log: bool,
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
    crate::kernel_log::ROOT_KERNEL_LOG,
    "kernel-report.json",
    "output",
];

/// `thresholds.json`: the stall threshold in force when the roll call was taken, and how it was learned; the holds
/// of the run so far; why the verdict came late (written again at the end of a run that held or came late).
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
    /// The holds of the run so far (ranks seen working without progress, the job not ended for it), one per
    /// stall, with what was seen working and how each ended.
    pub holds: Vec<crate::stall_log::HoldRecord>,
    /// Why the verdict that ended the job came later than its threshold (plus a few seconds), when it did.
    pub late: Option<crate::stall_log::LateRecord>,
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
            holds: Vec::new(),
            late: None,
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
        files.extend(kernel_files(
            self.kernel_log,
            self.kernel_log_unavailable,
            self.kernel_log_scope,
            self.keep_whole_kernel_log,
        ));
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

/// `kernel-log.txt` and `kernel-report.json` (and, for a cut log kept whole, [`crate::kernel_log::ROOT_KERNEL_LOG`]):
/// every line of `kernel_log`, or with `scope` only those about the job (pure).
pub fn kernel_files(
    kernel_log: &str,
    unavailable: Option<&str>,
    scope: Option<&hangwatch_kmsg::JobScope>,
    keep_whole: bool,
) -> Vec<EvidenceFile> {
    let mut files = Vec::new();
    let (kernel, report) = match (unavailable, scope) {
        (Some(why), _) => (
            format!("# kernel log not collected: {why}\n"),
            hangwatch_kmsg::report_from_text(kernel_log),
        ),
        (None, None) => (
            kernel_log.to_string(),
            hangwatch_kmsg::report_from_text(kernel_log),
        ),
        (None, Some(scope)) => {
            let all: Vec<&str> = kernel_log.lines().collect();
            let kept = hangwatch_kmsg::lines_of_job(&all, scope);
            let mut text: String = kept.iter().map(|l| format!("{l}\n")).collect();
            let report = hangwatch_kmsg::report_from_text(&text);
            let whole = if keep_whole {
                files.push(EvidenceFile::new(
                    crate::kernel_log::ROOT_KERNEL_LOG,
                    kernel_log.as_bytes().to_vec(),
                ));
                format!(
                    "; every line is in {} (root's)",
                    crate::kernel_log::ROOT_KERNEL_LOG
                )
            } else {
                String::new()
            };
            text.insert_str(
                    0,
                    &format!(
                        "# the {} of {} kernel-log lines since the job started that concern it (its processes, its \
                         user's OOM kills, its filesystems, GPU Xid errors; --kernel-log job){whole}\n",
                        kept.len(),
                        all.len()
                    ),
                );
            (text, report)
        }
    };
    files.push(EvidenceFile::new("kernel-log.txt", kernel.into_bytes()));
    files.push(EvidenceFile::new("kernel-report.json", json(&report)));
    files
}

/// The job a cut kernel log is kept for: its processes (`pids`, those observed) and their threads, its user, and
/// the filesystems its ranks' blocked calls and probes name.
pub fn job_scope(
    pids: &[i32],
    observations: &[ProcessObservation],
    probes: &[ProbeResult],
    uid: Option<u32>,
) -> hangwatch_kmsg::JobScope {
    let mut scope = hangwatch_kmsg::JobScope {
        uid,
        ..Default::default()
    };
    let ids = pids.iter().copied().chain(
        observations
            .iter()
            .flat_map(|o| std::iter::once(o.pid).chain(o.threads.iter().map(|t| t.tid))),
    );
    scope.pids = ids.filter_map(|id| u32::try_from(id).ok()).collect();
    let mut mount = |fstype: Option<&str>, source: Option<&str>| {
        if let (Some(fstype), Some(source)) = (fstype, source) {
            let pair = (fstype.to_string(), source.to_string());
            if !scope.mounts.contains(&pair) {
                scope.mounts.push(pair);
            }
        }
    };
    for thread in observations.iter().flat_map(|o| &o.threads) {
        if let Some(hangwatch_model::SyscallObservation::InSyscall {
            file: Some(file), ..
        }) = &thread.syscall
        {
            mount(file.fstype.as_deref(), file.source.as_deref());
        }
    }
    for probe in probes {
        mount(probe.fstype.as_deref(), probe.source.as_deref());
    }
    scope
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

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
3,100,900000000,-;INFO: task python:5402 blocked for more than 120 seconds.
6,101,900000001,-;task:python          state:D stack:0     pid:5402  tgid:5390  ppid:5380   flags:0x00000002
6,102,900000002,-;Call Trace:
6,103,900000003,-; ksys_write+0x6f/0xf0
3,104,900000004,-;Memory cgroup out of memory: Killed process 7777 (secret_tool) total-vm:1kB, UID:1002 pgtables:4kB
3,105,900000005,-;hangwatch-test-marker-XYZ
";

    fn file<'a>(files: &'a [EvidenceFile], name: &str) -> Option<&'a str> {
        files
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.text.as_str())
    }

    #[test]
    fn a_cut_kernel_log_holds_the_jobs_lines_and_the_whole_one_only_when_asked() {
        let scope = hangwatch_kmsg::JobScope {
            pids: [5390].into_iter().collect(),
            uid: Some(1001),
            mounts: Vec::new(),
        };
        let files = kernel_files(LOG, None, Some(&scope), false);
        let cut = file(&files, "kernel-log.txt").expect("kernel-log.txt");
        assert!(cut.starts_with("# the 4 of 6 kernel-log lines"), "{cut}");
        assert!(cut.contains("task python:5402 blocked"));
        assert!(
            !cut.contains("secret_tool") && !cut.contains("marker"),
            "{cut}"
        );
        let report = file(&files, "kernel-report.json").expect("report");
        assert!(
            report.contains("5402") && !report.contains("secret_tool"),
            "{report}"
        );
        assert_eq!(file(&files, crate::kernel_log::ROOT_KERNEL_LOG), None);

        let files = kernel_files(LOG, None, Some(&scope), true);
        assert_eq!(file(&files, crate::kernel_log::ROOT_KERNEL_LOG), Some(LOG));
        assert!(file(&files, "kernel-log.txt")
            .is_some_and(|t| t.contains("every line is in kernel-log.root.txt")));
    }

    #[test]
    fn without_a_scope_every_line_is_kept() {
        let files = kernel_files(LOG, None, None, true);
        assert_eq!(file(&files, "kernel-log.txt"), Some(LOG));
        assert_eq!(file(&files, crate::kernel_log::ROOT_KERNEL_LOG), None);
    }

    #[test]
    fn the_scope_is_the_jobs_processes_threads_user_and_mounts() {
        let observation = ProcessObservation {
            pid: 5390,
            threads: vec![hangwatch_model::ThreadObservation {
                tid: 5402,
                syscall: Some(hangwatch_model::SyscallObservation::InSyscall {
                    nr: 1,
                    name: Some("write".into()),
                    args: Vec::new(),
                    fd: Some(3),
                    file: Some(hangwatch_model::FileRef {
                        path: "/mnt/x/log".into(),
                        mount: Some("/mnt/x".into()),
                        fstype: Some("ext4".into()),
                        source: Some("/dev/loop3".into()),
                        filesystem: None,
                    }),
                    path: None,
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let probe = ProbeResult {
            fstype: Some("nfs4".into()),
            source: Some("fs01:/export".into()),
            ..Default::default()
        };
        let scope = job_scope(&[5391], &[observation], &[probe], Some(1001));
        assert_eq!(scope.pids, [5390, 5391, 5402].into_iter().collect());
        assert_eq!(scope.uid, Some(1001));
        assert_eq!(
            scope.mounts,
            vec![
                ("ext4".to_string(), "/dev/loop3".to_string()),
                ("nfs4".to_string(), "fs01:/export".to_string())
            ]
        );
    }
}
