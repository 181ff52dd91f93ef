//! Raw per-thread samples of a process, and the pure merge of two samples into [`ThreadObservation`]s: whether
//! a thread ran between them, how much CPU it used, and which call and file it waits in.

use std::time::Duration;

use hangwatch_kernel::syscall::{file_arg, syscall_name, FileArg, AT_FDCWD};
use hangwatch_model::{
    FileRef, PathArg, ProcessObservation, SecondLook, SyscallObservation, ThreadObservation,
};
use serde::{Deserialize, Serialize};

use crate::resolve::FileTarget;
use crate::stat::TaskStat;
use crate::status::{SignalMask, Status};
use crate::syscall::SyscallLine;

/// One sample of one thread, as read from `/proc/PID/task/TID/`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadSample {
    pub tid: i32,
    pub stat: TaskStat,
    /// `None` when `status` could not be read; the thread is then never called "not running".
    pub status: Option<Status>,
    pub wchan: Option<String>,
    pub syscall: Option<SyscallLine>,
    /// `None` without permission (root only) or without kernel support; empty for a running thread.
    pub kernel_stack: Option<Vec<String>>,
}

/// One sample of a process and all its threads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessSample {
    pub pid: i32,
    /// `/proc/PID/stat`: the process as a whole (comm, state of the leader, process CPU time).
    pub stat: TaskStat,
    /// `/proc/PID/status`: tracer and process-wide pending signals.
    pub status: Option<Status>,
    /// Ordered by tid.
    pub threads: Vec<ThreadSample>,
    /// Reads that failed without making the sample useless, in words.
    pub issues: Vec<String>,
    /// `/proc/PID/io`: what the process has read and written so far; `None` where the file could not be read.
    #[serde(default)]
    pub io: Option<crate::IoCounters>,
}

impl ProcessSample {
    /// Pid of the attached tracer (0: none), when `status` was read.
    pub fn tracer_pid(&self) -> Option<i32> {
        self.status.as_ref().and_then(|s| s.tracer_pid)
    }

    /// Signals pending on the process or on any of its threads.
    pub fn pending(&self) -> SignalMask {
        self.threads
            .iter()
            .filter_map(|t| t.status.as_ref())
            .chain(self.status.as_ref())
            .fold(SignalMask::default(), |acc, s| acc.union(s.pending()))
    }

    /// The process is a zombie or dead: it exited and waits to be reaped.
    pub fn exited(&self) -> bool {
        matches!(self.stat.state, 'Z' | 'X' | 'x')
    }

    fn thread(&self, tid: i32) -> Option<&ThreadSample> {
        self.threads.iter().find(|t| t.tid == tid)
    }
}

