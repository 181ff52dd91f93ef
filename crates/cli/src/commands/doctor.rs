//! `hangwatch doctor`: the checklist of what on this host would make a hang silent or hangwatch blind, each problem
//! with its fix (`hangwatch_doctor` holds the knowledge and the checklist, `hangwatch_run::doctor` gathers); on a
//! node with the node service, also the TaskProlog slurm.conf names (read here, in a child under a deadline).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use hangwatch_agent::human::say;
use hangwatch_child::{external_command, run_with_deadline, ChildOutcome};
use hangwatch_doctor::slurm_conf::{slurm_conf_candidates, slurm_conf_of_show_config, FileText};
use hangwatch_doctor::{checklist, diagnose, Finding, Glyphs, HostFacts, NodeServiceFacts};
use hangwatch_run::doctor::gather;

/// What on this machine would make a hang silent or hangwatch blind, each with the fix.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Checks the rights hangwatch runs with (Python and kernel stacks, the kernel log), the kernel's hung-task detector,
the heartbeat socket's queue, PyTorch/NCCL and DeepSpeed settings in the environment, and whether the report, state
and log directories, the binary and the current directory are on a network or FUSE filesystem (decided from the
mount table; nothing on those filesystems is touched). Run it in the job's environment (e.g. inside the sbatch
script) so that it sees the job's variables. On a node with the node service (`hangwatch node`), also whether
slurm.conf ($SLURM_CONF, else the one `scontrol show config` names, else /etc/slurm/slurm.conf) runs hangwatch's
TaskProlog. See docs/doctor.md.

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

pub fn run(args: Args, config: Option<&hangwatch_config::Loaded>) -> anyhow::Result<ExitCode> {
    let mut facts = gather(args.report_dir.as_deref(), args.log_file.as_deref());
    facts.node_service = node_service(config);
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

/// How long `scontrol show config` may take (it asks slurmctld).
const SCONTROL_DEADLINE: Duration = Duration::from_secs(5);

/// The node service on this node and the TaskProlog slurm.conf names; `None` where nothing shows the service (its
/// bootstrap under /run/hangwatch-node, its unit enabled, a `[node]` section in the site's configuration). Every
/// file is read in a child under a deadline: slurm.conf, the files it includes and the site's TaskProlog may be on a
/// network filesystem.
fn node_service(config: Option<&hangwatch_config::Loaded>) -> Option<NodeServiceFacts> {
    let bootstrap = Path::new(hangwatch_node::RUNTIME_DIR).join("python/sitecustomize.py");
    let unit = PathBuf::from("/etc/systemd/system/multi-user.target.wants/hangwatch-node.service");
    let found = read(&[bootstrap.clone(), unit.clone()]);
    let exists = |path: &Path| {
        found
            .iter()
            .any(|(p, f)| p == path && matches!(f, FileText::Text(_)))
    };
    let mut signs = Vec::new();
    if exists(&bootstrap) {
        signs.push(format!(
            "its bootstrap in {}: it has run since boot",
            hangwatch_node::RUNTIME_DIR
        ));
    }
    if exists(&unit) {
        signs.push("hangwatch-node.service enabled".to_string());
    }
    if let Some(setting) = config.and_then(|c| c.files.from_section("node")) {
        signs.push(format!(
            "[node] in {} line {}",
            setting.path.display(),
            setting.line
        ));
    }
    if signs.is_empty() {
        return None;
    }
    let env = std::env::var("SLURM_CONF")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let shown = match env {
        Some(_) => None,
        None => scontrol_slurm_conf(),
    };
    let candidates = slurm_conf_candidates(env.as_deref(), shown.as_deref());
    Some(NodeServiceFacts::gather(signs, &candidates, &mut read))
}

/// Files read by the configuration reader (`hangwatch __read-config`, abandoned at its deadline).
fn read(paths: &[PathBuf]) -> Vec<(PathBuf, FileText)> {
    hangwatch_config::read_files(paths)
        .into_iter()
        .map(|(path, found)| {
            let text = match found {
                hangwatch_config::Found::Text(text) => FileText::Text(text),
                hangwatch_config::Found::Missing => FileText::Missing,
                hangwatch_config::Found::Unreadable(why) => FileText::Unreadable(why),
            };
            (path, text)
        })
        .collect()
}

/// The slurm.conf `scontrol show config` names; `None` when it cannot say within its deadline.
fn scontrol_slurm_conf() -> Option<String> {
    let mut command = external_command("scontrol");
    command.args(["show", "config"]);
    match run_with_deadline(command, SCONTROL_DEADLINE) {
        Ok(ChildOutcome::Finished { status, stdout, .. }) if status.success() => {
            slurm_conf_of_show_config(&String::from_utf8_lossy(&stdout))
        }
        Ok(ChildOutcome::Finished { .. }) => None,
        Ok(ChildOutcome::TimedOut { .. }) => {
            tracing::debug!("scontrol show config did not answer within its deadline");
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot run scontrol show config");
            None
        }
    }
}
