//! The job's policy on the coordinator: what to do next about the whole job, decided from the membership's view
//! (the worst node's stall tier, the nodes that went silent, the nodes that left) and from finished roll calls.
//! Pure: inputs in, actions out, `now` passed in; the coordinator's loop carries the actions out in tasks that
//! report back as inputs.
//!
//! ```text
//!   Tick(worst stall) ──► Soft ─► RollCall(Soft) ──► done(conclusive) ─► Terminate ─► (every node leaves) ─► Finish
//!                         Hard ─► RollCall(Hard) ──► done(no activity)  ─► Terminate ─► ...
//!                                                    done(activity)     ─► hold: Announce(Computing), once
//!   (holding) Tick ─► every 30 s RollCall(Recheck) ─► activity: hold on; none: Terminate
//!                  ─► past --max-stall RollCall(MaxStall) ─► Terminate
//!   Tick(a node silent) ─► Announce(unreachable) + RollCall(NodeUnreachable) ─► done ─► (report only)
//! ```
//!
//! Each agent's detector is the authority on its own ranks' progress (it sees every beat, phase, output line
//! and CPU sample, and learns their step times); the job's tier is the worst node's. A node that stops answering
//! is named at once but ends nothing by itself: the job is ended when the remaining nodes stall too (their ranks
//! wait for the lost ones), and then the verdict says `node_unreachable`.

use std::collections::BTreeSet;
use std::time::Duration;

use hangwatch_diagnosis::{
    ActivityHold, ActivityRule, AfterLook, HoldCheck, HoldNotice, Ladder, Look, OnHang, Rung,
};

use crate::membership::StallTier;

/// Why the coordinator takes a roll call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobTrigger {
    /// A node is past its soft threshold: look, keep the evidence, alert; act only on conclusive evidence.
    Soft,
    /// A node is past its hard threshold (or a rank failed while its peers wait): look, then act.
    Hard,
    /// A node stopped answering: look at the others and name it.
    NodeUnreachable,
    /// A node's fast path holds (a rank stuck on its filesystem, or stopped): look at once, act only if a mount
    /// does not answer its probe.
    FsStall,
    /// Past the hard threshold the ranks were seen computing: look again, act if the work stopped.
    Recheck,
    /// A recheck saw the work stop: one more look confirms it before acting (its evidence is kept).
    ConfirmStop,
    /// Past `--max-stall` while the ranks compute: look one last time, then act.
    MaxStall,
}

impl From<Rung> for JobTrigger {
    fn from(rung: Rung) -> Self {
        match rung {
            Rung::FsStall => JobTrigger::FsStall,
            Rung::Hard => JobTrigger::Hard,
            Rung::Soft => JobTrigger::Soft,
        }
    }
}

impl JobTrigger {
    /// The words for people.
    pub fn describe(self) -> &'static str {
        match self {
            JobTrigger::Soft => Rung::Soft.describe(),
            JobTrigger::Hard => Rung::Hard.describe(),
            JobTrigger::NodeUnreachable => "a node stopped answering",
            JobTrigger::FsStall => Rung::FsStall.describe(),
            JobTrigger::Recheck => "still no progress while the ranks compute",
            JobTrigger::ConfirmStop => "the ranks stopped computing",
            JobTrigger::MaxStall => "--max-stall",
        }
    }
}

/// The job as the membership sees it at one tick.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JobView {
    /// The worst stall tier among the nodes still in the job.
    pub stall: StallTier,
    /// A node's fast path holds.
    pub fs_stuck: bool,
    /// The nodes silent for longer than the silence, by name.
    pub unreachable: BTreeSet<String>,
    /// Every node joined and then left: the job is over.
    pub all_left: bool,
    /// How long the worst node has made no progress.
    pub stalled_for: Duration,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobInput {
    Tick(JobView),
    /// A roll call finished; `conclusive`: strong enough to act on at the soft tier; `active`: the ranks were
    /// seen computing (`hangwatch_diagnosis::activity`).
    RollCallDone {
        trigger: JobTrigger,
        conclusive: bool,
        active: bool,
    },
}

