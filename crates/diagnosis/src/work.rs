//! Whose CPU time is the job's work: the sign of life of a job that neither prints to hangwatch nor beats (a job
//! under the node service without its TaskProlog, a job that logs only to files). A rank that waits in a
//! collective still uses a little CPU in its library's background threads (gloo's `gloo_tcp_loop`: 10-20 ms every
//! 10 s, measured on torch 2.x gloo ranks waiting in `all_reduce`; its main thread: nothing), and taken as progress
//! that trickle hides a hang for ever. So a process works when the CPU time of its threads that are not
//! housekeeping ([`housekeeping_thread`]) advances by at least [`WORK_FLOOR_PERMILLE`] of one core over a sample
//! window: its main thread computing, a thread pool preparing data, a DataLoader worker.
//!
//! [`CpuWork`] keeps what the last look saw, per process; `now` is passed in. The whole process's CPU time is
//! looked at first (one `stat` file); its threads only when that reaches the floor, so a waiting job costs one
//! read per process per look.

use std::collections::HashMap;
use std::time::Duration;

/// The least CPU time, in thousandths of one core over the sample window, that the job's own threads must use for
/// a process to count as working: 5% of a core. A waiting gloo rank uses 0.1-0.2% (all of it in background
/// threads); a computing thread uses close to 100%; a main thread that steps through a small model between
/// sleeps uses 10% and more.
pub const WORK_FLOOR_PERMILLE: u64 = 50;

/// Thread names (prefixes, as `/proc/PID/task/TID/comm` shows them: at most 15 bytes) of the background threads
/// that libraries start in every rank and that run while the rank waits: they keep connections and watchdogs,
/// and their CPU time is no sign that the job works.
const HOUSEKEEPING: &[&str] = &[
    // gloo's event loop.
    "gloo_",
    // PyTorch's process-group watchdog and heartbeat monitor (NCCL), its TCPStore threads, the elastic agent.
    "pt_nccl_",
    "pt_tcpstore",
    "pt_elastic",
    // CUDA's event handler.
    "cuda-EvtHandlr",
    // NCCL's proxy threads: the progress thread polls while a collective waits.
    "NCCL ",
    // hangwatch's own threads inside a rank (the bootstrap's).
    "hangwatch",
];

/// Whether a thread of this name is a library's background thread (see `HOUSEKEEPING`).
pub fn housekeeping_thread(name: &str) -> bool {
    HOUSEKEEPING.iter().any(|prefix| name.starts_with(prefix))
}

/// One thread's CPU time as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadCpu<'a> {
    pub tid: i32,
    pub name: &'a str,
    /// User plus system time so far, in milliseconds.
    pub cpu_ms: u64,
}

/// What one look at a process found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// The first look at this process: nothing to compare with yet.
    FirstLook,
    /// Its own threads used at least the floor since the last look.
    Working,
    /// Below the floor (or only housekeeping above it).
    Idle,
}

/// The last look at one process.
#[derive(Debug, Clone, Default)]
struct Looked {
    at: Duration,
    cpu_ms: u64,
    /// Housekeeping threads' CPU time when the threads were last read (by tid).
    housekeeping_ms: HashMap<i32, u64>,
}

/// The CPU time seen of each process at the last look (see the module documentation).
#[derive(Debug, Default)]
pub struct CpuWork {
    seen: HashMap<i32, Looked>,
}

impl CpuWork {
    pub fn new() -> Self {
        Self::default()
    }

    /// Looks at process `pid` whose CPU time so far is `cpu_ms` (all threads, as `/proc/PID/stat` says);
    /// `threads` reads its threads, called at the first look and then only when the process as a whole reached
    /// the floor.
    pub fn look<'a>(
        &mut self,
        pid: i32,
        cpu_ms: u64,
        now: Duration,
        threads: impl FnOnce() -> Vec<ThreadCpu<'a>>,
    ) -> Work {
        let Some(last) = self.seen.get_mut(&pid) else {
            // The housekeeping threads' time so far is the base their share is measured from.
            let housekeeping_ms = threads()
                .into_iter()
                .filter(|t| housekeeping_thread(t.name))
                .map(|t| (t.tid, t.cpu_ms))
                .collect();
            self.seen.insert(
                pid,
                Looked {
                    at: now,
                    cpu_ms,
                    housekeeping_ms,
                },
            );
            return Work::FirstLook;
        };
        let window = now.saturating_sub(last.at);
        let used = cpu_ms.saturating_sub(last.cpu_ms);
        last.at = now;
        last.cpu_ms = cpu_ms;
        let floor = floor_ms(window);
        if window.is_zero() || used < floor {
            return Work::Idle;
        }
        // The housekeeping threads' share since they were last read; a thread not read before counts whole (the
        // share is then overestimated once, and the look says idle rather than working). Read long ago, their
        // share is overestimated by what they used since: a few milliseconds.
        let mut housekeeping = 0u64;
        let mut now_seen = HashMap::new();
        for t in threads() {
            if housekeeping_thread(t.name) {
                let before = last.housekeeping_ms.get(&t.tid).copied().unwrap_or(0);
                housekeeping = housekeeping.saturating_add(t.cpu_ms.saturating_sub(before));
                now_seen.insert(t.tid, t.cpu_ms);
            }
        }
        last.housekeeping_ms = now_seen;
        if used.saturating_sub(housekeeping) >= floor {
            Work::Working
        } else {
            Work::Idle
        }
    }

    /// Forgets processes not in `pids` (exited ranks and workers).
    pub fn retain(&mut self, pids: &std::collections::HashSet<i32>) {
        self.seen.retain(|pid, _| pids.contains(pid));
    }
}

