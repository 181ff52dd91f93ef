//! What `--action requeue` does after a hung attempt: which nodes the next attempt must avoid, whether the
//! restart budget allows another attempt, and the record of this attempt that the next one reads. Pure: the
//! caller reads the Slurm job and carries out the commands (under deadlines).
//!
//! The record travels with the job in Slurm (the next attempt's `Comment`), because the next attempt may run on
//! other nodes: node-local state would not reach it, and a shared filesystem may be the one that froze.

use hangwatch_model::{Scope, Verdict, VerdictKind};

/// Marks hangwatch's part of a job's comment; text before it (the user's own comment) is kept.
pub const RECORD_MARK: &str = "hangwatch:";

/// What one hung attempt left for the next: read from the job's comment at the next start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    /// The attempt that hung, from 1 (Slurm's `SLURM_RESTART_COUNT` + 1).
    pub attempt: u32,
    pub kind: VerdictKind,
    /// The furthest step any rank of this node reached (from `hangwatch.beat(step)`), if ranks report steps.
    pub last_step: Option<u64>,
    /// Hung attempts in a row that got no step beyond the one before them (this one included).
    pub without_progress: u32,
    /// The nodes kept out of the next attempt (all of them so far, not only this attempt's).
    pub excluded: Vec<String>,
    /// The rank, node and call that held the job up, in a few words.
    pub cause: String,
    /// What the fault belonged to (`None`: not decided).
    pub scope: Option<Scope>,
    /// Mounts that blocked a rank and did not answer their probe: the next attempt waits until they answer
    /// before it starts the job, so that no attempt is spent into a frozen filesystem.
    pub mounts: Vec<String>,
    /// While the next attempt waits for those mounts: what it waits for, for people reading the job's comment
    /// (`squeue -o %k`); written, never read back.
    pub waiting: Option<String>,
}

/// A mount path in the record: spaces, commas and `%` encoded, since fields are space-separated and lists
/// comma-separated.
fn encode_path(path: &str) -> String {
    path.replace('%', "%25")
        .replace(' ', "%20")
        .replace(',', "%2C")
}

fn decode_path(text: &str) -> String {
    text.replace("%2C", ",")
        .replace("%20", " ")
        .replace("%25", "%")
}

impl AttemptRecord {
    /// The comment with this record in place of any earlier one (the user's text before it is kept).
    pub fn into_comment(&self, old_comment: &str) -> String {
        let user = old_comment
            .find(RECORD_MARK)
            .map_or(old_comment, |at| &old_comment[..at])
            .trim_end();
        // The cause is the last field and runs to the end: it may hold spaces, not line breaks.
        let cause: String = self
            .cause
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(160)
            .collect();
        // Written only when known: a record without them reads as before.
        let mut extra = String::new();
        if let Some(scope) = self.scope {
            extra.push_str(&format!(" scope={}", scope.as_str()));
        }
        if !self.mounts.is_empty() {
            let mounts: Vec<String> = self.mounts.iter().map(|m| encode_path(m)).collect();
            extra.push_str(&format!(" mounts={}", mounts.join(",")));
        }
        if let Some(w) = &self.waiting {
            extra.push_str(&format!(" waiting={}", encode_path(w)));
        }
        let record = format!(
            "{RECORD_MARK} attempt={} kind={} step={} without_progress={} excluded={}{extra} cause={}",
            self.attempt,
            self.kind.as_str(),
            self.last_step.map_or("-".to_string(), |s| s.to_string()),
            self.without_progress,
            if self.excluded.is_empty() {
                "-".to_string()
            } else {
                self.excluded.join(",")
            },
            if cause.trim().is_empty() {
                "-".into()
            } else {
                cause
            },
        );
        if user.is_empty() {
            record
        } else {
            format!("{user} {record}")
        }
    }

