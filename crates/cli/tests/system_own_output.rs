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
