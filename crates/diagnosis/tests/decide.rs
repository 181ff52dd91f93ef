//! Deciding from the observations of several nodes: groups across nodes, the culprit's node, nodes not seen, and
//! observations that survive the wire.

use hangwatch_diagnosis::{decide, DecideOptions};
use hangwatch_model::{
    FileRef, NodeObservations, ProbeResult, ProcessObservation, PythonFrame, PythonThread,
    SyscallObservation, ThreadObservation, VerdictKind, WorkerOf, NODE_OBSERVATIONS_VERSION,
};
use proptest::prelude::*;

const WINDOW_MS: u64 = 300;

/// A Python stack, innermost first; frames of the standard library are under /usr/lib.
fn py(frames: &[&str]) -> Option<Vec<PythonThread>> {
    Some(vec![PythonThread {
        os_tid: None,
        thread_id: 1,
        name: Some("MainThread".into()),
        frames: frames
            .iter()
            .map(|function| PythonFrame {
                function: (*function).into(),
                filename: match *function {
                    "recv_into" => "/usr/lib/python3.11/socket.py".into(),
                    _ => "/job/train.py".into(),
                },
                line: 10,
            })
            .collect(),
    }])
}

fn thread(tid: i32, state: char, wchan: &str, call: &str, file: FileRef) -> ThreadObservation {
    ThreadObservation {
        tid,
        name: Some("python3".into()),
        state,
        wchan: Some(wchan.into()),
        syscall: Some(SyscallObservation::InSyscall {
            nr: if call == "write" { 1 } else { 45 },
            name: Some(call.into()),
            args: vec![3, 0, 100],
            fd: Some(3),
            file: Some(file),
            path: None,
        }),
        kernel_stack: None,
        voluntary_ctxt_switches: Some(10),
        nonvoluntary_ctxt_switches: Some(1),
        not_running_for_ms: Some(WINDOW_MS),
        cpu_ms_during_sample: Some(0),
        cpu_ms_total: Some(1000),
        sigkill_pending: false,
        second_look: None,
    }
}

fn socket() -> FileRef {
    FileRef {
        filesystem: None,
        path: "socket:[77]".into(),
        mount: None,
        fstype: Some("sockfs".into()),
        source: None,
    }
}

/// A rank waiting in a barrier. Pids repeat from node to node, as they do on real machines.
fn waiting_rank(node: &str, rank: u32, local_rank: u32) -> ProcessObservation {
    let pid = 1000 + local_rank as i32;
    ProcessObservation {
        pid,
        rank: Some(rank),
        local_rank: Some(local_rank),
        node: Some(node.into()),
        comm: Some("python3".into()),
        threads: vec![thread(pid, 'S', "sk_wait_data", "recvfrom", socket())],
        python: py(&["recv_into", "barrier", "main"]),
        start_time: Some(5000),
        ..Default::default()
    }
}

/// A rank in D in write() on /gpfs.
fn writing_rank(node: &str, rank: u32, local_rank: u32) -> ProcessObservation {
    let mut p = waiting_rank(node, rank, local_rank);
    p.threads[0] = thread(
        p.pid,
        'D',
        "percpu_rwsem_wait",
        "write",
        FileRef {
            filesystem: None,
            path: "/gpfs/run/log.txt".into(),
            mount: Some("/gpfs".into()),
            fstype: Some("gpfs".into()),
            source: None,
        },
    );
    p.python = py(&["write", "log_step", "main"]);
    p
}

fn gpfs_probe(responsive: bool) -> ProbeResult {
    ProbeResult {
        filesystem: None,
        path: "/gpfs".into(),
        mount: Some("/gpfs".into()),
        fstype: Some("gpfs".into()),
        source: None,
        responsive: Some(responsive),
        elapsed_ms: 1000,
        detail: if responsive {
            "ok".into()
        } else {
            "write probe did not return within 1s".into()
        },
        steps: vec![],
    }
}

fn node(name: &str, ranks: Vec<ProcessObservation>) -> NodeObservations {
    let mut n = NodeObservations::new(Some(name.into()), WINDOW_MS);
    n.observed_at_unix_s = Some(1_700_000_000.0);
    n.ranks = ranks;
    n
}

