//! No process of the job outlives hangwatch: the job's process groups are swept when the job ends (a DataLoader
//! worker or daemon that outlived its rank), and a small `__job-reaper` child sweeps them if hangwatch itself dies
//! (SIGKILL, the OOM killer) — it learns the groups through a pipe and acts when the pipe closes without a "done".
//!
//! A group is known by its leader's pid and start time: a member is swept only if it started no earlier than the
//! leader, so a pid (and group id) reused by an unrelated process after the job is never signalled.

use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command, Stdio};

use hangwatch_proc::ProcFs;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A process group of the job: its leader's pid (the group id) and start time (clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobGroup {
    pub pgid: i32,
    pub leader_start: u64,
}

impl JobGroup {
    /// The group led by `pid`, if it is still there to be read.
    pub fn of_leader(procfs: &ProcFs, pid: i32) -> Option<Self> {
        let stat = procfs.stat(pid).ok()?;
        // A process that is not its group's leader (it moved itself): members must be no older than it.
        Some(Self {
            pgid: stat.pgrp,
            leader_start: stat.starttime,
        })
    }
}

/// One process found in a job's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub pid: i32,
    pub pgrp: i32,
    pub start: u64,
    pub state: char,
}

/// Pure: which of `processes` belong to one of `groups` (same group id, started no earlier than its leader).
pub fn members_of(groups: &[JobGroup], processes: &[Member], own_pid: i32) -> Vec<Member> {
    processes
        .iter()
        .filter(|p| p.pid != own_pid && p.state != 'Z')
        .filter(|p| {
            groups
                .iter()
                .any(|g| g.pgid == p.pgrp && p.start >= g.leader_start)
        })
        .copied()
        .collect()
}

/// Every process on the machine, as far as /proc/PID/stat tells (a safe read: it never touches a filesystem).
pub fn all_processes(procfs: &ProcFs) -> Vec<Member> {
    procfs
        .all_stats()
        .into_iter()
        .map(|stat| Member {
            pid: stat.pid,
            pgrp: stat.pgrp,
            start: stat.starttime,
            state: stat.state,
        })
        .collect()
}

/// SIGKILLs every live member of `groups`. Returns the pids signalled.
pub fn sweep(procfs: &ProcFs, groups: &[JobGroup]) -> Vec<i32> {
    if groups.is_empty() {
        return Vec::new();
    }
    let own = std::process::id() as i32;
    let members = members_of(groups, &all_processes(procfs), own);
    members
        .iter()
        .filter(|m| kill(Pid::from_raw(m.pid), Signal::SIGKILL).is_ok())
        .map(|m| m.pid)
        .collect()
}

/// The `__job-reaper` child, from hangwatch's side.
#[derive(Debug)]
pub struct Reaper {
    child: Child,
    stdin: Option<ChildStdin>,
}

/// The line that tells the reaper that hangwatch ended normally.
const DONE: &str = "done";

impl Reaper {
    /// Starts `program __job-reaper` in its own process group (a Ctrl-C for hangwatch is not for it).
    pub fn start(program: &std::path::Path) -> std::io::Result<Self> {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(program)
            .arg("__job-reaper")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let stdin = child.stdin.take();
        Ok(Self { child, stdin })
    }

    /// Tells the reaper about a group of the job. A reaper that is gone is noted once, not retried.
    pub fn watch(&mut self, group: JobGroup) {
        let line = format!("{} {}\n", group.pgid, group.leader_start);
        if let Some(stdin) = &mut self.stdin {
            // A few bytes into an empty pipe: never blocks in practice (the reaper reads as they come).
            if let Err(e) = stdin.write_all(line.as_bytes()) {
                tracing::warn!(error = %e, "the job reaper went away: processes of the job may outlive a killed hangwatch");
                self.stdin = None;
            }
        }
    }

    /// hangwatch ends normally: the reaper exits without touching anything.
    pub fn release(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(format!("{DONE}\n").as_bytes());
        }
        // It exits as soon as it reads the line; reap it if it already has, never wait.
        hangwatch_child::reap_within(
            &mut self.child,
            std::time::Duration::from_millis(100),
            std::time::Duration::from_millis(2),
        );
    }
}

/// The reaper child's main: reads groups until "done" (exit quietly) or end of input (hangwatch died: sweep).
pub fn reaper_main(input: impl BufRead, procfs: &ProcFs) {
    // Only the end of the pipe decides (the binary makes its helpers deaf to SIGTERM, SIGINT and SIGHUP).
    let mut groups = Vec::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        if line.trim() == DONE {
            return;
        }
        let mut fields = line.split_whitespace().map(str::parse::<i64>);
        if let (Some(Ok(pgid)), Some(Ok(start))) = (fields.next(), fields.next()) {
            if let (Ok(pgid), Ok(start)) = (i32::try_from(pgid), u64::try_from(start)) {
                groups.push(JobGroup {
                    pgid,
                    leader_start: start,
                });
            }
        }
    }
    // hangwatch is gone: twice, for members that were forking while we looked.
    sweep(procfs, &groups);
    std::thread::sleep(std::time::Duration::from_millis(200));
    sweep(procfs, &groups);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pid: i32, pgrp: i32, start: u64) -> Member {
        Member {
            pid,
            pgrp,
            start,
            state: 'S',
        }
    }

    #[test]
    fn members_are_in_a_job_group_and_no_older_than_its_leader() {
        let groups = [JobGroup {
            pgid: 100,
            leader_start: 5000,
        }];
        let procs = [
            m(100, 100, 5000), // the leader
            m(101, 100, 5100), // a DataLoader worker
            m(102, 100, 4000), // older than the leader: the group id was reused later, not ours
            m(200, 200, 6000), // another group
            m(7, 100, 9000),   // hangwatch itself never
            Member {
                state: 'Z',
                ..m(103, 100, 5200)
            },
        ];
        let found: Vec<i32> = members_of(&groups, &procs, 7)
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(found, vec![100, 101]);
    }
}