/// Merges two samples of the same process taken `elapsed` apart.
///
/// - state, wchan, syscall and stack come from `second`;
/// - `not_running_for_ms` is `elapsed` when neither context-switch counter nor the CPU time moved (the test the
///   kernel's hung-task detector uses), `None` when one moved or when it cannot be told;
/// - a thread present only in `second` is reported with what one sample tells; one present only in `first`
///   exited and is left out. A tid whose start time changed is a new thread that reused the tid.
///
/// `resolve` turns a syscall's fd (or the current directory for `AT_FDCWD`) into a [`FileRef`]; for calls that
/// take a directory fd and a path, the path is a pointer into the rank's memory that is not read, so the file
/// reported is the directory it is relative to.
pub fn observe_threads(
    first: &ProcessSample,
    second: &ProcessSample,
    elapsed: Duration,
    clk_tck: u64,
    mut resolve: impl FnMut(FileTarget) -> Option<FileRef>,
) -> Vec<ThreadObservation> {
    let mut threads: Vec<&ThreadSample> = second.threads.iter().collect();
    threads.sort_by_key(|t| t.tid);
    let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    let process_pending = second
        .status
        .as_ref()
        .map(Status::pending)
        .unwrap_or_default();
    threads
        .into_iter()
        .map(|now| {
            let before = first
                .thread(now.tid)
                .filter(|b| b.stat.starttime == now.stat.starttime);
            let counters = now.status.as_ref();
            let cpu_delta =
                before.and_then(|b| now.stat.cpu_ticks().checked_sub(b.stat.cpu_ticks()));
            let switches_unchanged = before.and_then(|b| {
                let (b, n) = (b.status.as_ref()?, counters?);
                Some(
                    b.voluntary_ctxt_switches? == n.voluntary_ctxt_switches?
                        && b.nonvoluntary_ctxt_switches? == n.nonvoluntary_ctxt_switches?,
                )
            });
            let not_running_for_ms = match (switches_unchanged, cpu_delta) {
                (Some(true), Some(0)) => Some(elapsed_ms),
                _ => None,
            };
            let pending = counters
                .map(Status::pending)
                .unwrap_or_default()
                .union(process_pending);
            ThreadObservation {
                tid: now.tid,
                name: Some(now.stat.comm.clone()),
                state: now.stat.state,
                wchan: now.wchan.clone(),
                syscall: now.syscall.map(|line| decode_syscall(line, &mut resolve)),
                kernel_stack: now.kernel_stack.clone(),
                voluntary_ctxt_switches: counters.and_then(|s| s.voluntary_ctxt_switches),
                nonvoluntary_ctxt_switches: counters.and_then(|s| s.nonvoluntary_ctxt_switches),
                not_running_for_ms,
                cpu_ms_during_sample: cpu_delta.map(|ticks| ticks_to_ms(ticks, clk_tck)),
                cpu_ms_total: Some(ticks_to_ms(now.stat.cpu_ticks(), clk_tck)),
                sigkill_pending: pending.sigkill(),
                second_look: None,
            }
        })
        .collect()
}

/// [`observe_threads`] plus the process-level facts: comm, exited, tracer, pending SIGSTOP. Rank, node and
/// Python stacks are left for the caller, who knows them.
pub fn observe_process(
    first: &ProcessSample,
    second: &ProcessSample,
    elapsed: Duration,
    clk_tck: u64,
    resolve: impl FnMut(FileTarget) -> Option<FileRef>,
) -> ProcessObservation {
    ProcessObservation {
        pid: second.pid,
        comm: Some(second.stat.comm.clone()),
        exited: second.exited(),
        threads: observe_threads(first, second, elapsed, clk_tck, resolve),
        tracer_pid: second.tracer_pid(),
        sigstop_pending: second.pending().sigstop(),
        read_issues: first.issues.iter().chain(&second.issues).cloned().collect(),
        ns_pid: second.status.as_ref().and_then(Status::inner_pid),
        bytes_per_s_during_sample: bytes_per_s(first, second, elapsed),
        ..ProcessObservation::default()
    }
}

/// A later look at a thread observed by [`observe_threads`]: its `stat` and `status` read `after` its second
/// sample (`None`: the thread had exited by then). Whether it ran in between is told by the same counters as
/// `not_running_for_ms`: CPU time and context switches.
pub fn second_look(
    observed: &ThreadObservation,
    now: Option<(&TaskStat, Option<&Status>)>,
    after: Duration,
    clk_tck: u64,
) -> SecondLook {
    let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
    let Some((stat, status)) = now else {
        return SecondLook {
            after_ms,
            state: 'X',
            cpu_ms: None,
            switched: None,
        };
    };
    let cpu_ms = observed
        .cpu_ms_total
        .and_then(|before| ticks_to_ms(stat.cpu_ticks(), clk_tck).checked_sub(before));
    let switched = status.and_then(|s| {
        Some(
            s.voluntary_ctxt_switches? != observed.voluntary_ctxt_switches?
                || s.nonvoluntary_ctxt_switches? != observed.nonvoluntary_ctxt_switches?,
        )
    });
    SecondLook {
        after_ms,
        state: stat.state,
        cpu_ms,
        switched,
    }
}

/// How fast the process read or wrote between the two samples, in bytes per second; `None` where either
/// sample lacks its counters or no time passed.
fn bytes_per_s(first: &ProcessSample, second: &ProcessSample, elapsed: Duration) -> Option<u64> {
    // rchar + wchar: bytes through read and write calls (files, pipes, a socket read with read()).
    let bytes = |s: &ProcessSample| s.io.and_then(|io| Some(io.rchar?.wrapping_add(io.wchar?)));
    let moved = bytes(second)?.checked_sub(bytes(first)?)?;
    let ms = u64::try_from(elapsed.as_millis())
        .ok()
        .filter(|ms| *ms > 0)?;
    Some(moved.saturating_mul(1000) / ms)
}

