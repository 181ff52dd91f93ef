//! The supervision policy: what `run` does next, decided from what happened. Pure: inputs in (a tick with the
//! detector's state, a roll call or a termination that finished, a signal), actions out (take a roll call, end the
//! job, pass a signal on, finish), `now` passed in. The supervision loop carries the actions out in workers that
//! report back as inputs, so the loop that decides never waits.
//!
//! ```text
//!   Tick(stall) ──► Soft ─► RollCall(Soft) ──► RollCallDone(conclusive) ─► Terminate ─► Terminated ─► Finish(Hung)
//!                   Hard ─► RollCall(Hard)  ──► RollCallDone(no activity) ─► Terminate ─► ...
//!                                               RollCallDone(activity)   ─► hold: Say(Computing) + Alert, once
//!   (holding) Tick ─► every 30 s RollCall(Recheck) ─► activity: hold on; none: Terminate
//!                  ─► past --max-stall RollCall(MaxStall) ─► Terminate
//!   Signal ──► stuck?  yes ─► RollCall(Signal) ─► RollCallDone ─► Forward ─► (grace) ─► Terminate{kill} ─► Finish
//!                      no  ─► Forward ─► job ends by itself ─► Finish(Interrupted)
//!   second Signal ──► Terminate{kill now}
//!   job gone by itself, a rank failed ──► RollCall(PostMortem) ─► RollCallDone ─► Finish(ByItself)
//! ```

use std::time::Duration;

pub use hangwatch_diagnosis::OnHang;
use hangwatch_diagnosis::{
    ActivityHold, ActivityRule, AfterLook, HoldCheck, HoldNotice, Ladder, Look, Rung,
};
use hangwatch_model::StallTier;

/// Why a roll call is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Past the soft threshold: look, keep the evidence, alert; act only on conclusive evidence.
    Soft,
    /// Past the hard threshold: look, then act.
    Hard,
    /// A rank failed and its peers go on waiting.
    RankFailed,
    /// hangwatch got this signal while the job was stuck: the evidence is kept before the job is ended.
    Signal(i32),
    /// The fast path: a rank sat in a filesystem wait (or stopped) with its I/O still for `--fs-stall` while the
    /// job made no progress. Act only if the roll call confirms it (the mount does not answer its probe).
    FsStall,
    /// The job's coordinator ordered the job ended, with its verdict: this node's evidence is kept while its
    /// ranks are ended.
    Ordered,
    /// Past the hard threshold, the ranks were seen computing: look again, act if the work stopped.
    Recheck,
    /// A recheck saw the work stop: one more look confirms it before acting (its evidence is kept).
    ConfirmStop,
    /// Past `--max-stall` while the ranks compute: look one last time for the evidence, then act.
    MaxStall,
    /// The job ended by itself after a rank failed: the verdict says who died first and how; nothing is acted
    /// on, the job's own exit code stands.
    PostMortem,
}

impl From<Rung> for Trigger {
    fn from(rung: Rung) -> Self {
        match rung {
            Rung::FsStall => Trigger::FsStall,
            Rung::Hard => Trigger::Hard,
            Rung::Soft => Trigger::Soft,
        }
    }
}

impl Trigger {
    /// The word for people ("soft threshold", "signal 15").
    pub fn describe(self) -> String {
        match self {
            Trigger::Soft => Rung::Soft.describe().into(),
            Trigger::Hard => Rung::Hard.describe().into(),
            Trigger::RankFailed => "a rank failed".into(),
            Trigger::Signal(sig) => format!("signal {sig}"),
            Trigger::FsStall => Rung::FsStall.describe().into(),
            Trigger::Ordered => "the coordinator's order".into(),
            Trigger::Recheck => "still no progress while the ranks compute".into(),
            Trigger::ConfirmStop => "the ranks stopped computing".into(),
            Trigger::MaxStall => "--max-stall".into(),
            Trigger::PostMortem => "a rank failed and the job ended".into(),
        }
    }
}

/// How the run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Every rank ended by itself: the job's own exit code.
    ByItself,
    /// hangwatch ended a hung job: 75.
    Hung,
    /// hangwatch was told to stop by this signal: 128 + signal (or the job's own failure code).
    Interrupted(i32),
    /// hangwatch, watching a job it did not start, was told to stop by this signal and left the job as it was.
    Left(i32),
}

/// What the policy wants said to people (rendered by the loop).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    ProgressResumed,
    /// The job is stuck and hangwatch was signalled: evidence first, then the signal goes on.
    InspectingBeforeSignal {
        signal: i32,
    },
    ForwardingSignal {
        signal: i32,
    },
    /// Watching a job hangwatch did not start, it was signalled: it stops watching and leaves the job alone.
    LeavingJob {
        signal: i32,
    },
    /// The job did not end within the grace period after the signal.
    GraceOver {
        signal: i32,
    },
    /// After the signal only processes blocked in the kernel are left: no grace for them.
    OnlyStuckLeft {
        signal: i32,
    },
    SecondSignal,
    /// Ending the job: SIGTERM, then SIGKILL after the grace period.
    EndingJob {
        grace: Duration,
    },
    /// No progress, but the last roll call saw the ranks compute: the job is not ended for it (once per stall).
    Computing,
    /// The ranks that computed without progress stopped computing: the hold is over.
    WorkStopped,
    /// `--max-stall` passed while the ranks computed without progress.
    MaxStallPassed,
}

