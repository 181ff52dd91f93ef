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

/// Writes the bundle into `dir` (created if needed). Returns the files written; errors name the file.
pub fn write_bundle(dir: &Path, evidence: &Evidence) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir.join("output"))?;
    let mut written = Vec::new();
    let mut put = |name: &str, bytes: &[u8]| -> std::io::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display()))
        })?;
        written.push(path);
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
        put(&format!("output/{who}.txt"), text.as_bytes())?;
    }
    Ok(written)
}

fn json<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}").into_bytes());
    bytes.push(b'\n');
    bytes
}