/// `nodes` nodes of `per_node` ranks each, all in a barrier; global rank = node rank x per_node + local rank.
fn job(nodes: u32, per_node: u32) -> Vec<NodeObservations> {
    (0..nodes)
        .map(|n| {
            let name = format!("n{}", n + 1);
            let ranks = (0..per_node)
                .map(|l| waiting_rank(&name, n * per_node + l, l))
                .collect();
            node(&name, ranks)
        })
        .collect()
}

/// The incident across nodes: rank 0 on n1 in D in write() on /gpfs, which does not answer n1's probe.
fn incident(nodes: u32, per_node: u32) -> Vec<NodeObservations> {
    let mut job = job(nodes, per_node);
    job[0].ranks[0] = writing_rank("n1", 0, 0);
    job[0].probes = vec![gpfs_probe(false)];
    job
}

fn names(n: u32) -> Vec<String> {
    (1..=n).map(|i| format!("n{i}")).collect()
}

#[test]
fn one_verdict_names_the_node_and_rank_and_groups_the_waiters_across_nodes() {
    let v = decide(
        &incident(3, 4),
        &DecideOptions {
            stalled_for_s: Some(12.0),
            expected_nodes: names(3),
            answered_late: Vec::new(),
        },
    );
    assert_eq!(v.kind, VerdictKind::BlockedInKernel, "{}", v.summary);
    assert_eq!(v.culprits.len(), 1, "{:?}", v.culprits);
    let c = &v.culprits[0];
    assert_eq!(
        (c.rank, c.node.as_deref(), c.pid, c.state.as_str()),
        (Some(0), Some("n1"), 1000, "D")
    );
    assert_eq!(c.syscall.as_deref(), Some("write"));
    assert_eq!(c.path.as_deref(), Some("/gpfs/run/log.txt"));
    assert_eq!(c.mount.as_deref(), Some("/gpfs"));
    assert_eq!(c.killable, Some(false));
    assert_eq!(v.groups.len(), 2, "{:?}", v.groups);
    let waiters = &v.groups[0];
    assert_eq!(waiters.ranks, (1..12).collect::<Vec<u32>>());
    assert_eq!(waiters.nodes, names(3));
    assert_eq!(waiters.state, "S");
    assert!(
        v.summary
            .starts_with("rank 0 (node n1, pid 1000) is in uninterruptible sleep (D) in write()"),
        "{}",
        v.summary
    );
    assert!(
        v.summary.contains("/gpfs (gpfs) does not respond"),
        "{}",
        v.summary
    );
    assert!(
        v.summary.contains("11 ranks on 3 nodes wait in barrier"),
        "{}",
        v.summary
    );
    assert_eq!(v.filesystems.len(), 1);
    assert_eq!(v.filesystems[0].node.as_deref(), Some("n1"));
    assert_eq!(v.filesystems[0].responsive, Some(false));
    assert!(v.nodes_not_seen.is_empty());
    assert_eq!(v.node, None, "a job-wide verdict is not one node's");
    assert_eq!(v.stalled_for_s, Some(12.0));
    // Every line of the roll call, in rank order, says its node.
    let lines: Vec<(Option<u32>, Option<&str>)> = v
        .ranks
        .iter()
        .map(|r| (r.rank, r.node.as_deref()))
        .collect();
    let want: Vec<(Option<u32>, Option<&str>)> = (0..12)
        .map(|r| (Some(r), Some(["n1", "n2", "n3"][r as usize / 4])))
        .collect();
    assert_eq!(lines, want);
}