/// One thing for the loop to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Say(Notice),
    /// Roll call, evidence, alert (one worker); reports back with [`Input::RollCallDone`].
    RollCall(Trigger),
    /// Pass the signal on to every process group of the job.
    Forward(i32),
    /// End the job: SIGTERM, grace, SIGKILL (`kill_now`: SIGKILL at once); reports back with
    /// [`Input::Terminated`].
    Terminate {
        kill_now: bool,
    },
    /// Send the warning alert that the job computes without progress and is not ended for it.
    AlertComputing,
    /// Exit.
    Finish(Ending),
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The supervision tick: the detector's state now and the job's.
    Tick {
        stall: StallTier,
        /// A rank failed this long ago (`--nproc` mode): while others still run, past `failed_rank_grace` that
        /// is a hang; once the job is gone, its post-mortem is taken.
        failed_rank_for: Option<Duration>,
        /// Any process of the job still alive.
        job_alive: bool,
        /// Every live process of the job is one the last verdict found blocked in the kernel: nothing left can
        /// act on a signal, so a grace period would be spent waiting on the unkillable.
        only_stuck_left: bool,
        /// The fast-path rule holds now (see `hangwatch_diagnosis::fs_stall`), whatever the thresholds say.
        fs_stuck: bool,
        /// How long the job has made no progress.
        stalled_for: Duration,
    },
    /// hangwatch received a signal. `stuck`: the job made no progress for longer than its usual step.
    Signal { signal: i32, stuck: bool },
    /// A roll call finished (evidence kept, alert sent). `conclusive`: strong enough to act at the soft tier;
    /// `active`: the ranks were seen computing (`hangwatch_diagnosis::activity`).
    RollCallDone {
        trigger: Trigger,
        conclusive: bool,
        active: bool,
    },
    /// A termination finished.
    Terminated,
    /// The job's coordinator ordered the job ended (multi-node): keep this node's evidence, end the ranks.
    TerminateOrdered,
}

/// Settings of the policy.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    pub on_hang: OnHang,
    /// Time between SIGTERM and SIGKILL, and after a forwarded signal before the job is killed.
    pub grace: Duration,
    /// A failed rank whose peers go on this long is treated as a hang.
    pub failed_rank_grace: Duration,
    /// The longest the evidence of a stuck job may hold a signal back.
    pub inspect_budget: Duration,
    /// How long ranks seen computing hold the hard tier back.
    pub activity: ActivityRule,
    /// hangwatch watches processes it did not start (`run --attach`, a node service): a signal ends the watch and
    /// leaves the job alone, since it is hangwatch that is told to stop, not the job.
    pub attached: bool,
}

/// Where the run is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Watching,
    /// Signalled while stuck: a roll call runs, the signal goes on when it is done or at `until`.
    InspectingBeforeSignal {
        signal: i32,
        until: Duration,
    },
    /// The signal went on; the job has until `until` to end by itself.
    Forwarded {
        signal: i32,
        until: Duration,
    },
    /// A termination runs; then finish with this.
    Ending(Ending),
    Finished,
}

/// The policy of one run. Feed it every input in order; carry out the actions it returns, in order.
#[derive(Debug, Clone)]
pub struct Policy {
    config: PolicyConfig,
    stage: Stage,
    /// The roll call in flight, if any: never two at once.
    rollcall: Option<Trigger>,
    /// The looks taken since the job last made progress (the ladder shared with the coordinator).
    ladder: Ladder,
    failed_done: bool,
    /// The job ended by itself after a rank failed: a post-mortem is taken once no roll call is in flight.
    post_mortem_due: bool,
    /// The hard tier was reached while the soft roll call was still running: act on its result.
    hard_pending: bool,
    signals: u32,
    /// The job ended while a roll call was still writing evidence: finish when it is done (or at this time).
    ended_while_inspecting: Option<Duration>,
    /// An ordered termination finished while this node's evidence was still being written: finish with this
    /// when it is written, or `EVIDENCE_WAIT` after the time.
    terminated_before_evidence: Option<(Ending, Duration)>,
    /// Ranks computing without progress hold the hard tier back (the rule shared with the coordinator).
    hold: ActivityHold,
    /// How long the job had made no progress at the last tick.
    stalled_for: Duration,
}

/// How long a finished job waits for the evidence of a roll call still in flight.
const EVIDENCE_WAIT: Duration = Duration::from_secs(5);

impl Policy {
    pub fn new(config: PolicyConfig) -> Self {
        Self {
            hold: ActivityHold::new(config.activity),
            stalled_for: Duration::ZERO,
            config,
            stage: Stage::Watching,
            rollcall: None,
            ladder: Ladder::default(),
            failed_done: false,
            post_mortem_due: false,
            hard_pending: false,
            signals: 0,
            ended_while_inspecting: None,
            terminated_before_evidence: None,
        }
    }

    /// The signal hangwatch was stopped by, if any.
    pub fn interrupted_by(&self) -> Option<i32> {
        match self.stage {
            Stage::InspectingBeforeSignal { signal, .. } | Stage::Forwarded { signal, .. } => {
                Some(signal)
            }
            Stage::Ending(Ending::Interrupted(signal)) => Some(signal),
            _ => None,
        }
    }

    /// Whether a roll call is in flight.
    pub fn inspecting(&self) -> bool {
        self.rollcall.is_some()
    }

    /// The latest a job that computes without progress is ended (`--max-stall`); `None`: activity never holds.
    pub fn max_stall(&self) -> Option<Duration> {
        self.hold.rule().max_stall
    }

    /// Whether the ranks were seen computing without progress in this stall (and so the job is not ended for
    /// it until `--max-stall` or the work stops).
    pub fn computing_without_progress(&self) -> bool {
        self.hold.announced()
    }