    /// The record in a job's comment, if hangwatch left one; `None` for a comment without one or one that does
    /// not parse (a record from another version is ignored rather than trusted).
    pub fn from_comment(comment: &str) -> Option<Self> {
        let at = comment.find(RECORD_MARK)?;
        let mut record = AttemptRecord {
            attempt: 0,
            kind: VerdictKind::Unknown,
            last_step: None,
            without_progress: 0,
            excluded: Vec::new(),
            cause: String::new(),
            scope: None,
            mounts: Vec::new(),
            waiting: None,
        };
        let mut seen_attempt = false;
        let text = &comment[at + RECORD_MARK.len()..];
        let (fields, cause) = match text.find(" cause=") {
            Some(c) => (&text[..c], text[c + " cause=".len()..].trim()),
            None => (text, "-"),
        };
        if cause != "-" {
            record.cause = cause.to_string();
        }
        for field in fields.split_whitespace() {
            let (key, value) = field.split_once('=')?;
            match key {
                "attempt" => {
                    record.attempt = value.parse().ok()?;
                    seen_attempt = true;
                }
                "kind" => record.kind = VerdictKind::from_name(value)?,
                "step" => {
                    record.last_step = if value == "-" {
                        None
                    } else {
                        Some(value.parse().ok()?)
                    }
                }
                "without_progress" => record.without_progress = value.parse().ok()?,
                "excluded" if value != "-" => {
                    record.excluded = value.split(',').map(str::to_string).collect();
                }
                "excluded" => {}
                "scope" => {
                    record.scope = [Scope::Filesystem, Scope::Node, Scope::Job]
                        .into_iter()
                        .find(|s| s.as_str() == value)
                }
                "mounts" if value != "-" => {
                    record.mounts = value.split(',').map(decode_path).collect();
                }
                "mounts" => {}
                // A field from a newer hangwatch: not ours to judge.
                _ => {}
            }
        }
        seen_attempt.then_some(record)
    }

    /// One line for the next attempt's start: what happened to this one.
    pub fn summary(&self) -> String {
        let excluded = if self.excluded.is_empty() {
            String::new()
        } else {
            format!("; {} excluded", self.excluded.join(", "))
        };
        let cause = if self.cause.is_empty() {
            String::new()
        } else {
            format!(": {}", self.cause)
        };
        format!(
            "previous attempt ({}) ended by hangwatch ({}){cause}{excluded}",
            self.attempt,
            self.kind.as_str()
        )
    }
}

/// What is known when a hung attempt has been ended.
#[derive(Debug, Clone)]
pub struct RequeueInput<'a> {
    pub verdict: &'a Verdict,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// The record the previous attempt left, if any.
    pub previous: Option<AttemptRecord>,
    /// The furthest step this attempt's ranks reported.
    pub last_step: Option<u64>,
    /// Hung attempts in a row without progress after which hangwatch stops requeueing.
    pub max_requeues: u32,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequeueDecision {
    /// Keep `record.excluded` out of the job and requeue it.
    Requeue {
        record: AttemptRecord,
        /// Nodes this attempt found bad (a subset of `record.excluded`).
        newly_excluded: Vec<String>,
    },
    /// The budget is spent: the job has hung `record.without_progress` times in a row without progress.
    GiveUp { record: AttemptRecord },
}

/// Nodes that cannot run the next attempt, and only those:
/// - a node that stopped answering;
/// - a node whose rank is still in D after SIGKILL (the termination's `unkillable` action), or whose culprit the
///   verdict found unkillable (in D in a wait that takes no signal: on another node, this node does not see its
///   termination): it holds the node until its call returns;
/// - with the fault scoped to the node (a mount only it has that does not answer), the culprit's node.
///
/// A node whose ranks ended cleanly is not excluded, whatever the verdict blamed: under a storage incident it is
/// as good as any other once the storage answers, and a Python deadlock or a busy rank would hang anywhere.
pub fn bad_nodes(verdict: &Verdict) -> Vec<String> {
    let unkillable: Vec<u32> = verdict
        .actions
        .iter()
        .filter(|a| a.action == "unkillable")
        .flat_map(|a| a.ranks.iter().copied())
        .collect();
    let held = verdict
        .culprits
        .iter()
        .filter(|c| {
            c.rank.is_some_and(|r| unkillable.contains(&r))
                || (verdict.kind == VerdictKind::BlockedInKernel
                    && c.killable == Some(false)
                    && c.state == "D")
        })
        .filter_map(|c| c.node.clone());
    let mut nodes: Vec<String> = match (verdict.kind, verdict.scope) {
        (VerdictKind::NodeUnreachable, _) => verdict
            .nodes_not_seen
            .iter()
            .cloned()
            .chain(verdict.culprits.iter().filter_map(|c| c.node.clone()))
            .collect(),
        (VerdictKind::BlockedInKernel, Some(Scope::Node)) => verdict
            .culprits
            .iter()
            .filter_map(|c| c.node.clone())
            .collect(),
        _ => held.collect(),
    };
    nodes.sort();
    nodes.dedup();
    nodes
}

