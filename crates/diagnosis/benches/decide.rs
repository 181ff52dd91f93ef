//! Deciding one verdict from recorded observations of a whole job: 128 x 8 and 1,250 x 8 ranks (10,000 GPUs), the
//! incident (rank 0 on n1 in D in write() on an unresponsive /gpfs) and everyone else in a barrier. Prints the
//! time to verdict, the bytes of one node's serialized observations, and the time to parse them all.
//!
//! Run with `cargo bench -p hangwatch-diagnosis --bench decide`.

use std::time::{Duration, Instant};

use hangwatch_diagnosis::{decide, DecideOptions};
use hangwatch_model::{
    FileRef, NodeObservations, ProbeResult, ProcessObservation, PythonFrame, PythonThread,
    SyscallObservation, ThreadObservation, VerdictKind, WorkerOf,
};

const WINDOW_MS: u64 = 300;
const RANKS_PER_NODE: u32 = 8;
/// A PyTorch rank with NCCL, a pin-memory thread and autograd workers has a few dozen threads.
const THREADS_PER_RANK: i32 = 24;
const WORKERS_PER_RANK: i32 = 2;
const RUNS: u32 = 5;

fn file(path: &str, mount: Option<&str>, fstype: &str) -> FileRef {
    FileRef {
        filesystem: None,
        path: path.into(),
        mount: mount.map(Into::into),
        fstype: Some(fstype.into()),
        source: None,
    }
}

fn thread(
    tid: i32,
    state: char,
    wchan: &str,
    call: &str,
    nr: i64,
    on: FileRef,
) -> ThreadObservation {
    ThreadObservation {
        tid,
        name: Some(format!("pt_thread_{}", tid % 100)),
        state,
        wchan: Some(wchan.into()),
        syscall: Some(SyscallObservation::InSyscall {
            nr,
            name: Some(call.into()),
            args: vec![3, 140_000_000_000, 4096, 0, 0, 0],
            fd: Some(3),
            file: Some(on),
            path: None,
        }),
        kernel_stack: Some(
            [
                "futex_wait_queue",
                "futex_wait",
                "do_futex",
                "__x64_sys_futex",
                "do_syscall_64",
            ]
            .map(String::from)
            .to_vec(),
        ),
        voluntary_ctxt_switches: Some(123_456),
        nonvoluntary_ctxt_switches: Some(789),
        not_running_for_ms: Some(WINDOW_MS),
        cpu_ms_during_sample: Some(0),
        cpu_ms_total: Some(3_600_000),
        sigkill_pending: false,
        second_look: None,
    }
}

fn python_stack(innermost: &str) -> Option<Vec<PythonThread>> {
    let mut frames = vec![PythonFrame {
        function: innermost.into(),
        filename: "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
            .into(),
        line: 3696,
    }];
    for depth in 0..24 {
        frames.push(PythonFrame {
            function: format!("forward_{depth}").into(),
            filename:
                "/opt/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py"
                    .into(),
            line: 100 + depth,
        });
    }
    Some(vec![PythonThread {
        os_tid: None,
        thread_id: 140_000_000_000,
        name: Some("MainThread".into()),
        frames,
    }])
}

fn rank(node: &str, rank: u32, local: u32, stuck: bool) -> Vec<ProcessObservation> {
    let pid = 40_000 + local as i32 * 100;
    let socket = || file("socket:[123456]", None, "sockfs");
    let mut threads: Vec<ThreadObservation> = (0..THREADS_PER_RANK)
        .map(|i| thread(pid + i, 'S', "futex_wait_queue", "futex", 202, socket()))
        .collect();
    threads[0] = if stuck {
        thread(
            pid,
            'D',
            "percpu_rwsem_wait",
            "write",
            1,
            file("/gpfs/run/log.txt", Some("/gpfs"), "gpfs"),
        )
    } else {
        thread(pid, 'S', "sk_wait_data", "recvfrom", 45, socket())
    };
    let mut out = vec![ProcessObservation {
        pid,
        rank: Some(rank),
        local_rank: Some(local),
        node: Some(node.into()),
        comm: Some("python3".into()),
        threads,
        python: python_stack(if stuck { "write" } else { "barrier" }),
        start_time: Some(123_456_789),
        ..Default::default()
    }];
    for w in 0..WORKERS_PER_RANK {
        let wpid = pid + 50 + w;
        out.push(ProcessObservation {
            pid: wpid,
            node: Some(node.into()),
            comm: Some("pt_data_worker".into()),
            threads: (0..2)
                .map(|i| thread(wpid + i, 'S', "futex_wait_queue", "futex", 202, socket()))
                .collect(),
            start_time: Some(123_456_999),
            worker_of: Some(WorkerOf {
                rank_pid: pid,
                rank: Some(rank),
                rank_source: None,
                parent_pid: pid,
            }),
            ..Default::default()
        });
    }
    out
}