    /// Decides what to do about `input` at `now` (time since the run started).
    pub fn handle(&mut self, input: Input, now: Duration) -> Vec<Action> {
        if self.stage == Stage::Finished {
            return Vec::new();
        }
        match input {
            Input::Tick {
                stall,
                failed_rank_for,
                job_alive,
                only_stuck_left,
                fs_stuck,
                stalled_for,
            } => {
                self.stalled_for = stalled_for;
                self.tick(
                    stall,
                    failed_rank_for,
                    job_alive,
                    only_stuck_left,
                    fs_stuck,
                    now,
                )
            }
            Input::Signal { signal, stuck } => self.signal(signal, stuck, now),
            Input::RollCallDone {
                trigger,
                conclusive,
                active,
            } => self.rollcall_done(trigger, conclusive, active, now),
            Input::Terminated => match self.stage {
                Stage::Ending(ending) if self.rollcall == Some(Trigger::Ordered) => {
                    self.terminated_before_evidence = Some((ending, now));
                    Vec::new()
                }
                Stage::Ending(ending) => self.finish(ending),
                _ => Vec::new(),
            },
            Input::TerminateOrdered => self.terminate_ordered(),
        }
    }

    /// The coordinator's order: this node's evidence (with the job's verdict) and the termination at once. A
    /// termination already under way (a signal's, a local hang's) goes on; the evidence is still kept.
    fn terminate_ordered(&mut self) -> Vec<Action> {
        match self.stage {
            Stage::Watching | Stage::InspectingBeforeSignal { .. } | Stage::Forwarded { .. } => {
                let mut actions = Vec::new();
                if self.rollcall.is_none() {
                    actions.push(self.start_rollcall(Trigger::Ordered));
                }
                let ending = match self.interrupted_by() {
                    Some(signal) => Ending::Interrupted(signal),
                    None => Ending::Hung,
                };
                actions.extend(self.terminate(ending, false));
                actions
            }
            Stage::Ending(_) | Stage::Finished => Vec::new(),
        }
    }

    fn finish(&mut self, ending: Ending) -> Vec<Action> {
        self.stage = Stage::Finished;
        vec![Action::Finish(ending)]
    }

    fn start_rollcall(&mut self, trigger: Trigger) -> Action {
        self.rollcall = Some(trigger);
        Action::RollCall(trigger)
    }

    fn terminate(&mut self, ending: Ending, kill_now: bool) -> Vec<Action> {
        self.stage = Stage::Ending(ending);
        let mut actions = Vec::new();
        if !kill_now {
            actions.push(Action::Say(Notice::EndingJob {
                grace: self.config.grace,
            }));
        }
        actions.push(Action::Terminate { kill_now });
        actions
    }

    fn tick(
        &mut self,
        stall: StallTier,
        failed_rank_for: Option<Duration>,
        job_alive: bool,
        only_stuck_left: bool,
        fs_stuck: bool,
        now: Duration,
    ) -> Vec<Action> {
        if let Some((ending, since)) = self.terminated_before_evidence {
            if now.saturating_sub(since) >= EVIDENCE_WAIT {
                return self.finish(ending);
            }
            return Vec::new();
        }
        if !job_alive {
            if failed_rank_for.is_some() && self.stage == Stage::Watching && !self.failed_done {
                self.post_mortem_due = true;
                if self.rollcall.is_none() {
                    self.failed_done = true;
                    self.ended_while_inspecting = Some(now);
                    return vec![self.start_rollcall(Trigger::PostMortem)];
                }
            }
            // A roll call still in flight is waited for (bounded); the post-mortem follows it.
            return self.job_gone(now);
        }
        match self.stage {
            Stage::Forwarded { signal, .. } if only_stuck_left => {
                self.stage = Stage::Ending(Ending::Interrupted(signal));
                return vec![
                    Action::Say(Notice::OnlyStuckLeft { signal }),
                    Action::Terminate { kill_now: true },
                ];
            }
            Stage::Watching => {}
            Stage::InspectingBeforeSignal { signal, until } if now >= until => {
                return self.forward(signal, now);
            }
            Stage::Forwarded { signal, until } if now >= until => {
                self.stage = Stage::Ending(Ending::Interrupted(signal));
                return vec![
                    Action::Say(Notice::GraceOver { signal }),
                    Action::Terminate { kill_now: true },
                ];
            }
            _ => return Vec::new(),
        }
        let mut actions = Vec::new();
        if stall == StallTier::Healthy && failed_rank_for.is_none() && !fs_stuck {
            if self.ladder.reset() {
                actions.push(Action::Say(Notice::ProgressResumed));
            }
            self.hard_pending = false;
            self.hold.reset();
            return actions;
        }
        if self.rollcall.is_some() {
            if stall == StallTier::Hard {
                self.hard_pending = true;
            }
            return actions;
        }
        match self.ladder.climb(stall, fs_stuck) {
            Some(rung) => actions.push(self.start_rollcall(Trigger::from(rung))),
            None => {
                if let Some(since) = failed_rank_for {
                    if since >= self.config.failed_rank_grace && !self.failed_done {
                        self.failed_done = true;
                        self.ladder.spend_tiers();
                        actions.push(self.start_rollcall(Trigger::RankFailed));
                        return actions;
                    }
                }
                match self.hold.tick(self.stalled_for, now) {
                    Some(HoldCheck::Recheck) => actions.push(self.start_rollcall(Trigger::Recheck)),
                    Some(HoldCheck::Confirm) => {
                        actions.push(self.start_rollcall(Trigger::ConfirmStop))
                    }
                    Some(HoldCheck::MaxStall) => {
                        actions.push(self.start_rollcall(Trigger::MaxStall))
                    }
                    None => {}
                }
            }
        }
        actions
    }

    /// Nothing of the job is alive any more.
    fn job_gone(&mut self, now: Duration) -> Vec<Action> {
        let ending = match self.stage {
            // A termination in flight reports back; finish then.
            Stage::Ending(_) => return Vec::new(),
            Stage::InspectingBeforeSignal { signal, .. } | Stage::Forwarded { signal, .. } => {
                Ending::Interrupted(signal)
            }
            Stage::Watching => Ending::ByItself,
            Stage::Finished => return Vec::new(),
        };
        if self.rollcall.is_some() {
            let since = *self.ended_while_inspecting.get_or_insert(now);
            if now.saturating_sub(since) < EVIDENCE_WAIT {
                return Vec::new();
            }
        }
        self.finish(ending)
    }

