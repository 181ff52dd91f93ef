//! The agent's metrics: per-rank progress and state, the node's stall state and thresholds, verdicts, alerts,
//! stuck probes, what was dropped, and the job itself. Updated by the supervision loop (a few atomic stores per
//! rank and tick), encoded by a scrape or the textfile writer.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hangwatch_model::{StallTier, TargetKind, VerdictKind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::labels::label_value_by_name;
use crate::outcomes::Outcomes;

type Seconds = Gauge<f64, AtomicU64>;

/// The node's stall tier as the `hangwatch_stall_state{state}` label says it (its values are the metrics'
/// contract: `healthy`, `suspected`, `stalled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StallState {
    Healthy,
    /// Past the soft threshold: a roll call, evidence and an alert; nothing is ended.
    Suspected,
    /// Past the hard threshold: the job is ended (`--action abort`) or observed.
    Stalled,
}

impl StallState {
    pub const ALL: [StallState; 3] = [
        StallState::Healthy,
        StallState::Suspected,
        StallState::Stalled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StallState::Healthy => "healthy",
            StallState::Suspected => "suspected",
            StallState::Stalled => "stalled",
        }
    }
}

impl From<StallTier> for StallState {
    fn from(tier: StallTier) -> Self {
        match tier {
            StallTier::Healthy => StallState::Healthy,
            StallTier::Soft => StallState::Suspected,
            StallTier::Hard => StallState::Stalled,
        }
    }
}

impl From<StallTier> for RankState {
    fn from(tier: StallTier) -> Self {
        match tier {
            StallTier::Healthy => RankState::Healthy,
            StallTier::Soft => RankState::Suspected,
            StallTier::Hard => RankState::Stalled,
        }
    }
}

/// One rank's state (`hangwatch_rank_state{rank,state}`): its own time without progress against the node's
/// thresholds, or gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RankState {
    Healthy,
    Suspected,
    Stalled,
    Exited,
}

impl RankState {
    pub const ALL: [RankState; 4] = [
        RankState::Healthy,
        RankState::Suspected,
        RankState::Stalled,
        RankState::Exited,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RankState::Healthy => "healthy",
            RankState::Suspected => "suspected",
            RankState::Stalled => "stalled",
            RankState::Exited => "exited",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Where the thresholds in force come from (`hangwatch_threshold_basis{basis}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ThresholdBasis {
    /// `--stall-after`.
    Fixed,
    /// Not enough steps seen yet to learn from.
    Warmup,
    /// Learned from the job's step intervals.
    Learned,
    /// Inside a phase never seen complete: the ceiling.
    NewPhase,
}

impl ThresholdBasis {
    pub const ALL: [ThresholdBasis; 4] = [
        ThresholdBasis::Fixed,
        ThresholdBasis::Warmup,
        ThresholdBasis::Learned,
        ThresholdBasis::NewPhase,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ThresholdBasis::Fixed => "fixed",
            ThresholdBasis::Warmup => "warmup",
            ThresholdBasis::Learned => "learned",
            ThresholdBasis::NewPhase => "new_phase",
        }
    }

    /// The detector's words for it (`fixed`, `warmup`, `learned`, `new phase`).
    pub fn from_detector(basis: &str) -> Option<Self> {
        match basis {
            "fixed" => Some(Self::Fixed),
            "warmup" => Some(Self::Warmup),
            "learned" => Some(Self::Learned),
            "new phase" => Some(Self::NewPhase),
            _ => None,
        }
    }
}

/// What was dropped rather than block a rank or the loop (`hangwatch_dropped_total{what}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dropped {
    /// Rank output lines the console could not keep up with (the log file has them).
    ConsoleLines,
    /// Heartbeat messages the ranks' clients dropped (gaps in their sequence numbers).
    Beats,
    /// Progress the progress board had no room for.
    Progress,
    /// Phase messages dropped because the loop's channel was full (their progress still counted).
    Phases,
    /// hangwatch's own messages its stdout/stderr did not take in time.
    Messages,
}

impl Dropped {
    pub const ALL: [Dropped; 5] = [
        Dropped::ConsoleLines,
        Dropped::Beats,
        Dropped::Progress,
        Dropped::Phases,
        Dropped::Messages,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::ConsoleLines => "console_lines",
            Dropped::Beats => "beats",
            Dropped::Progress => "progress",
            Dropped::Phases => "phases",
            Dropped::Messages => "messages",
        }
    }
}

/// The soft or hard threshold (`hangwatch_threshold_seconds{tier}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Tier {
    Soft,
    Hard,
}

impl Tier {
    fn as_str(self) -> &'static str {
        match self {
            Tier::Soft => "soft",
            Tier::Hard => "hard",
        }
    }
}