/// Mounts that blocked a rank and did not answer their probe: what the next attempt waits for, as paths of
/// hangwatch's own namespace (the next attempt's containers do not exist yet): a container's mount by where the
/// node has that directory; one the node does not mount at all is left to the next container.
pub fn blamed_mounts(verdict: &Verdict) -> Vec<String> {
    let mut mounts: Vec<String> = verdict
        .culprits
        .iter()
        .filter(|c| {
            c.filesystem_key().is_some_and(|key| {
                verdict
                    .filesystems
                    .iter()
                    .any(|f| f.filesystem_key() == key && f.responsive == Some(false))
            })
        })
        .filter_map(|c| match &c.filesystem {
            Some(id) if id.other_namespace => id.host_path.clone(),
            _ => c.mount.clone(),
        })
        .collect();
    mounts.sort();
    mounts.dedup();
    mounts
}

/// Decides whether to requeue, and with which nodes kept out.
pub fn decide_requeue(input: &RequeueInput<'_>) -> RequeueDecision {
    let previous = input.previous.as_ref();
    // Steps unknown on either side: a hang counts as one without progress (the budget must bind even then).
    let progressed = matches!(
        (input.last_step, previous.and_then(|p| p.last_step)),
        (Some(now), Some(before)) if now > before
    );
    // A storage incident is not the job's: it spends no attempt of the budget.
    let storage = input.verdict.scope == Some(Scope::Filesystem);
    let without_progress = match previous {
        Some(p) if storage => p.without_progress,
        Some(p) if !progressed => p.without_progress + 1,
        None if storage => 0,
        // The first hang, or the first since progress.
        _ => 1,
    };
    let newly: Vec<String> = bad_nodes(input.verdict);
    let mut excluded: Vec<String> = previous.map(|p| p.excluded.clone()).unwrap_or_default();
    let newly_excluded: Vec<String> = newly
        .into_iter()
        .filter(|n| !excluded.contains(n))
        .collect();
    excluded.extend(newly_excluded.iter().cloned());
    let record = AttemptRecord {
        attempt: input.attempt,
        kind: input.verdict.kind,
        last_step: input.last_step.max(previous.and_then(|p| p.last_step)),
        without_progress,
        excluded,
        cause: cause_of(input.verdict),
        scope: input.verdict.scope,
        mounts: blamed_mounts(input.verdict),
        waiting: None,
    };
    if without_progress > input.max_requeues {
        RequeueDecision::GiveUp { record }
    } else {
        RequeueDecision::Requeue {
            record,
            newly_excluded,
        }
    }
}

