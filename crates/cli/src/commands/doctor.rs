//! `hangwatch doctor`: the checklist of what on this host would make a hang silent or hangwatch blind, each problem
//! with its fix (`hangwatch_doctor` holds the knowledge and the checklist, `hangwatch_run::doctor` gathers).

use std::path::PathBuf;
use std::process::ExitCode;

use hangwatch_agent::human::say;
use hangwatch_doctor::{checklist, diagnose, Finding, Glyphs, HostFacts};
use hangwatch_run::doctor::gather;

/// What on this machine would make a hang silent or hangwatch blind, each with the fix.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Checks the rights hangwatch runs with (Python and kernel stacks, the kernel log), the kernel's hung-task detector,
the heartbeat socket's queue, PyTorch/NCCL and DeepSpeed settings in the environment, and whether the report, state
and log directories, the binary and the current directory are on a network or FUSE filesystem (decided from the
mount table; nothing on those filesystems is touched). Run it in the job's environment (e.g. inside the sbatch
script) so that it sees the job's variables. See docs/doctor.md.

Exit code: 0 when nothing would make hangwatch blind or a hang silent (advice may remain); 1 when something would;
2 for usage errors.")]
pub struct Args {
    /// One JSON document on stdout: {"version": 1, "problems": N, "findings": [...], "facts": {...}}.
    #[arg(long)]
    json: bool,
    /// The report directory `run` will be given [default: the per-user report root `run` would choose].
    #[arg(long, value_name = "DIR")]
    report_dir: Option<PathBuf>,
    /// The job's log file `run` will be given.
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
}

/// `--json`'s document.
#[derive(Debug, serde::Serialize)]
struct DoctorReport<'a> {
    version: u32,
    /// Failed Blind or Silent checks (what makes the exit code 1).
    problems: usize,
    findings: &'a [Finding],
    facts: &'a HostFacts,
}

/// The exit code when some check would leave hangwatch blind or a hang silent.
const PROBLEMS_FOUND: u8 = 1;

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let facts = gather(args.report_dir.as_deref(), args.log_file.as_deref());
    let findings = diagnose(&facts);
    let problems = findings.iter().filter(|f| f.is_problem()).count();
    if args.json {
        crate::output::print_json(&DoctorReport {
            version: 1,
            problems,
            findings: &findings,
            facts: &facts,
        })?;
    } else {
        say(checklist(&findings, &facts, Glyphs::for_locale()));
    }
    Ok(if problems == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(PROBLEMS_FOUND)
    })
}
