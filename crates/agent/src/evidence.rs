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
//!   kernel-log.txt      kernel-log lines since the job started; kernel-report.json: what they say
//!   output/rank-N.txt   the last lines each rank printed
//!   run.json            command, node, start time, hangwatch version
//! ```

use std::path::{Path, PathBuf};

use hangwatch_model::{ProbeResult, ProcessObservation, Verdict};
use hangwatch_safefs::{PrivateDir, SafeFsError};
use serde::Serialize;

/// Everything that goes into one bundle.
pub struct Evidence<'a> {
    pub verdict: &'a Verdict,
    pub observations: &'a [ProcessObservation],
    pub probes: &'a [ProbeResult],
    pub thresholds: &'a serde_json::Value,
    pub kernel_log: &'a str,
    pub kernel_log_unavailable: Option<&'a str>,
    pub tails: &'a [(String, Vec<String>)],
    pub run: &'a serde_json::Value,
}

/// Why the bundle (or one of its files) could not be written. Every file is created through
/// [`hangwatch_safefs`]: mode 0600, never through a symlink planted in the report directory.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    #[error("cannot write the evidence in {dir}")]
    Write {
        dir: PathBuf,
        #[source]
        source: SafeFsError,
    },
}

/// The files of a bundle, for a report directory that must not hold planted links in their place.
pub const BUNDLE_FILES: &[&str] = &[
    "verdict.json",
    "verdict.txt",
    "ranks.json",
    "probes.json",
    "thresholds.json",
    "run.json",
    "kernel-log.txt",
    "kernel-report.json",
    "output",
];

/// Writes the bundle into `dir` (created private if needed; files replaced in place when it is written again at a
/// later tier). Returns the files written; errors name the file.
pub fn write_bundle(dir: &Path, evidence: &Evidence) -> Result<Vec<PathBuf>, EvidenceError> {
    let wrap = |source| EvidenceError::Write {
        dir: dir.to_path_buf(),
        source,
    };
    let private = PrivateDir::open_or_create(dir).map_err(wrap)?;
    let output = private.subdir("output").map_err(wrap)?;
    let mut written = Vec::new();
    let mut put = |name: &str, bytes: &[u8]| -> Result<(), EvidenceError> {
        written.push(private.write(name, bytes).map_err(wrap)?);
        Ok(())
    };
    put("verdict.json", &json(evidence.verdict))?;
    put(
        "verdict.txt",
        crate::render::verdict_text(evidence.verdict).as_bytes(),
    )?;
    put("ranks.json", &json(&evidence.observations))?;
    put("probes.json", &json(&evidence.probes))?;
    put("thresholds.json", &json(evidence.thresholds))?;
    put("run.json", &json(evidence.run))?;
    let kernel = match evidence.kernel_log_unavailable {
        Some(why) => format!("# kernel log not collected: {why}\n"),
        None => evidence.kernel_log.to_string(),
    };
    put("kernel-log.txt", kernel.as_bytes())?;
    let report = hangwatch_kmsg::report_from_text(evidence.kernel_log);
    put("kernel-report.json", &json(&report))?;
    for (who, lines) in evidence.tails {
        let mut text = lines.join("\n");
        text.push('\n');
        written.push(
            output
                .write(&format!("{who}.txt"), text.as_bytes())
                .map_err(wrap)?,
        );
    }
    Ok(written)
}

/// Rewrites `verdict.json` and `verdict.txt` with the final verdict (the actions taken added).
pub fn write_verdict(dir: &Path, verdict: &Verdict) -> Result<(), EvidenceError> {
    let wrap = |source| EvidenceError::Write {
        dir: dir.to_path_buf(),
        source,
    };
    let private = PrivateDir::open_or_create(dir).map_err(wrap)?;
    private
        .write("verdict.json", &json(verdict))
        .map_err(wrap)?;
    private
        .write(
            "verdict.txt",
            crate::render::verdict_text(verdict).as_bytes(),
        )
        .map_err(wrap)?;
    Ok(())
}

/// An error and its causes on one line, for a log message.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn json<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}").into_bytes());
    bytes.push(b'\n');
    bytes
}