/// "rank 0 on n2 in write() on /gpfs" from the verdict's first culprit, or its summary when it names none.
fn cause_of(verdict: &Verdict) -> String {
    let Some(c) = verdict.culprits.first() else {
        return verdict.summary.clone();
    };
    let mut text = match c.rank {
        Some(rank) => format!("rank {rank}"),
        None => format!("pid {}", c.pid),
    };
    if let Some(node) = &c.node {
        text.push_str(&format!(" on {node}"));
    }
    if let Some(call) = &c.syscall {
        text.push_str(&format!(" in {call}()"));
    }
    if let Some(mount) = &c.mount {
        text.push_str(&format!(" on {mount}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::{ActionRecord, Culprit, FilesystemStatus, RankPlace};

    fn verdict(kind: VerdictKind, node: &str) -> Verdict {
        let mut v = Verdict::unknown("test");
        v.kind = kind;
        v.culprits.push(Culprit {
            killable: Some(false),
            ..Culprit::at(RankPlace {
                rank: Some(0),
                node: Some(node.into()),
                pid: 42,
                state: "D".into(),
                syscall: Some("write".into()),
                mount: Some("/gpfs".into()),
                ..Default::default()
            })
        });
        v
    }

    /// `verdict` after a termination that left rank 0 in D (SIGKILL did not end it).
    fn unkillable(kind: VerdictKind, node: &str) -> Verdict {
        let mut v = verdict(kind, node);
        v.actions.push(ActionRecord {
            action: "unkillable".into(),
            ranks: vec![0],
            ok: false,
            detail: None,
            outcomes: Vec::new(),
        });
        v
    }

    fn input(
        v: &Verdict,
        restart: u32,
        previous: Option<AttemptRecord>,
        step: Option<u64>,
    ) -> RequeueInput<'_> {
        RequeueInput {
            verdict: v,
            attempt: restart + 1,
            previous,
            last_step: step,
            max_requeues: 3,
        }
    }

    #[test]
    fn a_first_hang_in_the_kernel_excludes_its_node_and_requeues() {
        let v = unkillable(VerdictKind::BlockedInKernel, "n2");
        match decide_requeue(&input(&v, 0, None, Some(120))) {
            RequeueDecision::Requeue {
                record,
                newly_excluded,
            } => {
                assert_eq!(newly_excluded, vec!["n2"]);
                assert_eq!(record.excluded, vec!["n2"]);
                assert_eq!(record.attempt, 1);
                assert_eq!(record.without_progress, 1);
                assert_eq!(record.cause, "rank 0 on n2 in write() on /gpfs");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_next_attempt_waits_for_a_containers_mount_by_the_nodes_path() {
        let mut v = verdict(VerdictKind::BlockedInKernel, "n2");
        let id = hangwatch_model::FilesystemId {
            key: "/srv/shared".into(),
            device: "7:3".into(),
            fstype: "ext4".into(),
            source: "/dev/loop3".into(),
            root: "/run7".into(),
            host_mount: Some("/srv/shared".into()),
            host_path: Some("/srv/shared/run7".into()),
            other_namespace: true,
        };
        v.culprits[0].at.mount = Some("/data".into());
        v.culprits[0].at.filesystem = Some(id.clone());
        v.filesystems.push(FilesystemStatus {
            // another rank's container called it /scratch: the same filesystem
            mount: "/scratch".into(),
            node: Some("n2".into()),
            fstype: Some("ext4".into()),
            responsive: Some(false),
            detail: None,
            filesystem: Some(id.clone()),
        });
        assert_eq!(blamed_mounts(&v), vec!["/srv/shared/run7"]);
        // a FUSE mount only the container had: nothing on the node to wait for
        v.culprits[0].at.filesystem = Some(hangwatch_model::FilesystemId {
            key: "fuse dev 0:77".into(),
            host_mount: None,
            host_path: None,
            ..id.clone()
        });
        v.filesystems[0].filesystem = v.culprits[0].at.filesystem.clone();
        assert!(blamed_mounts(&v).is_empty());
    }

    #[test]
    fn a_storage_incident_excludes_only_nodes_that_cannot_run_and_spends_no_budget() {
        let mut v = verdict(VerdictKind::BlockedInKernel, "n2");
        // A FUSE or NFS wait takes SIGKILL: the rank ended cleanly.
        v.culprits[0].killable = Some(true);
        v.culprits[0].at.state = "S".into();
        v.scope = Some(Scope::Filesystem);
        v.filesystems.push(FilesystemStatus {
            filesystem: None,
            mount: "/gpfs".into(),
            node: Some("n2".into()),
            fstype: Some("gpfs".into()),
            responsive: Some(false),
            detail: None,
        });
        let previous = AttemptRecord {
            attempt: 1,
            kind: VerdictKind::BlockedInKernel,
            last_step: Some(100),
            without_progress: 2,
            excluded: Vec::new(),
            cause: String::new(),
            scope: Some(Scope::Filesystem),
            mounts: vec!["/gpfs".into()],
            waiting: None,
        };
        match decide_requeue(&input(&v, 1, Some(previous.clone()), Some(100))) {
            RequeueDecision::Requeue {
                record,
                newly_excluded,
            } => {
                assert!(
                    newly_excluded.is_empty(),
                    "its rank ended cleanly: n2 runs the next one"
                );
                assert_eq!(
                    record.without_progress, 2,
                    "the storage's hang spends no attempt"
                );
                assert_eq!(
                    record.mounts,
                    vec!["/gpfs"],
                    "the next attempt waits for it"
                );
                assert_eq!(record.scope, Some(Scope::Filesystem));
            }
            other => panic!("{other:?}"),
        }
        v.actions.push(ActionRecord {
            action: "unkillable".into(),
            ranks: vec![0],
            ok: false,
            detail: None,
            outcomes: Vec::new(),
        });
        match decide_requeue(&input(&v, 1, Some(previous), Some(100))) {
            RequeueDecision::Requeue { newly_excluded, .. } => {
                assert_eq!(
                    newly_excluded,
                    vec!["n2"],
                    "a rank still in D holds its node"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_node_scoped_mount_excludes_the_culprits_node_a_clean_end_otherwise_does_not() {
        let mut v = verdict(VerdictKind::BlockedInKernel, "n4");
        v.culprits[0].killable = Some(true);
        assert!(bad_nodes(&v).is_empty(), "ended cleanly, scope unknown");
        v.culprits[0].killable = Some(false);
        assert_eq!(
            bad_nodes(&v),
            vec!["n4"],
            "a rank in D that takes no signal holds its node"
        );
        v.culprits[0].killable = Some(true);
        assert!(bad_nodes(&v).is_empty(), "ended cleanly, scope unknown");
        v.scope = Some(Scope::Node);
        assert_eq!(bad_nodes(&v), vec!["n4"]);
    }

    #[test]
    fn a_python_deadlock_requeues_without_excluding_anything() {
        let v = verdict(VerdictKind::Diverged, "n2");
        match decide_requeue(&input(&v, 0, None, Some(5))) {
            RequeueDecision::Requeue {
                record,
                newly_excluded,
            } => {
                assert!(newly_excluded.is_empty());
                assert!(record.excluded.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hangs_without_progress_spend_the_budget_and_progress_refills_it() {
        let v = unkillable(VerdictKind::BlockedInKernel, "n3");
        let mut previous = None;
        let mut outcomes = Vec::new();
        for restart in 0..4 {
            let decision = decide_requeue(&input(&v, restart, previous.clone(), Some(100)));
            let record = match &decision {
                RequeueDecision::Requeue { record, .. } | RequeueDecision::GiveUp { record } => {
                    record.clone()
                }
            };
            outcomes.push(matches!(decision, RequeueDecision::Requeue { .. }));
            previous = Some(record);
        }
        assert_eq!(
            outcomes,
            vec![true, true, true, false],
            "3 requeues, then give up"
        );

        // A later step than the last hang's: the count starts again.
        let prev = AttemptRecord {
            without_progress: 3,
            ..previous.clone().unwrap()
        };
        match decide_requeue(&input(&v, 4, Some(prev), Some(150))) {
            RequeueDecision::Requeue { record, .. } => assert_eq!(record.without_progress, 1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_steps_count_as_no_progress() {
        let v = unkillable(VerdictKind::BlockedInKernel, "n1");
        let prev = AttemptRecord {
            attempt: 1,
            kind: VerdictKind::BlockedInKernel,
            last_step: None,
            without_progress: 3,
            excluded: vec!["n2".into()],
            cause: String::new(),
            scope: None,
            mounts: Vec::new(),
            waiting: None,
        };
        match decide_requeue(&input(&v, 1, Some(prev), None)) {
            RequeueDecision::GiveUp { record } => {
                assert_eq!(record.without_progress, 4);
                assert_eq!(record.excluded, vec!["n2", "n1"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_record_round_trips_through_a_comment_and_keeps_the_users_text() {
        let record = AttemptRecord {
            attempt: 2,
            kind: VerdictKind::BlockedInKernel,
            last_step: Some(1234),
            without_progress: 1,
            excluded: vec!["n2".into(), "n5".into()],
            cause: "rank 0 on n2 in write() on /gpfs".into(),
            scope: Some(Scope::Filesystem),
            mounts: vec!["/gpfs".into(), "/shared scratch,b".into()],
            waiting: None,
        };
        let comment = record.into_comment("my experiment hangwatch: attempt=1 kind=busy step=- without_progress=1 excluded=- cause=-");
        assert!(
            comment.starts_with("my experiment hangwatch: attempt=2 "),
            "{comment}"
        );
        assert_eq!(comment.matches(RECORD_MARK).count(), 1);
        assert_eq!(AttemptRecord::from_comment(&comment), Some(record.clone()));
        assert_eq!(
            record.summary(),
            "previous attempt (2) ended by hangwatch (blocked_in_kernel): rank 0 on n2 in write() on /gpfs; n2, n5 excluded"
        );
    }

    #[test]
    fn comments_without_a_record_or_with_a_broken_one_are_ignored() {
        assert_eq!(AttemptRecord::from_comment(""), None);
        assert_eq!(AttemptRecord::from_comment("(null)"), None);
        assert_eq!(AttemptRecord::from_comment("hangwatch: attempt=x"), None);
        assert_eq!(AttemptRecord::from_comment("hangwatch: kind=busy"), None);
        assert_eq!(
            AttemptRecord::from_comment("hangwatch: attempt=1 kind=frobnicated"),
            None
        );
    }
}
