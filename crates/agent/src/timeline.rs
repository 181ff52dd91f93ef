//! The progress timeline of a run (`progress.json` in the evidence): progress the loop took, bucketed by time
//! into at most [`ProgressTimeline::MAX_POINTS`] points; when full, neighbouring points merge (the span doubles),
//! so a week-long job keeps its whole history at a coarser grain and memory stays bounded.

use std::collections::BTreeSet;

use hangwatch_model::{ProgressPoint, ProgressTimeline};

/// See the module doc. Pure: every call takes the time it is about.
#[derive(Debug, Clone)]
pub struct TimelineRecorder {
    started_at_unix_s: f64,
    /// The length of one point, in seconds: 1, then 2, 4, ... as the timeline fills.
    span_s: f64,
    points: Vec<ProgressPoint>,
    /// The ranks that progressed in the last point (to count them once).
    last_ranks: BTreeSet<Option<u32>>,
    furthest_step: Option<u64>,
}

impl TimelineRecorder {
    pub fn new(started_at_unix_s: f64) -> Self {
        Self {
            started_at_unix_s,
            span_s: 1.0,
            points: Vec::new(),
            last_ranks: BTreeSet::new(),
            furthest_step: None,
        }
    }

    /// `units` of progress by `rank` at `at_unix_s`, the latest carrying `step`.
    pub fn record(&mut self, at_unix_s: f64, rank: Option<u32>, units: u64, step: Option<u64>) {
        self.furthest_step = self.furthest_step.max(step);
        let end = self.bucket_end(at_unix_s);
        match self.points.last_mut() {
            Some(last) if last.at_unix_s >= end => {
                last.units += units;
                last.step = self.furthest_step;
                if self.last_ranks.insert(rank) {
                    last.ranks_progressing += 1;
                }
            }
            _ => {
                self.last_ranks.clear();
                self.last_ranks.insert(rank);
                self.points.push(ProgressPoint {
                    at_unix_s: end,
                    step: self.furthest_step,
                    units,
                    ranks_progressing: 1,
                });
                if self.points.len() > ProgressTimeline::MAX_POINTS {
                    self.coarsen();
                }
            }
        }
    }

    /// The timeline so far.
    pub fn snapshot(
        &self,
        ranks: u32,
        threshold_s: Option<f64>,
        stall_detected_at_unix_s: Option<f64>,
    ) -> ProgressTimeline {
        ProgressTimeline {
            started_at_unix_s: self.started_at_unix_s,
            ranks,
            points: self.points.clone(),
            threshold_s,
            stall_detected_at_unix_s,
        }
    }

    /// The end of the bucket that holds `at_unix_s`.
    fn bucket_end(&self, at_unix_s: f64) -> f64 {
        let since = (at_unix_s - self.started_at_unix_s).max(0.0);
        self.started_at_unix_s + ((since / self.span_s).floor() + 1.0) * self.span_s
    }

    /// Doubles the span: every pair of points in the same new bucket becomes one (ranks progressing: the larger
    /// of the two, a lower bound of the truth).
    fn coarsen(&mut self) {
        self.span_s *= 2.0;
        let old = std::mem::take(&mut self.points);
        for point in old {
            let end = self.bucket_end(point.at_unix_s - 1e-9);
            match self.points.last_mut() {
                Some(last) if last.at_unix_s >= end => {
                    last.units += point.units;
                    last.step = last.step.max(point.step);
                    last.ranks_progressing = last.ranks_progressing.max(point.ranks_progressing);
                }
                _ => self.points.push(ProgressPoint {
                    at_unix_s: end,
                    ..point
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_in_one_second_is_one_point_with_its_ranks_counted_once() {
        let mut t = TimelineRecorder::new(1000.0);
        t.record(1000.2, Some(0), 1, Some(1));
        t.record(1000.5, Some(1), 1, Some(1));
        t.record(1000.9, Some(0), 2, Some(2));
        t.record(1003.1, Some(0), 1, Some(3));
        let s = t.snapshot(2, Some(30.0), Some(1040.0));
        assert_eq!(s.points.len(), 2);
        assert_eq!(
            s.points[0],
            ProgressPoint {
                at_unix_s: 1001.0,
                step: Some(2),
                units: 4,
                ranks_progressing: 2
            }
        );
        assert_eq!(s.points[1].at_unix_s, 1004.0);
        assert_eq!(s.points[1].step, Some(3));
        assert_eq!(s.stall_detected_at_unix_s, Some(1040.0));
    }

    #[test]
    fn a_long_job_stays_bounded_and_keeps_its_whole_history() {
        let mut t = TimelineRecorder::new(0.0);
        let seconds = 3 * ProgressTimeline::MAX_POINTS as u64;
        for s in 0..seconds {
            t.record(s as f64 + 0.5, Some(0), 1, Some(s));
        }
        let snap = t.snapshot(1, None, None);
        assert!(snap.points.len() <= ProgressTimeline::MAX_POINTS);
        assert_eq!(snap.points.iter().map(|p| p.units).sum::<u64>(), seconds);
        assert_eq!(snap.points.last().unwrap().step, Some(seconds - 1));
        assert!(snap.points.first().unwrap().at_unix_s <= 4.0);
        assert!(snap
            .points
            .windows(2)
            .all(|w| w[0].at_unix_s < w[1].at_unix_s));
    }
}
