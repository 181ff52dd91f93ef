//! The job's policy on the coordinator: what to do next about the whole job, decided from the membership's view
//! (the worst node's stall tier, the nodes that went silent, the nodes that left) and from finished roll calls.
//! Pure: inputs in, actions out, `now` passed in; the coordinator's loop carries the actions out in tasks that
//! report back as inputs.
//!
//! ```text
//!   Tick(worst stall) ──► Soft ─► RollCall(Soft) ──► done(conclusive) ─► Terminate ─► (every node leaves) ─► Finish
//!                         Hard ─► RollCall(Hard) ──► done               ─► Terminate ─► ...
//!   Tick(a node silent) ─► Announce(unreachable) + RollCall(NodeUnreachable) ─► done ─► (report only)
//! ```
//!
//! Each agent's detector is the authority on its own ranks' progress (it sees every beat, phase, output line
//! and CPU sample, and learns their step times); the job's tier is the worst node's. A node that stops answering
//! is named at once but ends nothing by itself: the job is ended when the remaining nodes stall too (their ranks
//! wait for the lost ones), and then the verdict says `node_unreachable`.

use std::collections::BTreeSet;
use std::time::Duration;

use hangwatch_diagnosis::OnHang;

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
}

impl JobTrigger {
    /// The words for people.
    pub fn describe(self) -> &'static str {
        match self {
            JobTrigger::Soft => "soft threshold",
            JobTrigger::Hard => "hard threshold",
            JobTrigger::NodeUnreachable => "a node stopped answering",
            JobTrigger::FsStall => "a rank stuck on its filesystem",
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
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobInput {
    Tick(JobView),
    /// A roll call finished; `conclusive`: strong enough to act on at the soft tier.
    RollCallDone {
        trigger: JobTrigger,
        conclusive: bool,
    },
}

/// Something to tell people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobNotice {
    Unreachable(Vec<String>),
    Reachable(Vec<String>),
    ProgressResumed,
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
    soft_done: bool,
    hard_done: bool,
    fast_done: bool,
    hard_pending: bool,
    /// The unreachable nodes already announced.
    announced: BTreeSet<String>,
}

impl JobPolicy {
    pub fn new(on_hang: OnHang) -> Self {
        Self {
            on_hang,
            stage: Stage::Watching,
            rollcall: None,
            soft_done: false,
            hard_done: false,
            fast_done: false,
            hard_pending: false,
            announced: BTreeSet::new(),
        }
    }

    /// Whether the termination was ordered.
    pub fn terminating(&self) -> bool {
        self.stage == Stage::Terminating
    }

    /// Decides what to do about `input`. (`now` is not needed yet: every timing rule lives in the agents'
    /// detectors and the membership's silence.)
    pub fn handle(&mut self, input: JobInput, _now: Duration) -> Vec<JobAction> {
        if self.stage == Stage::Finished {
            return Vec::new();
        }
        match input {
            JobInput::Tick(view) => self.tick(view),
            JobInput::RollCallDone {
                trigger,
                conclusive,
            } => self.rollcall_done(trigger, conclusive),
        }
    }

    fn tick(&mut self, view: JobView) -> Vec<JobAction> {
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
            if self.soft_done || self.hard_done || self.fast_done {
                actions.push(JobAction::Announce(JobNotice::ProgressResumed));
            }
            self.soft_done = false;
            self.hard_done = false;
            self.fast_done = false;
            self.hard_pending = false;
        }
        if self.rollcall.is_some() {
            if view.stall == StallTier::Hard {
                self.hard_pending = true;
            }
            return actions;
        }
        match view.stall {
            _ if view.fs_stuck && !self.fast_done && !self.hard_done => {
                self.fast_done = true;
                actions.push(self.start(JobTrigger::FsStall));
            }
            StallTier::Hard if !self.hard_done => {
                self.hard_done = true;
                self.soft_done = true;
                actions.push(self.start(JobTrigger::Hard));
            }
            StallTier::Soft if !self.soft_done => {
                self.soft_done = true;
                actions.push(self.start(JobTrigger::Soft));
            }
            _ if actions
                .iter()
                .any(|a| matches!(a, JobAction::Announce(JobNotice::Unreachable(_)))) =>
            {
                actions.push(self.start(JobTrigger::NodeUnreachable));
            }
            _ => {}
        }
        actions
    }

