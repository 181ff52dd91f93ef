//! What the looks of a stall were and what held the job back, kept as they happen, and the words they make: the
//! holds of the run for `thresholds.json` (each said once, with what was seen working), and why a verdict came
//! late. Pure: the loop records times (the stall's age, the run's clock), [`late`] decides the words.
//!
//! ```text
//!   stall age:  0 ........ hard threshold ─ look ─ hold ... look (work) ... look (none) ─ 5 s ─ confirm ─► ended
//!                               due ──────────────────────── late by ─────────────────────────────────┘
//!   words: "held back 60s while <what worked> (until a look found the work stopped; looks come every 30s);
//!           5s for a second look confirming it; 3.2s in the roll calls themselves"
//! ```

use std::time::Duration;

use hangwatch_model::{format_duration, Activity};
use serde::Serialize;

use crate::policy::Trigger;

/// A verdict this much past its threshold (or more) says why: less is the roll call's own time and the tick's.
pub const LATE_AFTER: Duration = Duration::from_secs(5);

/// One look (roll call) of a stall, in the stall's age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookTimes {
    pub trigger: Trigger,
    pub started: Duration,
    /// When its verdict came back; `None` while it runs.
    pub finished: Option<Duration>,
    /// It saw the job work (the activity rule).
    pub active: bool,
}

/// How a hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldEnd {
    /// The job made progress again.
    ProgressResumed,
    /// A look found the work stopped (a hold's look: confirmed by a second): the job was ended.
    WorkStopped,
    /// `--max-stall` passed while it worked: the job was ended.
    MaxStall,
    /// A conclusive finding (a rank stuck in the kernel, stopped or dead) ended the job, work or not.
    Conclusive,
    /// The job ended (by itself, or by a signal) while it was held.
    JobEnded,
}

/// One hold of the run as `thresholds.json` keeps it: said once per stall, with what was seen working.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HoldRecord {
    /// When it began (Unix seconds): the look that first saw the work.
    pub since_unix_s: f64,
    /// How long the job had made no progress then.
    pub stalled_for_s: f64,
    /// How long it held: until it ended, or until the file was written while it still holds.
    pub held_for_s: f64,
    /// How it ended; `null` while it holds.
    pub ended: Option<HoldEnd>,
    /// What was seen working (`summary` in words, `ranks`, `pids`, `where`, who waited and where).
    pub activity: Activity,
    /// The run's clock when it began, for `held_for_s`.
    #[serde(skip)]
    began: Duration,
}

/// What a verdict that came late waited for, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitedFor {
    /// A roll call already under way when the threshold passed (the soft tier's): its verdict was the one used.
    RollCallInFlight,
    /// The ranks worked: the hard tier was held back (looks every 30 s), until `--max-stall` or a look that found
    /// the work stopped.
    Hold,
    /// A look found the work stopped: one more, 5 s later, confirms it before the job is ended.
    ConfirmLook,
    /// The fast path waits until a rank stayed in its filesystem wait, its I/O still, for `--fs-stall`.
    FsStallWindow,
    /// The roll calls themselves (two /proc samples, stacks, probes that wait for their filesystem).
    RollCall,
}

/// One part of the lateness.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Waited {
    pub what: WaitedFor,
    pub seconds: f64,
}

/// Why a verdict came later than its threshold plus [`LATE_AFTER`]: `thresholds.json`'s `late`, and the line said
/// before the job is ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LateRecord {
    /// The threshold the verdict answered to (the soft one for a conclusive soft look, else the hard one).
    pub threshold_s: f64,
    /// How long the job had made no progress when the verdict came.
    pub decided_at_s: f64,
    pub late_by_s: f64,
    /// What the time went to, longest first.
    pub waited_for: Vec<Waited>,
    /// The same in words: "the verdict came 67s after the 2m threshold: held back 60s while ...".
    pub words: String,
}