/// The floor over `window`, in milliseconds of CPU time.
fn floor_ms(window: Duration) -> u64 {
    let ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    ms.saturating_mul(WORK_FLOOR_PERMILLE) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn thread(tid: i32, name: &'static str, cpu_ms: u64) -> ThreadCpu<'static> {
        ThreadCpu { tid, name, cpu_ms }
    }

    /// Looks once a second at a process with the given threads' CPU time per look (ms used per second each).
    fn looks(per_second: &[(i32, &'static str, u64)], seconds: u64) -> Vec<Work> {
        let mut work = CpuWork::new();
        let mut totals: Vec<u64> = per_second.iter().map(|_| 1_000).collect();
        let mut out = Vec::new();
        for s in 0..seconds {
            let threads: Vec<ThreadCpu> = per_second
                .iter()
                .zip(&totals)
                .map(|(&(tid, name, _), &ms)| thread(tid, name, ms))
                .collect();
            let whole = totals.iter().sum();
            out.push(work.look(7, whole, S(s), || threads));
            for (total, &(_, _, rate)) in totals.iter_mut().zip(per_second) {
                *total += rate;
            }
        }
        out
    }

    #[test]
    fn a_waiting_gloo_rank_is_idle_at_the_cpu_its_background_thread_uses() {
        // Measured: gloo_tcp_loop 10-20 ms per 10 s, the main thread nothing; here a generous 3 ms a second, and
        // an unnamed thread of the same trickle.
        let seen = looks(
            &[(7, "python", 0), (8, "gloo_tcp_loop", 3), (9, "python", 2)],
            12,
        );
        assert_eq!(seen[0], Work::FirstLook);
        assert!(seen[1..].iter().all(|w| *w == Work::Idle), "{seen:?}");
    }

    #[test]
    fn a_computing_main_thread_works_and_so_does_a_thread_pool() {
        let main = looks(&[(7, "python", 950), (8, "gloo_tcp_loop", 2)], 4);
        assert!(main[1..].iter().all(|w| *w == Work::Working), "{main:?}");
        let pool = looks(
            &[(7, "python", 0), (8, "python", 400), (9, "python", 400)],
            4,
        );
        assert!(pool[1..].iter().all(|w| *w == Work::Working), "{pool:?}");
    }

    #[test]
    fn a_main_thread_that_steps_between_sleeps_works() {
        // 0.05 s of sleep and a small model's step: about 10-30% of a core.
        let seen = looks(&[(7, "python", 120), (8, "gloo_tcp_loop", 2)], 4);
        assert!(seen[1..].iter().all(|w| *w == Work::Working), "{seen:?}");
    }

    #[test]
    fn a_polling_nccl_proxy_or_watchdog_is_not_work() {
        // NCCL's progress thread polls at a whole core while the rank waits in a collective.
        let seen = looks(
            &[
                (7, "python", 0),
                (8, "NCCL Progress 0", 1_000),
                (9, "pt_nccl_watchdg", 30),
            ],
            6,
        );
        assert!(seen[1..].iter().all(|w| *w == Work::Idle), "{seen:?}");
    }

    #[test]
    fn the_floor_scales_with_the_window_and_an_unchanged_clock_is_idle() {
        let mut work = CpuWork::new();
        assert_eq!(work.look(1, 0, S(0), Vec::new), Work::FirstLook);
        // 5% of 10 s is 500 ms: 400 ms in 10 s is idle, 600 ms working.
        assert_eq!(work.look(1, 400, S(10), Vec::new), Work::Idle);
        assert_eq!(work.look(1, 1_000, S(20), Vec::new), Work::Working);
        assert_eq!(work.look(1, 2_000, S(20), Vec::new), Work::Idle);
    }

    #[test]
    fn threads_are_read_only_when_the_process_reaches_the_floor() {
        let mut work = CpuWork::new();
        let read = std::cell::Cell::new(0);
        work.look(1, 0, S(0), || {
            read.set(read.get() + 1);
            vec![thread(2, "gloo_tcp_loop", 0)]
        });
        assert_eq!(
            read.get(),
            1,
            "the first look takes the housekeeping threads' base"
        );
        work.look(1, 10, S(1), || {
            read.set(read.get() + 1);
            Vec::new()
        });
        assert_eq!(read.get(), 1, "below the floor: one stat file only");
        work.look(1, 500, S(2), || {
            read.set(read.get() + 1);
            vec![thread(1, "python", 500)]
        });
        assert_eq!(read.get(), 2);
    }

    #[test]
    fn forgotten_processes_start_again_from_a_first_look() {
        let mut work = CpuWork::new();
        work.look(1, 0, S(0), Vec::new);
        work.look(2, 0, S(0), Vec::new);
        work.retain(&[2].into_iter().collect());
        assert_eq!(work.look(1, 5_000, S(1), Vec::new), Work::FirstLook);
        assert_eq!(work.look(2, 5_000, S(1), Vec::new), Work::Working);
    }

    #[test]
    fn library_threads_are_housekeeping_and_the_jobs_own_are_not() {
        for name in [
            "gloo_tcp_loop",
            "pt_nccl_watchdg",
            "pt_nccl_heartbt",
            "pt_tcpstore_uv",
            "pt_elastic",
            "cuda-EvtHandlr",
            "NCCL Progress 3",
            "NCCL Service 0",
            "hangwatch-rank",
        ] {
            assert!(housekeeping_thread(name), "{name}");
        }
        for name in [
            "python",
            "pt_autograd_0",
            "python3.11",
            "pt_main_thread",
            "torch-compile",
        ] {
            assert!(!housekeeping_thread(name), "{name}");
        }
    }
}