/// Names the call and resolves its file argument.
pub fn decode_syscall(
    line: SyscallLine,
    resolve: &mut impl FnMut(FileTarget) -> Option<FileRef>,
) -> SyscallObservation {
    match line {
        SyscallLine::Running => SyscallObservation::Running,
        SyscallLine::NotInSyscall { pc, .. } => SyscallObservation::NotInSyscall { pc: Some(pc) },
        SyscallLine::InSyscall { nr, args, .. } => {
            let name = syscall_name(nr);
            let arg = |index: usize| args.get(index).copied();
            let fd_at = |index: usize| arg(index).map(|raw| raw as i32);
            // The directory a path argument is relative to: its dirfd, or the working directory.
            let dir_of = |index: Option<usize>| match index.map(fd_at) {
                None | Some(Some(AT_FDCWD)) => Some((None, FileTarget::Cwd)),
                Some(Some(fd)) if fd >= 0 => Some((Some(fd), FileTarget::Fd(fd))),
                Some(_) => None,
            };
            let (fd, file, path) = match name.map_or(FileArg::None, file_arg) {
                FileArg::None => (None, None, None),
                FileArg::Fd { index } => match fd_at(index) {
                    Some(fd) if fd >= 0 => (Some(fd), resolve(FileTarget::Fd(fd)), None),
                    _ => (None, None, None),
                },
                FileArg::DirFd { index, path } => {
                    path_call(dir_of(Some(index)), arg(path), resolve)
                }
                FileArg::CwdPath { path } => path_call(dir_of(None), arg(path), resolve),
            };
            SyscallObservation::InSyscall {
                nr,
                name: name.map(str::to_owned),
                args: args.to_vec(),
                fd,
                file,
                path,
            }
        }
    }
}

/// A call that takes a path: the file is not known until the string is read from the rank's memory (by the
/// inspector, in an abandonable child); here only where it is and the directory it is relative to. The directory
/// is never offered as the file: a `mkdir` on a frozen mount must not be blamed on the working directory's.
fn path_call(
    dir: Option<(Option<i32>, FileTarget)>,
    addr: Option<u64>,
    resolve: &mut impl FnMut(FileTarget) -> Option<FileRef>,
) -> (Option<i32>, Option<FileRef>, Option<Box<PathArg>>) {
    let Some(addr) = addr.filter(|a| *a != 0) else {
        return (None, None, None);
    };
    let (fd, base) = match dir {
        Some((fd, target)) => (fd, resolve(target).map(|f| f.path)),
        None => (None, None),
    };
    let path = PathArg {
        addr,
        base,
        text: None,
        unreadable: None,
    };
    (fd, None, Some(Box::new(path)))
}

