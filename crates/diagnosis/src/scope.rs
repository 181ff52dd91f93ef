//! What a fault belongs to — the filesystem, the node, or the program — decided from the evidence a verdict holds,
//! and said with that evidence. The scope decides what may be acted on: a storage incident burns no node (requeue
//! excludes and drains only nodes that cannot run the next attempt) and waits for the storage; see
//! docs/storage-incidents.md.
//!
//! The rule, in one place:
//! - a rank blocked on a mount, and ranks on **two or more nodes** blocked on the same mount → filesystem;
//! - the mount **does not answer from a node with no stuck rank** (the coordinator has every node probe it) →
//!   filesystem;
//! - **other jobs or nodes** were blocked on the same mount in the last minutes (the fleet database) → filesystem;
//! - the mount **answers from the other nodes** but not from the culprit's → node (a mount only it has, or its
//!   client of the filesystem is broken);
//! - one node alone, and no fleet memory: **cannot tell** — no scope, and the verdict says so rather than guess;
//! - a node that stopped answering → node; a program fault (deadlock, busy, a rank that died, a stopped rank) →
//!   job.

use std::collections::BTreeSet;

use hangwatch_model::{FilesystemStatus, Scope, Verdict, VerdictKind};

/// The scope of `verdict` and the facts it rests on. `fleet_sightings`: other jobs or nodes blocked on the
/// culprit's mount within the incident window, in words ("job 1240 on n7, 3 min ago"), from the fleet database.
pub fn scope_of(verdict: &Verdict, fleet_sightings: &[String]) -> (Option<Scope>, Vec<String>) {
    match verdict.kind {
        VerdictKind::BlockedInKernel => blocked_scope(verdict, fleet_sightings),
        VerdictKind::NodeUnreachable => {
            let nodes = verdict.nodes_not_seen.join(", ");
            (
                Some(Scope::Node),
                vec![format!(
                    "{nodes} stopped answering: the fault is that node's"
                )],
            )
        }
        VerdictKind::Stopped
        | VerdictKind::Exited
        | VerdictKind::Busy
        | VerdictKind::Diverged
        | VerdictKind::CollectiveHang => (
            Some(Scope::Job),
            vec![format!(
                "{}: the program's own state, not its node's or its storage's",
                verdict.kind.words()
            )],
        ),
        VerdictKind::Unknown => (None, Vec::new()),
    }
}

fn blocked_scope(verdict: &Verdict, fleet_sightings: &[String]) -> (Option<Scope>, Vec<String>) {
    // Filesystems are compared by identity: ranks in containers may call one filesystem by different paths.
    let Some((key, mount)) = verdict
        .culprits
        .iter()
        .filter_map(|c| Some((c.filesystem_key()?, c.mount.as_deref()?)))
        .min()
    else {
        return (
            None,
            vec!["the blocked call names no mount: cannot tell the node from the storage".into()],
        );
    };
    let stuck_nodes: BTreeSet<&str> = verdict
        .culprits
        .iter()
        .filter(|c| c.filesystem_key() == Some(key))
        .filter_map(|c| c.node.as_deref())
        .collect();
    let elsewhere = |responsive: bool| -> Vec<&str> {
        let nodes: BTreeSet<&str> = verdict
            .filesystems
            .iter()
            .filter(|f| f.filesystem_key() == key && f.responsive == Some(responsive))
            .filter_map(|f| f.node.as_deref())
            .filter(|n| !stuck_nodes.contains(n))
            .collect();
        nodes.into_iter().collect()
    };
    let list = |nodes: &[&str]| nodes.join(", ");
    let mut evidence = Vec::new();
    if stuck_nodes.len() >= 2 {
        let nodes: Vec<&str> = stuck_nodes.iter().copied().collect();
        evidence.push(format!("ranks on {} are blocked on {mount}", list(&nodes)));
    }
    let silent = elsewhere(false);
    if !silent.is_empty() {
        evidence.push(format!(
            "{mount} does not answer from {}, where no rank is stuck",
            list(&silent)
        ));
    }
    if !fleet_sightings.is_empty() {
        evidence.push(format!(
            "other jobs or nodes were blocked on {mount} in the last minutes: {}",
            fleet_sightings.join("; ")
        ));
    }
    if !evidence.is_empty() {
        return (Some(Scope::Filesystem), evidence);
    }
    let answering = elsewhere(true);
    if !answering.is_empty() {
        let culprit_nodes: Vec<&str> = stuck_nodes.iter().copied().collect();
        return (
            Some(Scope::Node),
            vec![format!(
                "{mount} answers from {} but not from {}: that node's mount or its filesystem client",
                list(&answering),
                if culprit_nodes.is_empty() {
                    "the culprit's node".to_string()
                } else {
                    list(&culprit_nodes)
                }
            )],
        );
    }
    (
        None,
        vec![format!(
            "one node alone, and no other node or job known to be blocked on {mount}: cannot tell the node from the \
             storage (a fleet database, --history-url, would)"
        )],
    )
}

