//! The progress the loop takes in: what waits on the progress board and in the shared-memory beat slots, fed to
//! the detector, the timeline and the coordinator; and the metrics' update of each tick.

use super::*;

impl Supervisor {
    /// Feeds the progress recorded on the board since the last take to the detector (and to the coordinator).
    pub(super) fn take_progress(&mut self) {
        self.take_slot_beats();
        for u in self.board.take_updates() {
            self.last_step = self.last_step.max(u.step);
            self.timeline
                .record(unix_time_of(u.at), u.rank, u.count, u.step);
            if let (Some(link), Some(rank)) = (&self.link, u.rank) {
                link.progress(rank, u.step, u.at);
            }
            self.detector
                .progress_batch(u.rank, u.source, u.batch(self.start));
        }
    }

    /// Beats in the shared-memory slots since the last look, from processes of the job only (a slot names its
    /// writer's pid). The beats of one slot between two looks are spread evenly over the time between them, so
    /// that the detector learns the same step intervals as from datagram beats.
    pub(super) fn take_slot_beats(&mut self) {
        let Some(slots) = self.beat_slots.as_mut() else {
            return;
        };
        let now = Instant::now();
        let since = self.last_slot_look.replace(now).unwrap_or(self.start);
        for moved in slots.take() {
            let slot = moved.slot;
            let Some(member) = self.members.who(slot.pid) else {
                tracing::debug!(
                    pid = slot.pid,
                    "beat slot written by a process outside the job: ignored"
                );
                continue;
            };
            let rank = slot.rank.or(member.rank);
            let beats = u32::try_from(moved.beats).unwrap_or(u32::MAX);
            let each = now.saturating_duration_since(since) / beats.max(1);
            let first = (since + each).min(now);
            self.detector.progress_batch(
                rank,
                ProgressSource::Heartbeat,
                hangwatch_diagnosis::ProgressBatch {
                    first: self.since_start(first),
                    last: self.since_start(now),
                    count: moved.beats,
                    longest_gap: each,
                },
            );
            self.last_step = self.last_step.max(slot.step);
            self.timeline
                .record(unix_time_of(now), rank, moved.beats, slot.step);
            if let (Some(link), Some(rank)) = (&self.link, rank) {
                link.progress(rank, slot.step, now);
            }
        }
    }

    /// The metrics' update of this tick (see [`crate::metrics_feed`]).
    pub(super) fn feed_metrics(&self, now: Duration) {
        let Some(metrics) = &self.config.metrics else {
            return;
        };
        let ranks = self.sampler.procs().iter();
        let ranks =
            ranks.filter_map(|p| Some((p.rank?, p.exit.is_some() || p.exited_at.is_some())));
        crate::metrics_feed::feed(
            metrics,
            crate::metrics_feed::FeedInput {
                detector: &self.detector,
                now,
                ranks: ranks.collect(),
                heartbeats: self.heartbeats.counts(),
                progress_dropped: self.board.dropped(),
                console_dropped: self.console.as_ref().map(Console::dropped),
                prober: self.sampler.prober(),
            },
        );
    }
}
