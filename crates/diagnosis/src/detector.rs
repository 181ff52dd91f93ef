//! Stall detection: progress events in, "healthy / soft stall / hard stall" out, with thresholds learned from the
//! job's own step intervals (per phase), a floor and a ceiling.
//!
//! Time is a `Duration` since the job started, passed in by the caller: the detector has no clock.
//!
//! Progress comes from the strongest source the job has shown: heartbeats from the Python client once any arrived,
//! else output lines, else CPU activity. Intervals are measured per rank (16 ranks printing the same step are one
//! step, not 16) and attributed to the phase the rank was in. While any rank is inside a phase, that phase's
//! threshold applies; a phase never completed before gets the ceiling, so a first 10-minute checkpoint is not a
//! hang.

use std::collections::HashMap;
use std::time::Duration;

use hangwatch_model::StallTier;

/// What counts as progress, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgressSource {
    Heartbeat,
    Output,
    Activity,
}

impl ProgressSource {
    /// What was missing, in words, when progress of this kind stopped ("no output" for a job without the
    /// client); `None`: nothing was ever seen.
    pub fn missing_words(source: Option<ProgressSource>) -> &'static str {
        match source {
            Some(ProgressSource::Heartbeat) => "no heartbeat",
            Some(ProgressSource::Output) => "no output",
            Some(ProgressSource::Activity) => "no CPU activity",
            None => "no progress signal yet",
        }
    }
}

/// Thresholds and how they are learned.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectorConfig {
    /// `--stall-after`: a fixed hard threshold; nothing is learned.
    pub fixed: Option<Duration>,
    /// The learned hard threshold is never below this.
    pub floor: Duration,
    /// ... and never above this; also the threshold of a phase not seen complete before.
    pub ceiling: Duration,
    /// Hard threshold until `min_samples` intervals were seen (slow first steps: compilation, data loading).
    pub warmup: Duration,
    pub min_samples: usize,
    /// Learned threshold = max(`p95_factor` x p95 interval, `max_factor` x longest interval seen).
    pub p95_factor: f64,
    pub max_factor: f64,
    /// The soft threshold (roll call, evidence, alert; nothing killed) as a fraction of the hard one.
    pub soft_fraction: f64,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        Self {
            fixed: None,
            floor: Duration::from_secs(120),
            ceiling: Duration::from_secs(30 * 60),
            warmup: Duration::from_secs(15 * 60),
            min_samples: 8,
            p95_factor: 10.0,
            max_factor: 3.0,
            soft_fraction: 0.5,
        }
    }
}

/// Progress units of one rank and source gathered between two ticks (times since the job started).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressBatch {
    /// When the first unit of the batch came.
    pub first: Duration,
    /// When the last one came.
    pub last: Duration,
    /// How many units; at least 1.
    pub count: u64,
    /// The longest time between two consecutive units of the batch (zero for one unit).
    pub longest_gap: Duration,
}

/// What the detector thinks now: a [`StallTier`] with its details.
#[derive(Debug, Clone, PartialEq)]
pub enum StallState {
    /// Progress is recent enough.
    Healthy,
    /// Past the soft threshold: time for a roll call and an alert.
    Soft {
        stalled_for: Duration,
        threshold: Threshold,
    },
    /// Past the hard threshold: time to act.
    Hard {
        stalled_for: Duration,
        threshold: Threshold,
    },
}

impl StallState {
    /// The tier, without the details.
    pub fn tier(&self) -> StallTier {
        match self {
            StallState::Healthy => StallTier::Healthy,
            StallState::Soft { .. } => StallTier::Soft,
            StallState::Hard { .. } => StallTier::Hard,
        }
    }
}

/// The threshold in force and where it came from, for verdicts and evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub hard: Duration,
    pub soft: Duration,
    /// `fixed`, `warmup`, `learned`, `new phase`.
    pub basis: String,
    pub phase: Option<String>,
    pub samples: usize,
    pub source: Option<ProgressSource>,
}

impl Threshold {
    /// The tier of a quiet time against these thresholds (a rank's own, or the node's).
    pub fn tier_of(&self, quiet: Duration) -> StallTier {
        if quiet >= self.hard {
            StallTier::Hard
        } else if quiet >= self.soft {
            StallTier::Soft
        } else {
            StallTier::Healthy
        }
    }
}

