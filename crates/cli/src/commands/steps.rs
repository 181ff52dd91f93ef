//! `hangwatch steps [--node-name NAME] [--json]`: the Slurm job steps running on this machine and their ranks,
//! found from outside the jobs (nothing in their scripts): what a node service watches, and an admin's answer
//! to "which processes of which job are which rank here".

use std::process::ExitCode;

use hangwatch_agent::human::{write, Stream};
use hangwatch_inspect::pystack::StackReadOptions;
use hangwatch_proc::ProcFs;
use hangwatch_slurm::steps::{find_steps, StepOnNode};
use serde::Serialize;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Each step is a slurmstepd (a root process running Slurm's file; its job and step from its own title) and the
tasks it started; its ranks are found below them as `run` finds them (the outermost process with RANK, else each
task by SLURM_PROCID). Needs to read other users' /proc entries: root (or
CAP_SYS_PTRACE) for every job, else only your own. See docs/node-service.md.")]
pub struct Args {
    /// This node's name in Slurm, where it is not the host name; on a machine that runs several emulated nodes
    /// (`slurmd -N NAME`), only that node's steps [default: the host name; every emulated node].
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// Print one JSON document on stdout.
    #[arg(long)]
    json: bool,
}

/// What `hangwatch steps --json` prints.
#[derive(Debug, Serialize)]
struct StepsDocument<'a> {
    node: Option<&'a str>,
    steps: &'a [StepOnNode],
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let options = StackReadOptions::for_self()?;
    let steps = find_steps(&ProcFs::new("/proc"), args.node_name.as_deref(), &options);
    if args.json {
        crate::output::print_json(&StepsDocument {
            node: args.node_name.as_deref(),
            steps: &steps,
        })?;
    } else {
        write(
            Stream::Stdout,
            render(&steps, args.node_name.as_deref()).into_bytes(),
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn render(steps: &[StepOnNode], node: Option<&str>) -> String {
    if steps.is_empty() {
        let on = node.map(|n| format!(" of node {n}")).unwrap_or_default();
        return format!("no Slurm job step{on} runs on this machine\n");
    }
    let mut out = String::new();
    for step in steps {
        let on = step.node.as_deref().unwrap_or("?");
        let owner = step.uid.map(|u| format!(", uid {u}")).unwrap_or_default();
        let tasks: Vec<String> = step.tasks.iter().map(i32::to_string).collect();
        out.push_str(&format!(
            "step {} on {on}{owner}: slurmstepd {}, tasks {}\n",
            step.name(),
            step.slurmstepd,
            tasks.join(" ")
        ));
        if step.ranks.is_empty() {
            out.push_str("  no ranks (no process carries a rank variable)\n");
        }
        for rank in &step.ranks {
            let local = rank
                .local_rank
                .map(|l| format!(", local rank {l}"))
                .unwrap_or_default();
            out.push_str(&format!(
                "  rank {}: pid {}{local} ({})\n",
                rank.rank, rank.pid, rank.source
            ));
        }
    }
    out
}