/// The looks of the current stall and the holds of the run.
#[derive(Debug, Clone, Default)]
pub struct StallLog {
    looks: Vec<LookTimes>,
    holds: Vec<HoldRecord>,
}

impl StallLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// A look starts when the job has made no progress for `stalled_for`. A stall age below the last look's is a
    /// new stall: the looks of the last one are forgotten.
    pub fn look_started(&mut self, trigger: Trigger, stalled_for: Duration) {
        if self.looks.last().is_some_and(|l| stalled_for < l.started) {
            self.looks.clear();
        }
        self.looks.push(LookTimes {
            trigger,
            started: stalled_for,
            finished: None,
            active: false,
        });
    }

    /// The look of `trigger` still running came back at `stalled_for`; `active`: it saw the job work.
    pub fn look_finished(&mut self, trigger: Trigger, stalled_for: Duration, active: bool) {
        if let Some(look) = self
            .looks
            .iter_mut()
            .rev()
            .find(|l| l.trigger == trigger && l.finished.is_none())
        {
            look.finished = Some(stalled_for.max(look.started));
            look.active = active;
        }
    }

    /// The job made progress: the stall is over, and so is a hold.
    pub fn progress(&mut self, now: Duration) {
        self.looks.clear();
        self.hold_ended(now, HoldEnd::ProgressResumed);
    }

    /// A hold was said (once per stall) at `now` (the run's clock), with the job stalled for `stalled_for` and
    /// `activity` seen. A hold already open is not said twice.
    pub fn hold_said(
        &mut self,
        now: Duration,
        unix_s: f64,
        stalled_for: Duration,
        activity: Activity,
    ) {
        if self.holding() {
            return;
        }
        self.holds.push(HoldRecord {
            since_unix_s: unix_s,
            stalled_for_s: stalled_for.as_secs_f64(),
            held_for_s: 0.0,
            ended: None,
            activity,
            began: now,
        });
    }

    /// The job is being ended on the verdict of the last look: an open hold ended with it, by what that look found.
    pub fn ending(&mut self, now: Duration) {
        let how = match self.looks.last().map(|l| l.trigger) {
            Some(Trigger::Hard | Trigger::Recheck | Trigger::ConfirmStop) => HoldEnd::WorkStopped,
            Some(Trigger::MaxStall) => HoldEnd::MaxStall,
            _ => HoldEnd::Conclusive,
        };
        self.hold_ended(now, how);
    }

    /// The open hold ended at `now`, `how`.
    pub fn hold_ended(&mut self, now: Duration, how: HoldEnd) {
        if let Some(hold) = self.holds.last_mut().filter(|h| h.ended.is_none()) {
            hold.held_for_s = now.saturating_sub(hold.began).as_secs_f64();
            hold.ended = Some(how);
        }
    }

    /// Whether a hold is open.
    pub fn holding(&self) -> bool {
        self.holds.last().is_some_and(|h| h.ended.is_none())
    }

    /// The holds of the run, an open one held until `now`.
    pub fn holds(&self, now: Duration) -> Vec<HoldRecord> {
        let mut holds = self.holds.clone();
        for hold in holds.iter_mut().filter(|h| h.ended.is_none()) {
            hold.held_for_s = now.saturating_sub(hold.began).as_secs_f64();
        }
        holds
    }

    /// The looks of the current stall, in order.
    pub fn looks(&self) -> &[LookTimes] {
        &self.looks
    }

    /// What the last hold saw working, in words.
    pub fn last_hold_words(&self) -> Option<&str> {
        self.holds.last().map(|h| h.activity.summary.as_str())
    }
}