#[derive(Debug, Default, Clone)]
struct RankState {
    last: HashMap<ProgressSource, Duration>,
    /// Phases the rank is inside, innermost last, with when each began.
    phases: Vec<(String, Duration)>,
}

/// The stall detector of one job.
#[derive(Debug, Clone)]
pub struct Detector {
    config: DetectorConfig,
    ranks: HashMap<Option<u32>, RankState>,
    /// Intervals per (source, phase); `None` phase = ordinary steps.
    intervals: HashMap<(ProgressSource, Option<String>), Samples>,
    /// Phases seen complete, with their durations.
    phase_durations: HashMap<String, Samples>,
    last_progress: HashMap<ProgressSource, Duration>,
    started: Duration,
}

impl Detector {
    pub fn new(config: DetectorConfig, started: Duration) -> Self {
        Self {
            config,
            ranks: HashMap::new(),
            intervals: HashMap::new(),
            phase_durations: HashMap::new(),
            last_progress: HashMap::new(),
            started,
        }
    }

    pub fn config(&self) -> &DetectorConfig {
        &self.config
    }

    /// The strongest source seen so far.
    pub fn source(&self) -> Option<ProgressSource> {
        self.last_progress.keys().min().copied()
    }

    /// One unit of progress from a rank (`None`: output not attributable to a rank).
    pub fn progress(&mut self, rank: Option<u32>, source: ProgressSource, now: Duration) {
        let state = self.ranks.entry(rank).or_default();
        let phase = state.phases.last().map(|(name, _)| name.clone());
        if let Some(prev) = state.last.insert(source, now) {
            let interval = now.saturating_sub(prev);
            self.intervals
                .entry((source, phase))
                .or_default()
                .push(interval);
        }
        self.last_progress.insert(source, now);
    }

    /// Progress the caller gathered between two of its ticks (many beats of one rank in 200 ms). Learns as if
    /// each unit had come alone, so that the threshold does not depend on the tick: the gap before the first
    /// unit is measured here (phase-aware, like [`Detector::progress`]), the longest gap inside the batch is kept
    /// exactly and the other gaps count as their mean. At most [`RECENT_SAMPLES`] intervals are learned from
    /// one batch. A batch older than this rank's last progress (a phase event handled first) is moved up to it.
    pub fn progress_batch(
        &mut self,
        rank: Option<u32>,
        source: ProgressSource,
        batch: ProgressBatch,
    ) {
        let prev = self
            .ranks
            .get(&rank)
            .and_then(|r| r.last.get(&source))
            .copied()
            .unwrap_or_default();
        let first = batch.first.max(prev);
        let last = batch.last.max(first);
        self.progress(rank, source, first);
        let gaps = batch.count.saturating_sub(1);
        if gaps == 0 {
            self.progress(rank, source, last);
            return;
        }
        let span = last.saturating_sub(first);
        let longest = batch.longest_gap.min(span);
        let phase = self
            .ranks
            .get(&rank)
            .and_then(|r| r.phases.last().map(|(name, _)| name.clone()));
        let samples = self.intervals.entry((source, phase)).or_default();
        samples.push(longest);
        if gaps > 1 {
            let mean = span.saturating_sub(longest).div_f64((gaps - 1) as f64);
            for _ in 0..(gaps - 1).min(RECENT_SAMPLES as u64) {
                samples.push(mean);
            }
        }
        self.ranks
            .entry(rank)
            .or_default()
            .last
            .insert(source, last);
        self.last_progress.insert(source, last);
    }

    /// A rank entered a phase (`hangwatch.phase(name)`). Counts as progress.
    pub fn phase_begin(&mut self, rank: Option<u32>, name: &str, now: Duration) {
        self.progress(rank, ProgressSource::Heartbeat, now);
        let state = self.ranks.entry(rank).or_default();
        state.phases.push((name.to_string(), now));
    }