    fn forward(&mut self, signal: i32, now: Duration) -> Vec<Action> {
        self.stage = Stage::Forwarded {
            signal,
            until: now + self.config.grace,
        };
        vec![
            Action::Say(Notice::ForwardingSignal { signal }),
            Action::Forward(signal),
        ]
    }

    fn signal(&mut self, signal: i32, stuck: bool, now: Duration) -> Vec<Action> {
        if self.config.attached {
            // Nothing is forwarded and nothing killed: the job is not hangwatch's to end on a signal.
            return match self.stage {
                Stage::Finished => Vec::new(),
                _ => {
                    self.stage = Stage::Finished;
                    vec![
                        Action::Say(Notice::LeavingJob { signal }),
                        Action::Finish(Ending::Left(signal)),
                    ]
                }
            };
        }
        self.signals += 1;
        if self.signals >= 2 {
            return match self.stage {
                Stage::Ending(Ending::Interrupted(_)) | Stage::Finished => Vec::new(),
                Stage::Ending(_) => {
                    // A termination is running (TERM, grace): make it KILL now; the reason stays.
                    vec![
                        Action::Say(Notice::SecondSignal),
                        Action::Terminate { kill_now: true },
                    ]
                }
                _ => {
                    let first = self.interrupted_by().unwrap_or(signal);
                    self.stage = Stage::Ending(Ending::Interrupted(first));
                    vec![
                        Action::Say(Notice::SecondSignal),
                        Action::Terminate { kill_now: true },
                    ]
                }
            };
        }
        match self.stage {
            Stage::Watching if stuck => {
                self.stage = Stage::InspectingBeforeSignal {
                    signal,
                    until: now + self.config.inspect_budget,
                };
                let mut actions = vec![Action::Say(Notice::InspectingBeforeSignal { signal })];
                if self.rollcall.is_none() {
                    actions.push(self.start_rollcall(Trigger::Signal(signal)));
                }
                actions
            }
            Stage::Watching => self.forward(signal, now),
            // Already ending the job (a hang): the signal changes nothing but the next one kills.
            _ => Vec::new(),
        }
    }

