//! System tests of a rank that dies: OOM-killed in a small memory cgroup (two torch gloo ranks), a segfault, an
//! exception. Real processes and a real cgroup; the verdict must say which rank died and how, and the job's own
//! exit status must come through when the job ends by itself.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use hangwatch_testkit::{python, require, torch_python, MemoryCgroup};

/// A job script in a directory of its own, removed with the test.
fn script(body: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a directory for the job script");
    let path = dir.path().join("job.py");
    std::fs::write(&path, body).expect("the job script is written");
    (dir, path)
}

fn job(python: &Path, script: &Path) -> Vec<String> {
    vec![
        python.to_string_lossy().into_owned(),
        script.to_string_lossy().into_owned(),
    ]
}

/// Rank 1 moves itself into the cgroup once the group is up (what torch loaded is charged where it was) and
/// allocates until the kernel kills it; rank 0 waits for it in all_reduce, and fails when its peer's connection
/// goes.
const OOM_JOB: &str = r#"
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 1:
    with open(os.path.join(os.environ["HW_TEST_CGROUP"], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    print("rank 1 allocating", flush=True)
    hold = []
    while True:
        hold.append(torch.ones(16 * 2**20))
        time.sleep(0.02)
print("rank 0 waits in all_reduce", flush=True)
dist.all_reduce(torch.ones(4))
print("all_reduce returned", flush=True)
"#;

#[test]
fn a_rank_oom_killed_in_its_memory_cgroup_is_named_with_the_cgroup_and_its_limit() {
    let py = require!(torch_python());
    let cgroup = require!(MemoryCgroup::new(200 << 20));
    let (_dir, path) = script(OOM_JOB);
    let mut cmd = hangwatch();
    cmd.env("HW_TEST_CGROUP", cgroup.dir());
    let mut run = HangwatchRun::start_in(cmd, &["--nproc", "2", "--quiet"], &job(py, &path));
    let done = run.finish(Duration::from_secs(50));

    let v = &done.json;
    assert_eq!(v["kind"], "exited", "{}", done.describe());
    let c = &v["culprits"][0];
    assert_eq!(
        c["rank"],
        1,
        "the rank that died first: {}",
        done.describe()
    );
    let death = &c["death"];
    assert_eq!(death["oom_killed"], true, "{death:#}");
    assert_eq!(death["signal"], 9);
    assert_eq!(death["signal_name"], "SIGKILL");
    assert_eq!(death["memory_cgroup"], cgroup.name(), "{death:#}");
    assert_eq!(death["memory_limit_bytes"], 200u64 << 20);
    assert_eq!(death["memory_limit"], "200 MiB");
    let summary = v["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(&format!(
            "rank 1 (node {}, pid {}) was killed by the kernel's OOM killer (memory cgroup {}, limit 200 MiB)",
            c["node"].as_str().unwrap_or_default(),
            c["pid"],
            cgroup.name()
        )),
        "{summary}"
    );
    assert!(
        death["oom_evidence"].as_array().is_some_and(|e| e
            .iter()
            .any(|l| l.as_str().unwrap_or("").contains("Killed process"))),
        "the kernel log's line is the evidence: {death:#}"
    );
    // The job ended by itself (rank 0 failed when its peer vanished): its own status, 128 + SIGKILL.
    done.assert_code(137);
    assert_eq!(v["exit_code"], 137);
    let saved =
        std::fs::read_to_string(done.report_dir.join("verdict.json")).expect("verdict.json");
    assert!(saved.contains("\"oom_killed\": true"), "{saved}");
    assert!(
        done.stderr.contains("killed by the kernel's OOM killer"),
        "{}",
        done.describe()
    );
}

#[test]
fn a_rank_that_segfaults_is_named_with_its_signal_and_the_job_status_comes_through() {
    let py = require!(python());
    let (_dir, path) = script(
        r#"
import os, time, ctypes
if os.environ["RANK"] == "1":
    time.sleep(0.3)
    ctypes.string_at(0)
time.sleep(1.5)
raise SystemExit(1)
"#,
    );
    let mut run = HangwatchRun::start(&["--nproc", "2", "--quiet"], &job(py, &path));
    let done = run.finish(Duration::from_secs(30));
    done.assert_code(139);
    let v = &done.json;
    assert_eq!(v["kind"], "exited", "{}", done.describe());
    let c = &v["culprits"][0];
    assert_eq!(c["rank"], 1, "{}", done.describe());
    assert_eq!(c["exit_code"], 139);
    assert_eq!(c["death"]["signal"], 11);
    assert_eq!(c["death"]["signal_name"], "SIGSEGV");
    assert_eq!(c["death"]["oom_killed"], false);
    assert!(
        v["summary"].as_str().is_some_and(
            |s| s.contains("died of SIGSEGV") && s.contains("1 more rank exited after it")
        ),
        "{}",
        done.describe()
    );
    let files = std::fs::read_dir(&done.report_dir)
        .expect("the report directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect::<Vec<_>>();
    for wanted in ["verdict.json", "verdict.txt", "ranks.json", "run.json"] {
        assert!(files.iter().any(|f| f == wanted), "{wanted} in {files:?}");
    }
}

#[test]
fn a_rank_that_raises_while_its_peer_waits_is_named_with_its_exception_and_last_lines() {
    let py = require!(python());
    let (_dir, path) = script(
        r#"
import os, time
if os.environ["RANK"] == "1":
    print("step 1", flush=True)
    def train():
        raise RuntimeError("boom")
    train()
time.sleep(60)
"#,
    );
    // The peer never ends: the failed rank's grace (half of --stall-after) passes, the job is ended (75).
    let mut run = HangwatchRun::start(
        &["--nproc", "2", "--stall-after", STALL_AFTER, "--quiet"],
        &job(py, &path),
    );
    let done = run.finish(Duration::from_secs(40));
    done.assert_code(75);
    let v = &done.json;
    assert_eq!(v["kind"], "exited", "{}", done.describe());
    let c = done.culprit(1);
    let death = &c["death"];
    assert_eq!(death["exit_code"], 1);
    assert_eq!(death["exception"], "RuntimeError: boom");
    let tail: Vec<&str> = death["output_tail"]
        .as_array()
        .map(|t| t.iter().filter_map(|l| l.as_str()).collect())
        .unwrap_or_default();
    // stdout and stderr are two pipes, read apart: "step 1" may arrive among the traceback's lines.
    assert!(tail.contains(&"step 1"), "{death:#}");
    // Only the order within one pipe is known: the traceback comes before its exception line, and the exception is
    // stderr's last line ("step 1" from stdout may land after it: CI once saw exactly that).
    let traceback = tail
        .iter()
        .position(|l| *l == "Traceback (most recent call last):");
    let exception = tail.iter().rposition(|l| *l == "RuntimeError: boom");
    assert!(
        matches!((traceback, exception), (Some(t), Some(e)) if t < e),
        "{tail:?}"
    );
    let after_exception = exception.map_or(&[][..], |e| &tail[e + 1..]);
    assert!(
        after_exception.iter().all(|l| *l == "step 1"),
        "only stdout's line may follow the exception: {tail:?}"
    );
    assert!(
        v["summary"]
            .as_str()
            .is_some_and(|s| s.contains("exited with code 1: RuntimeError: boom; 1 rank waits in")),
        "{}",
        done.describe()
    );
}