/// Why the verdict of the last of `looks` came late, when it did: past `threshold` (the stall age at which it was
/// due) by more than [`LATE_AFTER`]. `holding`: what the hold saw working, in words; `recheck`: how often a hold
/// looks again. `None` when it came in time, or when its look is not one a threshold answers to (a signal's, the
/// coordinator's order, a failed rank's).
pub fn late(
    threshold: Duration,
    looks: &[LookTimes],
    holding: Option<&str>,
    recheck: Duration,
) -> Option<LateRecord> {
    let last = looks.last()?;
    let decided = last.finished?;
    let answers_a_threshold = matches!(
        last.trigger,
        Trigger::Soft
            | Trigger::Hard
            | Trigger::FsStall
            | Trigger::Recheck
            | Trigger::ConfirmStop
            | Trigger::MaxStall
    );
    if !answers_a_threshold || decided < threshold + LATE_AFTER {
        return None;
    }
    let mut parts: Vec<(WaitedFor, Duration)> = Vec::new();
    let mut add = |what: WaitedFor, d: Duration| match parts.iter_mut().find(|(w, _)| *w == what) {
        Some((_, sum)) => *sum += d,
        None => parts.push((what, d)),
    };
    // Walked from the threshold on: the time between looks goes to what the look before said (the work went on:
    // the hold; it stopped: the confirmation), the time in a look to the roll call.
    let mut t = threshold;
    let mut before: Option<&LookTimes> = None;
    let mut stopped_between = false;
    for look in looks {
        let Some(finished) = look.finished else {
            continue;
        };
        if finished <= threshold {
            before = Some(look);
            continue;
        }
        if look.started < t {
            add(WaitedFor::RollCallInFlight, finished.saturating_sub(t));
        } else {
            let gap = look.started.saturating_sub(t);
            let what = match (look.trigger, before) {
                (Trigger::FsStall, _) => WaitedFor::FsStallWindow,
                (Trigger::ConfirmStop, _) => WaitedFor::ConfirmLook,
                (_, Some(b)) if b.active => {
                    stopped_between |= !look.active && look.trigger != Trigger::MaxStall;
                    WaitedFor::Hold
                }
                // The tick after the threshold: part of taking the roll call.
                _ => WaitedFor::RollCall,
            };
            add(what, gap);
            add(WaitedFor::RollCall, finished.saturating_sub(look.started));
        }
        t = finished;
        before = Some(look);
    }
    // Tenths of a second say nothing about why.
    parts.retain(|(_, d)| *d >= Duration::from_millis(100));
    parts.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
    let late_by = decided.saturating_sub(threshold);
    let words: Vec<String> = parts
        .iter()
        .map(|(what, d)| {
            let d = seconds(*d);
            match what {
                WaitedFor::RollCallInFlight => format!("{d} for the roll call already under way"),
                WaitedFor::Hold => {
                    let until = if last.trigger == Trigger::MaxStall {
                        "until --max-stall".to_string()
                    } else if stopped_between {
                        format!(
                            "until a look found the work stopped; looks come every {}",
                            format_duration(recheck)
                        )
                    } else {
                        "while it lasted".to_string()
                    };
                    match holding {
                        Some(work) => format!("{d} held back while {work} ({until})"),
                        None => format!("{d} held back while the ranks worked ({until})"),
                    }
                }
                WaitedFor::ConfirmLook => format!("{d} for a second look confirming the work stopped"),
                WaitedFor::FsStallWindow => {
                    format!("{d} for the fs-stall window (a rank still in a filesystem wait, its I/O still)")
                }
                WaitedFor::RollCall => format!("{d} in the roll calls themselves"),
            }
        })
        .collect();
    Some(LateRecord {
        threshold_s: threshold.as_secs_f64(),
        decided_at_s: decided.as_secs_f64(),
        late_by_s: late_by.as_secs_f64(),
        waited_for: parts
            .iter()
            .map(|(what, d)| Waited {
                what: *what,
                seconds: d.as_secs_f64(),
            })
            .collect(),
        words: format!(
            "the verdict came {} after the {} threshold: {}",
            seconds(late_by),
            format_duration(threshold),
            words.join("; ")
        ),
    })
}