/// Something to tell people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobNotice {
    Unreachable(Vec<String>),
    Reachable(Vec<String>),
    ProgressResumed,
    /// No progress, but the ranks compute: the job is not ended for it (once per stall).
    Computing,
    /// The ranks that computed without progress stopped: the hold is over.
    WorkStopped,
    /// `--max-stall` passed while the ranks computed.
    MaxStallPassed,
}

/// One thing for the loop to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobAction {
    Announce(JobNotice),
    /// Order a roll call from every agent; reports back with [`JobInput::RollCallDone`].
    RollCall(JobTrigger),
    /// Order every agent to end its ranks, with the last roll call's verdict.
    Terminate,
    /// Every node left: the coordinator's work for this job is done.
    Finish,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Watching,
    /// The termination was ordered: nothing more is decided, the coordinator waits for the nodes to leave.
    Terminating,
    Finished,
}

/// The coordinator's policy for one job.
#[derive(Debug, Clone)]
pub struct JobPolicy {
    on_hang: OnHang,
    stage: Stage,
    rollcall: Option<JobTrigger>,
    /// The looks taken since the job last made progress (the ladder shared with the agents).
    ladder: Ladder,
    hard_pending: bool,
    /// The unreachable nodes already announced.
    announced: BTreeSet<String>,
    /// Ranks computing without progress hold the hard tier back (the rule shared with the agents).
    hold: ActivityHold,
    stalled_for: Duration,
}

impl JobPolicy {
    pub fn new(on_hang: OnHang, activity: ActivityRule) -> Self {
        Self {
            hold: ActivityHold::new(activity),
            stalled_for: Duration::ZERO,
            on_hang,
            stage: Stage::Watching,
            rollcall: None,
            ladder: Ladder::default(),
            hard_pending: false,
            announced: BTreeSet::new(),
        }
    }

    /// Whether the termination was ordered.
    pub fn terminating(&self) -> bool {
        self.stage == Stage::Terminating
    }

    /// Whether the job computes without progress in this stall (and so is not ended for it yet).
    pub fn computing_without_progress(&self) -> bool {
        self.hold.announced()
    }

    /// Decides what to do about `input` at `now` (since the coordinator started supervising).
    pub fn handle(&mut self, input: JobInput, now: Duration) -> Vec<JobAction> {
        if self.stage == Stage::Finished {
            return Vec::new();
        }
        match input {
            JobInput::Tick(view) => {
                self.stalled_for = view.stalled_for;
                self.tick(view, now)
            }
            JobInput::RollCallDone {
                trigger,
                conclusive,
                active,
            } => self.rollcall_done(trigger, conclusive, active, now),
        }
    }

    fn tick(&mut self, view: JobView, now: Duration) -> Vec<JobAction> {
        if view.all_left {
            self.stage = Stage::Finished;
            return vec![JobAction::Finish];
        }
        let mut actions = Vec::new();
        let gone: Vec<String> = view
            .unreachable
            .difference(&self.announced)
            .cloned()
            .collect();
        let back: Vec<String> = self
            .announced
            .difference(&view.unreachable)
            .cloned()
            .collect();
        self.announced = view.unreachable.clone();
        if !back.is_empty() {
            actions.push(JobAction::Announce(JobNotice::Reachable(back)));
        }
        if !gone.is_empty() {
            actions.push(JobAction::Announce(JobNotice::Unreachable(gone)));
        }
        if self.stage != Stage::Watching {
            return actions;
        }
        if view.stall == StallTier::Healthy && !view.fs_stuck {
            if self.ladder.reset() {
                actions.push(JobAction::Announce(JobNotice::ProgressResumed));
            }
            self.hard_pending = false;
            self.hold.reset();
        }
        if self.rollcall.is_some() {
            if view.stall == StallTier::Hard {
                self.hard_pending = true;
            }
            return actions;
        }
        match self.ladder.climb(view.stall, view.fs_stuck) {
            Some(rung) => actions.push(self.start(JobTrigger::from(rung))),
            None if actions
                .iter()
                .any(|a| matches!(a, JobAction::Announce(JobNotice::Unreachable(_)))) =>
            {
                actions.push(self.start(JobTrigger::NodeUnreachable));
            }
            None => match self.hold.tick(self.stalled_for, now) {
                Some(HoldCheck::Recheck) => actions.push(self.start(JobTrigger::Recheck)),
                Some(HoldCheck::Confirm) => actions.push(self.start(JobTrigger::ConfirmStop)),
                Some(HoldCheck::MaxStall) => actions.push(self.start(JobTrigger::MaxStall)),
                None => {}
            },
        }
        actions
    }

