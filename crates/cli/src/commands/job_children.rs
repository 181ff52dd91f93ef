//! The internal children of `run` that are not about inspecting: `__job-reaper` (ends the job if hangwatch dies)
//! and `__write-evidence` (writes the evidence where a frozen filesystem can only block it, not hangwatch).

use std::path::PathBuf;
use std::process::ExitCode;

/// `hangwatch __job-reaper`: reads the job's process groups on stdin; sweeps them if stdin closes without "done".
#[derive(Debug, clap::Args)]
pub struct ReaperArgs {}

pub fn run_reaper(_args: ReaperArgs) -> anyhow::Result<ExitCode> {
    let stdin = std::io::stdin().lock();
    hangwatch_agent::reaper::reaper_main(stdin, &hangwatch_proc::ProcFs::new("/proc"));
    Ok(ExitCode::SUCCESS)
}

/// `hangwatch __write-evidence DIR`: the evidence files as JSON on stdin.
#[derive(Debug, clap::Args)]
pub struct EvidenceArgs {
    dir: PathBuf,
}

pub fn run_evidence_writer(args: EvidenceArgs) -> anyhow::Result<ExitCode> {
    match hangwatch_agent::evidence::writer_child_main(&args.dir, std::io::stdin().lock()) {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(message) => Err(anyhow::anyhow!(message)),
    }
}
