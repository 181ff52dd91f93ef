//! The progress board: where the heartbeat receiver and the output drain threads record progress, coalesced per
//! (rank, source), for the supervision loop to take at each tick. However fast beats or lines come, the loop
//! sees at most one update per (rank, source) per tick, and nothing queues up behind it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hangwatch_diagnosis::{ProgressBatch, ProgressSource};

/// The most (rank, source) pairs the board holds between two takes. A job has a few ranks per node and three
/// sources; only a process of the job that invents rank numbers (accepted while its rank is not known yet) could
/// reach this. When full, progress for a new pair is dropped and counted; known pairs keep updating.
pub const MAX_KEYS: usize = 4096;

/// Progress of one rank from one source since the last take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressUpdate {
    pub rank: Option<u32>,
    pub source: ProgressSource,
    /// The latest unit.
    pub at: Instant,
    /// The first unit since the last take.
    pub first: Instant,
    /// How many units since the last take.
    pub count: u64,
    /// The longest time between two consecutive units since the last take.
    pub longest_gap: Duration,
    /// The step number of the latest beat, when it carried one.
    pub step: Option<u64>,
}

impl ProgressUpdate {
    /// The update in the detector's time (since `start`, the job's start).
    pub fn batch(&self, start: Instant) -> ProgressBatch {
        ProgressBatch {
            first: self.first.saturating_duration_since(start),
            last: self.at.saturating_duration_since(start),
            count: self.count,
            longest_gap: self.longest_gap,
        }
    }
}

/// See the module doc. Recording takes one short lock (a hash-map update); taking swaps the map out.
#[derive(Debug, Default)]
pub struct ProgressBoard {
    pending: Mutex<HashMap<(Option<u32>, ProgressSource), ProgressUpdate>>,
    dropped: AtomicU64,
}

impl ProgressBoard {
    pub fn new() -> Self {
        Self::default()
    }

    /// One unit of progress from `rank`, seen at `at`.
    pub fn record(
        &self,
        rank: Option<u32>,
        source: ProgressSource,
        at: Instant,
        step: Option<u64>,
    ) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let full = pending.len() >= MAX_KEYS;
        match pending.entry((rank, source)) {
            std::collections::hash_map::Entry::Occupied(mut slot) => {
                let u = slot.get_mut();
                let at = at.max(u.at);
                u.longest_gap = u.longest_gap.max(at.duration_since(u.at));
                u.at = at;
                u.count += 1;
                if step.is_some() {
                    u.step = step;
                }
            }
            std::collections::hash_map::Entry::Vacant(_) if full => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(ProgressUpdate {
                    rank,
                    source,
                    at,
                    first: at,
                    count: 1,
                    longest_gap: Duration::ZERO,
                    step,
                });
            }
        }
    }

    /// Everything recorded since the last take, at most one update per (rank, source), oldest latest unit first.
    pub fn take_updates(&self) -> Vec<ProgressUpdate> {
        let taken = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        let mut updates: Vec<ProgressUpdate> = taken.into_values().collect();
        updates.sort_by_key(|u| u.at);
        updates
    }

    /// Progress units dropped because the board held [`MAX_KEYS`] pairs.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn many_beats_of_one_rank_are_one_update_with_the_latest_time_and_step() {
        let board = ProgressBoard::new();
        let t0 = Instant::now();
        for (i, gap) in [0, 50, 50, 120, 50]
            .iter()
            .scan(0, |t, g| {
                *t += g;
                Some(*t)
            })
            .enumerate()
        {
            board.record(
                Some(3),
                ProgressSource::Heartbeat,
                t0 + ms(gap),
                Some(i as u64),
            );
        }
        let updates = board.take_updates();
        assert_eq!(updates.len(), 1);
        let u = updates[0];
        assert_eq!((u.rank, u.source), (Some(3), ProgressSource::Heartbeat));
        assert_eq!(u.first, t0);
        assert_eq!(u.at, t0 + ms(270));
        assert_eq!(u.count, 5);
        assert_eq!(u.longest_gap, ms(120));
        assert_eq!(u.step, Some(4));
        assert!(board.take_updates().is_empty(), "a take empties the board");
    }

    #[test]
    fn ranks_and_sources_are_kept_apart() {
        let board = ProgressBoard::new();
        let t0 = Instant::now();
        board.record(Some(0), ProgressSource::Heartbeat, t0, None);
        board.record(Some(0), ProgressSource::Output, t0 + ms(1), None);
        board.record(Some(1), ProgressSource::Heartbeat, t0 + ms(2), None);
        board.record(None, ProgressSource::Output, t0 + ms(3), None);
        board.record(Some(0), ProgressSource::Heartbeat, t0 + ms(4), None);
        let keys: Vec<_> = board
            .take_updates()
            .iter()
            .map(|u| (u.rank, u.source))
            .collect();
        assert_eq!(
            keys,
            vec![
                (Some(0), ProgressSource::Output),
                (Some(1), ProgressSource::Heartbeat),
                (None, ProgressSource::Output),
                (Some(0), ProgressSource::Heartbeat),
            ],
            "one per pair, by latest time"
        );
    }

    #[test]
    fn a_unit_recorded_late_with_an_earlier_time_never_moves_progress_back() {
        let board = ProgressBoard::new();
        let t0 = Instant::now();
        board.record(Some(0), ProgressSource::Heartbeat, t0 + ms(10), None);
        board.record(Some(0), ProgressSource::Heartbeat, t0, None);
        let u = board.take_updates()[0];
        assert_eq!(u.at, t0 + ms(10));
        assert_eq!(u.count, 2);
    }

    #[test]
    fn the_board_is_bounded_and_counts_what_it_drops() {
        let board = ProgressBoard::new();
        let t0 = Instant::now();
        for rank in 0..(MAX_KEYS as u32 + 10) {
            board.record(Some(rank), ProgressSource::Heartbeat, t0, None);
        }
        board.record(Some(0), ProgressSource::Heartbeat, t0 + ms(5), None);
        assert_eq!(board.dropped(), 10);
        let updates = board.take_updates();
        assert_eq!(updates.len(), MAX_KEYS);
        assert!(
            updates.iter().any(|u| u.rank == Some(0) && u.count == 2),
            "a known pair still updates when the board is full"
        );
        board.record(Some(99_999), ProgressSource::Heartbeat, t0, None);
        assert_eq!(board.take_updates().len(), 1, "room again after a take");
    }

    #[test]
    fn the_batch_is_in_the_detectors_time() {
        let board = ProgressBoard::new();
        let start = Instant::now();
        board.record(Some(0), ProgressSource::Heartbeat, start + ms(100), None);
        board.record(Some(0), ProgressSource::Heartbeat, start + ms(150), None);
        let b = board.take_updates()[0].batch(start);
        assert_eq!(
            b,
            ProgressBatch {
                first: ms(100),
                last: ms(150),
                count: 2,
                longest_gap: ms(50)
            }
        );
    }
}