/// The mounts that block a rank (kind `blocked_in_kernel`) and that some of `answered` did not probe: the
/// coordinator asks every node to probe them, so that the scope rests on what each node sees.
pub fn mounts_to_probe_everywhere(verdict: &Verdict, answered: &[String]) -> Vec<String> {
    if verdict.kind != VerdictKind::BlockedInKernel {
        return Vec::new();
    }
    let mounts: BTreeSet<(&str, &str)> = verdict
        .culprits
        .iter()
        .filter_map(|c| Some((c.mount.as_deref()?, c.filesystem_key()?)))
        .collect();
    let mut out: Vec<String> = mounts
        .into_iter()
        .filter(|(_, key)| {
            answered.iter().any(|node| {
                !verdict
                    .filesystems
                    .iter()
                    .any(|f| f.filesystem_key() == *key && f.node.as_deref() == Some(node.as_str()))
            })
        })
        .map(|(mount, _)| mount.to_string())
        .collect();
    out.dedup();
    out
}

/// Sets the verdict's scope and its evidence; a storage incident leads the summary and the recommendations (what
/// to do addresses the storage, not the nodes). Safe to call again with more facts.
pub fn apply_scope(verdict: &mut Verdict, fleet_sightings: &[String]) {
    let (scope, evidence) = scope_of(verdict, fleet_sightings);
    verdict.scope = scope;
    verdict.scope_evidence = evidence;
    if scope != Some(Scope::Filesystem) {
        return;
    }
    let Some(culprit) = verdict.culprits.iter().find(|c| c.mount.is_some()) else {
        return;
    };
    let mount = culprit.mount.clone().unwrap_or_default();
    let key = culprit.filesystem_key().unwrap_or(&mount).to_string();
    let fstype = culprit.fstype.clone().or_else(|| {
        verdict
            .filesystems
            .iter()
            .find(|f| f.filesystem_key() == key)
            .and_then(|f| f.fstype.clone())
    });
    let silent: BTreeSet<&str> = verdict
        .filesystems
        .iter()
        .filter(|f| f.filesystem_key() == key && f.responsive == Some(false))
        .filter_map(|f| f.node.as_deref())
        .collect();
    let named = FilesystemStatus {
        mount: mount.clone(),
        fstype,
        filesystem: culprit.filesystem.clone(),
        ..FilesystemStatus::default()
    }
    .words();
    let lead = if silent.is_empty() {
        format!("storage incident: {named} blocks ranks")
    } else {
        format!(
            "storage incident: {named} does not respond from {}",
            silent.into_iter().collect::<Vec<_>>().join(", ")
        )
    };
    if !verdict.summary.starts_with("storage incident:") {
        verdict.summary = format!("{lead}; {}", verdict.summary);
    }
    let storage = format!(
        "the storage is at fault, not the nodes: get {named} answering again (its servers, its network); \
         with --action requeue the next attempt waits for it, and no node is excluded or drained for it"
    );
    if !verdict.recommendations.contains(&storage) {
        verdict
            .recommendations
            .retain(|r| !(r.contains("drain") || r.contains("reboot")));
        verdict.recommendations.insert(0, storage);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::{Culprit, FilesystemStatus, RankPlace};

    fn blocked(culprits: &[(&str, &str)], probes: &[(&str, &str, bool)]) -> Verdict {
        let mut v =
            Verdict::unknown("rank 0 (node n1, pid 42) is in uninterruptible sleep (D) in write()");
        v.kind = VerdictKind::BlockedInKernel;
        for (i, (node, mount)) in culprits.iter().enumerate() {
            v.culprits.push(Culprit {
                killable: Some(false),
                ..Culprit::at(RankPlace {
                    rank: Some(i as u32),
                    node: Some(node.to_string()),
                    pid: 42 + i as i32,
                    state: "D".into(),
                    mount: Some(mount.to_string()),
                    fstype: Some("gpfs".into()),
                    ..RankPlace::default()
                })
            });
        }
        for (node, mount, responsive) in probes {
            v.filesystems.push(FilesystemStatus {
                filesystem: None,
                mount: mount.to_string(),
                node: Some(node.to_string()),
                fstype: Some("gpfs".into()),
                responsive: Some(*responsive),
                detail: None,
            });
        }
        v.recommendations
            .push("rank 0 cannot be killed while in D state: ... drain or reboot n1".into());
        v
    }

    #[test]
    fn a_mount_silent_from_nodes_with_no_stuck_rank_is_a_storage_incident() {
        let mut v = blocked(
            &[("n1", "/gpfs")],
            &[
                ("n1", "/gpfs", false),
                ("n2", "/gpfs", false),
                ("n3", "/gpfs", false),
            ],
        );
        apply_scope(&mut v, &[]);
        assert_eq!(v.scope, Some(Scope::Filesystem));
        assert_eq!(
            v.scope_evidence,
            vec!["/gpfs does not answer from n2, n3, where no rank is stuck"]
        );
        assert!(
            v.summary.starts_with(
                "storage incident: /gpfs (gpfs) does not respond from n1, n2, n3; rank 0"
            ),
            "{}",
            v.summary
        );
        assert!(v.recommendations[0].starts_with("the storage is at fault"));
        assert!(
            !v.recommendations[1..].iter().any(|r| r.contains("drain")),
            "what to do addresses the storage, not the nodes: {:?}",
            v.recommendations
        );
        apply_scope(&mut v, &[]);
        assert_eq!(
            v.summary.matches("storage incident").count(),
            1,
            "applied twice, said once"
        );
    }

    #[test]
    fn ranks_on_two_nodes_blocked_on_one_mount_are_a_storage_incident() {
        let v = blocked(&[("n1", "/gpfs"), ("n2", "/gpfs")], &[]);
        let (scope, evidence) = scope_of(&v, &[]);
        assert_eq!(scope, Some(Scope::Filesystem));
        assert_eq!(evidence, vec!["ranks on n1, n2 are blocked on /gpfs"]);
    }

    #[test]
    fn a_mount_that_answers_elsewhere_is_the_nodes() {
        let v = blocked(
            &[("n1", "/scratch")],
            &[
                ("n1", "/scratch", false),
                ("n2", "/scratch", true),
                ("n3", "/scratch", true),
            ],
        );
        let (scope, evidence) = scope_of(&v, &[]);
        assert_eq!(scope, Some(Scope::Node));
        assert!(
            evidence[0].contains("answers from n2, n3 but not from n1"),
            "{evidence:?}"
        );
    }

    #[test]
    fn one_node_alone_cannot_tell_unless_the_fleet_saw_the_mount_blocked() {
        let v = blocked(&[("n1", "/gpfs")], &[("n1", "/gpfs", false)]);
        let (scope, evidence) = scope_of(&v, &[]);
        assert_eq!(scope, None, "not guessed");
        assert!(evidence[0].contains("cannot tell the node from the storage"));
        let (scope, evidence) = scope_of(&v, &["job 1240 on n7, 3 min ago".to_string()]);
        assert_eq!(scope, Some(Scope::Filesystem));
        assert!(evidence[0].contains("job 1240 on n7"));
    }

    #[test]
    fn the_blocking_mount_is_probed_where_it_was_not() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let v = blocked(&[("n1", "/gpfs")], &[("n1", "/gpfs", false)]);
        assert_eq!(mounts_to_probe_everywhere(&v, &nodes), vec!["/gpfs"]);
        let v = blocked(
            &[("n1", "/gpfs")],
            &[
                ("n1", "/gpfs", false),
                ("n2", "/gpfs", true),
                ("n3", "/gpfs", false),
            ],
        );
        assert!(
            mounts_to_probe_everywhere(&v, &nodes).is_empty(),
            "probed everywhere already"
        );
        let mut busy = v.clone();
        busy.kind = VerdictKind::Busy;
        assert!(mounts_to_probe_everywhere(&busy, &nodes).is_empty());
    }

    #[test]
    fn program_faults_are_the_jobs_and_a_silent_node_is_the_nodes() {
        for kind in [
            VerdictKind::Busy,
            VerdictKind::Exited,
            VerdictKind::Diverged,
            VerdictKind::CollectiveHang,
            VerdictKind::Stopped,
        ] {
            let mut v = Verdict::unknown("x");
            v.kind = kind;
            assert_eq!(scope_of(&v, &[]).0, Some(Scope::Job), "{kind:?}");
        }
        let mut v = Verdict::unknown("x");
        v.kind = VerdictKind::NodeUnreachable;
        v.nodes_not_seen.push("n3".into());
        assert_eq!(scope_of(&v, &[]).0, Some(Scope::Node));
        assert_eq!(scope_of(&Verdict::unknown("x"), &[]).0, None);
    }
}
