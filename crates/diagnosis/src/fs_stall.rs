//! The fast path for a stuck filesystem: a rank that sits in a filesystem wait (D, or S in a FUSE/NFS request
//! wait) with its I/O counters still, or a rank that is stopped (T), for `--fs-stall`, while the job makes no
//! progress, is worth a roll call at once, whatever the learned threshold and the warm-up say. The roll call's
//! write probe of the rank's mount decides: a mount that does not answer (or a stopped rank) is conclusive; a
//! slow but moving filesystem answers the probe and nothing is ended.
//!
//! Pure: samples of each rank's threads in, time since the job started passed in.

use std::collections::HashMap;
use std::time::Duration;

/// How one rank is blocked, from the cheapest reads: its threads' states and wait channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Blocked {
    /// A thread in a filesystem wait.
    FilesystemWait,
    /// The rank is stopped (T) or traced-stopped (t).
    Stopped,
}

/// How one thread is blocked, if it is: `state` from its stat, `wchan` its wait channel. In D any wait counts
/// (D is the kernel's "do not disturb, I/O in progress"); in S, the filesystem waits the roll call knows (a FUSE or
/// NFS request, ...).
pub fn thread_blocked(state: char, wchan: Option<&str>) -> Option<Blocked> {
    match state {
        'D' => Some(Blocked::FilesystemWait),
        'T' | 't' => Some(Blocked::Stopped),
        'S' if wchan.is_some_and(hangwatch_kernel::filesystem::is_wait_frame) => {
            Some(Blocked::FilesystemWait)
        }
        _ => None,
    }
}

/// One rank at one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankSample {
    pub pid: i32,
    pub rank: Option<u32>,
    /// The way any of its threads is blocked (a stop outranks a wait), if one is.
    pub blocked: Option<Blocked>,
    /// The sum of its I/O counters (`/proc/PID/io`), when readable: bytes still flowing mean a slow filesystem,
    /// not a stuck one.
    pub io: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Since {
    blocked: Blocked,
    io: Option<u64>,
    at: Duration,
}

/// The longest-stuck rank, as the tracker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stuck {
    pub pid: i32,
    pub rank: Option<u32>,
    pub blocked: Blocked,
    /// Blocked the same way with I/O counters unchanged for this long.
    pub for_: Duration,
}

impl Stuck {
    /// What the fast path saw, for the line that says why a roll call is taken: "rank 0 stopped (T) for 12s",
    /// "rank 0 in a filesystem wait, its I/O still, for 12s".
    pub fn words(&self) -> String {
        let who = match self.rank {
            Some(r) => format!("rank {r}"),
            None => format!("pid {}", self.pid),
        };
        let secs = self.for_.as_secs_f64();
        match self.blocked {
            Blocked::Stopped => format!("{who} stopped (T) for {secs:.0}s"),
            Blocked::FilesystemWait => {
                format!("{who} in a filesystem wait, its I/O still, for {secs:.0}s")
            }
        }
    }
}

/// For each rank, since when it has been blocked the same way with its I/O counters unchanged.
#[derive(Debug, Default, Clone)]
pub struct FsStallTracker {
    since: HashMap<i32, Since>,
    ranks: HashMap<i32, Option<u32>>,
}

impl FsStallTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes this tick's samples (ranks not sampled are forgotten).
    pub fn observe(&mut self, samples: &[RankSample], now: Duration) {
        let mut next = HashMap::with_capacity(samples.len());
        for s in samples {
            let Some(blocked) = s.blocked else { continue };
            let kept = self
                .since
                .get(&s.pid)
                .filter(|old| old.blocked == blocked && old.io == s.io)
                .copied();
            next.insert(
                s.pid,
                kept.unwrap_or(Since {
                    blocked,
                    io: s.io,
                    at: now,
                }),
            );
        }
        self.since = next;
        self.ranks = samples.iter().map(|s| (s.pid, s.rank)).collect();
    }

    /// The rank blocked (I/O unchanged) the longest at `now`, if any is.
    pub fn longest(&self, now: Duration) -> Option<Stuck> {
        self.since
            .iter()
            .map(|(&pid, s)| Stuck {
                pid,
                rank: self.ranks.get(&pid).copied().flatten(),
                blocked: s.blocked,
                for_: now.saturating_sub(s.at),
            })
            .max_by_key(|s| (s.for_, std::cmp::Reverse(s.pid)))
    }
}

