//! hangwatch's own stdout/stderr on the filesystem that freezes (a Slurm batch script's output on GPFS): `run`
//! must still detect, end the job and exit, and keep what it could not write in the report directory.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hangwatch_testkit::{require, ChildGuard, LoopExt4};

#[test]
fn run_whose_own_output_is_on_the_frozen_mount_still_ends_the_job() {
    let fs = require!(LoopExt4::new(64));
    let report = tempfile::tempdir().unwrap();
    let out = std::fs::File::create(fs.path().join("hw.out")).unwrap();
    let err = std::fs::File::create(fs.path().join("hw.err")).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/python/rank.py");
    let log = fs.path().join("rank0.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
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
        .arg(report.path())
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
        .arg(&log)
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    let mut hw = ChildGuard::spawn(&mut command, "hangwatch run").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let frozen = require!(fs.freeze());
    let froze_at = Instant::now();
    let status = loop {
        if let Some(status) = hw.try_wait() {
            break Some(status);
        }
        if froze_at.elapsed() > Duration::from_secs(40) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.is_none() {
        drop(frozen);
        panic!("hangwatch blocked on its own output on the frozen filesystem");
    }
    assert_eq!(status.and_then(|s| s.code()), Some(75));
    eprintln!("exited {:?} after the freeze", froze_at.elapsed());
    let verdict: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.path().join("verdict.json")).unwrap())
            .unwrap();
    assert_eq!(verdict["kind"], "blocked_in_kernel");
    let saved = std::fs::read_to_string(report.path().join("hangwatch-stdout-undelivered.txt"))
        .unwrap_or_default();
    assert!(
        saved.contains("\"blocked_in_kernel\""),
        "the --json document was not kept: {saved}"
    );
    drop(frozen);
}

/// hangwatch installed on a shared filesystem (a venv on GPFS) that stops answering: its children (stack reads,
/// probes, log writers) must not be started from there, or the roll call hangs in `spawn`.
#[test]
fn run_installed_on_a_filesystem_that_stops_answering_still_ends_the_job() {
    let backing = tempfile::tempdir().unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_hangwatch"),
        backing.path().join("hangwatch"),
    )
    .unwrap();
    let fuse = require!(hangwatch_testkit::FuseMount::new(backing.path()));
    let report = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/python/rank.py");
    let log = fuse.path().join("rank0.log");
    let mut command = Command::new(fuse.path().join("hangwatch"));
    command
        .args([
            "run",
            "--nproc",
            "3",
            "--json",
            "--quiet",
            "--stall-after",
            "4s",
            "--grace",
            "1s",
            "--report-dir",
        ])
        .arg(report.path())
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
        .arg(&log)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut hw = ChildGuard::spawn(&mut command, "hangwatch run from FUSE").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let stopped = require!(fuse.stop_daemon());
    let stopped_at = Instant::now();
    let status = loop {
        if let Some(status) = hw.try_wait() {
            break Some(status);
        }
        if stopped_at.elapsed() > Duration::from_secs(40) {
            let pid = hw.pid();
            for t in std::fs::read_dir(format!("/proc/{pid}/task"))
                .unwrap()
                .flatten()
            {
                let p = t.path();
                eprintln!(
                    "DEBUG {} {} {}",
                    std::fs::read_to_string(p.join("comm"))
                        .unwrap_or_default()
                        .trim(),
                    std::fs::read_to_string(p.join("wchan")).unwrap_or_default(),
                    std::fs::read_to_string(p.join("stack"))
                        .unwrap_or_default()
                        .replace('\n', " | ")
                );
            }
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(stopped);
    let status = status
        .expect("hangwatch hung: it started a child from the filesystem that stopped answering");
    assert_eq!(status.code(), Some(75));
    let verdict: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.path().join("verdict.json")).unwrap())
            .unwrap();
    assert_eq!(verdict["kind"], "blocked_in_kernel", "{verdict:#}");
    assert_eq!(verdict["culprits"][0]["rank"], 0, "{verdict:#}");
}
