//! The roll call's second look: a thread whose state at the second sample was one instant's (in D, or on a CPU
//! with no CPU time known for the window) is read again a moment later, by the same safe reads (`stat` and
//! `status` of the task, which take no lock a stuck thread can hold), so that the decision can tell a wait that
//! lasts from a page fault on a healthy disk caught in passing.

use std::time::{Duration, Instant};

use hangwatch_diagnosis::position::wants_second_look;
use hangwatch_model::ProcessObservation;
use hangwatch_proc::{second_look, ProcFs, ReadError};

/// The least time between a process's second sample and the second look at its threads: a page read from a
/// local disk, or a thread's wake from a timed wait, is over well within it; a wait on a filesystem that does
/// not answer is not.
pub const AFTER: Duration = Duration::from_millis(200);

/// Looks again at the threads of `observations` that want it ([`wants_second_look`]), once the latest of
/// `sampled_at` (each observation's second sample, in order) is [`AFTER`] old; sleeps until then only when some
/// thread wants a look. A thread that cannot be read for another reason than having exited keeps no look.
pub fn look_again(
    procfs: &ProcFs,
    observations: &mut [ProcessObservation],
    sampled_at: &[Instant],
    clk_tck: u64,
) {
    let wanted = |o: &ProcessObservation| !o.exited && o.threads.iter().any(wants_second_look);
    if !observations.iter().any(wanted) {
        return;
    }
    if let Some(latest) = sampled_at.iter().max() {
        std::thread::sleep((*latest + AFTER).saturating_duration_since(Instant::now()));
    }
    for (observation, &at) in observations.iter_mut().zip(sampled_at) {
        if !wanted(observation) {
            continue;
        }
        let pid = observation.pid;
        for thread in observation
            .threads
            .iter_mut()
            .filter(|t| wants_second_look(t))
        {
            let stat = match procfs.task_stat(pid, thread.tid) {
                Ok(stat) => Some(stat),
                Err(ReadError::ThreadExited { .. } | ReadError::ProcessExited { .. }) => None,
                Err(_) => continue,
            };
            let status = stat
                .as_ref()
                .and_then(|_| procfs.task_status(pid, thread.tid).ok());
            thread.second_look = Some(second_look(
                thread,
                stat.as_ref().map(|s| (s, status.as_ref())),
                at.elapsed(),
                clk_tck,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::ThreadObservation;

    /// This test process's own thread, as an observation that says it was in D with counters read before.
    fn in_d_now(tid: i32) -> ThreadObservation {
        ThreadObservation {
            tid,
            state: 'D',
            cpu_ms_total: Some(0),
            voluntary_ctxt_switches: Some(0),
            nonvoluntary_ctxt_switches: Some(0),
            ..Default::default()
        }
    }

    #[test]
    fn a_thread_seen_in_d_is_looked_at_again_and_one_asleep_is_not() {
        let procfs = ProcFs::new("/proc");
        let pid = i32::try_from(std::process::id()).expect("a pid");
        let tid: i32 = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|link| link.file_name()?.to_str()?.parse().ok())
            .expect("this thread's id");
        let mut asleep = in_d_now(tid);
        asleep.state = 'S';
        asleep.cpu_ms_during_sample = Some(0);
        let mut observations = vec![
            ProcessObservation {
                pid,
                threads: vec![in_d_now(tid)],
                ..Default::default()
            },
            ProcessObservation {
                pid,
                threads: vec![asleep],
                ..Default::default()
            },
            ProcessObservation {
                pid: i32::MAX,
                threads: vec![in_d_now(i32::MAX)],
                ..Default::default()
            },
        ];
        let at = Instant::now();
        look_again(&procfs, &mut observations, &[at, at, at], 100);
        assert!(at.elapsed() >= AFTER, "the look waits its moment");
        let look = observations[0].threads[0]
            .second_look
            .expect("a thread in D is looked at again");
        // This thread is running the test: not in D, and it ran since the made-up counters.
        assert_eq!(look.state, 'R');
        assert!(look.after_ms >= 200, "{look:?}");
        assert!(look.moved_on('D'));
        assert_eq!(observations[1].threads[0].second_look, None);
        assert_eq!(
            observations[2].threads[0].second_look.map(|l| l.state),
            Some('X'),
            "a thread gone by then is said to be"
        );
    }
}