/// `67s`, `3.2s`: a span for the lateness words.
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        format!("{s:.1}s")
    } else {
        format!("{s:.0}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    fn look(trigger: Trigger, started: f64, finished: f64, active: bool) -> LookTimes {
        LookTimes {
            trigger,
            started: s(started),
            finished: Some(s(finished)),
            active,
        }
    }

    const COPY: &str = "rank 0 moves data (131 KB/s read or written) in copy (job.py)";

    #[test]
    fn a_verdict_in_time_says_nothing() {
        let looks = [
            look(Trigger::Soft, 60.0, 61.0, false),
            look(Trigger::Hard, 120.2, 121.5, false),
        ];
        assert_eq!(late(s(120.0), &looks, None, s(30.0)), None);
        assert_eq!(late(s(120.0), &[], None, s(30.0)), None);
    }

    #[test]
    fn a_hold_that_ended_when_the_work_stopped_says_what_it_waited_for() {
        let looks = [
            look(Trigger::Soft, 60.0, 61.0, true),
            look(Trigger::Hard, 120.2, 121.2, true),
            look(Trigger::Recheck, 151.2, 152.2, true),
            look(Trigger::Recheck, 182.2, 183.2, false),
            look(Trigger::ConfirmStop, 188.2, 189.2, false),
        ];
        let l = late(s(120.0), &looks, Some(COPY), s(30.0)).expect("late");
        assert!((l.late_by_s - 69.2).abs() < 1e-6, "{l:?}");
        assert_eq!(
            l.waited_for
                .iter()
                .map(|w| (w.what, w.seconds.round() as u64))
                .collect::<Vec<_>>(),
            vec![
                (WaitedFor::Hold, 60),
                (WaitedFor::ConfirmLook, 5),
                (WaitedFor::RollCall, 4),
            ]
        );
        assert_eq!(
            l.words,
            "the verdict came 69s after the 2m threshold: 60s held back while rank 0 moves data (131 KB/s read or \
             written) in copy (job.py) (until a look found the work stopped; looks come every 30s); 5.0s for a \
             second look confirming the work stopped; 4.0s in the roll calls themselves"
        );
    }

    #[test]
    fn a_hold_ended_at_max_stall_says_so() {
        let looks = [
            look(Trigger::Hard, 6.0, 7.0, true),
            look(Trigger::Recheck, 37.0, 38.0, true),
            look(Trigger::MaxStall, 60.0, 61.0, true),
        ];
        let l = late(
            s(6.0),
            &looks,
            Some("all 4 ranks compute in spin (job.py)"),
            s(30.0),
        )
        .expect("late");
        assert!(
            l.words.contains(
                "held back while all 4 ranks compute in spin (job.py) (until --max-stall)"
            ),
            "{}",
            l.words
        );
    }

    #[test]
    fn the_fast_path_after_a_hold_names_the_fs_stall_window() {
        // Rank 0 computed, then blocked on a frozen mount: the fast path's window ran out before the next look.
        let looks = [
            look(Trigger::Hard, 120.0, 121.0, true),
            look(Trigger::FsStall, 140.0, 142.5, false),
        ];
        let l = late(s(120.0), &looks, None, s(30.0)).expect("late");
        assert_eq!(l.waited_for[0].what, WaitedFor::FsStallWindow);
        assert!(
            l.words.contains("19s for the fs-stall window"),
            "{}",
            l.words
        );
        assert!(
            l.words.contains("3.5s in the roll calls themselves"),
            "{}",
            l.words
        );
    }

    #[test]
    fn a_slow_soft_roll_call_in_flight_at_the_threshold_is_named() {
        // The soft look's probes waited for their filesystem past the hard threshold; its verdict was acted on.
        let looks = [look(Trigger::Soft, 3.0, 12.0, false)];
        let l = late(s(6.0), &looks, None, s(30.0)).expect("late");
        assert_eq!(
            l.words,
            "the verdict came 6.0s after the 6s threshold: 6.0s for the roll call already under way"
        );
    }

    #[test]
    fn looks_that_no_threshold_asked_for_are_never_late() {
        for trigger in [
            Trigger::Signal(15),
            Trigger::Ordered,
            Trigger::RankFailed,
            Trigger::PostMortem,
        ] {
            let looks = [look(trigger, 300.0, 301.0, false)];
            assert_eq!(late(s(120.0), &looks, None, s(30.0)), None, "{trigger:?}");
        }
    }

    fn activity(summary: &str) -> Activity {
        Activity {
            ranks: vec![0],
            pids: vec![100],
            where_: "copy (job.py)".into(),
            of_ranks: 4,
            waiting: 3,
            waiting_where: Some("all_reduce (torch/distributed/distributed_c10d.py)".into()),
            summary: summary.into(),
        }
    }

    #[test]
    fn a_hold_is_kept_once_per_stall_and_closed_by_what_ended_it() {
        let mut log = StallLog::new();
        log.look_started(Trigger::Hard, s(120.0));
        log.look_finished(Trigger::Hard, s(121.0), true);
        log.hold_said(s(200.0), 1_000.0, s(121.0), activity(COPY));
        log.hold_said(s(230.0), 1_030.0, s(151.0), activity("said twice"));
        assert!(log.holding());
        let open = log.holds(s(260.0));
        assert_eq!(open.len(), 1, "once per stall");
        assert_eq!(open[0].ended, None);
        assert_eq!(open[0].held_for_s, 60.0, "an open hold counts until now");
        assert_eq!(log.last_hold_words(), Some(COPY));
        log.progress(s(270.0));
        let closed = log.holds(s(400.0));
        assert_eq!(closed[0].ended, Some(HoldEnd::ProgressResumed));
        assert_eq!(closed[0].held_for_s, 70.0);
        assert!(log.looks().is_empty(), "a new stall starts with no looks");
        // The next stall's hold is a second record, ended when a look found no work.
        log.look_started(Trigger::Soft, s(61.0));
        log.look_finished(Trigger::Soft, s(62.0), true);
        log.hold_said(s(500.0), 1_300.0, s(62.0), activity(COPY));
        log.look_started(Trigger::Hard, s(120.0));
        log.look_finished(Trigger::Hard, s(121.0), false);
        log.ending(s(530.0));
        let both = log.holds(s(600.0));
        assert_eq!(both.len(), 2);
        assert_eq!(both[1].ended, Some(HoldEnd::WorkStopped));
        let json = serde_json::to_value(&both[1]).expect("json");
        assert_eq!(json["ended"], "work_stopped");
        assert_eq!(json["activity"]["summary"], COPY);
        assert!(json.get("began").is_none(), "the run's clock stays inside");
    }

    #[test]
    fn a_hold_ended_by_a_conclusive_finding_or_at_max_stall_says_so() {
        for (trigger, how) in [
            (Trigger::FsStall, HoldEnd::Conclusive),
            (Trigger::Soft, HoldEnd::Conclusive),
            (Trigger::RankFailed, HoldEnd::Conclusive),
            (Trigger::MaxStall, HoldEnd::MaxStall),
            (Trigger::ConfirmStop, HoldEnd::WorkStopped),
        ] {
            let mut log = StallLog::new();
            log.hold_said(s(0.0), 0.0, s(60.0), activity(COPY));
            log.look_started(trigger, s(70.0));
            log.look_finished(trigger, s(71.0), false);
            log.ending(s(11.0));
            assert_eq!(log.holds(s(20.0))[0].ended, Some(how), "{trigger:?}");
            assert_eq!(log.holds(s(20.0))[0].held_for_s, 11.0);
        }
    }

    #[test]
    fn a_look_at_a_younger_stall_starts_a_new_one() {
        let mut log = StallLog::new();
        log.look_started(Trigger::Soft, s(60.0));
        log.look_finished(Trigger::Soft, s(61.0), false);
        log.look_started(Trigger::Soft, s(30.0));
        assert_eq!(log.looks().len(), 1);
        assert_eq!(log.looks()[0].finished, None);
    }
}
