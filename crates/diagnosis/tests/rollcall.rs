//! Roll-call decisions on synthetic observations: each verdict kind, and invariants.

use hangwatch_diagnosis::{mounts_to_probe, roll_call, RollCallInput};
use hangwatch_model::{
    FileRef, ProbeResult, ProcessObservation, PythonFrame, PythonThread, SecondLook,
    SyscallObservation, ThreadObservation, VerdictKind, WorkerOf,
};
use proptest::prelude::*;

const WINDOW_MS: u64 = 300;

fn py(frames: &[(&str, &str)]) -> Option<Vec<PythonThread>> {
    Some(vec![PythonThread {
        os_tid: None,
        thread_id: 1,
        name: Some("MainThread".into()),
        frames: frames
            .iter()
            .map(|(function, filename)| PythonFrame {
                function: (*function).into(),
                filename: (*filename).into(),
                line: 10,
            })
            .collect(),
    }])
}

fn barrier_stack() -> Option<Vec<PythonThread>> {
    py(&[
        ("recv_into", "/usr/lib/python3.11/socket.py"),
        ("barrier", "/work/tests/python/rank.py"),
        ("main", "/work/tests/python/rank.py"),
    ])
}

fn thread(
    tid: i32,
    state: char,
    wchan: &str,
    syscall: Option<SyscallObservation>,
) -> ThreadObservation {
    ThreadObservation {
        tid,
        name: Some("python3".into()),
        state,
        wchan: Some(wchan.into()),
        syscall,
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

fn in_call(
    name: &str,
    nr: i64,
    path: &str,
    mount: &str,
    fstype: &str,
) -> Option<SyscallObservation> {
    Some(SyscallObservation::InSyscall {
        nr,
        name: Some(name.into()),
        args: vec![3, 0, 100],
        fd: Some(3),
        file: Some(FileRef {
            filesystem: None,
            path: path.into(),
            mount: Some(mount.into()),
            fstype: Some(fstype.into()),
            source: None,
        }),
        path: None,
    })
}

fn waiting_rank(rank: u32) -> ProcessObservation {
    let pid = 1000 + rank as i32;
    ProcessObservation {
        pid,
        rank: Some(rank),
        comm: Some("python3".into()),
        threads: vec![thread(
            pid,
            'S',
            "sk_wait_data",
            in_call("recvfrom", 45, "socket:[77]", "", "sockfs"),
        )],
        python: barrier_stack(),
        ..Default::default()
    }
}

fn ranks(n: u32) -> Vec<ProcessObservation> {
    (0..n).map(waiting_rank).collect()
}

fn probe(mount: &str, fstype: &str, responsive: bool) -> ProbeResult {
    ProbeResult {
        filesystem: None,
        path: mount.into(),
        mount: Some(mount.into()),
        fstype: Some(fstype.into()),
        source: None,
        responsive: Some(responsive),
        elapsed_ms: 2000,
        detail: if responsive {
            "ok".into()
        } else {
            "write did not return within 2s".into()
        },
        steps: vec![],
    }
}

fn input(processes: Vec<ProcessObservation>, probes: Vec<ProbeResult>) -> RollCallInput {
    RollCallInput {
        processes,
        probes,
        window_ms: WINDOW_MS,
        node: Some("n1".into()),
        stalled_for_s: None,
        now_unix_s: None,
    }
}

/// A checkpoint's mkdir in D whose path could not be read (the rank's memory map was locked): no file and no
/// mount are named, least of all the working directory's, and nothing is called responsive.
#[test]
fn a_path_that_could_not_be_read_is_said_to_be_unknown_not_guessed() {
    let mut procs = ranks(4);
    procs[0].threads[0] = thread(
        1000,
        'D',
        "percpu_rwsem_wait",
        Some(SyscallObservation::InSyscall {
            nr: 83,
            name: Some("mkdir".into()),
            args: vec![0x7f00, 0o777],
            fd: None,
            file: None,
            path: Some(Box::new(hangwatch_model::PathArg {
                addr: 0x7f00,
                base: Some("/home/me/run".into()),
                text: None,
                unreadable: Some("reading the rank's memory did not return within 1.0s".into()),
            })),
        }),
    );
    let v = roll_call(&input(procs.clone(), vec![probe("/", "ext4", true)]));
    assert_eq!(v.kind, VerdictKind::BlockedInKernel, "{v:#?}");
    let c = &v.culprits[0];
    assert_eq!(c.rank, Some(0));
    assert_eq!(c.syscall.as_deref(), Some("mkdir"));
    assert_eq!(c.path, None, "{c:#?}");
    assert_eq!(c.mount, None, "{c:#?}");
    assert!(
        v.summary
            .contains("in mkdir() (the path it was given could not be read)"),
        "{}",
        v.summary
    );
    assert!(!v.summary.contains("responds"), "{}", v.summary);
    assert!(
        mounts_to_probe(&procs, WINDOW_MS).is_empty(),
        "no mount is probed on the strength of a guess"
    );
}

/// A store into a shared mapping on a frozen mount: D in a page fault, no call, no file. The one mount of the node
/// that does not answer its probe is named; with two that do not, none is guessed.
#[test]
fn a_wait_on_a_frozen_superblock_is_put_on_the_one_mount_that_does_not_answer() {
    let mut procs = ranks(3);
    let mut t = thread(
        1000,
        'D',
        "percpu_rwsem_wait",
        Some(SyscallObservation::NotInSyscall { pc: None }),
    );
    t.kernel_stack = Some(vec![
        "percpu_rwsem_wait".into(),
        "ext4_page_mkwrite".into(),
        "do_page_mkwrite".into(),
    ]);
    procs[0].threads[0] = t;
    assert!(hangwatch_diagnosis::superblock_waiter(&procs, WINDOW_MS).is_some());
    let one = roll_call(&input(
        procs.clone(),
        vec![probe("/", "ext4", true), probe("/data", "ext4", false)],
    ));
    let c = &one.culprits[0];
    assert_eq!(c.rank, Some(0), "{one:#?}");
    assert_eq!(
        (c.path.as_deref(), c.mount.as_deref()),
        (None, Some("/data"))
    );
    assert!(
        one.summary
            .contains("is blocked writing to a memory-mapped file")
            && one.summary.contains("; /data (ext4) does not respond"),
        "{}",
        one.summary
    );
    let two = roll_call(&input(
        procs,
        vec![
            probe("/data", "ext4", false),
            probe("/scratch", "xfs", false),
        ],
    ));
    assert_eq!(two.culprits[0].mount, None, "{two:#?}");
}

/// The seed incident: rank 0 in D in write() on a frozen ext4, 15 peers in a barrier.
#[test]
fn incident_names_rank_0_in_write_on_the_frozen_mount() {
    let mut procs = ranks(16);
    procs[0].threads[0] = thread(
        1000,
        'D',
        "percpu_rwsem_wait",
        in_call("write", 1, "/shared/log.txt", "/shared", "ext4"),
    );
    procs[0].python = py(&[
        ("log_step", "/work/tests/python/rank.py"),
        ("main", "/work/tests/python/rank.py"),
    ]);
    assert_eq!(
        mounts_to_probe(&procs, WINDOW_MS),
        vec!["/shared".to_string()]
    );

    let v = roll_call(&input(procs, vec![probe("/shared", "ext4", false)]));
    assert_eq!(v.kind, VerdictKind::BlockedInKernel);
    assert_eq!(v.culprits.len(), 1);
    let c = &v.culprits[0];
    assert_eq!((c.rank, c.pid, c.state.as_str()), (Some(0), 1000, "D"));
    assert_eq!(c.syscall.as_deref(), Some("write"));
    assert_eq!(c.path.as_deref(), Some("/shared/log.txt"));
    assert_eq!(c.mount.as_deref(), Some("/shared"));
    assert_eq!(c.fstype.as_deref(), Some("ext4"));
    assert_eq!(c.killable, Some(false));
    assert_eq!(v.groups[0].where_, "barrier (rank.py)");
    assert_eq!(v.groups[0].ranks, (1..16).collect::<Vec<u32>>());
    assert_eq!(v.filesystems[0].responsive, Some(false));
    assert!(
        v.summary.starts_with("rank 0 (node n1, pid 1000) is in uninterruptible sleep (D) in write() on /shared/log.txt; /shared (ext4) does not respond"),
        "{}",
        v.summary
    );
    assert!(
        v.summary.contains("15 ranks wait in barrier (rank.py)"),
        "{}",
        v.summary
    );
    assert!(
        v.recommendations
            .iter()
            .any(|r| r.contains("drain or reboot n1")),
        "{:?}",
        v.recommendations
    );
}

/// FUSE: the writer sleeps in S in request_wait_answer; with the probe failing it is blocked in the kernel.
#[test]
fn fuse_wait_in_s_state_is_blocked_in_kernel_when_the_mount_does_not_respond() {
    let mut procs = ranks(4);
    procs[2].threads[0] = thread(
        1002,
        'S',
        "request_wait_answer",
        in_call("write", 1, "/mnt/fuse/log.txt", "/mnt/fuse", "fuse.bindfs"),
    );
    procs[2].python = py(&[("log_step", "/work/rank.py")]);
    assert_eq!(
        mounts_to_probe(&procs, WINDOW_MS),
        vec!["/mnt/fuse".to_string()]
    );
    let v = roll_call(&input(
        procs.clone(),
        vec![probe("/mnt/fuse", "fuse.bindfs", false)],
    ));
    assert_eq!(v.kind, VerdictKind::BlockedInKernel);
    assert_eq!(v.culprits[0].rank, Some(2));
    assert_eq!(v.culprits[0].state, "S");
    assert_eq!(v.culprits[0].killable, Some(true));
    assert!(
        v.summary
            .contains("/mnt/fuse (fuse.bindfs) does not respond"),
        "{}",
        v.summary
    );

    // The same wait on a mount that answers is ordinary I/O: the rank is merely elsewhere.
    let v = roll_call(&input(procs, vec![probe("/mnt/fuse", "fuse.bindfs", true)]));
    assert_eq!(v.kind, VerdictKind::Diverged);
    assert_eq!(v.culprits[0].rank, Some(2));
}

#[test]
fn stopped_rank_is_named() {
    let mut procs = ranks(8);
    procs[5].threads[0].state = 'T';
    procs[5].threads[0].wchan = Some("do_signal_stop".into());
    let v = roll_call(&input(procs, vec![]));
    assert_eq!(v.kind, VerdictKind::Stopped);
    assert_eq!(v.culprits.len(), 1);
    assert_eq!(v.culprits[0].rank, Some(5));
    assert!(v
        .recommendations
        .iter()
        .any(|r| r.contains("kill -CONT 1005")));
}

#[test]
fn exited_rank_is_named_with_its_exit_code() {
    let mut procs = ranks(4);
    procs[3].exited = true;
    procs[3].exit_code = Some(3);
    procs[3].threads.clear();
    let v = roll_call(&input(procs, vec![]));
    assert_eq!(v.kind, VerdictKind::Exited);
    assert_eq!(v.culprits[0].rank, Some(3));
    assert_eq!(v.culprits[0].killable, None);
    assert!(v.summary.contains("exited (code 3)"), "{}", v.summary);
}

#[test]
fn spinning_rank_is_busy() {
    let mut procs = ranks(4);
    procs[1].threads[0] = ThreadObservation {
        state: 'R',
        syscall: Some(SyscallObservation::Running),
        not_running_for_ms: None,
        cpu_ms_during_sample: Some(290),
        ..procs[1].threads[0].clone()
    };
    procs[1].python = py(&[("spin", "/work/rank.py")]);
    let v = roll_call(&input(procs, vec![]));
    assert_eq!(v.kind, VerdictKind::Busy);
    assert_eq!(v.culprits[0].rank, Some(1));
    assert!(
        v.summary.contains("computing in spin (rank.py)"),
        "{}",
        v.summary
    );
}

#[test]
fn rank_waiting_elsewhere_diverged() {
    let mut procs = ranks(8);
    procs[6].threads[0] = thread(1006, 'S', "futex_wait_queue", None);
    procs[6].python = py(&[
        ("acquire", "/usr/lib/python3.11/threading.py"),
        ("deadlock", "/work/rank.py"),
    ]);
    let v = roll_call(&input(procs, vec![]));
    assert_eq!(v.kind, VerdictKind::Diverged);
    assert_eq!(v.culprits.len(), 1);
    assert_eq!(v.culprits[0].rank, Some(6));
    assert!(v.summary.contains("odd one out"), "{}", v.summary);
    assert!(v.summary.contains("deadlock (rank.py)"), "{}", v.summary);
}

#[test]
fn everyone_in_the_same_wait_is_a_collective_hang() {
    let v = roll_call(&input(ranks(8), vec![]));
    assert_eq!(v.kind, VerdictKind::CollectiveHang);
    assert!(v.culprits.is_empty());
    assert_eq!(v.groups.len(), 1);
}

#[test]
fn even_split_names_nobody() {
    let mut procs = ranks(4);
    for p in &mut procs[2..] {
        p.python = py(&[("other", "/work/rank.py")]);
    }
    let v = roll_call(&input(procs, vec![]));
    assert_eq!(v.kind, VerdictKind::Unknown);
    assert!(v.culprits.is_empty());
    assert!(v.summary.starts_with("no rank stands out"), "{}", v.summary);
}

#[test]
fn empty_roll_call_says_so() {
    let v = roll_call(&input(vec![], vec![]));
    assert_eq!(v.kind, VerdictKind::Unknown);
    assert_eq!(v.summary, "no rank processes found");
}

#[test]
fn verdict_json_has_the_spec_fields_with_nulls_not_inventions() {
    let mut procs = ranks(2);
    procs[1].exited = true;
    let v = roll_call(&input(procs, vec![]));
    let json = serde_json::to_value(&v).unwrap();
    for key in [
        "version",
        "kind",
        "summary",
        "stalled_for_s",
        "culprits",
        "groups",
        "filesystems",
        "actions",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert_eq!(json["version"], 1);
    assert_eq!(json["kind"], "exited");
    let culprit = &json["culprits"][0];
    for key in [
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
        assert!(culprit.get(key).is_some(), "culprit lacks {key}");
    }
    assert!(culprit["syscall"].is_null());
    assert!(culprit["path"].is_null());
    assert!(json["stalled_for_s"].is_null());
}

fn arb_rank(rank: u32) -> impl Strategy<Value = ProcessObservation> {
    (0u8..6, any::<bool>()).prop_map(move |(what, progressed)| {
        let mut p = waiting_rank(rank);
        let t = &mut p.threads[0];
        match what {
            0 => {
                t.state = 'D';
                t.syscall = in_call("write", 1, "/shared/x", "/shared", "ext4");
            }
            1 => t.state = 'T',
            2 => {
                t.state = 'R';
                t.cpu_ms_during_sample = Some(WINDOW_MS);
                t.syscall = Some(SyscallObservation::Running);
            }
            3 => p.python = py(&[("elsewhere", "/work/rank.py")]),
            _ => {}
        }
        if progressed && what >= 3 {
            t.not_running_for_ms = None;
            t.cpu_ms_during_sample = Some(5);
        }
        p
    })
}

proptest! {
    /// A rank in the majority's place that is neither stuck, stopped, gone nor spinning is never blamed.
    #[test]
    fn never_blames_a_rank_that_is_where_its_peers_are(procs in (2u32..24).prop_flat_map(|n| (0..n).map(arb_rank).collect::<Vec<_>>())) {
        let v = roll_call(&input(procs.clone(), vec![]));
        let majority = v.groups.first().cloned();
        for c in &v.culprits {
            let p = procs.iter().find(|p| p.pid == c.pid).unwrap();
            let t = &p.threads[0];
            let special = p.exited || matches!(t.state, 'D' | 'T' | 'R');
            if let Some(g) = &majority {
                if g.pids.contains(&c.pid) && v.groups.iter().filter(|o| o.pids.len() == g.pids.len()).count() == 1 {
                    prop_assert!(special, "blamed {} which is in the majority group: {}", c.pid, v.summary);
                }
            }
        }
        prop_assert!(!v.summary.is_empty());
    }
}

/// Regression: rank 3 crashed (code 3), ranks 1 and 2 failed after it (code 1); the verdict leads with rank 3.
#[test]
fn the_first_rank_to_exit_leads_an_exited_verdict() {
    let mut procs = ranks(4);
    for (rank, code, at) in [(1usize, 1, 20.5), (2, 1, 20.4), (3, 3, 20.0)] {
        procs[rank].exited = true;
        procs[rank].exit_code = Some(code);
        procs[rank].exited_at_unix_s = Some(at);
        procs[rank].threads.clear();
    }
    let v = roll_call(&input(procs, vec![]));
    assert_eq!(v.kind, VerdictKind::Exited);
    let order: Vec<Option<u32>> = v.culprits.iter().map(|c| c.rank).collect();
    assert_eq!(order, vec![Some(3), Some(2), Some(1)]);
    assert!(v.summary.starts_with("rank 3 "), "{}", v.summary);
    assert!(
        v.summary
            .contains("exited (code 3) first (2 more exited after it)"),
        "{}",
        v.summary
    );
}

#[test]
fn a_dead_rank_is_named_with_how_it_died_while_its_peer_waits() {
    let mut procs = ranks(2);
    procs[1].exited = true;
    procs[1].exit_code = Some(137);
    procs[1].exited_at_unix_s = Some(20.0);
    procs[1].threads.clear();
    procs[1].death = Some(hangwatch_diagnosis::death::explain(
        &hangwatch_diagnosis::death::DeathFacts {
            signal: Some(9),
            kernel_log_readable: true,
            kernel_oom: Some(hangwatch_diagnosis::death::KernelOom {
                line: "Memory cgroup out of memory: Killed process 1001 (python)".into(),
                memcg: Some("/hw-test".into()),
            }),
            memory_cgroup: Some(hangwatch_diagnosis::death::CgroupFacts {
                path: "/hw-test".into(),
                version: 1,
                limit_bytes: Some(256 << 20),
                oom_kills: Some(1),
            }),
            ..Default::default()
        },
    ));
    let v = roll_call(&input(procs, vec![]));
    assert_eq!(v.kind, VerdictKind::Exited);
    assert!(
        v.summary.starts_with(
            "rank 1 (node n1, pid 1001) was killed by the kernel's OOM killer (memory cgroup /hw-test, limit \
             256 MiB); 1 rank waits in "
        ),
        "{}",
        v.summary
    );
    let death = v.culprits[0]
        .death
        .as_ref()
        .expect("the culprit carries its death");
    assert_eq!(death.oom_killed, Some(true));
    assert_eq!(v.culprits[0].exit_code, Some(137));
    assert_eq!(v.culprits[0].reason.as_deref(), Some(death.cause.as_str()));
}

#[test]
fn after_the_job_ended_the_first_rank_to_fail_leads_and_a_finished_one_never_does() {
    let mut procs = ranks(3);
    for (rank, code, at) in [(0usize, 0, 10.0), (1, 1, 12.0), (2, 1, 12.5)] {
        procs[rank].exited = true;
        procs[rank].exit_code = Some(code);
        procs[rank].exited_at_unix_s = Some(at);
        procs[rank].threads.clear();
    }
    procs[1].death = Some(hangwatch_diagnosis::death::explain(
        &hangwatch_diagnosis::death::DeathFacts {
            exit_code: Some(1),
            output: vec![
                "Traceback (most recent call last):".into(),
                "RuntimeError: boom".into(),
            ],
            ..Default::default()
        },
    ));
    let v = roll_call(&input(procs, vec![]));
    let order: Vec<Option<u32>> = v.culprits.iter().map(|c| c.rank).collect();
    assert_eq!(order, vec![Some(1), Some(2), Some(0)]);
    assert_eq!(
        v.summary,
        "rank 1 (node n1, pid 1001) exited with code 1: RuntimeError: boom; 2 more ranks exited after it"
    );
}

/// A worker of `rank` (pid 2000 + 10 x rank + n): a forked child waiting on its pipe, as a healthy one does.
fn worker(rank: u32, n: i32) -> ProcessObservation {
    let pid = 2000 + 10 * rank as i32 + n;
    ProcessObservation {
        pid,
        comm: Some("python3".into()),
        threads: vec![thread(
            pid,
            'S',
            "pipe_read",
            in_call("read", 0, "pipe:[55]", "", "pipefs"),
        )],
        worker_of: Some(WorkerOf {
            rank_pid: 1000 + rank as i32,
            rank: Some(rank),
            rank_source: None,
            parent_pid: 1000 + rank as i32,
        }),
        ..Default::default()
    }
}

/// Four ranks in a barrier, two healthy workers each.
fn ranks_with_workers() -> Vec<ProcessObservation> {
    let mut procs = ranks(4);
    for rank in 0..4 {
        procs.extend([worker(rank, 1), worker(rank, 2)]);
    }
    procs
}

fn stuck_in_read(p: &mut ProcessObservation) {
    p.threads[0] = thread(
        p.pid,
        'D',
        "percpu_rwsem_wait",
        in_call("read", 0, "/mnt/x/data.bin", "/mnt/x", "ext4"),
    );
}

#[test]
fn a_worker_in_d_on_a_frozen_mount_names_its_rank_and_the_worker() {
    let mut procs = ranks_with_workers();
    // Rank 3 waits for its batch elsewhere than its peers; its worker is stuck reading the dataset.
    procs[3].python = py(&[("next_batch", "/work/train.py")]);
    let stuck = procs.iter_mut().find(|p| p.pid == 2031).unwrap();
    stuck_in_read(stuck);
    assert_eq!(
        mounts_to_probe(&procs, WINDOW_MS),
        vec!["/mnt/x".to_string()]
    );
    let v = roll_call(&input(procs, vec![probe("/mnt/x", "ext4", false)]));
    assert_eq!(v.kind, VerdictKind::BlockedInKernel, "{}", v.summary);
    assert_eq!(v.culprits.len(), 1, "{:?}", v.culprits);
    let c = &v.culprits[0];
    assert_eq!(
        (c.rank, c.node.as_deref(), c.pid),
        (Some(3), Some("n1"), 2031)
    );
    assert_eq!(
        (c.state.as_str(), c.syscall.as_deref()),
        ("D", Some("read"))
    );
    assert_eq!(c.path.as_deref(), Some("/mnt/x/data.bin"));
    assert_eq!(
        (c.mount.as_deref(), c.fstype.as_deref()),
        (Some("/mnt/x"), Some("ext4"))
    );
    assert_eq!(c.killable, Some(false));
    let w = c.worker.as_ref().expect("the worker is named");
    assert_eq!((w.pid, w.rank_pid, w.parent_pid), (2031, 1003, 1003));
    assert_eq!(w.role, "child of rank 3");
    assert!(
        v.summary.starts_with(
            "rank 3's worker pid 2031 (child of rank 3, node n1) is in uninterruptible sleep (D) in read() on \
             /mnt/x/data.bin; /mnt/x (ext4) does not respond"
        ),
        "{}",
        v.summary
    );
    assert!(
        v.summary.contains("3 ranks wait in barrier (rank.py)"),
        "{}",
        v.summary
    );
    // Workers are not ranks: the roll call lists 4 ranks, each with its 2 workers.
    assert_eq!(v.ranks.len(), 4);
    assert!(v.ranks.iter().all(|r| r.workers.len() == 2));
    assert_eq!(v.groups.iter().map(|g| g.pids.len()).sum::<usize>(), 4);
}

#[test]
fn a_rank_in_d_leads_and_a_stuck_worker_is_listed_next_to_it() {
    let mut procs = ranks_with_workers();
    procs[0].threads[0] = thread(
        1000,
        'D',
        "percpu_rwsem_wait",
        in_call("write", 1, "/mnt/x/log.txt", "/mnt/x", "ext4"),
    );
    stuck_in_read(procs.iter_mut().find(|p| p.pid == 2012).unwrap());
    let v = roll_call(&input(procs, vec![probe("/mnt/x", "ext4", false)]));
    assert_eq!(v.kind, VerdictKind::BlockedInKernel);
    let who: Vec<(Option<u32>, i32)> = v.culprits.iter().map(|c| (c.rank, c.pid)).collect();
    assert_eq!(who, vec![(Some(0), 1000), (Some(1), 2012)]);
    assert!(v.culprits[0].worker.is_none());
    assert!(
        v.summary.starts_with("rank 0 (node n1, pid 1000)"),
        "{}",
        v.summary
    );
}

#[test]
fn exited_and_healthy_workers_are_never_culprits() {
    let mut procs = ranks_with_workers();
    for p in procs
        .iter_mut()
        .filter(|p| p.worker_of.is_some() && p.pid % 2 == 1)
    {
        p.exited = true;
        p.threads.clear();
    }
    let v = roll_call(&input(procs, vec![]));
    assert_eq!(v.kind, VerdictKind::CollectiveHang, "{}", v.summary);
    assert!(v.culprits.is_empty());
    assert!(v.summary.starts_with("all 4 ranks wait"), "{}", v.summary);
}

#[test]
fn a_worker_in_a_short_read_of_a_responsive_disk_is_not_a_culprit() {
    let mut procs = ranks_with_workers();
    stuck_in_read(procs.iter_mut().find(|p| p.pid == 2021).unwrap());
    let v = roll_call(&input(procs.clone(), vec![probe("/mnt/x", "ext4", true)]));
    assert_eq!(v.kind, VerdictKind::CollectiveHang, "{}", v.summary);
    // It ran during the window (a context switch): moving I/O, not a hang, even with the mount unprobed.
    let busy = procs.iter_mut().find(|p| p.pid == 2021).unwrap();
    busy.threads[0].not_running_for_ms = None;
    let v = roll_call(&input(procs, vec![]));
    assert_eq!(v.kind, VerdictKind::CollectiveHang, "{}", v.summary);
}

#[test]
fn a_dataloader_worker_is_called_so() {
    let mut procs = ranks_with_workers();
    let stuck = procs.iter_mut().find(|p| p.pid == 2002).unwrap();
    stuck_in_read(stuck);
    stuck.comm = Some("pt_data_worker".into());
    stuck.worker_of.as_mut().unwrap().parent_pid = 2001;
    let v = roll_call(&input(procs, vec![probe("/mnt/x", "ext4", false)]));
    let w = v.culprits[0].worker.as_ref().unwrap();
    assert_eq!(
        w.role,
        "DataLoader worker, descendant of rank 0 (parent pid 2001)"
    );
    assert!(v.summary.starts_with("rank 0's worker pid 2002 (DataLoader worker, descendant of rank 0 (parent pid 2001), node n1)"), "{}", v.summary);
}

/// Issue 25: a rank held up by one of its threads names that thread as its name, not its id.
#[test]
fn the_stuck_thread_of_a_rank_is_named() {
    let mut procs = ranks(3);
    let mut writer = thread(
        1007,
        'D',
        "percpu_rwsem_wait",
        in_call("write", 1, "/shared/ckpt.pt", "/shared", "ext4"),
    );
    writer.name = Some("ckpt-writer".into());
    procs[0].threads.push(writer);
    let v = roll_call(&input(procs, vec![probe("/shared", "ext4", false)]));
    assert_eq!(
        v.summary,
        "rank 0 (node n1, pid 1000, thread ckpt-writer) is in uninterruptible sleep (D) in write() on \
         /shared/ckpt.pt; /shared (ext4) does not respond; 2 ranks wait in barrier (rank.py)"
    );
    assert_eq!(v.culprits[0].tid, Some(1007));
    assert_eq!(v.culprits[0].thread_name.as_deref(), Some("ckpt-writer"));
}

/// Issue 25: a rank in a page fault on a mapped dataset file of a mount that does not answer: the file named in
/// the summary, the culprit and its reason.
#[test]
fn a_rank_in_a_page_fault_names_the_mapped_file_and_its_mount() {
    use hangwatch_model::{FaultFound, MappedFile, MappedFiles};
    let mut procs = ranks(4);
    let mut t = thread(
        1000,
        'D',
        "folio_wait_bit_common",
        Some(SyscallObservation::NotInSyscall { pc: Some(0x10) }),
    );
    t.kernel_stack = Some(
        [
            "folio_wait_bit_common",
            "filemap_fault",
            "__do_fault",
            "handle_mm_fault",
            "exc_page_fault",
        ]
        .map(String::from)
        .to_vec(),
    );
    procs[0].threads[0] = t;
    let file = |path: &str, mount: &str, fstype: &str, at: u64| MappedFile {
        file: FileRef {
            filesystem: None,
            path: path.into(),
            mount: Some(mount.into()),
            fstype: Some(fstype.into()),
            source: None,
        },
        ranges: vec![(at, at + 0x1000)],
        code: false,
    };
    procs[0].mapped_files = Some(MappedFiles {
        files: vec![
            file("/usr/bin/python3", "/", "ext4", 0),
            file("/data/train.arrow", "/data", "fuse.s3fs", 0x100000),
        ],
        unreadable: None,
    });
    assert_eq!(
        mounts_to_probe(&procs, WINDOW_MS),
        ["/", "/data"],
        "the stack names no filesystem: every mount it maps files from"
    );
    let v = roll_call(&input(
        procs,
        vec![probe("/", "ext4", true), probe("/data", "fuse.s3fs", false)],
    ));
    assert_eq!(v.kind, VerdictKind::BlockedInKernel);
    assert_eq!(
        v.summary,
        "rank 0 (node n1, pid 1000) is blocked reading a memory-mapped file /data/train.arrow (a page fault, in \
         uninterruptible sleep (D)); /data (fuse.s3fs) does not respond; 3 ranks wait in barrier (rank.py)"
    );
    let c = &v.culprits[0];
    assert_eq!(
        (c.path.as_deref(), c.mount.as_deref(), c.fstype.as_deref()),
        (Some("/data/train.arrow"), Some("/data"), Some("fuse.s3fs"))
    );
    assert_eq!(
        c.page_fault.as_ref().map(|f| f.found_by),
        Some(FaultFound::OnlyMapping)
    );
    assert_eq!(
        c.reason.as_deref(),
        Some(
            "in uninterruptible sleep (D) in a page fault, blocked reading a memory-mapped file /data/train.arrow, \
             waiting for the filesystem"
        )
    );
}

#[test]
fn a_rank_waiting_for_a_lock_someone_holds_is_the_culprit_even_in_an_even_split() {
    use hangwatch_model::{LockHolder, LockWait};
    let mut procs = ranks(2);
    procs[0].threads[0] = thread(
        1000,
        'S',
        "flock_lock_inode_wait",
        in_call("flock", 73, "/cache/shared.lock", "/cache", "ext4"),
    );
    procs[0].python = py(&[("do_flock", "/work/rank.py"), ("main", "/work/rank.py")]);
    procs[0].lock_waits = vec![LockWait {
        class: "FLOCK".into(),
        file: "08:01:131090".into(),
        holders: vec![LockHolder {
            pid: 4242,
            comm: Some("cache-cleaner".into()),
            in_job: false,
        }],
    }];
    let v = roll_call(&input(procs.clone(), vec![]));
    assert_eq!(v.kind, VerdictKind::Diverged, "{}", v.summary);
    assert_eq!(v.culprits.len(), 1);
    assert_eq!(v.culprits[0].rank, Some(0));
    let reason = v.culprits[0].reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("the lock (FLOCK on 08:01:131090) is held by pid 4242 (cache-cleaner), not a process of the job"),
        "{reason}"
    );
    assert_eq!(
        v.culprits[0].lock_wait.as_ref().map(|w| w.holders[0].pid),
        Some(4242)
    );
    // Without the holder known, an even split still names nobody.
    procs[0].lock_waits[0].holders.clear();
    let v = roll_call(&input(procs, vec![]));
    assert_eq!(v.kind, VerdictKind::Unknown, "{}", v.summary);
}

/// Every rank of three waits at the same line; their Flight Recorders (real gloo dumps, tests/fixtures) say what
/// /proc cannot.
fn with_recorders(case: &str, answered: &[u32]) -> hangwatch_model::NodeObservations {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/flight_recorder")
        .join(case);
    let mut obs = input(ranks(3), vec![]).to_node_observations();
    obs.collectives_asked = vec![0, 1, 2];
    obs.collectives = answered
        .iter()
        .map(|&rank| {
            let json =
                std::fs::read(dir.join(format!("rank{rank}.json"))).expect("a recorded dump");
            hangwatch_model::CollectiveRecord::from_flight_recorder_json(rank, &json, 16)
                .expect("a dump")
        })
        .collect();
    obs
}

#[test]
fn a_collective_hang_whose_recorders_name_the_odd_rank_is_diverged_on_that_rank() {
    let v = hangwatch_diagnosis::decide(
        &[with_recorders("mismatch", &[0, 1, 2])],
        &Default::default(),
    );
    assert_eq!(v.kind, VerdictKind::Diverged, "{}", v.summary);
    assert_eq!(v.culprits.len(), 1);
    assert_eq!(v.culprits[0].rank, Some(1));
    assert!(
        v.summary.starts_with(
            "rank 1 entered all_gather #6 of process group 0 ([4] float32) where ranks 0, 2 entered all_reduce #6"
        ),
        "{}",
        v.summary
    );
    assert_eq!(v.collectives.as_ref().map(|c| c.findings.len()), Some(1));
    let reason = v.culprits[0].reason.as_deref().unwrap_or_default();
    assert!(
        reason
            .contains("where its peers are too; the Flight Recorder: rank 1 entered all_gather #6"),
        "{reason}"
    );
    // The verdict JSON carries the finding.
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(json["collectives"]["findings"][0]["kind"], "mismatch");
}

#[test]
fn without_answers_from_every_rank_the_recorders_accuse_nobody_and_say_who_did_not_answer() {
    let v = hangwatch_diagnosis::decide(&[with_recorders("missing", &[0, 1])], &Default::default());
    assert_eq!(v.kind, VerdictKind::CollectiveHang, "{}", v.summary);
    assert!(v.culprits.is_empty());
    assert!(
        v.warnings
            .iter()
            .any(|w| w.starts_with("rank 2 did not return its Flight Recorder in time")),
        "{:?}",
        v.warnings
    );
    // Nobody asked: no analysis at all.
    let v = roll_call(&input(ranks(3), vec![]));
    assert!(v.collectives.is_none());
}

#[test]
fn a_rank_blocked_in_the_kernel_stays_the_culprit_and_the_recorder_says_which_collective_it_missed()
{
    let mut obs = with_recorders("missing", &[0, 1, 2]);
    obs.ranks[2].threads[0] = thread(1002, 'D', "percpu_rwsem_wait", None);
    let v = hangwatch_diagnosis::decide(&[obs], &Default::default());
    assert_eq!(v.kind, VerdictKind::BlockedInKernel, "{}", v.summary);
    assert_eq!(v.culprits[0].rank, Some(2));
    assert!(
        v.summary.contains(
            "; the Flight Recorder: rank 2 never joined all_reduce #6 of process group 0 ([20000] float32); ranks 0-1 \
             wait in it"
        ),
        "{}",
        v.summary
    );
}

/// Two nodes' observations, each with its ranks' records: the coordinator's decide analyses them together.
#[test]
fn the_recorders_of_every_node_are_analysed_together() {
    let whole = with_recorders("missing", &[0, 1, 2]);
    let mut n1 = whole.clone();
    n1.ranks.truncate(2);
    n1.collectives_asked = vec![0, 1];
    n1.collectives.truncate(2);
    let mut n2 = whole;
    n2.node = Some("n2".into());
    n2.ranks.drain(..2);
    for p in &mut n2.ranks {
        p.node = Some("n2".into());
    }
    n2.collectives_asked = vec![2];
    n2.collectives.drain(..2);
    let v = hangwatch_diagnosis::decide(&[n1, n2], &Default::default());
    assert_eq!(v.kind, VerdictKind::Diverged, "{}", v.summary);
    assert_eq!(v.culprits[0].rank, Some(2));
    assert!(
        v.summary
            .starts_with("rank 2 never joined all_reduce #6 of process group 0"),
        "{}",
        v.summary
    );
}

// ---- Issue 34, item 4: a moment is not a state ----

/// A look 250 ms after the second sample.
fn look(state: char, switched: bool) -> SecondLook {
    SecondLook {
        after_ms: 250,
        state,
        cpu_ms: Some(0),
        switched: Some(switched),
    }
}

/// Rank 2 deadlocked in `load_batch` while its peers wait in the barrier; rank 0's helper thread `prefetch` was
/// caught in D in a page fault (`folio_wait_bit_common`, in no system call) on a file it maps from /data, seen
/// again `second_look` (None: no second look was taken).
fn diverged_while_a_helper_faults(second_look: Option<SecondLook>) -> Vec<ProcessObservation> {
    use hangwatch_model::{MappedFile, MappedFiles};
    let mut procs = ranks(4);
    procs[2].threads[0] = thread(1002, 'S', "futex_wait_queue", None);
    procs[2].python = py(&[
        ("acquire", "/usr/lib/python3.11/threading.py"),
        ("load_batch", "/work/rank.py"),
    ]);
    let mut helper = thread(
        1010,
        'D',
        "folio_wait_bit_common",
        Some(SyscallObservation::NotInSyscall { pc: Some(0x10) }),
    );
    helper.name = Some("prefetch".into());
    helper.not_running_for_ms = None;
    helper.kernel_stack = Some(
        [
            "folio_wait_bit_common",
            "filemap_fault",
            "__do_fault",
            "handle_mm_fault",
            "exc_page_fault",
        ]
        .map(String::from)
        .to_vec(),
    );
    helper.second_look = second_look;
    procs[0].threads.push(helper);
    procs[0].mapped_files = Some(MappedFiles {
        files: vec![MappedFile {
            file: FileRef {
                filesystem: None,
                path: "/data/shard-0.bin".into(),
                mount: Some("/data".into()),
                fstype: Some("ext4".into()),
                source: None,
            },
            ranges: vec![(0x100000, 0x4100000)],
            code: false,
        }],
        unreadable: None,
    });
    procs
}

#[test]
fn a_helper_thread_in_d_for_a_moment_on_a_mount_that_answers_does_not_outrank_a_diverged_rank() {
    let procs = diverged_while_a_helper_faults(Some(look('S', true)));
    assert_eq!(
        mounts_to_probe(&procs, WINDOW_MS),
        ["/data"],
        "the mount of the moment's fault is still probed: its answer is part of the decision"
    );
    let v = roll_call(&input(procs, vec![probe("/data", "ext4", true)]));
    assert_eq!(v.kind, VerdictKind::Diverged, "{}", v.summary);
    assert_eq!(v.culprits.len(), 1, "{}", v.summary);
    assert_eq!(v.culprits[0].rank, Some(2));
    assert!(v.summary.contains("load_batch (rank.py)"), "{}", v.summary);
    assert!(
        v.warnings.iter().any(|w| w.starts_with(
            "rank 0: thread 1010 (prefetch) was in uninterruptible sleep (D) in folio_wait_bit_common at the roll \
             call and 250 ms later was in sleep (S)"
        )),
        "{:?}",
        v.warnings
    );
    // Back in D, but it was woken and ran in between: a new fault, the same moment.
    let v = roll_call(&input(
        diverged_while_a_helper_faults(Some(look('D', true))),
        vec![probe("/data", "ext4", true)],
    ));
    assert_eq!(
        (v.kind, v.culprits[0].rank),
        (VerdictKind::Diverged, Some(2))
    );
}

#[test]
fn a_wait_in_d_that_lasted_or_a_mount_that_does_not_answer_or_a_hung_task_report_stays_conclusive()
{
    let blocked_rank_0 = |v: &hangwatch_model::Verdict| {
        assert_eq!(v.kind, VerdictKind::BlockedInKernel, "{}", v.summary);
        assert_eq!(v.culprits[0].rank, Some(0), "{}", v.summary);
        assert_eq!(v.culprits[0].tid, Some(1010));
    };
    // Still in the same wait 250 ms later: not switched, no CPU.
    blocked_rank_0(&roll_call(&input(
        diverged_while_a_helper_faults(Some(look('D', false))),
        vec![probe("/data", "ext4", true)],
    )));
    // No second look (an agent that does not take one): the instant is all there is.
    blocked_rank_0(&roll_call(&input(
        diverged_while_a_helper_faults(None),
        vec![probe("/data", "ext4", true)],
    )));
    // Over, but the mount it faults on does not answer: a reader of a frozen mount wakes and sleeps again.
    blocked_rank_0(&roll_call(&input(
        diverged_while_a_helper_faults(Some(look('D', true))),
        vec![probe("/data", "ext4", false)],
    )));
    // Over, but the kernel reported that thread hung.
    let mut obs = input(
        diverged_while_a_helper_faults(Some(look('D', true))),
        vec![probe("/data", "ext4", true)],
    )
    .to_node_observations();
    obs.kernel_log = Some(hangwatch_kmsg::report_from_text(
        "[  967.723340] INFO: task prefetch:1010 blocked for more than 120 seconds.\n\
         [  967.723400]       Not tainted 6.1.0 #1\n\
         [  967.723410] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.\n\
         [  967.723420] task:prefetch        state:D stack:0     pid:1010  tgid:1000  ppid:1      flags:0x00000000\n\
         [  967.723430] Call Trace:\n\
         [  967.723440]  <TASK>\n\
         [  967.723450]  __schedule+0x2d0/0x8a0\n\
         [  967.723460]  io_schedule+0x46/0x70\n\
         [  967.723470]  folio_wait_bit_common+0x13d/0x350\n\
         [  967.723480]  filemap_fault+0x3c0/0x9d0\n\
         [  967.723490]  </TASK>\n",
    ));
    assert_eq!(
        obs.kernel_log.as_ref().map(|k| k.hung_tasks.len()),
        Some(1),
        "the fixture is a hung-task report"
    );
    blocked_rank_0(&hangwatch_diagnosis::decide(&[obs], &Default::default()));
}

/// The issue's own case: the Flight Recorder says who never joined; a thread caught in D for a moment elsewhere
/// does not outrank it.
#[test]
fn a_moment_in_d_does_not_outrank_the_flight_recorder_naming_who_did_not_join() {
    let mut obs = with_recorders("missing", &[0, 1, 2]);
    let mut helper = thread(
        1010,
        'D',
        "folio_wait_bit_common",
        Some(SyscallObservation::NotInSyscall { pc: Some(0x10) }),
    );
    helper.not_running_for_ms = None;
    helper.second_look = Some(look('R', true));
    obs.ranks[0].threads.push(helper.clone());
    let v = hangwatch_diagnosis::decide(&[obs.clone()], &Default::default());
    assert_eq!(v.kind, VerdictKind::Diverged, "{}", v.summary);
    assert_eq!(v.culprits.len(), 1);
    assert_eq!(v.culprits[0].rank, Some(2), "{}", v.summary);
    assert!(
        v.summary.starts_with("rank 2 never joined all_reduce #6"),
        "{}",
        v.summary
    );
    // The same thread still in D a moment later is a wait that lasts: the kernel view leads.
    obs.ranks[0].threads[1].second_look = Some(look('D', false));
    let v = hangwatch_diagnosis::decide(&[obs], &Default::default());
    assert_eq!(v.kind, VerdictKind::BlockedInKernel, "{}", v.summary);
    assert_eq!(v.culprits[0].rank, Some(0));
}

/// hangwatch's own thread in a rank (the bootstrap's `hangwatch-rank`) held in D, however long, never makes the
/// rank blocked in the kernel, nor outranks the rank that diverged (commit dd91f39 for the telling thread; here
/// for the verdict's ranking).
#[test]
fn hangwatchs_own_thread_in_d_never_makes_its_rank_the_culprit() {
    let mut procs = diverged_while_a_helper_faults(Some(look('D', false)));
    procs[0].threads[1].name = Some("hangwatch-rank".into());
    let v = roll_call(&input(procs, vec![probe("/data", "ext4", false)]));
    assert_eq!(v.kind, VerdictKind::Diverged, "{}", v.summary);
    assert_eq!(v.culprits.len(), 1);
    assert_eq!(v.culprits[0].rank, Some(2));
}

/// The flake of `system_run::deadlocked_rank_is_diverged_in_load_batch`: rank 2 waits in the barrier (a poll that
/// wakes twice a second) and was caught runnable at the instant of the second sample.
#[test]
fn a_waiting_rank_caught_runnable_for_an_instant_is_neither_busy_nor_an_odd_one_out() {
    let caught = |cpu: Option<u64>, second_look: Option<SecondLook>| {
        let mut procs = diverged_while_a_helper_faults(None);
        procs[0].threads.truncate(1);
        procs[2].threads[0] = thread(1002, 'S', "futex_wait_queue", None);
        procs[1].threads[0] = ThreadObservation {
            state: 'R',
            syscall: Some(SyscallObservation::Running),
            not_running_for_ms: None,
            cpu_ms_during_sample: cpu,
            second_look,
            ..procs[1].threads[0].clone()
        };
        roll_call(&input(procs, vec![]))
    };
    let diverged_on_rank_2 = |v: hangwatch_model::Verdict| {
        assert_eq!(v.kind, VerdictKind::Diverged, "{}", v.summary);
        assert_eq!(v.culprits.len(), 1, "{}", v.summary);
        assert_eq!(v.culprits[0].rank, Some(2));
        assert_eq!(v.groups[0].ranks, [0, 1, 3], "{:?}", v.groups);
    };
    // Charged no CPU over the window: waiting, and grouped with its peers whatever letter the instant showed.
    diverged_on_rank_2(caught(Some(0), None));
    // No CPU time known for the window (no earlier sample of it): asleep again at the second look, no CPU since.
    diverged_on_rank_2(caught(None, Some(look('S', true))));
    // On a CPU again and charged for it: it computes.
    let spinning = SecondLook {
        cpu_ms: Some(240),
        ..look('R', false)
    };
    let v = caught(None, Some(spinning));
    assert_eq!((v.kind, v.culprits[0].rank), (VerdictKind::Busy, Some(1)));
    // Without a second look the instant is all there is.
    assert_eq!(caught(None, None).kind, VerdictKind::Busy);
}