/// 1,250 nodes of 8 ranks: the verdict names the culprit and groups all 10,000 ranks, but its table lists only the
/// culprit and one rank per group, and says so; up to `FULL_TABLE_RANKS` every rank has its row.
#[test]
fn a_job_past_the_full_table_size_lists_the_culprits_and_one_rank_per_group() {
    let options = |n| DecideOptions {
        stalled_for_s: Some(12.0),
        expected_nodes: names(n),
        answered_late: Vec::new(),
    };
    let v = decide(&incident(1250, 8), &options(1250));
    assert_eq!(v.kind, VerdictKind::BlockedInKernel, "{}", v.summary);
    assert_eq!(v.culprits[0].rank, Some(0));
    let grouped: usize = v.groups.iter().map(|g| g.ranks.len()).sum();
    assert_eq!(grouped, 10_000, "every rank is in its group");
    assert!(
        v.groups.iter().all(|g| g.pids.is_empty()),
        "{:?}",
        v.groups[1]
    );
    let rows: Vec<(Option<u32>, Option<&str>)> = v
        .ranks
        .iter()
        .map(|r| (r.rank, r.node.as_deref()))
        .collect();
    // The culprit (also the first of its group) and the first rank of the waiters.
    assert_eq!(rows, vec![(Some(0), Some("n1")), (Some(1), Some("n1"))]);
    assert_eq!(v.ranks_not_listed, 9_998);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("lists 2 of 10000 ranks") && w.contains("evidence bundle")),
        "{:?}",
        v.warnings
    );
    let json = serde_json::to_vec(&v).expect("json");
    assert!(json.len() < 4 << 20, "{} bytes", json.len());

    // Node n7 keeps the verdict with its own eight rows, made from its own observations, beside the culprit's.
    let n7 = &incident(1250, 8)[6];
    let kept = hangwatch_diagnosis::rollcall::with_own_rows(v.clone(), n7);
    let rows: Vec<(Option<u32>, Option<&str>)> = kept
        .ranks
        .iter()
        .map(|r| (r.rank, r.node.as_deref()))
        .collect();
    let mut want = vec![(Some(0), Some("n1")), (Some(1), Some("n1"))];
    want.extend((48..56).map(|r| (Some(r), Some("n7"))));
    assert_eq!(rows, want);
    assert_eq!(kept.ranks_not_listed, 9_990);
    assert!(kept.ranks[2..].iter().all(|r| r.state == "S"));

    let full = hangwatch_diagnosis::rollcall::FULL_TABLE_RANKS as u32;
    let v = decide(&incident(full / 8, 8), &options(full / 8));
    assert_eq!(v.ranks.len() as u32, full);
    assert_eq!(v.ranks_not_listed, 0);
}

/// Same pids on different nodes are different processes: each node's workers stay with that node's rank.
#[test]
fn workers_stay_with_their_own_nodes_rank_when_pids_repeat() {
    let mut job = job(2, 2);
    for n in &mut job {
        let name = n.node.clone();
        n.workers = vec![ProcessObservation {
            pid: 2000,
            node: name,
            comm: Some("pt_data_worker".into()),
            worker_of: Some(WorkerOf {
                rank_pid: 1000,
                rank: n.ranks[0].rank,
                rank_source: None,
                parent_pid: 1000,
            }),
            threads: vec![thread(2000, 'S', "futex_wait", "futex", socket())],
            ..Default::default()
        }];
    }
    let v = decide(&job, &DecideOptions::default());
    let workers: Vec<usize> = v.ranks.iter().map(|r| r.workers.len()).collect();
    assert_eq!(workers, vec![1, 0, 1, 0]);
}

#[test]
fn a_node_whose_observations_are_missing_is_named_as_not_seen() {
    let mut seen = job(3, 4);
    seen.pop();
    let v = decide(
        &seen,
        &DecideOptions {
            stalled_for_s: None,
            expected_nodes: names(3),
            answered_late: Vec::new(),
        },
    );
    assert_eq!(v.kind, VerdictKind::NodeUnreachable, "{}", v.summary);
    assert_eq!(v.nodes_not_seen, vec!["n3".to_string()]);
    assert!(v.culprits.is_empty());
    assert!(
        v.summary.starts_with("node n3 was not seen"),
        "{}",
        v.summary
    );
    assert!(
        v.summary.contains("8 ranks on 2 nodes wait in barrier"),
        "{}",
        v.summary
    );
    assert!(
        v.warnings.iter().any(|w| w.contains("node n3")),
        "{:?}",
        v.warnings
    );
    assert!(
        v.recommendations.iter().any(|r| r.contains("node n3")),
        "{:?}",
        v.recommendations
    );

    // A culprit among the nodes that were seen still leads; the missing node is a warning.
    let mut seen = incident(3, 4);
    seen.remove(1);
    let v = decide(
        &seen,
        &DecideOptions {
            stalled_for_s: None,
            expected_nodes: names(3),
            answered_late: Vec::new(),
        },
    );
    assert_eq!(v.kind, VerdictKind::BlockedInKernel, "{}", v.summary);
    assert_eq!(v.culprits[0].node.as_deref(), Some("n1"));
    assert_eq!(v.nodes_not_seen, vec!["n2".to_string()]);
    assert!(v
        .warnings
        .iter()
        .any(|w| w.contains("node n2 was not seen")));
}