    fn rollcall_done(
        &mut self,
        trigger: Trigger,
        conclusive: bool,
        active: bool,
        now: Duration,
    ) -> Vec<Action> {
        self.rollcall = None;
        if let Some((ending, _)) = self.terminated_before_evidence.take() {
            return self.finish(ending);
        }
        if self.ended_while_inspecting.is_some() {
            if self.post_mortem_due && !self.failed_done {
                // Ended (a rank failed) while another roll call ran: its verdict is about a live job.
                self.failed_done = true;
                self.ended_while_inspecting = Some(now);
                return vec![self.start_rollcall(Trigger::PostMortem)];
            }
            return self.job_gone(now);
        }
        match self.stage {
            Stage::InspectingBeforeSignal { signal, .. } => self.forward(signal, now),
            Stage::Watching => {
                let look = match trigger {
                    Trigger::RankFailed => Look::RankFailed,
                    Trigger::Hard => Look::Hard,
                    Trigger::Recheck => Look::Recheck,
                    Trigger::ConfirmStop => Look::Confirm,
                    Trigger::MaxStall => Look::MaxStall,
                    Trigger::Soft | Trigger::FsStall => Look::BelowHard {
                        conclusive,
                        hard_pending: self.hard_pending,
                    },
                    Trigger::Signal(_) | Trigger::Ordered | Trigger::PostMortem => Look::Never,
                };
                self.hard_pending = false;
                let AfterLook { act, say } =
                    self.hold.after_look(look, active, self.stalled_for, now);
                let mut actions = Vec::new();
                match say {
                    Some(HoldNotice::Computing) => {
                        actions.extend([Action::Say(Notice::Computing), Action::AlertComputing])
                    }
                    Some(HoldNotice::WorkStopped) => actions.push(Action::Say(Notice::WorkStopped)),
                    Some(HoldNotice::MaxStallPassed) => {
                        actions.push(Action::Say(Notice::MaxStallPassed))
                    }
                    None => {}
                }
                if act && self.config.on_hang == OnHang::Abort {
                    actions.extend(self.terminate(Ending::Hung, false));
                }
                actions
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    fn policy(on_hang: OnHang) -> Policy {
        Policy::new(PolicyConfig {
            on_hang,
            grace: s(10.0),
            failed_rank_grace: s(30.0),
            inspect_budget: s(4.0),
            activity: ActivityRule::until(s(1800.0)),
            attached: false,
        })
    }

    #[test]
    fn watching_a_job_it_did_not_start_a_signal_ends_the_watch_and_touches_nothing() {
        let mut p = Policy::new(PolicyConfig {
            attached: true,
            ..policy(OnHang::Abort).config
        });
        for stuck in [false, true] {
            let mut p = Policy::new(PolicyConfig {
                attached: true,
                ..policy(OnHang::Abort).config
            });
            assert_eq!(
                p.handle(Input::Signal { signal: 15, stuck }, s(3.0)),
                vec![
                    Action::Say(Notice::LeavingJob { signal: 15 }),
                    Action::Finish(Ending::Left(15))
                ]
            );
            assert!(p
                .handle(Input::Signal { signal: 2, stuck }, s(4.0))
                .is_empty());
        }
        // A hang is still acted on as configured: attach changes only what a signal to hangwatch means.
        p.handle(stalled(StallTier::Hard, 5.0), s(5.0));
        assert_eq!(
            p.handle(done(Trigger::Hard, false), s(6.0)).last(),
            Some(&Action::Terminate { kill_now: false })
        );
    }

    fn tick(stall: StallTier) -> Input {
        Input::Tick {
            stall,
            failed_rank_for: None,
            job_alive: true,
            only_stuck_left: false,
            fs_stuck: false,
            stalled_for: Duration::ZERO,
        }
    }

    const GONE: Input = Input::Tick {
        stall: StallTier::Healthy,
        failed_rank_for: None,
        job_alive: false,
        only_stuck_left: false,
        fs_stuck: false,
        stalled_for: Duration::ZERO,
    };

    /// The job is gone; a rank failed `ago` before.
    fn gone_after_failure(ago: f64) -> Input {
        Input::Tick {
            stall: StallTier::Healthy,
            failed_rank_for: Some(s(ago)),
            job_alive: false,
            only_stuck_left: false,
            fs_stuck: false,
            stalled_for: Duration::ZERO,
        }
    }

    #[test]
    fn a_job_that_ended_because_a_rank_failed_gets_a_post_mortem_then_its_own_code() {
        let mut p = policy(OnHang::Abort);
        assert!(p.handle(tick(StallTier::Healthy), s(1.0)).is_empty());
        assert_eq!(
            p.handle(gone_after_failure(0.1), s(2.0)),
            vec![Action::RollCall(Trigger::PostMortem)]
        );
        assert!(
            p.handle(gone_after_failure(0.2), s(2.1)).is_empty(),
            "waits"
        );
        assert_eq!(
            p.handle(
                Input::RollCallDone {
                    trigger: Trigger::PostMortem,
                    conclusive: true,
                    active: false,
                },
                s(2.5)
            ),
            vec![Action::Finish(Ending::ByItself)],
            "nothing is acted on: the job is over"
        );
    }

    #[test]
    fn a_post_mortem_that_does_not_finish_is_not_waited_for_long() {
        let mut p = policy(OnHang::Observe);
        assert_eq!(
            p.handle(gone_after_failure(0.1), s(2.0)),
            vec![Action::RollCall(Trigger::PostMortem)]
        );
        assert!(p.handle(gone_after_failure(1.0), s(3.0)).is_empty());
        assert_eq!(
            p.handle(gone_after_failure(6.0), s(8.0)),
            vec![Action::Finish(Ending::ByItself)]
        );
    }

    #[test]
    fn a_job_that_fails_during_a_roll_call_gets_its_post_mortem_after_it() {
        let mut p = policy(OnHang::Observe);
        assert_eq!(
            p.handle(tick(StallTier::Soft), s(1.0)),
            vec![Action::RollCall(Trigger::Soft)]
        );
        assert!(p.handle(gone_after_failure(0.1), s(2.0)).is_empty());
        assert_eq!(
            p.handle(
                Input::RollCallDone {
                    trigger: Trigger::Soft,
                    conclusive: false,
                    active: false,
                },
                s(3.0)
            ),
            vec![Action::RollCall(Trigger::PostMortem)]
        );
        assert_eq!(
            p.handle(
                Input::RollCallDone {
                    trigger: Trigger::PostMortem,
                    conclusive: false,
                    active: false,
                },
                s(3.5)
            ),
            vec![Action::Finish(Ending::ByItself)]
        );
    }

    #[test]
    fn a_failed_rank_already_judged_while_its_peers_waited_gets_no_second_verdict() {
        let mut p = policy(OnHang::Observe);
        let waiting = Input::Tick {
            stall: StallTier::Healthy,
            failed_rank_for: Some(s(31.0)),
            job_alive: true,
            only_stuck_left: false,
            fs_stuck: false,
            stalled_for: Duration::ZERO,
        };
        assert_eq!(
            p.handle(waiting, s(31.0)),
            vec![Action::RollCall(Trigger::RankFailed)]
        );
        assert!(p
            .handle(
                Input::RollCallDone {
                    trigger: Trigger::RankFailed,
                    conclusive: true,
                    active: false,
                },
                s(32.0)
            )
            .is_empty());
        assert_eq!(
            p.handle(gone_after_failure(40.0), s(40.0)),
            vec![Action::Finish(Ending::ByItself)]
        );
    }

    #[test]
    fn a_healthy_job_that_ends_finishes_with_its_own_code() {
        let mut p = policy(OnHang::Abort);
        assert!(p.handle(tick(StallTier::Healthy), s(1.0)).is_empty());
        assert_eq!(
            p.handle(GONE, s(2.0)),
            vec![Action::Finish(Ending::ByItself)]
        );
        assert!(p.handle(GONE, s(3.0)).is_empty(), "finishes once");
    }

    #[test]
    fn soft_tier_looks_once_and_acts_only_on_conclusive_evidence() {
        let mut p = policy(OnHang::Abort);
        assert_eq!(
            p.handle(tick(StallTier::Soft), s(1.0)),
            vec![Action::RollCall(Trigger::Soft)]
        );
        assert!(
            p.handle(tick(StallTier::Soft), s(1.2)).is_empty(),
            "one roll call at a time"
        );
        let done = Input::RollCallDone {
            trigger: Trigger::Soft,
            conclusive: false,
            active: false,
        };
        assert!(p.handle(done, s(2.0)).is_empty());
        assert!(
            p.handle(tick(StallTier::Soft), s(2.2)).is_empty(),
            "not again at the same tier"
        );
        assert_eq!(
            p.handle(tick(StallTier::Hard), s(5.0)),
            vec![Action::RollCall(Trigger::Hard)]
        );
        let actions = p.handle(
            Input::RollCallDone {
                trigger: Trigger::Hard,
                conclusive: false,
                active: false,
            },
            s(6.0),
        );
        assert_eq!(actions.last(), Some(&Action::Terminate { kill_now: false }));
        assert!(p.handle(tick(StallTier::Hard), s(6.2)).is_empty());
        assert_eq!(
            p.handle(Input::Terminated, s(20.0)),
            vec![Action::Finish(Ending::Hung)]
        );
    }

    fn stalled(stall: StallTier, stalled_for: f64) -> Input {
        Input::Tick {
            stall,
            failed_rank_for: None,
            job_alive: true,
            only_stuck_left: false,
            fs_stuck: false,
            stalled_for: s(stalled_for),
        }
    }

    fn done(trigger: Trigger, active: bool) -> Input {
        Input::RollCallDone {
            trigger,
            conclusive: false,
            active,
        }
    }

    #[test]
    fn ranks_that_compute_in_silence_are_not_ended_until_max_stall() {
        let mut p = policy(OnHang::Abort);
        assert_eq!(
            p.handle(stalled(StallTier::Soft, 60.0), s(100.0)),
            vec![Action::RollCall(Trigger::Soft)]
        );
        assert_eq!(
            p.handle(done(Trigger::Soft, true), s(101.0)),
            vec![Action::Say(Notice::Computing), Action::AlertComputing],
            "said and alerted once, at the first look that sees the work"
        );
        assert!(p.computing_without_progress());
        assert_eq!(
            p.handle(stalled(StallTier::Hard, 120.0), s(160.0)),
            vec![Action::RollCall(Trigger::Hard)]
        );
        assert!(
            p.handle(done(Trigger::Hard, true), s(161.0)).is_empty(),
            "the hard tier is held back, and not said again"
        );
        assert!(p
            .handle(stalled(StallTier::Hard, 140.0), s(180.0))
            .is_empty());
        assert_eq!(
            p.handle(stalled(StallTier::Hard, 152.0), s(192.0)),
            vec![Action::RollCall(Trigger::Recheck)],
            "looked at again 30 s later"
        );
        assert!(p.handle(done(Trigger::Recheck, true), s(193.0)).is_empty());
        assert_eq!(
            p.handle(stalled(StallTier::Hard, 1800.0), s(1840.0)),
            vec![Action::RollCall(Trigger::MaxStall)]
        );
        assert_eq!(
            p.handle(done(Trigger::MaxStall, true), s(1841.0)),
            vec![
                Action::Say(Notice::MaxStallPassed),
                Action::Say(Notice::EndingJob { grace: s(10.0) }),
                Action::Terminate { kill_now: false }
            ],
            "a busy loop that never ends is still ended, at --max-stall"
        );
    }

    #[test]
    fn work_that_stops_during_a_hold_is_acted_on_and_progress_ends_the_hold() {
        let mut p = policy(OnHang::Abort);
        p.handle(stalled(StallTier::Hard, 120.0), s(120.0));
        assert_eq!(
            p.handle(done(Trigger::Hard, true), s(121.0)),
            vec![Action::Say(Notice::Computing), Action::AlertComputing]
        );
        assert!(
            p.handle(stalled(StallTier::Healthy, 0.0), s(140.0))
                .contains(&Action::Say(Notice::ProgressResumed)),
            "the evaluation ended and training resumed"
        );
        assert!(!p.computing_without_progress());
        p.handle(stalled(StallTier::Hard, 120.0), s(300.0));
        assert_eq!(
            p.handle(done(Trigger::Hard, true), s(301.0)),
            vec![Action::Say(Notice::Computing), Action::AlertComputing],
            "a new stall is said again"
        );
        assert_eq!(
            p.handle(stalled(StallTier::Hard, 150.0), s(331.0)),
            vec![Action::RollCall(Trigger::Recheck)]
        );
        assert!(
            p.handle(done(Trigger::Recheck, false), s(332.0)).is_empty(),
            "the stop is confirmed by one more look"
        );
        assert_eq!(
            p.handle(stalled(StallTier::Hard, 156.0), s(337.0)),
            vec![Action::RollCall(Trigger::ConfirmStop)]
        );
        assert_eq!(
            p.handle(done(Trigger::ConfirmStop, false), s(338.0)),
            vec![
                Action::Say(Notice::WorkStopped),
                Action::Say(Notice::EndingJob { grace: s(10.0) }),
                Action::Terminate { kill_now: false }
            ]
        );
    }

    #[test]
    fn a_fixed_threshold_ends_a_busy_job_at_the_hard_tier() {
        let mut p = Policy::new(PolicyConfig {
            activity: ActivityRule::never(),
            ..policy(OnHang::Abort).config
        });
        p.handle(stalled(StallTier::Hard, 5.0), s(5.0));
        assert_eq!(
            p.handle(done(Trigger::Hard, true), s(6.0)).last(),
            Some(&Action::Terminate { kill_now: false })
        );
    }

    #[test]
    fn conclusive_evidence_acts_at_the_soft_tier() {
        let mut p = policy(OnHang::Abort);
        p.handle(tick(StallTier::Soft), s(1.0));
        let actions = p.handle(
            Input::RollCallDone {
                trigger: Trigger::Soft,
                conclusive: true,
                active: false,
            },
            s(2.0),
        );
        assert!(actions.contains(&Action::Terminate { kill_now: false }));
    }

    #[test]
    fn hard_tier_reached_during_the_soft_roll_call_acts_on_its_result() {
        let mut p = policy(OnHang::Abort);
        p.handle(tick(StallTier::Soft), s(1.0));
        assert!(p.handle(tick(StallTier::Hard), s(2.0)).is_empty());
        let actions = p.handle(
            Input::RollCallDone {
                trigger: Trigger::Soft,
                conclusive: false,
                active: false,
            },
            s(3.0),
        );
        assert!(actions.contains(&Action::Terminate { kill_now: false }));
    }

    #[test]
    fn observe_never_terminates() {
        let mut p = policy(OnHang::Observe);
        p.handle(tick(StallTier::Hard), s(1.0));
        assert!(p
            .handle(
                Input::RollCallDone {
                    trigger: Trigger::Hard,
                    conclusive: true,
                    active: false,
                },
                s(2.0)
            )
            .is_empty());
        assert!(p.handle(tick(StallTier::Hard), s(3.0)).is_empty());
    }

    #[test]
    fn progress_resumed_rearms_both_tiers() {
        let mut p = policy(OnHang::Observe);
        p.handle(tick(StallTier::Soft), s(1.0));
        p.handle(
            Input::RollCallDone {
                trigger: Trigger::Soft,
                conclusive: false,
                active: false,
            },
            s(1.5),
        );
        assert_eq!(
            p.handle(tick(StallTier::Healthy), s(2.0)),
            vec![Action::Say(Notice::ProgressResumed)]
        );
        assert_eq!(
            p.handle(tick(StallTier::Soft), s(3.0)),
            vec![Action::RollCall(Trigger::Soft)]
        );
    }

    #[test]
    fn a_failed_rank_waits_for_its_grace_then_acts() {
        let mut p = policy(OnHang::Abort);
        let failed = |for_s: f64| Input::Tick {
            stall: StallTier::Healthy,
            failed_rank_for: Some(s(for_s)),
            job_alive: true,
            only_stuck_left: false,
            fs_stuck: false,
            stalled_for: Duration::ZERO,
        };
        assert!(p.handle(failed(10.0), s(10.0)).is_empty());
        assert_eq!(
            p.handle(failed(30.0), s(30.0)),
            vec![Action::RollCall(Trigger::RankFailed)]
        );
        let actions = p.handle(
            Input::RollCallDone {
                trigger: Trigger::RankFailed,
                conclusive: false,
                active: false,
            },
            s(31.0),
        );
        assert!(actions.contains(&Action::Terminate { kill_now: false }));
    }

    #[test]
    fn a_signal_to_a_healthy_job_goes_on_at_once_then_kills_after_grace() {
        let mut p = policy(OnHang::Abort);
        assert_eq!(
            p.handle(
                Input::Signal {
                    signal: 15,
                    stuck: false
                },
                s(1.0)
            ),
            vec![
                Action::Say(Notice::ForwardingSignal { signal: 15 }),
                Action::Forward(15)
            ]
        );
        assert!(
            p.handle(tick(StallTier::Hard), s(5.0)).is_empty(),
            "no roll call while ending"
        );
        assert_eq!(
            p.handle(tick(StallTier::Healthy), s(11.0)),
            vec![
                Action::Say(Notice::GraceOver { signal: 15 }),
                Action::Terminate { kill_now: true }
            ]
        );
        assert_eq!(
            p.handle(Input::Terminated, s(14.0)),
            vec![Action::Finish(Ending::Interrupted(15))]
        );
    }

    #[test]
    fn a_signalled_job_that_ends_by_itself_finishes_as_interrupted() {
        let mut p = policy(OnHang::Abort);
        p.handle(
            Input::Signal {
                signal: 2,
                stuck: false,
            },
            s(1.0),
        );
        assert_eq!(
            p.handle(GONE, s(2.0)),
            vec![Action::Finish(Ending::Interrupted(2))]
        );
    }

    #[test]
    fn a_stuck_job_is_inspected_before_the_signal_goes_on() {
        let mut p = policy(OnHang::Abort);
        let actions = p.handle(
            Input::Signal {
                signal: 15,
                stuck: true,
            },
            s(1.0),
        );
        assert_eq!(
            actions,
            vec![
                Action::Say(Notice::InspectingBeforeSignal { signal: 15 }),
                Action::RollCall(Trigger::Signal(15))
            ]
        );
        assert_eq!(p.interrupted_by(), Some(15));
        let actions = p.handle(
            Input::RollCallDone {
                trigger: Trigger::Signal(15),
                conclusive: true,
                active: false,
            },
            s(2.5),
        );
        assert_eq!(actions.last(), Some(&Action::Forward(15)));
    }

    #[test]
    fn the_inspection_before_a_signal_is_bounded() {
        let mut p = policy(OnHang::Abort);
        p.handle(
            Input::Signal {
                signal: 15,
                stuck: true,
            },
            s(1.0),
        );
        assert!(p.handle(tick(StallTier::Hard), s(4.0)).is_empty());
        assert_eq!(
            p.handle(tick(StallTier::Hard), s(5.0)).last(),
            Some(&Action::Forward(15))
        );
        assert!(
            p.handle(
                Input::RollCallDone {
                    trigger: Trigger::Signal(15),
                    conclusive: true,
                    active: false,
                },
                s(6.0)
            )
            .is_empty(),
            "a late roll call changes nothing"
        );
        assert_eq!(
            p.handle(tick(StallTier::Hard), s(15.0)).last(),
            Some(&Action::Terminate { kill_now: true })
        );
    }

    #[test]
    fn no_grace_is_spent_on_processes_blocked_in_the_kernel() {
        let mut p = policy(OnHang::Abort);
        p.handle(
            Input::Signal {
                signal: 15,
                stuck: true,
            },
            s(1.0),
        );
        p.handle(
            Input::RollCallDone {
                trigger: Trigger::Signal(15),
                conclusive: true,
                active: false,
            },
            s(2.0),
        );
        let only_stuck = Input::Tick {
            stall: StallTier::Hard,
            failed_rank_for: None,
            job_alive: true,
            only_stuck_left: true,
            fs_stuck: false,
            stalled_for: Duration::ZERO,
        };
        assert_eq!(
            p.handle(only_stuck, s(2.2)),
            vec![
                Action::Say(Notice::OnlyStuckLeft { signal: 15 }),
                Action::Terminate { kill_now: true }
            ],
            "the peers ended; the rank in D cannot: kill now, not after the grace"
        );
    }

    #[test]
    fn a_second_signal_kills_at_once() {
        let mut p = policy(OnHang::Abort);
        p.handle(
            Input::Signal {
                signal: 2,
                stuck: false,
            },
            s(1.0),
        );
        assert_eq!(
            p.handle(
                Input::Signal {
                    signal: 2,
                    stuck: false
                },
                s(1.5)
            ),
            vec![
                Action::Say(Notice::SecondSignal),
                Action::Terminate { kill_now: true }
            ]
        );
        assert!(p
            .handle(
                Input::Signal {
                    signal: 2,
                    stuck: false
                },
                s(1.6)
            )
            .is_empty());
        assert_eq!(
            p.handle(Input::Terminated, s(4.0)),
            vec![Action::Finish(Ending::Interrupted(2))]
        );
    }

    #[test]
    fn a_second_signal_during_a_hang_termination_kills_and_keeps_the_hang() {
        let mut p = policy(OnHang::Abort);
        p.handle(tick(StallTier::Hard), s(1.0));
        p.handle(
            Input::RollCallDone {
                trigger: Trigger::Hard,
                conclusive: true,
                active: false,
            },
            s(2.0),
        );
        assert!(p
            .handle(
                Input::Signal {
                    signal: 15,
                    stuck: true
                },
                s(3.0)
            )
            .is_empty());
        assert_eq!(
            p.handle(
                Input::Signal {
                    signal: 15,
                    stuck: true
                },
                s(3.5)
            )
            .last(),
            Some(&Action::Terminate { kill_now: true })
        );
        assert_eq!(
            p.handle(Input::Terminated, s(7.0)),
            vec![Action::Finish(Ending::Hung)]
        );
    }

    #[test]
    fn a_job_that_ends_during_a_roll_call_waits_briefly_for_the_evidence() {
        let mut p = policy(OnHang::Abort);
        p.handle(tick(StallTier::Soft), s(1.0));
        assert!(p.handle(GONE, s(1.5)).is_empty(), "evidence being written");
        assert_eq!(
            p.handle(
                Input::RollCallDone {
                    trigger: Trigger::Soft,
                    conclusive: true,
                    active: false,
                },
                s(2.0)
            ),
            vec![Action::Finish(Ending::ByItself)]
        );
        let mut q = policy(OnHang::Abort);
        q.handle(tick(StallTier::Soft), s(1.0));
        assert!(q.handle(GONE, s(1.5)).is_empty());
        assert_eq!(
            q.handle(GONE, s(1.5) + EVIDENCE_WAIT),
            vec![Action::Finish(Ending::ByItself)],
            "never waits long for a roll call"
        );
    }

    #[test]
    fn the_coordinators_order_keeps_this_nodes_evidence_while_the_ranks_are_ended() {
        let mut p = policy(OnHang::Abort);
        assert_eq!(
            p.handle(Input::TerminateOrdered, s(1.0)),
            vec![
                Action::RollCall(Trigger::Ordered),
                Action::Say(Notice::EndingJob { grace: s(10.0) }),
                Action::Terminate { kill_now: false },
            ]
        );
        assert!(
            p.handle(Input::TerminateOrdered, s(1.1)).is_empty(),
            "a second order changes nothing"
        );
        assert!(
            p.handle(Input::Terminated, s(2.0)).is_empty(),
            "the evidence is still being written"
        );
        assert_eq!(
            p.handle(
                Input::RollCallDone {
                    trigger: Trigger::Ordered,
                    conclusive: false,
                    active: false,
                },
                s(2.5)
            ),
            vec![Action::Finish(Ending::Hung)]
        );

        // Evidence that never comes (a report directory that froze) holds the end only so long.
        let mut p = policy(OnHang::Abort);
        p.handle(Input::TerminateOrdered, s(1.0));
        assert!(p.handle(Input::Terminated, s(2.0)).is_empty());
        assert!(p.handle(GONE, s(4.0)).is_empty());
        assert_eq!(
            p.handle(GONE, s(2.0) + EVIDENCE_WAIT),
            vec![Action::Finish(Ending::Hung)]
        );
    }

    #[test]
    fn the_fast_path_looks_at_once_and_acts_only_when_the_roll_call_confirms_it() {
        let stuck = Input::Tick {
            stall: StallTier::Healthy,
            failed_rank_for: None,
            job_alive: true,
            only_stuck_left: false,
            fs_stuck: true,
            stalled_for: Duration::ZERO,
        };
        // Confirmed (the mount does not answer): the job is ended long before any threshold.
        let mut p = policy(OnHang::Abort);
        assert_eq!(
            p.handle(stuck.clone(), s(16.0)),
            vec![Action::RollCall(Trigger::FsStall)]
        );
        assert_eq!(
            p.handle(
                Input::RollCallDone {
                    trigger: Trigger::FsStall,
                    conclusive: true,
                    active: false,
                },
                s(18.0)
            ),
            vec![
                Action::Say(Notice::EndingJob { grace: s(10.0) }),
                Action::Terminate { kill_now: false }
            ]
        );
        // Not confirmed (a slow filesystem answered its probe): nothing is ended, and it is not asked again
        // until the job has made progress.
        let mut p = policy(OnHang::Abort);
        p.handle(stuck.clone(), s(16.0));
        assert!(p
            .handle(
                Input::RollCallDone {
                    trigger: Trigger::FsStall,
                    conclusive: false,
                    active: false,
                },
                s(18.0)
            )
            .is_empty());
        assert!(p.handle(stuck.clone(), s(19.0)).is_empty());
        assert_eq!(
            p.handle(tick(StallTier::Healthy), s(30.0)),
            vec![Action::Say(Notice::ProgressResumed)]
        );
        assert_eq!(
            p.handle(stuck, s(50.0)),
            vec![Action::RollCall(Trigger::FsStall)]
        );
    }
}