fn job(nodes: u32) -> Vec<NodeObservations> {
    (0..nodes)
        .map(|n| {
            let name = format!("node{n:04}");
            let mut obs = NodeObservations::new(Some(name.clone()), WINDOW_MS);
            obs.observed_at_unix_s = Some(1_700_000_000.0);
            for local in 0..RANKS_PER_NODE {
                for p in rank(
                    &name,
                    n * RANKS_PER_NODE + local,
                    local,
                    n == 0 && local == 0,
                ) {
                    match p.worker_of {
                        None => obs.ranks.push(p),
                        Some(_) => obs.workers.push(p),
                    }
                }
            }
            if n == 0 {
                obs.probes.push(ProbeResult {
                    filesystem: None,
                    path: "/gpfs".into(),
                    mount: Some("/gpfs".into()),
                    fstype: Some("gpfs".into()),
                    source: Some("gpfs0".into()),
                    responsive: Some(false),
                    elapsed_ms: 1000,
                    detail: "write probe did not return within 1s".into(),
                    steps: vec![],
                });
            }
            obs
        })
        .collect()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    println!("deciding from recorded observations ({RANKS_PER_NODE} ranks/node, {THREADS_PER_RANK} threads/rank, {WORKERS_PER_RANK} workers/rank), median of {RUNS}");
    for nodes in [128u32, 1250] {
        let job = job(nodes);
        let wire: Vec<Vec<u8>> = job
            .iter()
            .map(|n| serde_json::to_vec(n).expect("observations serialize"))
            .collect();
        let bytes = wire.iter().map(Vec::len).sum::<usize>();
        let options = DecideOptions {
            stalled_for_s: Some(30.0),
            expected_nodes: job.iter().filter_map(|n| n.node.clone()).collect(),
            answered_late: Vec::new(),
        };
        let mut parse = Vec::new();
        let mut decided = Vec::new();
        let mut verdict = None;
        for _ in 0..RUNS {
            let started = Instant::now();
            let parsed: Vec<NodeObservations> = wire
                .iter()
                .map(|b| serde_json::from_slice(b).expect("observations parse"))
                .collect();
            parse.push(started.elapsed());
            let started = Instant::now();
            verdict = Some(decide(&parsed, &options));
            decided.push(started.elapsed());
        }
        let verdict = verdict.expect("at least one run");
        assert_eq!(
            verdict.kind,
            VerdictKind::BlockedInKernel,
            "{}",
            verdict.summary
        );
        assert_eq!(verdict.culprits[0].node.as_deref(), Some("node0000"));
        let verdict_bytes = serde_json::to_vec(&verdict).map_or(0, |v| v.len());
        println!(
            "{nodes:>5} nodes x {RANKS_PER_NODE} = {:>6} ranks: decide {:>8.1} ms, parse all observations {:>8.1} ms; \
             {:>7} bytes per node's observations (JSON), verdict {} bytes",
            nodes * RANKS_PER_NODE,
            median(decided).as_secs_f64() * 1e3,
            median(parse).as_secs_f64() * 1e3,
            bytes / job.len(),
            verdict_bytes,
        );
        println!("      summary: {}", verdict.summary);
    }
}