#[test]
fn a_node_that_answered_late_but_still_reports_progress_is_late_not_unreachable_and_never_excluded()
{
    let mut seen = job(3, 4);
    seen.pop();
    let v = decide(
        &seen,
        &DecideOptions {
            stalled_for_s: None,
            expected_nodes: names(3),
            answered_late: vec!["n3".to_string()],
        },
    );
    assert_ne!(v.kind, VerdictKind::NodeUnreachable, "{}", v.summary);
    assert!(v.nodes_not_seen.is_empty(), "{:?}", v.nodes_not_seen);
    assert_eq!(v.nodes_late, vec!["n3".to_string()]);
    assert!(v.summary.contains("node n3 answered late"), "{}", v.summary);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("node n3 answered late")),
        "{:?}",
        v.warnings
    );
    assert!(
        !hangwatch_diagnosis::is_conclusive_for_job(&v),
        "waits for the hard tier"
    );
    assert!(hangwatch_diagnosis::requeue::bad_nodes(&v).is_empty());

    // With a culprit seen elsewhere, the late node is named beside it and still not excluded.
    let mut seen = incident(3, 4);
    seen.pop();
    let v = decide(
        &seen,
        &DecideOptions {
            stalled_for_s: None,
            expected_nodes: names(3),
            answered_late: vec!["n3".to_string()],
        },
    );
    assert_eq!(v.kind, VerdictKind::BlockedInKernel, "{}", v.summary);
    assert_eq!(v.nodes_late, vec!["n3".to_string()]);
    assert!(!hangwatch_diagnosis::requeue::bad_nodes(&v).contains(&"n3".to_string()));
}

/// The culprit's JSON keeps SPEC's flat field names: the shared part is flattened, not nested.
#[test]
fn culprit_json_keeps_the_spec_fields_flat() {
    let v = decide(&incident(3, 4), &DecideOptions::default());
    let json = serde_json::to_value(&v).unwrap();
    let c = &json["culprits"][0];
    for field in [
        "rank",
        "node",
        "pid",
        "state",
        "wchan",
        "syscall",
        "path",
        "mount",
        "fstype",
        "killable",
        "python_stack",
        "kernel_stack",
    ] {
        assert!(c.get(field).is_some(), "culprit lacks {field}: {c:#}");
    }
    assert!(c.get("at").is_none(), "{c:#}");
    assert_eq!(c["node"], "n1");
    assert_eq!(c["rank"], 0);
    let line = &json["ranks"][5];
    assert_eq!((&line["rank"], &line["node"]), (&5.into(), &"n2".into()));
    assert_eq!(json["groups"][0]["where"], "barrier (train.py)");
    let back: hangwatch_model::Verdict = serde_json::from_value(json).unwrap();
    assert_eq!(back, v);
}

#[test]
fn node_observations_survive_the_wire() {
    let mut obs = incident(1, 4).remove(0);
    obs.workers = vec![ProcessObservation {
        pid: 2000,
        node: obs.node.clone(),
        worker_of: Some(WorkerOf {
            rank_pid: 1001,
            rank: Some(1),
            rank_source: None,
            parent_pid: 1001,
        }),
        ..Default::default()
    }];
    obs.unreadable = vec!["the Python stack reader failed".into()];
    obs.kernel_log = Some(hangwatch_kmsg::report_from_text(
        "[Sat Mar  4 04:10:52 2023] nfs: server fs1 not responding, still trying\n",
    ));
    let text = serde_json::to_string(&obs).unwrap();
    let back: NodeObservations = serde_json::from_str(&text).unwrap();
    assert_eq!(back, obs);
    assert_eq!(back.version, NODE_OBSERVATIONS_VERSION);
    // The decision is the same on either side of the wire.
    let options = DecideOptions::default();
    assert_eq!(
        decide(std::slice::from_ref(&back), &options),
        decide(std::slice::from_ref(&obs), &options)
    );
}

