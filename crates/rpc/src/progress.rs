//! Coalescing of rank progress on the agent: any number of beats per rank between two reports become one entry,
//! and a report goes out every interval even when nothing moved (it is also the agent's heartbeat).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::pb::{ProgressReport, RankProgress};

#[derive(Debug, Clone, Copy)]
struct Latest {
    step: Option<u64>,
    at: Instant,
}

/// The latest progress of each local rank, and when the last report left.
#[derive(Debug)]
pub struct ProgressCoalescer {
    interval: Duration,
    ranks: BTreeMap<u32, Option<Latest>>,
    last_sent: Option<Instant>,
}

impl ProgressCoalescer {
    /// A coalescer for `ranks`, none of which has made progress yet.
    pub fn new(interval: Duration, ranks: impl IntoIterator<Item = u32>) -> Self {
        Self {
            interval,
            ranks: ranks.into_iter().map(|r| (r, None)).collect(),
            last_sent: None,
        }
    }

    /// `rank` made progress at `now` (a beat, a step, a log line); a beat without a step keeps the last step.
    pub fn progress(&mut self, rank: u32, step: Option<u64>, now: Instant) {
        let entry = self.ranks.entry(rank).or_insert(None);
        let step = step.or(entry.and_then(|l| l.step));
        *entry = Some(Latest { step, at: now });
    }

    /// The report to send at `now`, when an interval has passed since the last one (or none was sent yet).
    /// Ages are measured from `now`; a rank that never made progress is as old as the agent's watch (`started`).
    pub fn due(
        &mut self,
        session_id: &str,
        now: Instant,
        started: Instant,
    ) -> Option<ProgressReport> {
        if let Some(last) = self.last_sent {
            if now.saturating_duration_since(last) < self.interval {
                return None;
            }
        }
        self.last_sent = Some(now);
        let ranks = self
            .ranks
            .iter()
            .map(|(&rank, latest)| {
                let since = latest.map_or(started, |l| l.at);
                RankProgress {
                    rank,
                    step: latest.and_then(|l| l.step),
                    last_progress_age_ms: millis(now.saturating_duration_since(since)),
                }
            })
            .collect();
        Some(ProgressReport {
            session_id: session_id.to_string(),
            ranks,
            ..ProgressReport::default()
        })
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_beats_become_one_report_per_interval_with_the_latest_step() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut c = ProgressCoalescer::new(Duration::from_secs(1), [0, 1]);
        let first = c
            .due("s7", t0, t0)
            .expect("the first report goes out at once");
        assert_eq!(first.session_id, "s7");
        assert_eq!(first.ranks.len(), 2);
        for ms in 0..100 {
            c.progress(0, Some(ms), at(ms * 5));
        }
        c.progress(0, None, at(600));
        assert!(c.due("s7", at(999), t0).is_none(), "within the interval");
        let r = c.due("s7", at(1000), t0).expect("one report per interval");
        assert_eq!(
            r.ranks,
            vec![
                RankProgress {
                    rank: 0,
                    step: Some(99),
                    last_progress_age_ms: 400
                },
                RankProgress {
                    rank: 1,
                    step: None,
                    last_progress_age_ms: 1000
                },
            ]
        );
        assert!(c.due("s7", at(1500), t0).is_none());
        let idle = c
            .due("s7", at(2000), t0)
            .expect("sent even when nothing moved");
        assert_eq!(idle.ranks[0].last_progress_age_ms, 1400);
    }
}