    fn start(&mut self, trigger: JobTrigger) -> JobAction {
        self.rollcall = Some(trigger);
        JobAction::RollCall(trigger)
    }

    fn rollcall_done(&mut self, trigger: JobTrigger, conclusive: bool) -> Vec<JobAction> {
        self.rollcall = None;
        if self.stage != Stage::Watching {
            return Vec::new();
        }
        let act = match trigger {
            JobTrigger::Hard => true,
            JobTrigger::Soft | JobTrigger::FsStall => conclusive || self.hard_pending,
            // A silent node alone ends nothing: the job may go on without hearing from it (a cut management link).
            JobTrigger::NodeUnreachable => false,
        };
        self.hard_pending = false;
        if act && self.on_hang == OnHang::Abort {
            self.stage = Stage::Terminating;
            vec![JobAction::Terminate]
        } else {
            Vec::new()
        }
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
        })
    }

    const T: Duration = Duration::ZERO;

    #[test]
    fn a_soft_stall_looks_once_and_ends_the_job_on_conclusive_evidence() {
        let mut p = JobPolicy::new(OnHang::Abort);
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
                    conclusive: true
                },
                T
            ),
            vec![JobAction::Terminate]
        );
        assert!(p.terminating());
        assert!(p.handle(view(StallTier::Hard, &[]), T).is_empty());
        let done = JobInput::Tick(JobView {
            all_left: true,
            ..JobView::default()
        });
        assert_eq!(p.handle(done.clone(), T), vec![JobAction::Finish]);
        assert!(p.handle(done, T).is_empty(), "finishes once");
    }

    #[test]
    fn inconclusive_soft_evidence_waits_for_the_hard_tier_and_observe_never_ends_the_job() {
        for on_hang in [OnHang::Abort, OnHang::Observe] {
            let mut p = JobPolicy::new(on_hang);
            p.handle(view(StallTier::Soft, &[]), T);
            let done = |trigger| JobInput::RollCallDone {
                trigger,
                conclusive: false,
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
        let mut p = JobPolicy::new(OnHang::Abort);
        p.handle(view(StallTier::Soft, &[]), T);
        assert!(p.handle(view(StallTier::Hard, &[]), T).is_empty());
        assert_eq!(
            p.handle(
                JobInput::RollCallDone {
                    trigger: JobTrigger::Soft,
                    conclusive: false
                },
                T
            ),
            vec![JobAction::Terminate]
        );
    }

    #[test]
    fn progress_resumed_rearms_the_tiers() {
        let mut p = JobPolicy::new(OnHang::Observe);
        p.handle(view(StallTier::Soft, &[]), T);
        p.handle(
            JobInput::RollCallDone {
                trigger: JobTrigger::Soft,
                conclusive: false,
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
        let mut p = JobPolicy::new(OnHang::Abort);
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
                    conclusive: true
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
                    conclusive: true
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
        };
        let mut p = JobPolicy::new(OnHang::Abort);
        assert_eq!(
            p.handle(stuck.clone(), T),
            vec![JobAction::RollCall(JobTrigger::FsStall)]
        );
        assert_eq!(p.handle(done(true), T), vec![JobAction::Terminate]);

        let mut p = JobPolicy::new(OnHang::Abort);
        p.handle(stuck.clone(), T);
        assert!(p.handle(done(false), T).is_empty(), "a slow filesystem");
        assert!(p.handle(stuck, T).is_empty(), "asked once until progress");
    }
}