/// One node's observations under arbitrary rank positions.
fn arb_rank(rank: u32) -> impl Strategy<Value = ProcessObservation> {
    (0u8..5).prop_map(move |what| {
        let mut p = waiting_rank("n1", rank, rank);
        p.pid = 1000 + rank as i32;
        let t = &mut p.threads[0];
        match what {
            0 => p = writing_rank("n1", rank, rank),
            1 => t.state = 'T',
            2 => {
                t.state = 'R';
                t.cpu_ms_during_sample = Some(WINDOW_MS);
                t.not_running_for_ms = None;
                t.syscall = Some(SyscallObservation::Running);
            }
            3 => p.python = py(&["elsewhere", "main"]),
            _ => {}
        }
        p.pid = 1000 + rank as i32;
        p
    })
}

proptest! {
    /// Where a rank runs does not change what is decided about it: the same ranks, split over any number of
    /// nodes, give the same kind, the same culprit ranks and the same groups of ranks as on one node.
    #[test]
    fn splitting_ranks_over_nodes_does_not_change_the_decision(
        procs in (2u32..24).prop_flat_map(|n| (0..n).map(arb_rank).collect::<Vec<_>>()),
        nodes in 1usize..6,
    ) {
        let one = decide(&[node("n1", procs.clone())], &DecideOptions::default());
        let mut split: Vec<NodeObservations> = (0..nodes).map(|i| node(&format!("n{}", i + 1), vec![])).collect();
        for (i, mut p) in procs.into_iter().enumerate() {
            let n = &mut split[i % nodes];
            p.node = n.node.clone();
            n.ranks.push(p);
        }
        let many = decide(&split, &DecideOptions::default());
        prop_assert_eq!(one.kind, many.kind, "{} / {}", one.summary, many.summary);
        let culprits = |v: &hangwatch_model::Verdict| v.culprits.iter().map(|c| c.rank).collect::<Vec<_>>();
        prop_assert_eq!(culprits(&one), culprits(&many));
        let groups = |v: &hangwatch_model::Verdict| {
            let mut g: Vec<(String, Vec<u32>)> = v.groups.iter().map(|g| (g.where_.clone(), g.ranks.clone())).collect();
            g.sort();
            g
        };
        prop_assert_eq!(groups(&one), groups(&many));
    }
}

#[test]
fn ranks_that_cannot_be_known_are_said_once_in_words_and_the_source_of_a_number_is_kept() {
    let mut culprit = writing_rank("n1", 0, 0);
    culprit.rank = None;
    let mut peer = waiting_rank("n1", 1, 1);
    peer.rank = None;
    peer.pid = 1001;
    let v = decide(
        &[node("n1", vec![culprit, peer])],
        &DecideOptions::default(),
    );
    let said: Vec<&String> = v
        .warnings
        .iter()
        .filter(|w| w.contains("is not known"))
        .collect();
    assert_eq!(said.len(), 1, "{:?}", v.warnings);
    assert!(said[0].contains("2 processes"), "{}", said[0]);
    assert_eq!(v.culprits[0].rank, None);

    let mut culprit = writing_rank("n1", 0, 0);
    culprit.rank_source = Some(hangwatch_model::RankSource::EnvSlurm);
    let v = decide(
        &[node("n1", vec![culprit, waiting_rank("n1", 1, 1)])],
        &DecideOptions::default(),
    );
    assert!(!v.warnings.iter().any(|w| w.contains("is not known")));
    let json = serde_json::to_value(&v.culprits[0]).unwrap();
    assert_eq!(json["rank_source"], "env:SLURM_PROCID");
}
