//! Ending a job fast: SIGTERM to every process group, a grace period, SIGKILL, and then no more waiting: a process
//! still alive (in D state, a SIGKILL cannot take effect until its call returns) is reported as unkillable. Also
//! the worker that runs it, which processes cannot act on SIGTERM, and what the verdict and the user are told.

use std::time::{Duration, Instant};

use hangwatch_model::{StuckThread, Verdict};
use hangwatch_proc::ProcFs;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::human::say;

/// A process of the job that hangwatch may signal (its own child, or a rank found below it).
pub trait JobProcess {
    fn pid(&self) -> i32;
    fn pgid(&self) -> i32;
    /// Reaps if possible; `true` when the process is gone.
    fn has_exited(&mut self) -> bool;
}

/// What happened to each process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TerminationReport {
    /// Pids that ended after SIGTERM.
    pub ended_by_term: Vec<i32>,
    /// Pids that needed SIGKILL.
    pub ended_by_kill: Vec<i32>,
    /// Processes still alive after SIGKILL and `kill_wait`.
    pub unkillable: Vec<Unkillable>,
    pub elapsed: Duration,
    /// The container the job ran in, when it was a container client's (`crate::container`): ended through its
    /// runtime, with how.
    pub container: Option<hangwatch_model::ContainerRef>,
}

/// A process still there after SIGKILL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unkillable {
    pub pid: i32,
    /// Its state letter (`D`; `Z` when its main thread exited and another thread holds it), `?` when unread.
    pub state: char,
    /// The thread that holds it, when that is not the main thread.
    pub stuck_thread: Option<StuckThread>,
}

/// What is left of a process after SIGKILL, as /proc shows it: its state and its threads (`tid`, name, state).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Remains {
    pub state: Option<char>,
    pub threads: Vec<(i32, String, char)>,
}

impl Unkillable {
    /// From what /proc shows: the thread that holds the process is one in D (else any that is not a zombie),
    /// named only when it is not the main thread.
    pub fn from_remains(pid: i32, remains: &Remains) -> Self {
        let holder = remains
            .threads
            .iter()
            .find(|(_, _, s)| *s == 'D')
            .or_else(|| {
                remains
                    .threads
                    .iter()
                    .find(|(_, _, s)| !matches!(s, 'Z' | 'X'))
            });
        Unkillable {
            pid,
            state: remains.state.unwrap_or('?'),
            stuck_thread: holder
                .filter(|(tid, _, _)| *tid != pid)
                .map(|(tid, name, state)| StuckThread {
                    tid: *tid,
                    name: Some(name.clone()).filter(|n| !n.is_empty()),
                    state: *state,
                }),
        }
    }

    /// In words: "pid 42 is still in uninterruptible sleep (D) after SIGKILL", or, for a zombie held by a thread,
    /// "pid 42's main thread exited (Z), but its thread 57 (ckpt-writer) is still in uninterruptible sleep (D)
    /// after SIGKILL".
    pub fn words(&self) -> String {
        let thread = |t: &StuckThread| match &t.name {
            Some(name) => format!("thread {} ({name})", t.tid),
            None => format!("thread {}", t.tid),
        };
        match (&self.stuck_thread, self.state) {
            (Some(t), 'Z') => format!(
                "pid {}'s main thread exited (Z), but its {} is still in {} after SIGKILL",
                self.pid,
                thread(t),
                state_words(t.state)
            ),
            (Some(t), state) => format!(
                "pid {} is still in {} after SIGKILL: its {} is in {}",
                self.pid,
                state_words(state),
                thread(t),
                state_words(t.state)
            ),
            (None, state) => format!(
                "pid {} is still in {} after SIGKILL",
                self.pid,
                state_words(state)
            ),
        }
    }
}