fn ticks_to_ms(ticks: u64, clk_tck: u64) -> u64 {
    let ms = u128::from(ticks) * 1000 / u128::from(clk_tck.max(1));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(tid: i32, state: char, utime: u64, stime: u64) -> TaskStat {
        TaskStat {
            pid: tid,
            comm: "python3".into(),
            state,
            ppid: 1,
            pgrp: 1,
            session: 1,
            utime,
            stime,
            num_threads: 2,
            starttime: 5000,
            processor: Some(0),
        }
    }

    fn status(voluntary: u64, nonvoluntary: u64) -> Status {
        Status {
            voluntary_ctxt_switches: Some(voluntary),
            nonvoluntary_ctxt_switches: Some(nonvoluntary),
            tracer_pid: Some(0),
            sig_pnd: Some(SignalMask(0)),
            shd_pnd: Some(SignalMask(0)),
            ..Status::default()
        }
    }

    fn thread(tid: i32, stat: TaskStat, status: Status, syscall: SyscallLine) -> ThreadSample {
        ThreadSample {
            tid,
            stat,
            status: Some(status),
            wchan: None,
            syscall: Some(syscall),
            kernel_stack: None,
        }
    }

    fn process(threads: Vec<ThreadSample>) -> ProcessSample {
        ProcessSample {
            io: None,
            pid: 100,
            stat: threads[0].stat.clone(),
            status: threads[0].status.clone(),
            threads,
            issues: vec![],
        }
    }

    fn write_on(fd: u64) -> SyscallLine {
        SyscallLine::InSyscall {
            nr: 1,
            args: [fd, 0x7f00, 12, 0, 0, 0],
            sp: 1,
            pc: 2,
        }
    }

    fn no_files(_: FileTarget) -> Option<FileRef> {
        None
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn stuck_thread_did_not_run_and_busy_thread_did() {
        let first = process(vec![
            thread(100, stat(100, 'D', 10, 5), status(7, 2), write_on(3)),
            thread(
                101,
                stat(101, 'R', 300, 0),
                status(1, 40),
                SyscallLine::Running,
            ),
        ]);
        let second = process(vec![
            thread(100, stat(100, 'D', 10, 5), status(7, 2), write_on(3)),
            thread(
                101,
                stat(101, 'R', 398, 2),
                status(1, 41),
                SyscallLine::Running,
            ),
        ]);
        let observed = observe_threads(&first, &second, SECOND, 100, no_files);
        assert_eq!(observed.len(), 2);
        let (stuck, busy) = (&observed[0], &observed[1]);
        assert_eq!(stuck.tid, 100);
        assert_eq!(stuck.state, 'D');
        assert_eq!(stuck.not_running_for_ms, Some(1000));
        assert_eq!(stuck.cpu_ms_during_sample, Some(0));
        assert_eq!(stuck.cpu_ms_total, Some(150));
        assert_eq!(busy.not_running_for_ms, None);
        assert_eq!(busy.cpu_ms_during_sample, Some(1000));
        assert_eq!(busy.cpu_ms_total, Some(4000));
        assert_eq!(busy.syscall, Some(SyscallObservation::Running));
    }

    #[test]
    fn a_context_switch_alone_means_it_ran() {
        let first = process(vec![thread(
            100,
            stat(100, 'S', 1, 1),
            status(7, 2),
            write_on(3),
        )]);
        let second = process(vec![thread(
            100,
            stat(100, 'S', 1, 1),
            status(8, 2),
            write_on(3),
        )]);
        let observed = observe_threads(&first, &second, SECOND, 100, no_files);
        assert_eq!(observed[0].not_running_for_ms, None);
        assert_eq!(observed[0].cpu_ms_during_sample, Some(0));
    }

    #[test]
    fn cpu_time_alone_means_it_ran() {
        let first = process(vec![thread(
            100,
            stat(100, 'R', 1, 1),
            status(7, 2),
            SyscallLine::Running,
        )]);
        let second = process(vec![thread(
            100,
            stat(100, 'R', 2, 1),
            status(7, 2),
            SyscallLine::Running,
        )]);
        let observed = observe_threads(&first, &second, SECOND, 100, no_files);
        assert_eq!(observed[0].not_running_for_ms, None);
        assert_eq!(observed[0].cpu_ms_during_sample, Some(10));
    }

    #[test]
    fn new_thread_and_reused_tid_are_reported_with_one_sample() {
        let first = process(vec![
            thread(100, stat(100, 'S', 1, 1), status(7, 2), write_on(3)),
            thread(102, stat(102, 'S', 9, 9), status(1, 1), write_on(3)),
        ]);
        let mut reused = stat(102, 'S', 9, 9);
        reused.starttime = 9000;
        let second = process(vec![
            thread(100, stat(100, 'S', 1, 1), status(7, 2), write_on(3)),
            thread(102, reused, status(1, 1), write_on(3)),
            thread(103, stat(103, 'S', 0, 0), status(0, 0), write_on(3)),
        ]);
        let observed = observe_threads(&first, &second, SECOND, 100, no_files);
        assert_eq!(observed.len(), 3);
        assert_eq!(observed[0].not_running_for_ms, Some(1000));
        for new in &observed[1..] {
            assert_eq!(new.not_running_for_ms, None, "tid {}", new.tid);
            assert_eq!(new.cpu_ms_during_sample, None, "tid {}", new.tid);
            assert!(new.cpu_ms_total.is_some());
            assert!(new.syscall.is_some());
        }
    }

    #[test]
    fn a_second_look_tells_a_wait_that_lasted_from_one_that_moved_on() {
        let first = process(vec![thread(
            100,
            stat(100, 'S', 10, 5),
            status(7, 2),
            write_on(3),
        )]);
        let second = process(vec![thread(
            100,
            stat(100, 'D', 10, 5),
            status(8, 2),
            write_on(3),
        )]);
        let observed = &observe_threads(&first, &second, SECOND, 100, no_files)[0];
        let later = Duration::from_millis(250);

        // Still in D, not switched, no CPU: the wait lasted.
        let held = second_look(
            observed,
            Some((&stat(100, 'D', 10, 5), Some(&status(8, 2)))),
            later,
            100,
        );
        assert_eq!(
            held,
            SecondLook {
                after_ms: 250,
                state: 'D',
                cpu_ms: Some(0),
                switched: Some(false)
            }
        );
        assert!(!held.moved_on('D'));
        // In D again, but it was woken and slept again in between: a new wait.
        let again = second_look(
            observed,
            Some((&stat(100, 'D', 10, 5), Some(&status(10, 2)))),
            later,
            100,
        );
        assert_eq!(again.switched, Some(true));
        assert!(again.moved_on('D'));
        // Out of it, with a tick of CPU.
        let out = second_look(
            observed,
            Some((&stat(100, 'S', 11, 5), Some(&status(9, 2)))),
            later,
            100,
        );
        assert_eq!((out.state, out.cpu_ms), ('S', Some(10)));
        assert!(out.moved_on('D'));
        // Gone.
        let gone = second_look(observed, None, later, 100);
        assert_eq!(gone.state, 'X');
        assert!(gone.moved_on('D'));
        // Without counters (status unreadable), only the state tells.
        let blind = second_look(observed, Some((&stat(100, 'D', 10, 5), None)), later, 100);
        assert_eq!(blind.switched, None);
        assert!(!blind.moved_on('D'));
    }

    #[test]
    fn exited_thread_is_left_out() {
        let first = process(vec![
            thread(100, stat(100, 'S', 1, 1), status(7, 2), write_on(3)),
            thread(101, stat(101, 'S', 1, 1), status(7, 2), write_on(3)),
        ]);
        let second = process(vec![thread(
            100,
            stat(100, 'S', 1, 1),
            status(7, 2),
            write_on(3),
        )]);
        let observed = observe_threads(&first, &second, SECOND, 100, no_files);
        assert_eq!(observed.iter().map(|t| t.tid).collect::<Vec<_>>(), [100]);
    }

    #[test]
    fn without_status_it_cannot_tell() {
        let mut first = process(vec![thread(
            100,
            stat(100, 'D', 1, 1),
            status(7, 2),
            write_on(3),
        )]);
        let mut second = first.clone();
        first.threads[0].status = None;
        second.threads[0].status = None;
        let observed = observe_threads(&first, &second, SECOND, 100, no_files);
        assert_eq!(observed[0].not_running_for_ms, None);
        assert_eq!(observed[0].voluntary_ctxt_switches, None);
    }

    #[test]
    fn write_fd_is_resolved() {
        let sample = process(vec![thread(
            100,
            stat(100, 'D', 1, 1),
            status(7, 2),
            write_on(3),
        )]);
        let mut asked = vec![];
        let observed = observe_threads(&sample, &sample, SECOND, 100, |target| {
            asked.push(target);
            Some(FileRef {
                filesystem: None,
                path: "/shared/log.txt".into(),
                mount: Some("/shared".into()),
                fstype: Some("ext4".into()),
                source: Some("/dev/loop0".into()),
            })
        });
        assert_eq!(asked, [FileTarget::Fd(3)]);
        let Some(SyscallObservation::InSyscall {
            nr, name, fd, file, ..
        }) = &observed[0].syscall
        else {
            panic!("expected a syscall, got {:?}", observed[0].syscall);
        };
        assert_eq!(*nr, 1);
        assert_eq!(fd, &Some(3));
        if cfg!(target_arch = "x86_64") {
            assert_eq!(name.as_deref(), Some("write"));
            assert_eq!(file.as_ref().unwrap().mount.as_deref(), Some("/shared"));
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn dirfd_calls_resolve_the_directory() {
        let mut asked = vec![];
        let mut resolve = |target| {
            asked.push(target);
            None
        };
        let openat = |dirfd: i64| SyscallLine::InSyscall {
            nr: 257,
            args: [dirfd as u64, 0x7f00, 0, 0, 0, 0],
            sp: 0,
            pc: 0,
        };
        let cwd = decode_syscall(openat(-100), &mut resolve);
        assert!(matches!(
            cwd,
            SyscallObservation::InSyscall { fd: None, .. }
        ));
        let dir = decode_syscall(openat(7), &mut resolve);
        assert!(matches!(
            dir,
            SyscallObservation::InSyscall { fd: Some(7), .. }
        ));
        let anon_mmap = SyscallLine::InSyscall {
            nr: 9,
            args: [0, 4096, 3, 0x22, u64::MAX, 0],
            sp: 0,
            pc: 0,
        };
        let mmap = decode_syscall(anon_mmap, &mut resolve);
        assert!(matches!(
            mmap,
            SyscallObservation::InSyscall { fd: None, .. }
        ));
        let futex = SyscallLine::InSyscall {
            nr: 202,
            args: [0x7f00, 0x80, 2, 0, 0, 0xffffffff],
            sp: 0,
            pc: 0,
        };
        let futex = decode_syscall(futex, &mut resolve);
        assert!(matches!(
            futex,
            SyscallObservation::InSyscall {
                fd: None,
                file: None,
                ..
            }
        ));
        assert_eq!(asked, [FileTarget::Cwd, FileTarget::Fd(7)]);
    }

    #[test]
    fn not_in_syscall_and_unknown_numbers() {
        let mut resolve = no_files;
        assert_eq!(
            decode_syscall(SyscallLine::NotInSyscall { sp: 1, pc: 2 }, &mut resolve),
            SyscallObservation::NotInSyscall { pc: Some(2) }
        );
        let unknown = decode_syscall(
            SyscallLine::InSyscall {
                nr: 9999,
                args: [3, 0, 0, 0, 0, 0],
                sp: 0,
                pc: 0,
            },
            &mut resolve,
        );
        assert_eq!(
            unknown,
            SyscallObservation::InSyscall {
                nr: 9999,
                name: None,
                args: vec![3, 0, 0, 0, 0, 0],
                fd: None,
                file: None,
                path: None,
            }
        );
    }

    #[test]
    fn pending_signals_and_tracer() {
        let mut first = process(vec![
            thread(100, stat(100, 'S', 1, 1), status(7, 2), write_on(3)),
            thread(101, stat(101, 'S', 1, 1), status(7, 2), write_on(3)),
        ]);
        first.status.as_mut().unwrap().tracer_pid = Some(4242);
        let mut second = first.clone();
        second.threads[1].status.as_mut().unwrap().sig_pnd =
            Some(SignalMask(1 << (SignalMask::SIGKILL - 1)));
        second.status.as_mut().unwrap().shd_pnd = Some(SignalMask(1 << (SignalMask::SIGSTOP - 1)));
        let observation = observe_process(&first, &second, SECOND, 100, no_files);
        assert_eq!(observation.tracer_pid, Some(4242));
        assert!(observation.sigstop_pending);
        assert!(!observation.threads[0].sigkill_pending);
        assert!(observation.threads[1].sigkill_pending);
        assert_eq!(observation.comm.as_deref(), Some("python3"));
        assert!(!observation.exited);
    }

    #[test]
    fn zombie_is_exited() {
        let sample = process(vec![thread(
            100,
            stat(100, 'Z', 1, 1),
            status(7, 2),
            write_on(3),
        )]);
        assert!(observe_process(&sample, &sample, SECOND, 100, no_files).exited);
    }

    #[test]
    fn ticks_convert_with_any_clock() {
        assert_eq!(ticks_to_ms(150, 100), 1500);
        assert_eq!(ticks_to_ms(150, 250), 600);
        assert_eq!(ticks_to_ms(u64::MAX, 1), u64::MAX);
        assert_eq!(ticks_to_ms(5, 0), 5000);
    }
}
