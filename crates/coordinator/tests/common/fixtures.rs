//! Recorded node observations of the incident: rank 0 on n1 in D in write() on an unresponsive /gpfs, every
//! other rank in a barrier. Shared by the component tests and the benchmark.

use hangwatch_model::{
    FileRef, NodeObservations, ProbeResult, ProcessObservation, PythonFrame, PythonThread,
    SyscallObservation, ThreadObservation,
};

pub const WINDOW_MS: u64 = 300;

fn frames(names: &[&str]) -> Option<Vec<PythonThread>> {
    Some(vec![PythonThread {
        os_tid: None,
        thread_id: 1,
        name: Some("MainThread".into()),
        frames: names
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

fn rank(node: &str, rank: u32, local_rank: u32, stuck: bool) -> ProcessObservation {
    let pid = 1000 + local_rank as i32;
    let (state, wchan, call, file, stack) = if stuck {
        (
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
            ["write", "log_step", "main"],
        )
    } else {
        (
            'S',
            "sk_wait_data",
            "recvfrom",
            FileRef {
                filesystem: None,
                path: "socket:[77]".into(),
                mount: None,
                fstype: Some("sockfs".into()),
                source: None,
            },
            ["recv_into", "barrier", "main"],
        )
    };
    ProcessObservation {
        pid,
        rank: Some(rank),
        local_rank: Some(local_rank),
        node: Some(node.into()),
        comm: Some("python3".into()),
        threads: vec![thread(pid, state, wchan, call, file)],
        python: frames(&stack),
        start_time: Some(5000),
        ..Default::default()
    }
}

/// Node `node_rank` (named `n{node_rank + 1}`) of the incident, `per_node` ranks each; global rank = node rank x
/// per_node + local rank. Node 0 holds the stuck rank 0 and sees /gpfs not answering its probe.
pub fn incident_node(node_rank: u32, per_node: u32) -> NodeObservations {
    node_as(node_rank, per_node, node_rank == 0, &node_name(node_rank))
}

/// Node `node_rank`'s ranks, every one of them in a barrier.
pub fn waiting_node(node_rank: u32, per_node: u32) -> NodeObservations {
    node_as(node_rank, per_node, false, &node_name(node_rank))
}

/// Node `node_rank`'s ranks with its first one stuck on /gpfs (as rank 0 of the incident), the observations and
/// every process claiming to be on node `claimed`: what a forging agent sends.
pub fn stuck_node_claiming(node_rank: u32, per_node: u32, claimed: &str) -> NodeObservations {
    node_as(node_rank, per_node, true, claimed)
}

fn node_as(node_rank: u32, per_node: u32, stuck: bool, name: &str) -> NodeObservations {
    let mut obs = NodeObservations::new(Some(name.to_string()), WINDOW_MS);
    obs.observed_at_unix_s = Some(1_700_000_000.0);
    obs.ranks = (0..per_node)
        .map(|l| rank(name, node_rank * per_node + l, l, stuck && l == 0))
        .collect();
    if stuck {
        obs.probes.push(ProbeResult {
            filesystem: None,
            path: "/gpfs".into(),
            mount: Some("/gpfs".into()),
            fstype: Some("gpfs".into()),
            source: None,
            responsive: Some(false),
            elapsed_ms: 1000,
            detail: "write probe did not return within 1s".into(),
            steps: vec![],
        });
    }
    obs
}

pub fn node_name(node_rank: u32) -> String {
    format!("n{}", node_rank + 1)
}
