//! Ending a job fast: SIGTERM to every process group, a grace period, SIGKILL, and then no more waiting: a process
//! still alive (in D state, a SIGKILL cannot take effect until its call returns) is reported as unkillable.

use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

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
    /// Pids still alive after SIGKILL and `kill_wait`, with their state letter.
    pub unkillable: Vec<(i32, char)>,
    pub elapsed: Duration,
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
    state_of: impl Fn(i32) -> Option<char>,
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
                (pid, state_of(pid).unwrap_or('?'))
            })
            .collect();
    }
    report.elapsed = started.elapsed();
    report
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
