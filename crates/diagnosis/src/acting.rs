//! The stall ladder and when a verdict is strong enough to act on: which look a stall earns next, and whether the
//! look's verdict lets the policy end the job. One place for both the node's agent and the job's coordinator; their
//! policies add only their own inputs (signals and a failed rank; a silent node).

use hangwatch_model::{StallTier, Verdict, VerdictKind};

/// A look that a stall earns, in the order the ladder offers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rung {
    /// The fast path: a rank sat in a filesystem wait (or stopped) with its I/O still while nothing progressed. Acts
    /// only if the look confirms it ([`is_confirmed_stuck`]).
    FsStall,
    /// Past the hard threshold: look, then act.
    Hard,
    /// Past the soft threshold: look, keep the evidence, alert; act only on conclusive evidence.
    Soft,
}

impl Rung {
    /// The words for people.
    pub fn describe(self) -> &'static str {
        match self {
            Rung::FsStall => "a rank stopped or in a filesystem wait, its I/O still",
            Rung::Hard => "hard threshold",
            Rung::Soft => "soft threshold",
        }
    }
}

/// Which rungs were climbed since progress last moved: each is climbed once, the hard tier spends the soft one,
/// and the fast path is not offered once the hard tier was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ladder {
    soft: bool,
    hard: bool,
    fast: bool,
}

impl Ladder {
    /// Progress moved: every rung may be climbed again. True when one had been (worth saying that it resumed).
    pub fn reset(&mut self) -> bool {
        let climbed = *self != Self::default();
        *self = Self::default();
        climbed
    }

    /// The next look this stall earns, marked as taken; `None` when none is due.
    pub fn climb(&mut self, stall: StallTier, fs_stuck: bool) -> Option<Rung> {
        if fs_stuck && !self.fast && !self.hard {
            self.fast = true;
            return Some(Rung::FsStall);
        }
        match stall {
            StallTier::Hard if !self.hard => {
                self.spend_tiers();
                Some(Rung::Hard)
            }
            StallTier::Soft if !self.soft => {
                self.soft = true;
                Some(Rung::Soft)
            }
            _ => None,
        }
    }

    /// A look that acts like the hard tier's was taken for another reason (a rank failed): the tiers are spent.
    pub fn spend_tiers(&mut self) {
        self.hard = true;
        self.soft = true;
    }
}

/// Whether a look's verdict lets the policy act: after the fast path only a confirmed stuck filesystem (or a
/// stopped rank) does; after any other look, `conclusive` says (the node's [`is_conclusive`] or the job's
/// [`is_conclusive_for_job`]).
pub fn acts_on(verdict: &Verdict, after_fast_path: bool, conclusive: fn(&Verdict) -> bool) -> bool {
    if after_fast_path {
        is_confirmed_stuck(verdict)
    } else {
        conclusive(verdict)
    }
}

/// What to do about a hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnHang {
    /// Roll call, evidence, alert; nothing is killed.
    Observe,
    /// ... and end the job (TERM, grace, KILL), exit 75.
    Abort,
}

/// Evidence strong enough to act on at the soft threshold: a rank blocked in the kernel on a filesystem that
/// does not answer (or in D), a stopped rank, or a rank that died. A rank that exited with 0 did not die: it
/// finished (its peers may still save a last checkpoint, for minutes); that waits for the hard threshold, like
/// anything less.
pub fn is_conclusive(verdict: &Verdict) -> bool {
    match verdict.kind {
        VerdictKind::Stopped => true,
        VerdictKind::Exited => verdict.culprits.iter().any(|c| c.exit_code != Some(0)),
        VerdictKind::BlockedInKernel => {
            verdict
                .filesystems
                .iter()
                .any(|f| f.responsive == Some(false))
                || verdict.culprits.iter().any(|c| c.state == "D")
        }
        _ => false,
    }
}

/// Evidence for the fast path (`--fs-stall`), which acts before any threshold: only a stopped rank, or a rank
/// blocked on a filesystem whose write probe did not return. A rank in D on a filesystem that answers its probe
/// is a slow filesystem (a big checkpoint to a loaded GPFS), not a stuck one: it waits for the thresholds.
pub fn is_confirmed_stuck(verdict: &Verdict) -> bool {
    match verdict.kind {
        VerdictKind::Stopped => true,
        VerdictKind::BlockedInKernel => verdict
            .filesystems
            .iter()
            .any(|f| f.responsive == Some(false)),
        _ => false,
    }
}