/// The verdict's records of a termination: `terminate` lists the ranks that ended (ok: they did), with each
/// process's outcome; `unkillable` the ranks that could not be killed (not ok), each said in words. `rank_of`
/// gives a pid's rank (a launcher has none).
pub fn termination_actions(
    report: &TerminationReport,
    rank_of: impl Fn(i32) -> Option<u32>,
) -> Vec<hangwatch_model::ActionRecord> {
    use hangwatch_model::{ActionRecord, Ended, ProcessOutcome};
    let ranks = |pids: &mut dyn Iterator<Item = i32>| -> Vec<u32> {
        let mut r: Vec<u32> = pids.filter_map(&rank_of).collect();
        r.sort_unstable();
        r
    };
    let ended = ranks(
        &mut report
            .ended_by_term
            .iter()
            .chain(&report.ended_by_kill)
            .copied(),
    );
    let stuck = ranks(&mut report.unkillable.iter().map(|u| u.pid));
    let mut outcomes: Vec<ProcessOutcome> = Vec::new();
    for (pids, how) in [
        (&report.ended_by_term, Ended::BySigterm),
        (&report.ended_by_kill, Ended::BySigkill),
    ] {
        outcomes.extend(pids.iter().map(|&pid| ProcessOutcome {
            pid,
            rank: rank_of(pid),
            ended: how,
            state: None,
            stuck_thread: None,
        }));
    }
    outcomes.extend(report.unkillable.iter().map(|u| ProcessOutcome {
        pid: u.pid,
        rank: rank_of(u.pid),
        ended: Ended::Unkillable,
        state: Some(u.state),
        stuck_thread: u.stuck_thread.clone(),
    }));
    let label = |ranks: &[u32], fallback: usize, what: &str| match ranks {
        [] => format!("{fallback} process{}", if fallback == 1 { "" } else { "es" }),
        many => hangwatch_model::ranks_words(many),
    } + what;
    let n_ended = report.ended_by_term.len() + report.ended_by_kill.len();
    let mut detail = format!(
        "{} ({} by SIGTERM, {} by SIGKILL) in {:.1}s",
        label(&ended, n_ended, " ended"),
        report.ended_by_term.len(),
        report.ended_by_kill.len(),
        report.elapsed.as_secs_f64()
    );
    if !report.unkillable.is_empty() {
        detail.push_str(&format!(
            "; {}",
            label(&stuck, report.unkillable.len(), " could not be killed")
        ));
    }
    let mut actions = vec![ActionRecord {
        action: "terminate".into(),
        ranks: ended,
        ok: true,
        detail: Some(detail),
        outcomes,
    }];
    if !report.unkillable.is_empty() {
        actions.push(ActionRecord {
            action: "unkillable".into(),
            ranks: stuck,
            ok: false,
            detail: Some(
                report
                    .unkillable
                    .iter()
                    .map(Unkillable::words)
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            outcomes: Vec::new(),
        });
    }
    actions
}

fn state_words(state: char) -> String {
    match state {
        'D' => "uninterruptible sleep (D)".into(),
        'Z' => "state Z (a zombie)".into(),
        '?' => "an unknown state".into(),
        other => format!("state {other}"),
    }
}

fn wait_all<P: JobProcess>(
    procs: &mut [P],
    alive: &mut Vec<usize>,
    until: Instant,
    cannot_act: &dyn Fn(i32) -> bool,
) {
    loop {
        alive.retain(|&i| !procs[i].has_exited());
        if alive.is_empty() || Instant::now() >= until {
            return;
        }
        // Only processes that cannot act on SIGTERM are left (blocked in the kernel, or a launcher waiting for
        // nothing but those): the grace would be spent waiting on the unkillable.
        if alive.iter().all(|&i| cannot_act(procs[i].pid())) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// TERM -> `grace` -> KILL -> `kill_wait` -> report. Never waits longer than `grace + kill_wait`. `cannot_act`:
/// whether a process cannot act on SIGTERM (the verdict found it blocked in the kernel, or it is a launcher whose
/// only live descendants are such processes); the grace ends as soon as only such processes are left.
pub fn terminate<P: JobProcess>(
    procs: &mut [P],
    grace: Duration,
    kill_wait: Duration,
    cannot_act: &dyn Fn(i32) -> bool,
    remains_of: impl Fn(i32) -> Remains,
) -> TerminationReport {
    terminate_with(procs, grace, kill_wait, cannot_act, remains_of, &mut |_| {})
}

/// [`terminate`], with `also` called after each of hangwatch's own signals (SIGTERM, SIGKILL) to pass it on where
/// a process group cannot reach (a container's processes, through its runtime).
pub fn terminate_with<P: JobProcess>(
    procs: &mut [P],
    grace: Duration,
    kill_wait: Duration,
    cannot_act: &dyn Fn(i32) -> bool,
    remains_of: impl Fn(i32) -> Remains,
    also: &mut dyn FnMut(Signal),
) -> TerminationReport {
    let started = Instant::now();
    let mut report = TerminationReport::default();
    let mut alive: Vec<usize> = (0..procs.len())
        .filter(|&i| !procs[i].has_exited())
        .collect();
    if alive.is_empty() {
        return report;
    }
    let live_now: Vec<usize> = alive.clone();
    let live_procs: Vec<&P> = live_now.iter().map(|&i| &procs[i]).collect();
    signal_each(&live_procs, Signal::SIGTERM);
    also(Signal::SIGTERM);
    wait_all(procs, &mut alive, Instant::now() + grace, cannot_act);
    report.ended_by_term = live_now
        .iter()
        .filter(|i| !alive.contains(i))
        .map(|&i| procs[i].pid())
        .collect();
    if !alive.is_empty() {
        let before_kill = alive.clone();
        let remaining: Vec<&P> = alive.iter().map(|&i| &procs[i]).collect();
        signal_each(&remaining, Signal::SIGKILL);
        also(Signal::SIGKILL);
        wait_all(procs, &mut alive, Instant::now() + kill_wait, &|_| false);
        report.ended_by_kill = before_kill
            .iter()
            .filter(|i| !alive.contains(i))
            .map(|&i| procs[i].pid())
            .collect();
        report.unkillable = alive
            .iter()
            .map(|&i| {
                let pid = procs[i].pid();
                Unkillable::from_remains(pid, &remains_of(pid))
            })
            .collect();
    }
    report.elapsed = started.elapsed();
    report
}

/// [`terminate`] in a worker thread that reads /proc itself; `done` gets the report. `stuck`: the pids the verdict
/// found blocked in the kernel (see [`stuck_pids`]).
/// `container`: the job's container, when it is a container client's: each signal also goes to the container
/// through its runtime (`kill`, under a deadline), and afterwards the container is settled
/// (`crate::container::settle`: still running or not, its exit code, `rm` for `--rm`); `client_exit` gives the
/// client's exit code once it is gone.
pub fn spawn_termination<P: JobProcess + Send + 'static>(
    mut procs: Vec<P>,
    grace: Duration,
    kill_wait: Duration,
    stuck: Vec<i32>,
    container: Option<(crate::container::RuntimeCli, hangwatch_model::ContainerRef)>,
    client_exit: impl Fn(&[P]) -> Option<i32> + Send + 'static,
    done: impl FnOnce(TerminationReport) + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("hw-terminate".into())
        .spawn(move || {
            let procfs = ProcFs::new("/proc");
            let cannot_act = |pid: i32| cannot_act_on_term(&procfs, &stuck, pid);
            let mut problems: Vec<String> = Vec::new();
            let mut signalled = false;
            let mut also = |signal: Signal| {
                signalled = true;
                if let Some((cli, c)) = &container {
                    problems.extend(crate::container::signal_container(cli, c, signal.as_str()));
                }
            };
            let mut report = terminate_with(
                &mut procs,
                grace,
                kill_wait,
                &cannot_act,
                |pid| remains(&procfs, pid),
                &mut also,
            );
            if let Some((cli, mut c)) = container {
                // Nothing of the job was left to signal (its client gone): the container may still run.
                if !signalled {
                    problems.extend(crate::container::signal_container(&cli, &c, "SIGKILL"));
                }
                let unkillable_left = report.unkillable.iter().any(|u| procfs.stat(u.pid).is_ok());
                c.ended = Some(crate::container::settle(
                    &cli,
                    &c,
                    client_exit(&procs),
                    problems,
                    unkillable_left,
                ));
                report.container = Some(c);
            }
            done(report);
        })
        .map(|_| ())
}

/// Processes `verdict` found blocked in the kernel: a culprit in D, or waiting on a filesystem that did not answer
/// its probe. They cannot act on SIGTERM until their call returns. A job-wide verdict names processes of every
/// node: pids are this node's (`node`) only where the node is.
pub fn stuck_pids(verdict: Option<&Verdict>, node: Option<&str>) -> Vec<i32> {
    let Some(verdict) = verdict else {
        return Vec::new();
    };
    let unresponsive = |mount: &Option<String>| {
        mount.as_ref().is_some_and(|m| {
            verdict
                .filesystems
                .iter()
                .any(|f| &f.mount == m && f.responsive == Some(false))
        })
    };
    let here = |culprit: &Option<String>| {
        culprit.is_none() || node.is_none() || culprit.as_deref() == node
    };
    verdict
        .culprits
        .iter()
        .filter(|c| here(&c.node))
        .filter(|c| c.state == "D" || unresponsive(&c.mount))
        .map(|c| c.pid)
        .collect()
}

/// Ranks that `verdict` places in a `torch.distributed` wait (a collective, a barrier) on this node while a
/// culprit is stuck in the kernel ([`stuck_pids`]): their collective cannot complete, and a SIGTERM handler of
/// theirs runs only when it does (Lightning's records the signal and lets the rank go on; Python runs a handler
/// between bytecodes, never inside the C call that waits). A rank without a handler is gone at SIGTERM; one with
/// a handler would hold the whole grace for nothing. Measured: Lightning 2.6 DDP, rank 0 in D in `mkdir`, rank 1 in
/// `barrier`: the job ended 32 s after the freeze, 10 s of it the grace spent on rank 1.
pub fn held_pids(verdict: Option<&Verdict>, node: Option<&str>) -> Vec<i32> {
    let Some(v) = verdict else {
        return Vec::new();
    };
    let stuck = stuck_pids(verdict, node);
    if stuck.is_empty() {
        return Vec::new();
    }
    v.ranks
        .iter()
        .map(|r| &r.at)
        .filter(|at| at.node.is_none() || node.is_none() || at.node.as_deref() == node)
        .filter(|at| !stuck.contains(&at.pid))
        .filter(|at| hangwatch_diagnosis::activity::in_distributed(&at.where_))
        .map(|at| at.pid)
        .collect()
}

/// Whether `pid` cannot act on SIGTERM: the verdict found it blocked in the kernel (`stuck`), or it is a launcher
/// (torchrun) whose only live descendants are such processes — it waits for them and would hold the grace for
/// nothing. Zombies do not count: a rank in D cannot reap its exited DataLoader workers.
pub fn cannot_act_on_term(procfs: &ProcFs, stuck: &[i32], pid: i32) -> bool {
    if stuck.is_empty() {
        return false;
    }
    if stuck.contains(&pid) {
        return true;
    }
    let live: Vec<i32> = procfs
        .descendants(pid)
        .unwrap_or_default()
        .into_iter()
        .filter(|d| procfs.stat(*d).is_ok_and(|s| s.state != 'Z'))
        .collect();
    !live.is_empty() && live.iter().all(|d| stuck.contains(d))
}

/// What /proc shows of a process that SIGKILL did not end (safe reads: stat of each task).
fn remains(procfs: &ProcFs, pid: i32) -> Remains {
    Remains {
        state: procfs.stat(pid).ok().map(|s| s.state),
        threads: procfs
            .list_threads(pid)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|tid| {
                procfs
                    .task_stat(pid, tid)
                    .ok()
                    .map(|s| (tid, s.comm, s.state))
            })
            .collect(),
    }
}

/// Adds what `report` says the termination did to `verdict` (the ranks by `rank_of`), and says which processes
/// could not be killed and that `node` must be drained.
pub fn report_termination(
    verdict: Option<&mut Verdict>,
    report: &TerminationReport,
    node: &str,
    rank_of: impl Fn(i32) -> Option<u32>,
) {
    for u in &report.unkillable {
        say(format!(
            "hangwatch: {}: not waiting for it; drain or reboot {node}",
            u.words()
        ));
    }
    let container_words = report.container.as_ref().and_then(|c| {
        let ended = c.ended.as_ref()?;
        let words = crate::container::ended_words(c, ended);
        say(format!("hangwatch: {words}"));
        Some((words, ended.problems.is_empty() || !ended.still_running))
    });
    let Some(verdict) = verdict else {
        return;
    };
    verdict.actions.extend(termination_actions(report, rank_of));
    if let (Some(container), Some((words, ok))) = (&report.container, container_words) {
        verdict.actions.push(hangwatch_model::ActionRecord {
            action: "container".into(),
            ranks: Vec::new(),
            ok,
            detail: Some(words),
            outcomes: Vec::new(),
        });
        verdict.container = Some(container.clone());
    }
    if !report.unkillable.is_empty() {
        verdict.recommendations.insert(
            0,
            format!(
                "processes of this job are stuck in the kernel and cannot be killed: drain {node} (or reboot it) \
                 and restart the job elsewhere"
            ),
        );
    }
}

/// Signals each process's group, and the process itself (one that left its group with setsid still gets it).
fn signal_each<P: JobProcess>(procs: &[&P], signal: Signal) {
    let mut groups: Vec<i32> = procs.iter().map(|p| p.pgid()).filter(|g| *g > 1).collect();
    groups.sort_unstable();
    groups.dedup();
    for g in groups {
        if let Err(e) = killpg(Pid::from_raw(g), signal) {
            tracing::debug!(pgid = g, error = %e, "signal to process group failed");
        }
    }
    for p in procs {
        let _ = nix::sys::signal::kill(Pid::from_raw(p.pid()), signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: i32, rank: u32, state: &str, where_: &str) -> hangwatch_model::RankReport {
        serde_json::from_value(serde_json::json!({
            "rank": rank, "pid": pid, "state": state, "where": where_, "cpu_ms_during_sample": 0,
        }))
        .expect("a rank row")
    }

    #[test]
    fn ranks_waiting_in_a_collective_behind_a_rank_in_d_are_held_and_no_others() {
        let mut v = Verdict::unknown("rank 0 is blocked in the kernel");
        let mut culprit = hangwatch_model::Culprit::at(hangwatch_model::RankPlace {
            rank: Some(0),
            pid: 100,
            state: "D".into(),
            ..Default::default()
        });
        culprit.at.where_ = "LocalFileSystem.makedirs (fsspec/implementations/local.py)".into();
        v.culprits.push(culprit);
        v.ranks = vec![
            row(
                100,
                0,
                "D",
                "LocalFileSystem.makedirs (fsspec/implementations/local.py)",
            ),
            row(
                101,
                1,
                "S",
                "barrier (torch/distributed/distributed_c10d.py)",
            ),
            row(102, 2, "S", "fetch (train.py)"),
        ];
        assert_eq!(stuck_pids(Some(&v), None), [100]);
        assert_eq!(
            held_pids(Some(&v), None),
            [101],
            "rank 2 is not in a collective"
        );
        // Nobody stuck (a rank that diverged): every rank keeps its grace.
        v.culprits[0].at.state = "S".into();
        assert!(held_pids(Some(&v), None).is_empty());
        assert!(held_pids(None, None).is_empty());
    }

    #[test]
    fn a_termination_says_which_ranks_ended_and_which_could_not_be_killed() {
        let report = TerminationReport {
            ended_by_term: vec![101, 102],
            ended_by_kill: vec![103, 99],
            unkillable: vec![Unkillable {
                pid: 100,
                state: 'D',
                stuck_thread: None,
            }],
            elapsed: Duration::from_millis(2100),
            container: None,
        };
        let rank_of = |pid: i32| (100..104).contains(&pid).then(|| (pid - 100) as u32);
        let actions = termination_actions(&report, rank_of);
        assert_eq!(actions[0].action, "terminate");
        assert_eq!(actions[0].ranks, [1, 2, 3]);
        assert!(actions[0].ok, "ranks 1-3 ended: that part did not fail");
        assert_eq!(
            actions[0].detail.as_deref(),
            Some(
                "ranks 1-3 ended (2 by SIGTERM, 2 by SIGKILL) in 2.1s; rank 0 could not be killed"
            )
        );
        assert_eq!(actions[0].outcomes.len(), 5);
        assert_eq!(actions[1].action, "unkillable");
        assert_eq!(actions[1].ranks, [0]);
        assert!(!actions[1].ok);
        assert_eq!(
            actions[1].detail.as_deref(),
            Some("pid 100 is still in uninterruptible sleep (D) after SIGKILL")
        );
        let clean = termination_actions(
            &TerminationReport {
                ended_by_term: vec![100],
                ..Default::default()
            },
            rank_of,
        );
        assert_eq!(clean.len(), 1);
        assert_eq!(
            clean[0].detail.as_deref(),
            Some("rank 0 ended (1 by SIGTERM, 0 by SIGKILL) in 0.0s")
        );
    }

    #[test]
    fn a_zombie_held_by_a_thread_in_d_is_said_as_such() {
        let zombie = Unkillable::from_remains(
            42,
            &Remains {
                state: Some('Z'),
                threads: vec![(42, "python".into(), 'Z'), (57, "ckpt-writer".into(), 'D')],
            },
        );
        assert_eq!(
            zombie.words(),
            "pid 42's main thread exited (Z), but its thread 57 (ckpt-writer) is still in uninterruptible sleep \
             (D) after SIGKILL"
        );
        let main = Unkillable::from_remains(
            42,
            &Remains {
                state: Some('D'),
                threads: vec![(42, "python".into(), 'D'), (43, "pin_memory".into(), 'S')],
            },
        );
        assert_eq!(main.stuck_thread, None);
        assert_eq!(
            main.words(),
            "pid 42 is still in uninterruptible sleep (D) after SIGKILL"
        );
        let gone = Unkillable::from_remains(42, &Remains::default());
        assert_eq!(
            gone.words(),
            "pid 42 is still in an unknown state after SIGKILL"
        );
    }
}
