//! Counter samples taken before a roll call (by the tick sampler while the job stalls), kept so that the roll
//! call can use one as its first sample instead of taking one and sleeping a window: a roll call then costs the
//! second sample and the stack reads.
//!
//! A sample serves only when it is at least the roll call's window old (a thread that did not run for that long
//! is "not running") and not older than [`MAX_AGE`] (the counters of a process that changed since then say
//! little about now). Two samples per process are kept, so that a roll call right after a tick's sample can use
//! the one before it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hangwatch_proc::ProcessSample;

/// A sample older than this is not used: the roll call takes a fresh first sample instead.
pub const MAX_AGE: Duration = Duration::from_secs(5);

/// One process's counters (stat and status of every thread), and when they were read.
#[derive(Debug, Clone)]
pub struct EarlierSample {
    pub sample: ProcessSample,
    pub at: Instant,
}

/// The last two counter samples of each process, by pid.
#[derive(Debug, Clone, Default)]
pub struct EarlierSamples {
    /// Newest first.
    by_pid: HashMap<i32, [Option<EarlierSample>; 2]>,
}

impl EarlierSamples {
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `sample` of `pid` read `at`, as its newest; the one before it stays as the older.
    pub fn record(&mut self, pid: i32, sample: ProcessSample, at: Instant) {
        let slots = self.by_pid.entry(pid).or_default();
        slots[1] = slots[0].take();
        slots[0] = Some(EarlierSample { sample, at });
    }

    /// Forgets every process not in `pids` (exited, or no longer a rank or worker).
    pub fn retain(&mut self, pids: &std::collections::HashSet<i32>) {
        self.by_pid.retain(|pid, _| pids.contains(pid));
    }

    /// Forgets everything (the job made progress: what was read while it stalled no longer says anything).
    pub fn clear(&mut self) {
        self.by_pid.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }

    /// The newest sample of `pid` that is at least `min_age` and at most [`MAX_AGE`] old at `now`.
    pub fn usable(&self, pid: i32, min_age: Duration, now: Instant) -> Option<&EarlierSample> {
        self.by_pid.get(&pid)?.iter().flatten().find(|s| {
            let age = now.saturating_duration_since(s.at);
            age >= min_age && age <= MAX_AGE
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: i32, utime: u64) -> ProcessSample {
        let stat = hangwatch_proc::TaskStat {
            pid,
            comm: "python".into(),
            state: 'S',
            ppid: 1,
            pgrp: pid,
            session: pid,
            utime,
            stime: 0,
            num_threads: 1,
            starttime: 100,
            processor: None,
        };
        ProcessSample {
            io: None,
            pid,
            stat,
            status: None,
            threads: Vec::new(),
            issues: Vec::new(),
        }
    }

    #[test]
    fn the_newest_sample_old_enough_serves_and_a_too_fresh_one_falls_back_to_the_one_before() {
        let start = Instant::now();
        let mut kept = EarlierSamples::new();
        kept.record(7, sample(7, 1), start);
        kept.record(7, sample(7, 2), start + Duration::from_millis(900));
        let window = Duration::from_millis(100);

        // 50 ms after the newest: too fresh, the one 950 ms old serves.
        let now = start + Duration::from_millis(950);
        assert_eq!(
            kept.usable(7, window, now).map(|s| s.sample.stat.utime),
            Some(1)
        );
        // 200 ms after the newest: it serves.
        let now = start + Duration::from_millis(1100);
        assert_eq!(
            kept.usable(7, window, now).map(|s| s.sample.stat.utime),
            Some(2)
        );
        // A pid never sampled: none.
        assert!(kept.usable(8, window, now).is_none());
    }

    #[test]
    fn samples_older_than_the_limit_do_not_serve_and_a_third_pushes_out_the_first() {
        let start = Instant::now();
        let mut kept = EarlierSamples::new();
        kept.record(7, sample(7, 1), start);
        let window = Duration::from_millis(100);
        assert!(kept
            .usable(7, window, start + MAX_AGE + Duration::from_millis(1))
            .is_none());

        kept.record(7, sample(7, 2), start + Duration::from_secs(1));
        kept.record(7, sample(7, 3), start + Duration::from_secs(2));
        // Right after the third: the second serves, the first is gone.
        let now = start + Duration::from_millis(2010);
        assert_eq!(
            kept.usable(7, window, now).map(|s| s.sample.stat.utime),
            Some(2)
        );

        kept.retain(&[8].into_iter().collect());
        assert!(kept.is_empty());
    }
}