    /// A rank left a phase. Counts as progress; the phase's duration is learned.
    pub fn phase_end(&mut self, rank: Option<u32>, name: &str, now: Duration) {
        let state = self.ranks.entry(rank).or_default();
        if let Some(pos) = state.phases.iter().rposition(|(n, _)| n == name) {
            let (_, began) = state.phases.remove(pos);
            self.phase_durations
                .entry(name.to_string())
                .or_default()
                .push(now.saturating_sub(began));
        }
        // The interval that ends here belongs to the phase just left, not to ordinary steps.
        if let Some(prev) = state.last.insert(ProgressSource::Heartbeat, now) {
            self.intervals
                .entry((ProgressSource::Heartbeat, Some(name.to_string())))
                .or_default()
                .push(now.saturating_sub(prev));
        }
        self.last_progress.insert(ProgressSource::Heartbeat, now);
    }

    /// A rank went away: its open phases no longer hold the threshold open.
    pub fn rank_gone(&mut self, rank: Option<u32>) {
        if let Some(state) = self.ranks.get_mut(&rank) {
            state.phases.clear();
        }
    }

    /// The threshold in force now.
    pub fn threshold(&self) -> Threshold {
        let source = self.source();
        let soft_of = |hard: Duration| hard.mul_f64(self.config.soft_fraction);
        if let Some(hard) = self.config.fixed {
            return Threshold {
                hard,
                soft: soft_of(hard),
                basis: "fixed".into(),
                phase: None,
                samples: 0,
                source,
            };
        }
        // Inside a phase: that phase's threshold (the longest among open phases).
        let open_phases: Vec<&String> = self
            .ranks
            .values()
            .filter_map(|r| r.phases.last().map(|(n, _)| n))
            .collect();
        let mut best: Option<Threshold> = None;
        for phase in open_phases {
            let t = self.phase_threshold(phase, source);
            if best.as_ref().is_none_or(|b| t.hard > b.hard) {
                best = Some(t);
            }
        }
        if let Some(t) = best {
            return t;
        }
        let empty = Samples::default();
        let samples = source
            .and_then(|s| self.intervals.get(&(s, None)))
            .unwrap_or(&empty);
        let (hard, basis) = self.learned(samples);
        Threshold {
            hard,
            soft: soft_of(hard),
            basis,
            phase: None,
            samples: samples.len(),
            source,
        }
    }

    fn phase_threshold(&self, phase: &str, source: Option<ProgressSource>) -> Threshold {
        let empty = Samples::default();
        let durations = self.phase_durations.get(phase).unwrap_or(&empty);
        let (hard, basis) = if durations.is_empty() {
            (self.config.ceiling, "new phase".to_string())
        } else {
            let inside = source
                .and_then(|s| self.intervals.get(&(s, Some(phase.to_string()))))
                .map(Samples::longest)
                .unwrap_or_default();
            let longest = durations.longest().max(inside);
            let hard = longest
                .mul_f64(self.config.max_factor)
                .clamp(self.config.floor, self.config.ceiling);
            (hard, "learned".to_string())
        };
        Threshold {
            hard,
            soft: hard.mul_f64(self.config.soft_fraction),
            basis,
            phase: Some(phase.to_string()),
            samples: durations.len(),
            source,
        }
    }

    fn learned(&self, samples: &Samples) -> (Duration, String) {
        if samples.len() < self.config.min_samples {
            return (self.config.warmup.max(self.config.floor), "warmup".into());
        }
        let hard = samples
            .p95()
            .mul_f64(self.config.p95_factor)
            .max(samples.longest().mul_f64(self.config.max_factor))
            .clamp(self.config.floor, self.config.ceiling);
        (hard, "learned".into())
    }

    /// The usual interval between two steps of the strongest source (p95 of recent ordinary intervals), once at
    /// least two were seen: "no progress for longer than its usual step" is how a signal handler tells a job that
    /// is stuck from one that is merely between steps.
    pub fn usual_step(&self) -> Option<Duration> {
        let samples = self.intervals.get(&(self.source()?, None))?;
        (samples.len() >= 2).then(|| samples.p95())
    }

    /// How long since the last progress of the strongest source (since the start when there was none).
    pub fn stalled_for(&self, now: Duration) -> Duration {
        let last = self
            .source()
            .and_then(|s| self.last_progress.get(&s).copied())
            .unwrap_or(self.started);
        now.saturating_sub(last)
    }

