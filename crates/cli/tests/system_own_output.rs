//! `run` must not depend on the filesystems around it: its own stdout/stderr on the mount that freezes (a Slurm
//! batch script's output on GPFS), and its own binary on a filesystem that stops answering (a shared venv).

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use hangwatch_testkit::{require, ChildGuard, FuseMount, LoopExt4};

/// `hangwatch run` on the incident: 3 ranks, rank 0 logging to `log`, a 4 s threshold.
fn incident(program: &Path, report: &Path, log: &Path) -> Command {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/python/rank.py");
    let mut command = Command::new(program);
    command
        .args([
            "run",
            "--nproc",
            "3",
            "--json",
            "--stall-after",
            "4s",
            "--grace",
            "1s",
            "--report-dir",
        ])
        .arg(report)
        .args([
            "--",
            "python3",
            script,
            "--step-time",
            "0.1",
            "--only-rank",
            "0",
            "--log",
        ])
        .arg(log);
    command
}

/// Waits for hangwatch to exit; on a hang, prints where its threads are (to say what it blocked on) and `None`.
fn wait_exit(hw: &mut ChildGuard, limit: Duration) -> Option<ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(status) = hw.try_wait() {
            eprintln!(
                "hangwatch exited {:?} after the filesystem stopped",
                started.elapsed()
            );
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for task in std::fs::read_dir(format!("/proc/{}/task", hw.pid()))
        .into_iter()
        .flatten()
        .flatten()
    {
        let read = |name: &str| std::fs::read_to_string(task.path().join(name)).unwrap_or_default();
        eprintln!(
            "thread {} in {}: {}",
            read("comm").trim(),
            read("wchan"),
            read("stack").replace('\n', " | ")
        );
    }
    None
}

fn verdict(report: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(report.join("verdict.json"))
        .expect("verdict.json in the report directory");
    serde_json::from_str(&text).expect("verdict.json is JSON")
}

#[test]
fn run_whose_own_output_is_on_the_frozen_mount_still_ends_the_job() {
    let fs = require!(LoopExt4::new(64));
    let report = tempfile::tempdir().unwrap();
    let mut command = incident(
        Path::new(env!("CARGO_BIN_EXE_hangwatch")),
        report.path(),
        &fs.path().join("rank0.log"),
    );
    command
        .stdout(Stdio::from(
            std::fs::File::create(fs.path().join("hw.out")).unwrap(),
        ))
        .stderr(Stdio::from(
            std::fs::File::create(fs.path().join("hw.err")).unwrap(),
        ));
    let mut hw = ChildGuard::spawn(&mut command, "hangwatch run").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let frozen = require!(fs.freeze());
    let status = wait_exit(&mut hw, Duration::from_secs(40));
    drop(frozen);
    let status = status.expect("hangwatch blocked on its own output on the frozen filesystem");
    assert_eq!(status.code(), Some(75));
    assert_eq!(verdict(report.path())["kind"], "blocked_in_kernel");
    let saved = std::fs::read_to_string(report.path().join("hangwatch-stdout-undelivered.txt"))
        .unwrap_or_default();
    assert!(
        saved.contains("\"blocked_in_kernel\""),
        "the --json document was not kept: {saved}"
    );
}

/// hangwatch installed on a shared filesystem (a venv on GPFS) that stops answering: its children (stack reads,
/// probes, log writers) must not be started from there, nor its code paged in from there, or the roll call hangs.
#[test]
fn run_installed_on_a_filesystem_that_stops_answering_still_ends_the_job() {
    let backing = tempfile::tempdir().unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_hangwatch"),
        backing.path().join("hangwatch"),
    )
    .unwrap();
    let fuse = require!(FuseMount::new(backing.path()));
    let report = tempfile::tempdir().unwrap();
    let mut command = incident(
        &fuse.path().join("hangwatch"),
        report.path(),
        &fuse.path().join("rank0.log"),
    );
    command.stdout(Stdio::null()).stderr(Stdio::null());
    let mut hw = ChildGuard::spawn(&mut command, "hangwatch run from FUSE").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let stopped = require!(fuse.stop_daemon());
    let status = wait_exit(&mut hw, Duration::from_secs(40));
    drop(stopped);
    let status = status.expect("hangwatch hung on the filesystem its binary lives on");
    assert_eq!(status.code(), Some(75));
    let v = verdict(report.path());
    assert_eq!(v["kind"], "blocked_in_kernel", "{v:#}");
    assert_eq!(v["culprits"][0]["rank"], 0, "{v:#}");
}