    fn start(&mut self, trigger: JobTrigger) -> JobAction {
        self.rollcall = Some(trigger);
        JobAction::RollCall(trigger)
    }

    fn rollcall_done(
        &mut self,
        trigger: JobTrigger,
        conclusive: bool,
        active: bool,
        now: Duration,
    ) -> Vec<JobAction> {
        self.rollcall = None;
        if self.stage != Stage::Watching {
            return Vec::new();
        }
        let look = match trigger {
            JobTrigger::Hard => Look::Hard,
            JobTrigger::Recheck => Look::Recheck,
            JobTrigger::ConfirmStop => Look::Confirm,
            JobTrigger::MaxStall => Look::MaxStall,
            JobTrigger::Soft | JobTrigger::FsStall => Look::BelowHard {
                conclusive,
                hard_pending: self.hard_pending,
            },
            // A silent node alone ends nothing: the job may go on without hearing from it (a cut management link).
            JobTrigger::NodeUnreachable => Look::Never,
        };
        self.hard_pending = false;
        let AfterLook { act, say } = self.hold.after_look(look, active, self.stalled_for, now);
        let mut actions: Vec<JobAction> = say
            .map(|notice| {
                JobAction::Announce(match notice {
                    HoldNotice::Computing => JobNotice::Computing,
                    HoldNotice::WorkStopped => JobNotice::WorkStopped,
                    HoldNotice::MaxStallPassed => JobNotice::MaxStallPassed,
                })
            })
            .into_iter()
            .collect();
        if act && self.on_hang == OnHang::Abort {
            self.stage = Stage::Terminating;
            actions.push(JobAction::Terminate);
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(stall: StallTier, unreachable: &[&str]) -> JobInput {
        JobInput::Tick(JobView {
            stall,
            fs_stuck: false,
            unreachable: unreachable.iter().map(|s| s.to_string()).collect(),
            all_left: false,
            stalled_for: Duration::ZERO,
        })
    }

    const T: Duration = Duration::ZERO;

    fn stalled(stall: StallTier, secs: u64) -> JobInput {
        JobInput::Tick(JobView {
            stall,
            stalled_for: Duration::from_secs(secs),
            ..JobView::default()
        })
    }

    fn looked(trigger: JobTrigger, active: bool) -> JobInput {
        JobInput::RollCallDone {
            trigger,
            conclusive: false,
            active,
        }
    }

    #[test]
    fn a_job_whose_ranks_compute_is_held_until_the_work_stops() {
        let secs = Duration::from_secs;
        let mut p = JobPolicy::new(OnHang::Abort, ActivityRule::until(secs(600)));
        assert_eq!(
            p.handle(stalled(StallTier::Hard, 120), secs(120)),
            vec![JobAction::RollCall(JobTrigger::Hard)]
        );
        assert_eq!(
            p.handle(looked(JobTrigger::Hard, true), secs(121)),
            vec![JobAction::Announce(JobNotice::Computing)],
            "not ended; said once"
        );
        assert!(p.computing_without_progress());
        assert!(p
            .handle(stalled(StallTier::Hard, 130), secs(130))
            .is_empty());
        assert_eq!(
            p.handle(stalled(StallTier::Hard, 152), secs(152)),
            vec![JobAction::RollCall(JobTrigger::Recheck)]
        );
        assert!(p
            .handle(looked(JobTrigger::Recheck, true), secs(153))
            .is_empty());
        assert_eq!(
            p.handle(stalled(StallTier::Hard, 184), secs(184)),
            vec![JobAction::RollCall(JobTrigger::Recheck)]
        );
        assert!(p
            .handle(looked(JobTrigger::Recheck, false), secs(185))
            .is_empty());
        assert_eq!(
            p.handle(stalled(StallTier::Hard, 190), secs(190)),
            vec![JobAction::RollCall(JobTrigger::ConfirmStop)]
        );
        assert_eq!(
            p.handle(looked(JobTrigger::ConfirmStop, false), secs(191)),
            vec![
                JobAction::Announce(JobNotice::WorkStopped),
                JobAction::Terminate
            ]
        );
        assert!(p.terminating());
    }

    #[test]
    fn a_job_whose_ranks_compute_forever_is_ended_at_max_stall() {
        let secs = Duration::from_secs;
        let mut p = JobPolicy::new(OnHang::Abort, ActivityRule::until(secs(600)));
        p.handle(stalled(StallTier::Hard, 120), secs(120));
        p.handle(looked(JobTrigger::Hard, true), secs(121));
        assert_eq!(
            p.handle(stalled(StallTier::Hard, 600), secs(600)),
            vec![JobAction::RollCall(JobTrigger::MaxStall)]
        );
        assert_eq!(
            p.handle(looked(JobTrigger::MaxStall, true), secs(601)),
            vec![
                JobAction::Announce(JobNotice::MaxStallPassed),
                JobAction::Terminate
            ]
        );
    }

    #[test]
    fn a_soft_stall_looks_once_and_ends_the_job_on_conclusive_evidence() {
        let mut p = JobPolicy::new(
            OnHang::Abort,
            ActivityRule::until(Duration::from_secs(1800)),
        );
        assert!(p.handle(view(StallTier::Healthy, &[]), T).is_empty());
        assert_eq!(
            p.handle(view(StallTier::Soft, &[]), T),
            vec![JobAction::RollCall(JobTrigger::Soft)]
        );
        assert!(
            p.handle(view(StallTier::Soft, &[]), T).is_empty(),
            "one roll call at a time, one per tier"
        );
        assert_eq!(
            p.handle(
                JobInput::RollCallDone {
                    trigger: JobTrigger::Soft,
                    conclusive: true,
                    active: false,
                },
                T
            ),
            vec![JobAction::Terminate]
        );
        assert!(p.terminating());
        assert!(p.handle(view(StallTier::Hard, &[]), T).is_empty());
        let done = JobInput::Tick(JobView {
            all_left: true,
            stalled_for: Duration::ZERO,
            ..JobView::default()
        });
        assert_eq!(p.handle(done.clone(), T), vec![JobAction::Finish]);
        assert!(p.handle(done, T).is_empty(), "finishes once");
    }

    #[test]
    fn inconclusive_soft_evidence_waits_for_the_hard_tier_and_observe_never_ends_the_job() {
        for on_hang in [OnHang::Abort, OnHang::Observe] {
            let mut p = JobPolicy::new(on_hang, ActivityRule::until(Duration::from_secs(1800)));
            p.handle(view(StallTier::Soft, &[]), T);
            let done = |trigger| JobInput::RollCallDone {
                trigger,
                conclusive: false,
                active: false,
            };
            assert!(p.handle(done(JobTrigger::Soft), T).is_empty());
            assert_eq!(
                p.handle(view(StallTier::Hard, &[]), T),
                vec![JobAction::RollCall(JobTrigger::Hard)]
            );
            let acted = p.handle(done(JobTrigger::Hard), T);
            match on_hang {
                OnHang::Abort => assert_eq!(acted, vec![JobAction::Terminate]),
                OnHang::Observe => assert!(acted.is_empty()),
            }
        }
    }

    #[test]
    fn the_hard_tier_reached_during_the_soft_roll_call_acts_on_its_result() {
        let mut p = JobPolicy::new(
            OnHang::Abort,
            ActivityRule::until(Duration::from_secs(1800)),
        );
        p.handle(view(StallTier::Soft, &[]), T);
        assert!(p.handle(view(StallTier::Hard, &[]), T).is_empty());
        assert_eq!(
            p.handle(
                JobInput::RollCallDone {
                    trigger: JobTrigger::Soft,
                    conclusive: false,
                    active: false,
                },
                T
            ),
            vec![JobAction::Terminate]
        );
    }

    #[test]
    fn progress_resumed_rearms_the_tiers() {
        let mut p = JobPolicy::new(
            OnHang::Observe,
            ActivityRule::until(Duration::from_secs(1800)),
        );
        p.handle(view(StallTier::Soft, &[]), T);
        p.handle(
            JobInput::RollCallDone {
                trigger: JobTrigger::Soft,
                conclusive: false,
                active: false,
            },
            T,
        );
        assert_eq!(
            p.handle(view(StallTier::Healthy, &[]), T),
            vec![JobAction::Announce(JobNotice::ProgressResumed)]
        );
        assert_eq!(
            p.handle(view(StallTier::Soft, &[]), T),
            vec![JobAction::RollCall(JobTrigger::Soft)]
        );
    }

    #[test]
    fn a_silent_node_is_named_at_once_and_ends_nothing_by_itself() {
        let mut p = JobPolicy::new(
            OnHang::Abort,
            ActivityRule::until(Duration::from_secs(1800)),
        );
        assert_eq!(
            p.handle(view(StallTier::Healthy, &["n2"]), T),
            vec![
                JobAction::Announce(JobNotice::Unreachable(vec!["n2".into()])),
                JobAction::RollCall(JobTrigger::NodeUnreachable),
            ]
        );
        assert!(
            p.handle(view(StallTier::Healthy, &["n2"]), T).is_empty(),
            "named once"
        );
        assert!(p
            .handle(
                JobInput::RollCallDone {
                    trigger: JobTrigger::NodeUnreachable,
                    conclusive: true,
                    active: false,
                },
                T
            )
            .is_empty());
        assert_eq!(
            p.handle(view(StallTier::Healthy, &[]), T),
            vec![JobAction::Announce(JobNotice::Reachable(vec!["n2".into()]))]
        );
        // Gone again, and this time the others stall: the soft roll call decides.
        let actions = p.handle(view(StallTier::Soft, &["n2"]), T);
        assert_eq!(
            actions,
            vec![
                JobAction::Announce(JobNotice::Unreachable(vec!["n2".into()])),
                JobAction::RollCall(JobTrigger::Soft),
            ]
        );
        assert_eq!(
            p.handle(
                JobInput::RollCallDone {
                    trigger: JobTrigger::Soft,
                    conclusive: true,
                    active: false,
                },
                T
            ),
            vec![JobAction::Terminate]
        );
    }

    #[test]
    fn a_nodes_fast_path_gets_a_roll_call_at_once_and_ends_the_job_only_when_confirmed() {
        let stuck = JobInput::Tick(JobView {
            fs_stuck: true,
            ..JobView::default()
        });
        let done = |conclusive| JobInput::RollCallDone {
            trigger: JobTrigger::FsStall,
            conclusive,
            active: false,
        };
        let mut p = JobPolicy::new(
            OnHang::Abort,
            ActivityRule::until(Duration::from_secs(1800)),
        );
        assert_eq!(
            p.handle(stuck.clone(), T),
            vec![JobAction::RollCall(JobTrigger::FsStall)]
        );
        assert_eq!(p.handle(done(true), T), vec![JobAction::Terminate]);

        let mut p = JobPolicy::new(
            OnHang::Abort,
            ActivityRule::until(Duration::from_secs(1800)),
        );
        p.handle(stuck.clone(), T);
        assert!(p.handle(done(false), T).is_empty(), "a slow filesystem");
        assert!(p.handle(stuck, T).is_empty(), "asked once until progress");
    }
}