    /// When each rank last made progress, by the source the detector judges by (the strongest the job has shown)
    /// or, for a rank that never showed that one, its latest of any source. For metrics; `None` ranks are output
    /// not attributable to a rank.
    pub fn rank_progress(&self) -> impl Iterator<Item = (Option<u32>, Duration)> + '_ {
        let source = self.source();
        self.ranks.iter().filter_map(move |(rank, state)| {
            let last = source
                .and_then(|s| state.last.get(&s).copied())
                .or_else(|| state.last.values().max().copied())?;
            Some((*rank, last))
        })
    }

    /// When the detector started watching (the time without progress of a rank that made none is counted from
    /// here).
    pub fn started(&self) -> Duration {
        self.started
    }

    /// The decision now.
    pub fn check(&self, now: Duration) -> StallState {
        let threshold = self.threshold();
        let stalled_for = self.stalled_for(now);
        if stalled_for >= threshold.hard {
            StallState::Hard {
                stalled_for,
                threshold,
            }
        } else if stalled_for >= threshold.soft {
            StallState::Soft {
                stalled_for,
                threshold,
            }
        } else {
            StallState::Healthy
        }
    }
}

/// Recent intervals, for the p95, and the longest seen after the first few, which are slow by nature (compilation,
/// data loading) and would otherwise hold the threshold up for the whole run. Bounded: the threshold is computed
/// every tick, so it must stay cheap however long the job runs.
#[derive(Debug, Clone, Default)]
struct Samples {
    recent: std::collections::VecDeque<Duration>,
    seen: usize,
    longest_after_first: Duration,
}

/// How many recent intervals the p95 is taken over.
pub const RECENT_SAMPLES: usize = 512;
const FIRST_SAMPLES_IGNORED_FOR_LONGEST: usize = 3;

impl Samples {
    fn push(&mut self, d: Duration) {
        if self.recent.len() >= RECENT_SAMPLES {
            self.recent.pop_front();
        }
        self.recent.push_back(d);
        self.seen += 1;
        if self.seen > FIRST_SAMPLES_IGNORED_FOR_LONGEST {
            self.longest_after_first = self.longest_after_first.max(d);
        }
    }

    fn len(&self) -> usize {
        self.seen
    }

    fn is_empty(&self) -> bool {
        self.seen == 0
    }

    /// The longest interval: of all, when there are only a few.
    fn longest(&self) -> Duration {
        if self.seen > FIRST_SAMPLES_IGNORED_FOR_LONGEST {
            self.longest_after_first
        } else {
            self.recent.iter().max().copied().unwrap_or_default()
        }
    }