/// The fast-path rule: a rank stuck for at least `fs_stall` while the job made no progress for at least as long.
/// `fs_stall` zero turns the fast path off.
pub fn fast_path_due(
    stuck: Option<Stuck>,
    job_stalled_for: Duration,
    fs_stall: Duration,
) -> Option<Stuck> {
    if fs_stall.is_zero() {
        return None;
    }
    stuck.filter(|s| s.for_ >= fs_stall && job_stalled_for >= fs_stall)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn sample(pid: i32, blocked: Option<Blocked>, io: u64) -> RankSample {
        RankSample {
            pid,
            rank: Some(pid as u32 - 100),
            blocked,
            io: Some(io),
        }
    }

    #[test]
    fn which_threads_count_as_blocked_on_a_filesystem_or_stopped() {
        assert_eq!(
            thread_blocked('D', Some("percpu_rwsem_wait")),
            Some(Blocked::FilesystemWait)
        );
        assert_eq!(thread_blocked('D', None), Some(Blocked::FilesystemWait));
        assert_eq!(
            thread_blocked('S', Some("request_wait_answer")),
            Some(Blocked::FilesystemWait)
        );
        assert_eq!(
            thread_blocked('S', Some("rpc_wait_bit_killable")),
            Some(Blocked::FilesystemWait)
        );
        assert_eq!(
            thread_blocked('S', Some("futex_wait_queue")),
            None,
            "a lock is not a filesystem"
        );
        assert_eq!(
            thread_blocked('S', Some("sk_wait_data")),
            None,
            "nor is a socket"
        );
        assert_eq!(thread_blocked('T', None), Some(Blocked::Stopped));
        assert_eq!(thread_blocked('R', None), None);
    }

    #[test]
    fn a_rank_stuck_with_still_io_while_the_job_stalls_is_due_after_fs_stall() {
        let mut t = FsStallTracker::new();
        let fs_stall = s(15);
        for now in 0..=20 {
            let blocked = (now >= 2).then_some(Blocked::FilesystemWait);
            t.observe(&[sample(100, blocked, 500), sample(101, None, 9)], s(now));
            let due = fast_path_due(t.longest(s(now)), s(now), fs_stall);
            if now < 17 {
                assert_eq!(due, None, "at {now}s");
            } else {
                let due = due.expect("due");
                assert_eq!((due.pid, due.rank, due.for_), (100, Some(0), s(now - 2)));
            }
        }
        assert_eq!(
            fast_path_due(t.longest(s(20)), s(10), fs_stall),
            None,
            "the job made progress 10 s ago: not a hang of the job"
        );
        assert_eq!(
            fast_path_due(t.longest(s(20)), s(20), Duration::ZERO),
            None,
            "off"
        );
    }

    #[test]
    fn the_trigger_says_what_was_seen() {
        let stuck = |blocked| Stuck {
            pid: 42,
            rank: Some(0),
            blocked,
            for_: s(12),
        };
        assert_eq!(
            stuck(Blocked::Stopped).words(),
            "rank 0 stopped (T) for 12s"
        );
        assert_eq!(
            stuck(Blocked::FilesystemWait).words(),
            "rank 0 in a filesystem wait, its I/O still, for 12s"
        );
    }

    #[test]
    fn bytes_still_flowing_mean_a_slow_filesystem_and_restart_the_clock() {
        let mut t = FsStallTracker::new();
        for now in 0..40 {
            // In D the whole time, but each second a little more was written.
            t.observe(
                &[sample(100, Some(Blocked::FilesystemWait), 1000 + now)],
                s(now),
            );
            assert!(t.longest(s(now)).is_some_and(|l| l.for_ == Duration::ZERO));
        }
        // A stop is another way of being blocked: its clock starts anew.
        t.observe(&[sample(100, Some(Blocked::Stopped), 1039)], s(40));
        t.observe(&[sample(100, Some(Blocked::Stopped), 1039)], s(60));
        let l = t.longest(s(60)).expect("stopped");
        assert_eq!((l.blocked, l.for_), (Blocked::Stopped, s(20)));
        // Gone from the samples (exited): forgotten.
        t.observe(&[], s(61));
        assert_eq!(t.longest(s(61)), None);
    }
}