/// The same, for a whole job that stopped making progress: a node that stopped answering is as conclusive as a
/// rank that died, since the ranks of the other nodes wait for its ranks forever.
pub fn is_conclusive_for_job(verdict: &Verdict) -> bool {
    is_conclusive(verdict) || verdict.kind == VerdictKind::NodeUnreachable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladder_offers_each_look_once_until_progress_moves() {
        let mut l = Ladder::default();
        assert_eq!(l.climb(StallTier::Healthy, false), None);
        assert_eq!(l.climb(StallTier::Soft, false), Some(Rung::Soft));
        assert_eq!(l.climb(StallTier::Soft, false), None, "once");
        assert_eq!(l.climb(StallTier::Soft, true), Some(Rung::FsStall));
        assert_eq!(l.climb(StallTier::Hard, true), Some(Rung::Hard));
        assert_eq!(l.climb(StallTier::Hard, true), None);
        assert!(l.reset(), "something had been climbed");
        assert!(!l.reset());
        // The hard tier spends the soft one and the fast path.
        assert_eq!(l.climb(StallTier::Hard, false), Some(Rung::Hard));
        assert_eq!(l.climb(StallTier::Soft, true), None);
        // A failed rank spends the tiers but leaves nothing else.
        let mut l = Ladder::default();
        l.spend_tiers();
        assert_eq!(l.climb(StallTier::Hard, false), None);
        assert_eq!(l.climb(StallTier::Soft, false), None);
    }
    use hangwatch_model::{Culprit, FilesystemStatus, RankPlace};

    #[test]
    fn only_strong_evidence_is_conclusive() {
        let mut v = Verdict::unknown("nothing seen");
        assert!(!is_conclusive(&v));
        v.kind = VerdictKind::CollectiveHang;
        assert!(!is_conclusive(&v), "everyone waiting is not a culprit");
        v.kind = VerdictKind::BlockedInKernel;
        assert!(
            !is_conclusive(&v),
            "S in a call, filesystem not known to be stuck"
        );
        v.filesystems.push(FilesystemStatus {
            filesystem: None,
            mount: "/shared".into(),
            node: None,
            fstype: Some("ext4".into()),
            responsive: Some(false),
            detail: None,
        });
        assert!(is_conclusive(&v));
        let mut d = Verdict::unknown("x");
        d.kind = VerdictKind::BlockedInKernel;
        d.culprits.push(Culprit {
            at: RankPlace {
                state: "D".into(),
                ..RankPlace::default()
            },
            tid: None,
            killable: Some(false),
            kernel_stack: None,
            reason: None,
            worker: None,
            exit_code: None,
            death: None,
            thread_name: None,
            page_fault: None,
            lock_wait: None,
            threads: Vec::new(),
            deadlock: None,
            waits_on_peer: None,
        });
        assert!(is_conclusive(&d));
        assert!(
            !is_confirmed_stuck(&d),
            "in D on a filesystem not known to be stuck: maybe just slow"
        );
        assert!(is_confirmed_stuck(&v), "its filesystem does not answer");
        let mut gone = Verdict::unknown("x");
        gone.kind = VerdictKind::NodeUnreachable;
        assert!(!is_conclusive(&gone));
        assert!(is_conclusive_for_job(&gone));
    }

    #[test]
    fn a_rank_that_finished_cleanly_is_not_conclusive_one_that_failed_is() {
        let exited = |code: Option<i32>| {
            let mut v = Verdict::unknown("x");
            v.kind = VerdictKind::Exited;
            v.culprits.push(Culprit {
                at: RankPlace::default(),
                tid: None,
                killable: None,
                kernel_stack: None,
                reason: None,
                worker: None,
                exit_code: code,
                death: None,
                thread_name: None,
                page_fault: None,
                lock_wait: None,
                threads: Vec::new(),
                deadlock: None,
                waits_on_peer: None,
            });
            v
        };
        assert!(
            !is_conclusive(&exited(Some(0))),
            "a peer saving its last checkpoint after the others finished is not a hang"
        );
        assert!(is_conclusive(&exited(Some(1))));
        assert!(is_conclusive(&exited(Some(137))), "killed by SIGKILL");
        assert!(
            is_conclusive(&exited(None)),
            "an exit seen without its status"
        );
    }
}
