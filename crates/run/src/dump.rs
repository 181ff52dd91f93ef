//! A roll call now of every rank process named or found below a launcher, decided as for a one-node job
//! (`hangwatch dump`).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use hangwatch_diagnosis::{decide, DecideOptions};
use hangwatch_inspect::probe::{ProbeOptions, Prober};
use hangwatch_inspect::pystack::StackReadOptions;
use hangwatch_inspect::ranks::RankFinder;
use hangwatch_inspect::rollcall::{
    hostname, is_python, take_roll_call, KnownProcess, RollCallOptions,
};
use hangwatch_model::Verdict;
use hangwatch_proc::ProcFs;

/// Which processes, and how long each read may take (`hangwatch dump`'s flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Rank processes by pid.
    pub pids: Vec<i32>,
    /// A launcher: the ranks are found below it.
    pub tree: Option<i32>,
    /// Time between the two samples of /proc.
    pub window: Duration,
    /// Give up on a rank's Python stack after this long.
    pub stack_timeout: Duration,
    /// Give up on a filesystem probe after this long.
    pub probe_timeout: Duration,
    pub read_stacks: bool,
}

/// The roll call's verdict, over how many processes, taken in how long.
pub struct Dump {
    pub verdict: Verdict,
    pub processes: usize,
    pub elapsed: Duration,
}

/// Takes the roll call of the processes `settings` names and decides over it as for a one-node job.
pub fn roll_call(args: &Settings) -> anyhow::Result<Dump> {
    let procfs = ProcFs::new("/proc");
    let (pids, known) = select_pids(&procfs, args)?;
    let mut stacks = StackReadOptions::for_self()
        .context("cannot find the hangwatch binary to read stacks with")?;
    stacks.per_pid_timeout = args.stack_timeout;
    stacks.total_timeout = args.stack_timeout * 4;
    let options = RollCallOptions {
        extra_probes: Vec::new(),
        window: args.window,
        read_stacks: args.read_stacks,
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
    Ok(Dump {
        verdict,
        processes: pids.len(),
        elapsed: rollcall.elapsed,
    })
}

/// The pids to look at, and what is known of the ranks found below `--tree` (their number and its source: the
/// structure's numbers are not in any environment).
fn select_pids(
    procfs: &ProcFs,
    args: &Settings,
) -> anyhow::Result<(Vec<i32>, HashMap<i32, KnownProcess>)> {
    let mut known = HashMap::new();
    if args.pids.is_empty() && args.tree.is_none() {
        return Err(crate::usage(
            "name the ranks: `hangwatch dump --pid PID ...` or `hangwatch dump --tree LAUNCHER_PID`",
        ));
    }
    let mut pids = Vec::new();
    for &pid in &args.pids {
        if procfs.stat(pid).is_err() {
            return Err(crate::usage(format!(
                "no process with pid {pid} (it may have exited; check `ps -p {pid}`)"
            )));
        }
        pids.push(pid);
    }
    if let Some(root) = args.tree {
        if procfs.stat(root).is_err() {
            return Err(crate::usage(format!(
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
                return Err(crate::usage(format!(
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
