//! `hangwatch doctor`: the checklist of what on this host would make a hang silent or hangwatch blind, each problem
//! with its fix; and the lines `run` says at start from the same checks (`crates/doctor` holds the knowledge).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use hangwatch_agent::human::say;
use hangwatch_doctor::{
    diagnose, startup_warnings, Finding, GatherOptions, HostFacts, PathRole, Severity,
};
use hangwatch_proc::MountTable;

use hangwatch_run::dirs::{report_root_candidates, state_dir, ProcessEnv};

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

/// For `run`, before the job starts: one line per check that would leave hangwatch blind or a hang silent. Reads a
/// dozen small /proc files and the mount table; starts no process.
pub fn say_startup_warnings(report_dir: &Path, log_file: Option<&Path>) {
    let facts = gather(Some(report_dir), log_file);
    for finding in startup_warnings(&diagnose(&facts)) {
        say(format!(
            "hangwatch: doctor: {} (fix: {})",
            finding.what,
            finding.fix.as_deref().unwrap_or("see hangwatch doctor")
        ));
    }
}

fn gather(report_dir: Option<&Path>, log_file: Option<&Path>) -> HostFacts {
    let table = hangwatch_proc::ProcFs::new("/proc")
        .mountinfo(std::process::id() as i32)
        .ok();
    let local = |path: &Path| node_local(table.as_ref(), path);
    let uid = hangwatch_safefs::euid();
    let mut paths = Vec::new();
    let report = report_dir.map(Path::to_path_buf).or_else(|| {
        report_root_candidates(&ProcessEnv, uid, &local)
            .into_iter()
            .next()
    });
    if let Some(dir) = report {
        paths.push((PathRole::ReportDir, dir));
    }
    paths.push((PathRole::StateDir, state_dir(&ProcessEnv, uid, &local)));
    if let Some(file) = log_file {
        let dir = match file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        paths.push((PathRole::LogDir, dir));
    }
    HostFacts::gather(&GatherOptions::host(paths))
}

/// Node-local by the mount table alone (no stat of the path: it may be on a frozen mount). Unknown counts as local.
fn node_local(table: Option<&MountTable>, path: &Path) -> bool {
    table
        .and_then(|t| t.containing(&path.to_string_lossy()))
        .is_none_or(|m| !m.is_remote())
}

/// The marks of the checklist: Unicode where the locale says UTF-8, ASCII otherwise.
#[derive(Debug, Clone, Copy)]
struct Glyphs {
    pass: &'static str,
    problem: &'static str,
    advice: &'static str,
}

impl Glyphs {
    fn for_locale() -> Self {
        let utf8 = ["LC_ALL", "LC_CTYPE", "LANG"]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
            .is_some_and(|v| {
                let v = v.to_ascii_lowercase();
                v.contains("utf-8") || v.contains("utf8")
            });
        if utf8 {
            Glyphs {
                pass: "✓",
                problem: "✗",
                advice: "!",
            }
        } else {
            Glyphs {
                pass: "ok",
                problem: "XX",
                advice: "!!",
            }
        }
    }
}

/// The human checklist: grouped by severity, worst first; problems first within a group, each with why and fix.
fn checklist(findings: &[Finding], facts: &HostFacts, glyphs: Glyphs) -> String {
    let count = |s: Severity| findings.iter().filter(|f| !f.ok && f.severity == s).count();
    let (blind, silent, advice) = (
        count(Severity::Blind),
        count(Severity::Silent),
        count(Severity::Advice),
    );
    let who = match facts.euid {
        Some(0) => "root".to_string(),
        Some(uid) => format!("uid {uid}"),
        None => "uid unknown".to_string(),
    };
    let mut out = format!(
        "hangwatch doctor ({who}): {blind} would make hangwatch blind, {silent} would leave a hang silent, {advice} advice\n"
    );
    for severity in [Severity::Blind, Severity::Silent, Severity::Advice] {
        let mut group: Vec<&Finding> = findings.iter().filter(|f| f.severity == severity).collect();
        if group.is_empty() {
            continue;
        }
        group.sort_by_key(|f| f.ok);
        out.push_str(&format!("\n{}:\n", severity.heading()));
        for f in group {
            let mark = match (f.ok, f.severity) {
                (true, _) => glyphs.pass,
                (false, Severity::Advice) => glyphs.advice,
                (false, _) => glyphs.problem,
            };
            out.push_str(&format!("  {mark} {}: {}\n", check_name(f), f.what));
            if let Some(fix) = &f.fix {
                out.push_str(&format!("      why: {}\n      fix: {fix}\n", f.why));
            }
        }
    }
    if blind + silent == 0 {
        out.push_str("\nNothing here would make hangwatch blind or a hang silent.\n");
    }
    out.truncate(out.trim_end().len());
    out
}

fn check_name(finding: &Finding) -> String {
    serde_json::to_value(finding.check)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{:?}", finding.check))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_proc::parse_mountinfo;

    #[test]
    fn node_local_is_decided_by_the_table() {
        let table = parse_mountinfo(
            "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:40 / /shared rw - nfs4 srv:/x rw\n",
        )
        .unwrap();
        assert!(node_local(Some(&table), Path::new("/var/tmp/x")));
        assert!(!node_local(
            Some(&table),
            Path::new("/shared/never/created")
        ));
        assert!(node_local(None, Path::new("/shared/x")));
    }
}
