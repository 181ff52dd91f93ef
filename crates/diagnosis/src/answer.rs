//! What a node's roll-call answer to the coordinator carries: its observations with the idle threads folded.
//!
//! A PyTorch rank has a few dozen threads, most of them asleep on the same futex; at 1,250 nodes their copies are
//! most of the 130 MB that one roll call sends to the coordinator. The coordinator decides from each rank's telling
//! thread ([`crate::position`]), and a thread that waits just like one already kept, without running, can never be
//! that thread: it is folded into a count. The node keeps every thread in its own evidence.

use hangwatch_model::{
    NodeObservations, ProcessObservation, SyscallObservation, ThreadObservation,
};

/// Folds, in every process of `node` (ranks and workers), the threads that wait just like a thread kept before them.
pub fn fold_idle_threads(node: &mut NodeObservations) {
    for process in node.ranks.iter_mut().chain(node.workers.iter_mut()) {
        fold_process(process);
    }
}

fn fold_process(process: &mut ProcessObservation) {
    let pid = process.pid;
    let mut kept: Vec<ThreadObservation> = Vec::with_capacity(process.threads.len());
    let mut folded = 0u32;
    for thread in std::mem::take(&mut process.threads) {
        if thread.tid != pid && is_idle(&thread) && kept.iter().any(|k| waits_alike(k, &thread)) {
            folded += 1;
        } else {
            kept.push(thread);
        }
    }
    process.threads = kept;
    process.threads_folded += folded;
}

/// Asleep in a system call, without CPU time during the sample and without a pending kill: never the telling
/// thread of its process (a filesystem or page-fault wait is in D, or is kept as the first of its kind).
fn is_idle(thread: &ThreadObservation) -> bool {
    thread.state == 'S'
        && thread.cpu_ms_during_sample.unwrap_or(0) == 0
        && !thread.sigkill_pending
        && matches!(thread.syscall, Some(SyscallObservation::InSyscall { .. }))
}

/// The same wait: state, wait channel, system call (by number, and the file it waits on) and kernel stack.
fn waits_alike(a: &ThreadObservation, b: &ThreadObservation) -> bool {
    let call = |t: &ThreadObservation| match &t.syscall {
        Some(SyscallObservation::InSyscall { nr, file, .. }) => Some((*nr, file.clone())),
        _ => None,
    };
    a.state == b.state
        && a.wchan == b.wchan
        && a.kernel_stack == b.kernel_stack
        && call(a) == call(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::classify;

    fn thread(tid: i32, state: char, wchan: &str, nr: i64, cpu: u64) -> ThreadObservation {
        ThreadObservation {
            tid,
            state,
            wchan: Some(wchan.into()),
            syscall: Some(SyscallObservation::InSyscall {
                nr,
                name: None,
                args: vec![],
                fd: None,
                file: None,
                path: None,
            }),
            cpu_ms_during_sample: Some(cpu),
            ..ThreadObservation::default()
        }
    }

    /// A rank as a PyTorch rank looks: the main thread in a barrier, 20 helper threads on one futex, one on a
    /// socket, one that ran during the sample.
    fn rank() -> ProcessObservation {
        let mut threads = vec![thread(100, 'S', "futex_wait_queue", 202, 0)];
        threads.extend((1..=20).map(|i| thread(100 + i, 'S', "futex_wait_queue", 202, 0)));
        threads.push(thread(121, 'S', "do_epoll_wait", 232, 0));
        threads.push(thread(122, 'S', "futex_wait_queue", 202, 3));
        ProcessObservation {
            pid: 100,
            rank: Some(0),
            threads,
            ..ProcessObservation::default()
        }
    }

    #[test]
    fn threads_that_wait_like_a_kept_one_are_counted_not_sent() {
        let mut node = NodeObservations::new(Some("n1".into()), 100);
        node.ranks.push(rank());
        fold_idle_threads(&mut node);
        let p = &node.ranks[0];
        let tids: Vec<i32> = p.threads.iter().map(|t| t.tid).collect();
        // The main thread (the 20 helpers wait on the same futex as it does), the socket wait, the thread that ran.
        assert_eq!(tids, vec![100, 121, 122]);
        assert_eq!(p.threads_folded, 20);
        assert_eq!(p.threads.len() as u32 + p.threads_folded, 23);
    }

    #[test]
    fn folding_leaves_the_position_of_every_kind_of_rank_as_it_was() {
        let mut blocked = rank();
        blocked.threads[5] = thread(105, 'D', "jbd2_log_wait_commit", 1, 0);
        let mut busy = rank();
        busy.threads[0].state = 'R';
        busy.threads[0].syscall = Some(SyscallObservation::Running);
        let mut busy_no_cpu = busy.clone();
        busy_no_cpu.threads[22].cpu_ms_during_sample = Some(0);
        let mut spinning = rank();
        spinning.threads[12].cpu_ms_during_sample = Some(95);
        for process in [rank(), blocked, busy, busy_no_cpu, spinning] {
            let before = classify(&process, 100);
            let mut folded = process.clone();
            fold_process(&mut folded);
            assert!(folded.threads.len() < process.threads.len());
            assert_eq!(classify(&folded, 100), before, "{process:?}");
        }
    }

    #[test]
    fn a_thread_with_a_kill_pending_or_another_kernel_stack_is_kept() {
        let mut p = rank();
        p.threads[3].sigkill_pending = true;
        p.threads[4].kernel_stack = Some(vec!["futex_wait".into(), "do_futex".into()]);
        fold_process(&mut p);
        let tids: Vec<i32> = p.threads.iter().map(|t| t.tid).collect();
        assert!(tids.contains(&103) && tids.contains(&104), "{tids:?}");
    }
}
