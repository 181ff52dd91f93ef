//! When a verdict is strong enough to act on before the hard threshold, and what acting means. One place for both
//! the node's agent and the job's coordinator.

use hangwatch_model::{Verdict, VerdictKind};

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