label_value_by_name!(StallState, RankState, ThresholdBasis, Dropped, Tier);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RankLabels {
    rank: u32,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RankStateLabels {
    rank: u32,
    state: RankState,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: StallState,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    tier: Tier,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BasisLabels {
    basis: ThresholdBasis,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DroppedLabels {
    what: Dropped,
}

/// A rank's series, kept so that a tick only stores into atomics (no label hashing, no family lock).
#[derive(Debug, Clone)]
struct RankSeries {
    seconds: Seconds,
    states: [Gauge; 4],
}

/// The agent's metrics. Every series carries the labels `job_id` and `node` (a textfile collector holds the
/// files of several jobs; Prometheus's own `job` label is the scrape job's, hence `job_id`).
#[derive(Debug)]
pub struct AgentMetrics {
    registry: Registry,
    rank_seconds: Family<RankLabels, Seconds>,
    rank_state: Family<RankStateLabels, Gauge>,
    ranks: Mutex<HashMap<u32, RankSeries>>,
    stall_state: Family<StateLabels, Gauge>,
    stalled_seconds: Seconds,
    computing_without_progress: Gauge,
    waiting_for_storage: Gauge,
    threshold_seconds: Family<TierLabels, Seconds>,
    threshold_basis: Family<BasisLabels, Gauge>,
    outcomes: Outcomes,
    probes_stuck: Gauge,
    dropped: Family<DroppedLabels, Counter>,
    /// The totals the counters of `dropped` were last brought up to, by [`Dropped`] in `ALL` order.
    dropped_seen: [AtomicU64; 5],
    job_up: Gauge,
    job_ranks: Gauge,
    job_running_seconds: Seconds,
}

impl AgentMetrics {
    /// The metrics of job `job_id` on `node`, every state series present from the start (a state-set: one series
    /// per value, 1 for the current one), every verdict kind and alert target at 0.
    pub fn new(job_id: &str, node: &str) -> Self {
        let labels = [
            (Cow::Borrowed("job_id"), Cow::Owned(job_id.to_string())),
            (Cow::Borrowed("node"), Cow::Owned(node.to_string())),
        ];
        let mut registry = Registry::with_labels(labels.into_iter());
        let metrics = AgentMetrics {
            registry: Registry::default(),
            rank_seconds: Family::default(),
            rank_state: Family::default(),
            ranks: Mutex::default(),
            stall_state: Family::default(),
            stalled_seconds: Seconds::default(),
            computing_without_progress: Gauge::default(),
            waiting_for_storage: Gauge::default(),
            threshold_seconds: Family::default(),
            threshold_basis: Family::default(),
            outcomes: Outcomes::default(),
            probes_stuck: Gauge::default(),
            dropped: Family::default(),
            dropped_seen: Default::default(),
            job_up: Gauge::default(),
            job_ranks: Gauge::default(),
            job_running_seconds: Seconds::default(),
        };
        let r = &mut registry;
        r.register(
            "hangwatch_job_up",
            "1 while the job runs under hangwatch, 0 once it has ended (the textfile keeps the last state)",
            metrics.job_up.clone(),
        );
        r.register(
            "hangwatch_job_ranks",
            "Ranks of the job alive on this node",
            metrics.job_ranks.clone(),
        );
        r.register(
            "hangwatch_job_running_seconds",
            "Seconds since hangwatch started the job",
            metrics.job_running_seconds.clone(),
        );
        r.register(
            "hangwatch_rank_seconds_since_progress",
            "Seconds since this rank last made progress (beat, output line or CPU time, whichever the job shows; since the start when it made none)",
            metrics.rank_seconds.clone(),
        );
        r.register(
            "hangwatch_rank_state",
            "1 for the rank's state: its own time without progress against the node's thresholds (healthy, suspected, stalled), or exited",
            metrics.rank_state.clone(),
        );
        r.register(
            "hangwatch_stall_state",
            "1 for the node's stall state as hangwatch's detector sees it: healthy, suspected (past the soft threshold: roll call and alert) or stalled (past the hard threshold)",
            metrics.stall_state.clone(),
        );
        r.register(
            "hangwatch_stalled_seconds",
            "Seconds since the job last made progress on this node (any rank)",
            metrics.stalled_seconds.clone(),
        );
        r.register(
            "hangwatch_computing_without_progress",
            "1 while the job makes no progress but a roll call saw its ranks compute, so hangwatch does not end it (until --max-stall or the work stops; docs/false-alarms.md)",
            metrics.computing_without_progress.clone(),
        );
        r.register(
            "hangwatch_waiting_for_storage",
            "1 while this attempt waits, before starting the job, for the storage that hung the one before (--action requeue; docs/storage-incidents.md)",
            metrics.waiting_for_storage.clone(),
        );
        r.register(
            "hangwatch_threshold_seconds",
            "The stall thresholds in force: soft (roll call, evidence, alert) and hard (act)",
            metrics.threshold_seconds.clone(),
        );
        r.register(
            "hangwatch_threshold_basis",
            "1 for where the thresholds in force come from: fixed (--stall-after), warmup, learned or new_phase",
            metrics.threshold_basis.clone(),
        );
        metrics
            .outcomes
            .register(r, "hangwatch", "Verdicts reached on this node, by kind");
        r.register(
            "hangwatch_probes_stuck",
            "Filesystem probes still stuck (their mount did not answer)",
            metrics.probes_stuck.clone(),
        );
        r.register(
            "hangwatch_dropped",
            "What was dropped rather than block a rank or hangwatch: console_lines, beats, progress, phases, messages",
            metrics.dropped.clone(),
        );
        for state in StallState::ALL {
            metrics
                .stall_state
                .get_or_create(&StateLabels { state })
                .set(i64::from(state == StallState::Healthy));
        }
        for tier in [Tier::Soft, Tier::Hard] {
            let _ = metrics
                .threshold_seconds
                .get_or_create(&TierLabels { tier });
        }
        for basis in ThresholdBasis::ALL {
            let _ = metrics
                .threshold_basis
                .get_or_create(&BasisLabels { basis });
        }
        for what in Dropped::ALL {
            let _ = metrics.dropped.get_or_create(&DroppedLabels { what });
        }
        metrics.job_up.set(1);
        AgentMetrics {
            registry,
            ..metrics
        }
    }

    /// Rank `rank`: seconds since its last progress and its state. The first call for a rank creates its series.
    pub fn set_rank(&self, rank: u32, since_progress: Duration, state: RankState) {
        let mut ranks = self.ranks.lock().unwrap_or_else(|e| e.into_inner());
        let series = ranks.entry(rank).or_insert_with(|| RankSeries {
            seconds: self.rank_seconds.get_or_create_owned(&RankLabels { rank }),
            states: RankState::ALL.map(|state| {
                self.rank_state
                    .get_or_create_owned(&RankStateLabels { rank, state })
            }),
        });
        series.seconds.set(since_progress.as_secs_f64());
        for (i, gauge) in series.states.iter().enumerate() {
            gauge.set(i64::from(i == state.index()));
        }
    }

    /// Drops the series of ranks not in `keep` (a process taken for a rank turned out to be a launcher).
    pub fn retain_ranks(&self, keep: impl Fn(u32) -> bool) {
        let mut ranks = self.ranks.lock().unwrap_or_else(|e| e.into_inner());
        ranks.retain(|&rank, _| {
            if keep(rank) {
                return true;
            }
            self.rank_seconds.remove(&RankLabels { rank });
            for state in RankState::ALL {
                self.rank_state.remove(&RankStateLabels { rank, state });
            }
            false
        });
    }

    /// The node's stall state and how long the job has made no progress.
    pub fn set_stall(&self, state: StallState, stalled_for: Duration) {
        for s in StallState::ALL {
            self.stall_state
                .get_or_create(&StateLabels { state: s })
                .set(i64::from(s == state));
        }
        self.stalled_seconds.set(stalled_for.as_secs_f64());
    }

    /// Whether the job computes without progress (and so is not ended for it).
    pub fn set_computing_without_progress(&self, computing: bool) {
        self.computing_without_progress.set(i64::from(computing));
    }

    /// Whether this attempt waits for the storage that hung the one before.
    pub fn set_waiting_for_storage(&self, waiting: bool) {
        self.waiting_for_storage.set(i64::from(waiting));
    }

    /// The thresholds in force (`basis`: `None` when the detector named one this version does not know).
    pub fn set_thresholds(&self, soft: Duration, hard: Duration, basis: Option<ThresholdBasis>) {
        self.threshold_seconds
            .get_or_create(&TierLabels { tier: Tier::Soft })
            .set(soft.as_secs_f64());
        self.threshold_seconds
            .get_or_create(&TierLabels { tier: Tier::Hard })
            .set(hard.as_secs_f64());
        for b in ThresholdBasis::ALL {
            self.threshold_basis
                .get_or_create(&BasisLabels { basis: b })
                .set(i64::from(Some(b) == basis));
        }
    }

    /// A verdict was reached (a roll call on this node, or the coordinator's order).
    pub fn verdict(&self, kind: VerdictKind) {
        self.outcomes.verdict(kind);
    }

    /// An alert reached `target`.
    pub fn alert_sent(&self, target: TargetKind) {
        self.outcomes.alert(target, true);
    }

    /// An alert to `target` failed (refused, timed out, the command failed).
    pub fn alert_failed(&self, target: TargetKind) {
        self.outcomes.alert(target, false);
    }

    /// An alert was not sent: a repeat within the window, or dropped with too many in flight.
    pub fn alert_not_sent(&self, reason: hangwatch_model::NotSentReason) {
        self.outcomes.alert_not_sent(reason);
    }

    pub fn set_probes_stuck(&self, stuck: usize) {
        self.probes_stuck
            .set(i64::try_from(stuck).unwrap_or(i64::MAX));
    }

    /// Brings the `what` counter up to `total`, the absolute count the agent keeps (a counter, not a gauge, so
    /// that `rate()` works; it is increased by the difference from the last total, so a total read twice counts
    /// once and a total that went down, which the agent's never do, is ignored).
    pub fn set_dropped_total(&self, what: Dropped, total: u64) {
        let seen = &self.dropped_seen[what as usize];
        let before = seen.fetch_max(total, Ordering::Relaxed);
        if total > before {
            self.dropped
                .get_or_create(&DroppedLabels { what })
                .inc_by(total - before);
        }
    }

    /// The job: alive ranks on this node and how long it has run.
    pub fn set_job(&self, live_ranks: usize, running_for: Duration) {
        self.job_ranks
            .set(i64::try_from(live_ranks).unwrap_or(i64::MAX));
        self.job_running_seconds.set(running_for.as_secs_f64());
    }

    /// The job has ended: `hangwatch_job_up` 0, no live ranks.
    pub fn set_ended(&self) {
        self.job_up.set(0);
        self.job_ranks.set(0);
    }

    /// Everything, in the Prometheus text exposition format (0.0.4).
    pub fn encode(&self) -> String {
        crate::text::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    const L: &str = "job_id=\"42\",node=\"n1\"";

    #[test]
    fn updates_show_in_the_text_with_help_and_type() {
        let m = AgentMetrics::new("42", "n1");
        m.set_rank(0, Duration::from_millis(1500), RankState::Healthy);
        m.set_rank(1, Duration::from_secs(7), RankState::Stalled);
        m.set_stall(StallState::Suspected, Duration::from_secs(7));
        m.set_thresholds(
            Duration::from_secs(2),
            Duration::from_secs(4),
            Some(ThresholdBasis::Fixed),
        );
        m.verdict(VerdictKind::BlockedInKernel);
        m.alert_failed(TargetKind::Webhook);
        m.alert_not_sent(hangwatch_model::NotSentReason::Repeat);
        m.set_dropped_total(Dropped::Beats, 5);
        m.set_dropped_total(Dropped::Beats, 5);
        m.set_dropped_total(Dropped::Beats, 8);
        m.set_dropped_total(Dropped::Beats, 3);
        let t = m.encode();
        assert!(
            t.contains("# TYPE hangwatch_rank_seconds_since_progress gauge\n"),
            "{t}"
        );
        assert!(
            t.contains("# HELP hangwatch_verdicts_total Verdicts"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE hangwatch_verdicts_total counter\n"),
            "{t}"
        );
        assert!(!t.contains("# EOF"));
        let s = |rest: &str| format!("{{{L},{rest}}}");
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_rank_seconds_since_progress{}", s("rank=\"0\""))
            ),
            Some(1.5)
        );
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_rank_state{}", s("rank=\"1\",state=\"stalled\""))
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_rank_state{}", s("rank=\"1\",state=\"healthy\""))
            ),
            Some(0.0)
        );
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_stall_state{}", s("state=\"suspected\""))
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_stall_state{}", s("state=\"healthy\""))
            ),
            Some(0.0)
        );
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_threshold_seconds{}", s("tier=\"hard\""))
            ),
            Some(4.0)
        );
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_threshold_basis{}", s("basis=\"fixed\""))
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                &format!(
                    "hangwatch_verdicts_total{}",
                    s("kind=\"blocked_in_kernel\"")
                )
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_verdicts_total{}", s("kind=\"collective_hang\""))
            ),
            Some(0.0)
        );
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_alerts_failed_total{}", s("target=\"webhook\""))
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_alerts_not_sent_total{}", s("reason=\"repeat\""))
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_alerts_not_sent_total{}", s("reason=\"dropped\""))
            ),
            Some(0.0)
        );
        assert_eq!(
            value(
                &t,
                &format!("hangwatch_dropped_total{}", s("what=\"beats\""))
            ),
            Some(8.0)
        );
        assert_eq!(value(&t, &format!("hangwatch_job_up{{{L}}}")), Some(1.0));
        m.set_ended();
        assert_eq!(
            value(&m.encode(), &format!("hangwatch_job_up{{{L}}}")),
            Some(0.0)
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let m = AgentMetrics::new("job \"x\"\\1", "node\nbad");
        let t = m.encode();
        assert!(
            t.contains("hangwatch_job_up{job_id=\"job \\\"x\\\"\\\\1\",node=\"node\\nbad\"} 1\n"),
            "{t}"
        );
    }

    #[test]
    fn ranks_that_went_away_lose_their_series() {
        let m = AgentMetrics::new("1", "n");
        m.set_rank(3, Duration::ZERO, RankState::Healthy);
        m.set_rank(4, Duration::ZERO, RankState::Exited);
        m.retain_ranks(|r| r == 4);
        let t = m.encode();
        assert!(!t.contains("rank=\"3\""), "{t}");
        assert!(t.contains("rank=\"4\",state=\"exited\"} 1"), "{t}");
    }
}