    fn p95(&self) -> Duration {
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        sorted
            .get(((sorted.len().saturating_sub(1)) as f64 * 0.95).round() as usize)
            .copied()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    fn fast_config() -> DetectorConfig {
        DetectorConfig {
            floor: s(2.0),
            ceiling: s(600.0),
            warmup: s(60.0),
            min_samples: 5,
            ..DetectorConfig::default()
        }
    }

    #[test]
    fn fixed_threshold_fires_soft_then_hard() {
        let mut d = Detector::new(
            DetectorConfig {
                fixed: Some(s(10.0)),
                ..DetectorConfig::default()
            },
            s(0.0),
        );
        d.progress(Some(0), ProgressSource::Output, s(1.0));
        assert_eq!(d.check(s(5.9)), StallState::Healthy);
        assert!(matches!(d.check(s(6.1)), StallState::Soft { .. }));
        match d.check(s(11.5)) {
            StallState::Hard {
                stalled_for,
                threshold,
            } => {
                assert_eq!(stalled_for, s(10.5));
                assert_eq!(threshold.basis, "fixed");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn usual_step_is_known_after_two_intervals() {
        let mut d = Detector::new(fast_config(), s(0.0));
        d.progress(Some(0), ProgressSource::Output, s(1.0));
        d.progress(Some(0), ProgressSource::Output, s(3.0));
        assert_eq!(d.usual_step(), None, "one interval says little");
        d.progress(Some(0), ProgressSource::Output, s(5.0));
        assert_eq!(d.usual_step(), Some(s(2.0)));
    }

    #[test]
    fn warmup_protects_slow_first_steps() {
        let mut d = Detector::new(fast_config(), s(0.0));
        d.progress(Some(0), ProgressSource::Heartbeat, s(50.0));
        assert_eq!(
            d.check(s(75.0)),
            StallState::Healthy,
            "a 50 s first step is no hang"
        );
        assert_eq!(d.threshold().basis, "warmup");
    }

    #[test]
    fn learned_threshold_follows_step_interval_and_respects_floor() {
        let mut d = Detector::new(fast_config(), s(0.0));
        for i in 0..20 {
            for rank in 0..4 {
                d.progress(Some(rank), ProgressSource::Heartbeat, s(i as f64 * 0.5));
            }
        }
        let t = d.threshold();
        assert_eq!(t.basis, "learned");
        assert_eq!(t.hard, s(5.0), "10 x p95 of 0.5 s steps");
        assert!(matches!(d.check(s(9.5 + 5.1)), StallState::Hard { .. }));
        let mut tiny = Detector::new(fast_config(), s(0.0));
        for i in 0..20 {
            tiny.progress(Some(0), ProgressSource::Heartbeat, s(i as f64 * 0.01));
        }
        assert_eq!(tiny.threshold().hard, s(2.0), "floor");
    }

    #[test]
    fn a_long_pause_once_seen_raises_the_threshold() {
        let mut d = Detector::new(fast_config(), s(0.0));
        let mut t = 0.0;
        for i in 0..40 {
            t += if i == 20 { 30.0 } else { 0.1 };
            d.progress(Some(0), ProgressSource::Output, s(t));
        }
        assert!(d.threshold().hard >= s(90.0), "{:?}", d.threshold());
    }

    #[test]
    fn slow_first_steps_do_not_hold_the_threshold_up_for_the_whole_run() {
        let mut d = Detector::new(fast_config(), s(0.0));
        let mut t = 0.0;
        for i in 0..200 {
            t += if i < 2 { 300.0 } else { 0.1 };
            d.progress(Some(0), ProgressSource::Heartbeat, s(t));
        }
        assert_eq!(d.threshold().hard, s(2.0), "{:?}", d.threshold());
    }

    #[test]
    fn the_threshold_stays_cheap_and_bounded_however_long_the_job_runs() {
        let mut d = Detector::new(fast_config(), s(0.0));
        for i in 0..100_000 {
            d.progress(Some(0), ProgressSource::Output, s(i as f64 * 0.01));
        }
        let samples = &d.intervals[&(ProgressSource::Output, None)];
        assert_eq!(samples.recent.len(), RECENT_SAMPLES);
        assert_eq!(samples.len(), 99_999);
        assert_eq!(d.threshold().hard, s(2.0));
    }

    #[test]
    fn heartbeats_outrank_output_once_seen() {
        let mut d = Detector::new(fast_config(), s(0.0));
        d.progress(Some(0), ProgressSource::Output, s(1.0));
        assert_eq!(d.source(), Some(ProgressSource::Output));
        d.progress(Some(0), ProgressSource::Heartbeat, s(2.0));
        d.progress(Some(0), ProgressSource::Output, s(100.0));
        assert_eq!(d.source(), Some(ProgressSource::Heartbeat));
        assert_eq!(
            d.stalled_for(s(100.0)),
            s(98.0),
            "output does not hide a heartbeat stall"
        );
    }

    #[test]
    fn a_phase_never_seen_gets_the_ceiling_and_then_is_learned() {
        let mut d = Detector::new(fast_config(), s(0.0));
        for i in 0..10 {
            d.progress(Some(0), ProgressSource::Heartbeat, s(i as f64));
        }
        d.phase_begin(Some(0), "checkpoint", s(10.0));
        let t = d.threshold();
        assert_eq!((t.basis.as_str(), t.hard), ("new phase", s(600.0)));
        assert_eq!(
            d.check(s(300.0)),
            StallState::Healthy,
            "a first 5-minute checkpoint is no hang"
        );
        d.phase_end(Some(0), "checkpoint", s(310.0));
        assert_eq!(d.threshold().phase, None);
        assert!(
            d.threshold().hard < s(60.0),
            "steps are fast again: {:?}",
            d.threshold()
        );
        d.phase_begin(Some(0), "checkpoint", s(320.0));
        let t = d.threshold();
        assert_eq!(t.basis, "learned");
        assert_eq!(t.hard, s(600.0), "3 x 300 s, clamped to the ceiling");
    }

    #[test]
    fn phase_intervals_do_not_pollute_step_intervals() {
        let mut d = Detector::new(fast_config(), s(0.0));
        let mut t = 0.0;
        for _ in 0..10 {
            t += 0.2;
            d.progress(Some(0), ProgressSource::Heartbeat, s(t));
        }
        d.phase_begin(Some(0), "eval", s(t));
        t += 120.0;
        d.phase_end(Some(0), "eval", s(t));
        for _ in 0..10 {
            t += 0.2;
            d.progress(Some(0), ProgressSource::Heartbeat, s(t));
        }
        assert_eq!(d.threshold().hard, s(2.0), "{:?}", d.threshold());
    }

    #[test]
    fn rank_gone_closes_its_phases() {
        let mut d = Detector::new(fast_config(), s(0.0));
        d.phase_begin(Some(1), "save", s(1.0));
        assert_eq!(d.threshold().phase.as_deref(), Some("save"));
        d.rank_gone(Some(1));
        assert_eq!(d.threshold().phase, None);
    }

    #[test]
    fn no_progress_at_all_counts_from_the_start() {
        let d = Detector::new(
            DetectorConfig {
                fixed: Some(s(5.0)),
                ..DetectorConfig::default()
            },
            s(2.0),
        );
        assert_eq!(d.stalled_for(s(4.0)), s(2.0));
        assert!(matches!(d.check(s(7.5)), StallState::Hard { .. }));
    }

    fn batch(first: f64, last: f64, count: u64, longest_gap: f64) -> ProgressBatch {
        ProgressBatch {
            first: s(first),
            last: s(last),
            count,
            longest_gap: s(longest_gap),
        }
    }

    #[test]
    fn batches_learn_the_step_interval_not_the_tick() {
        let mut d = Detector::new(fast_config(), s(0.0));
        // 50 ms steps, taken every 200 ms: 4 beats per batch.
        for tick in 0..20 {
            let t0 = tick as f64 * 0.2;
            d.progress_batch(
                Some(0),
                ProgressSource::Heartbeat,
                batch(t0 + 0.05, t0 + 0.2, 4, 0.05),
            );
        }
        let t = d.threshold();
        assert_eq!(t.basis, "learned");
        assert_eq!(
            t.samples, 79,
            "one interval per beat after the first: {t:?}"
        );
        assert_eq!(t.hard, s(2.0), "10 x 50 ms is below the floor: {t:?}");
        assert_eq!(d.stalled_for(s(4.5)), s(0.5), "the last beat counts");
    }

    #[test]
    fn a_long_gap_inside_a_batch_is_learned_exactly() {
        let mut individual = Detector::new(fast_config(), s(0.0));
        let mut batched = Detector::new(fast_config(), s(0.0));
        let mut t = 0.0;
        let mut times = Vec::new();
        for i in 0..40 {
            t += if i == 30 { 40.0 } else { 0.1 };
            times.push(t);
            individual.progress(Some(0), ProgressSource::Heartbeat, s(t));
        }
        // Batches of 5 beats; the 40 s gap falls inside the batch 25..30.
        for chunk in times.chunks(5) {
            let longest = chunk.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
            batched.progress_batch(
                Some(0),
                ProgressSource::Heartbeat,
                batch(
                    chunk[0],
                    chunk[chunk.len() - 1],
                    chunk.len() as u64,
                    longest,
                ),
            );
        }
        assert_eq!(batched.threshold().hard, individual.threshold().hard);
        assert!(batched.threshold().hard >= s(120.0));
    }

    #[test]
    fn a_batch_older_than_a_phase_event_does_not_move_progress_back() {
        let mut d = Detector::new(fast_config(), s(0.0));
        d.phase_begin(Some(0), "save", s(10.0));
        d.progress_batch(Some(0), ProgressSource::Heartbeat, batch(9.0, 9.5, 2, 0.5));
        assert_eq!(d.stalled_for(s(11.0)), s(1.0));
    }

    #[test]
    fn each_rank_s_progress_is_by_the_job_s_strongest_source_else_its_latest() {
        let mut d = Detector::new(fast_config(), s(0.0));
        d.progress(Some(0), ProgressSource::Heartbeat, s(5.0));
        d.progress(Some(0), ProgressSource::Output, s(9.0));
        d.progress(Some(1), ProgressSource::Output, s(7.0));
        let mut seen: Vec<(Option<u32>, Duration)> = d.rank_progress().collect();
        seen.sort();
        assert_eq!(seen, [(Some(0), s(5.0)), (Some(1), s(7.0))]);
    }
}
