//! `hangwatch dump`: a roll call now of every rank process on this node, the outlier named.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use hangwatch_diagnosis::{decide, DecideOptions};
use hangwatch_inspect::probe::{ProbeOptions, Prober};
use hangwatch_inspect::pystack::StackReadOptions;
use hangwatch_inspect::ranks::RankFinder;
use hangwatch_inspect::rollcall::{
    hostname, is_python, take_roll_call, KnownProcess, RollCallOptions,
};
use hangwatch_proc::ProcFs;

use crate::exit::usage;
use hangwatch_model::{format_duration, parse_nonzero_duration};

/// Roll call of the rank processes: `--pid` names them, `--tree` finds them below a launcher.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  hangwatch dump --tree $(pgrep -f torchrun | head -1)\n  hangwatch dump --pid 4242 \
                        --pid 4243 --json\n\nRanks are never ptrace-stopped; reads that could block on a frozen \
                        filesystem run in throwaway children under deadlines."
)]
pub struct Args {
    /// A rank process (repeatable, or comma-separated).
    #[arg(long = "pid", value_delimiter = ',')]
    pids: Vec<i32>,
    /// A launcher (torchrun, accelerate, deepspeed, srun step): the outermost processes below it that carry RANK
    /// are the ranks, their descendants (DataLoader workers...) their workers (all Python processes when none
    /// carries RANK).
    #[arg(long)]
    tree: Option<i32>,
    /// Print the verdict as one JSON document on stdout.
    #[arg(long)]
    json: bool,
    /// Time between the two samples of /proc; a thread with no context switch in it "is not running".
    #[arg(long, default_value = "300ms", value_parser = parse_nonzero_duration)]
    window: Duration,
    /// Give up on a rank's Python stack after this long (its memory may be locked by a stuck thread).
    #[arg(long, default_value = "1s", value_parser = parse_nonzero_duration)]
    stack_timeout: Duration,
    /// Give up on a filesystem probe after this long.
    #[arg(long, default_value = "1s", value_parser = parse_nonzero_duration)]
    probe_timeout: Duration,
    /// Do not read Python stacks.
    #[arg(long)]
    no_stacks: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let procfs = ProcFs::new("/proc");
    let (pids, known) = select_pids(&procfs, &args)?;
    let mut stacks = StackReadOptions::for_self()
        .context("cannot find the hangwatch binary to read stacks with")?;
    stacks.per_pid_timeout = args.stack_timeout;
    stacks.total_timeout = args.stack_timeout * 4;
    let options = RollCallOptions {
        extra_probes: Vec::new(),
        window: args.window,
        read_stacks: !args.no_stacks,
        stacks,
        prepared: None,
        node: hostname(),
        // A process of its own has read nothing before: it waits the window.
        earlier: Default::default(),
    };
    let probe_timeout = args.probe_timeout;
    let rollcall = take_roll_call(&procfs, &pids, &known, &options, |mounts| {
        probe_mounts(mounts, probe_timeout)
    });
    tracing::debug!(
        elapsed_ms = rollcall.elapsed.as_millis() as u64,
        ranks = pids.len(),
        "roll call done"
    );
    // One node: the same decision as for a whole job, over a slice of one.
    let verdict = decide(
        std::slice::from_ref(&rollcall.observations),
        &DecideOptions::default(),
    );
    if args.json {
        crate::output::print_json(&verdict)?;
    } else {
        print!("{}", hangwatch_agent::render::verdict_text(&verdict));
        eprintln!(
            "(roll call of {} processes in {})",
            pids.len(),
            format_duration(rollcall.elapsed)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The pids to look at, and what is known of the ranks found below `--tree` (their number and its source: the
/// structure's numbers are not in any environment).
fn select_pids(
    procfs: &ProcFs,
    args: &Args,
) -> anyhow::Result<(Vec<i32>, HashMap<i32, KnownProcess>)> {
    let mut known = HashMap::new();
    if args.pids.is_empty() && args.tree.is_none() {
        return Err(usage(
            "name the ranks: `hangwatch dump --pid PID ...` or `hangwatch dump --tree LAUNCHER_PID`",
        ));
    }
    let mut pids = Vec::new();
    for &pid in &args.pids {
        if procfs.stat(pid).is_err() {
            return Err(usage(format!(
                "no process with pid {pid} (it may have exited; check `ps -p {pid}`)"
            )));
        }
        pids.push(pid);
    }
    if let Some(root) = args.tree {
        if procfs.stat(root).is_err() {
            return Err(usage(format!(
                "no process with pid {root} to search below (check `ps -p {root}`)"
            )));
        }
        let found = RankFinder::new().refresh(procfs, &[root], &HashMap::new());
        if found.ranks.is_empty() {
            let python: Vec<i32> = procfs
                .subtree(&[root])
                .iter()
                .map(|s| s.pid)
                .filter(|&p| is_python(procfs, p))
                .collect();
            if python.is_empty() {
                return Err(usage(format!(
                    "no Python process below pid {root}: is it the launcher of the job (torchrun, srun, python)?"
                )));
            }
            pids.extend(python);
        } else {
            pids.extend(found.ranks.iter().map(|r| r.id.pid));
            known.extend(found.ranks.iter().map(|r| {
                let rank = KnownProcess {
                    rank: Some(r.rank),
                    rank_source: Some(r.source),
                    exited: false,
                    exit_code: None,
                    exited_at_unix_s: None,
                };
                (r.id.pid, rank)
            }));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    Ok((pids, known))
}

/// Probes each mount in a sacrificial child, different mounts in parallel, each under `timeout`.
fn probe_mounts(
    mounts: &[hangwatch_inspect::probe::ProbeTarget],
    timeout: Duration,
) -> Vec<hangwatch_model::ProbeResult> {
    let mut prober = match Prober::new() {
        Ok(prober) => prober,
        Err(e) => {
            tracing::warn!(error = %e, "cannot probe filesystems");
            return Vec::new();
        }
    };
    let options = ProbeOptions {
        timeout,
        write: true,
    };
    prober
        .probe_targets(mounts, &options)
        .into_iter()
        .filter_map(|r| {
            r.map_err(|e| tracing::warn!(error = %e, "probe failed"))
                .ok()
        })
        .collect()
}
