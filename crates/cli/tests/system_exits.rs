//! System tests of "exits that cannot hang": every external program hangwatch starts (`scontrol`, `sbatch`,
//! `scancel`, an alert command's shell) is started through `hangwatch __exec`, so that finding it through a `PATH`
//! whose first directory is on a stopped filesystem (the job's venv on a frozen GPFS, here a FUSE mount whose
//! daemon is stopped) blocks only that child, which is abandoned at the deadline, never `run` itself. And what a job
//! chose (a file name with an escape sequence) reaches the reader's terminal as text.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use hangwatch_testkit::{require, wait_with_deadline, FuseMount, LoopExt4};

#[test]
fn a_stopped_filesystem_first_in_path_cannot_hold_run_under_action_requeue() {
    let backing = tempfile::tempdir().expect("backing dir");
    let fuse = require!(FuseMount::new(backing.path()));
    let report = tempfile::tempdir().expect("report dir");
    let _stopped = require!(fuse.stop_daemon());
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", fuse.path().display());
    let started = Instant::now();
    // Under Slurm with --action requeue, run asks scontrol for the previous attempt before the job starts.
    let mut child = hangwatch()
        .env("PATH", &path)
        .env("SLURM_JOB_ID", "4242424")
        .env("HANGWATCH_STATE_DIR", report.path().join("state"))
        .args(["run", "--action", "requeue", "--report-dir"])
        .arg(report.path())
        .args(["--", "/bin/true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hangwatch starts");
    let status = wait_with_deadline(&mut child, Duration::from_secs(60));
    let took = started.elapsed();
    let stderr = child
        .stderr
        .take()
        .map(|mut e| {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
            s
        })
        .unwrap_or_default();
    let Some(status) = status else {
        let _ = child.kill();
        panic!("hangwatch run is held by scontrol's exec on the stopped PATH entry ({took:?})");
    };
    assert_eq!(status.code(), Some(0), "the job itself succeeded: {stderr}");
    assert!(
        stderr.contains("scontrol") || stderr.contains("previous attempt"),
        "says that Slurm could not be asked: {stderr}"
    );
}

#[test]
fn an_escape_sequence_in_the_stuck_file_name_is_printed_as_text() {
    let fs = require!(LoopExt4::new(64));
    // Sets the terminal's title and clears the screen, if printed raw.
    let log = fs.path().join("rank0-\u{1b}]0;owned\u{7}\u{1b}[2J.log");
    let log_s = log.to_string_lossy().into_owned();
    let py = hangwatch_testkit::python().expect("python3");
    let mut run = HangwatchRun::start(
        &["--stall-after", STALL_AFTER, "--nproc", "2"],
        &rank_job(
            py,
            &["--step-time", "0.1", "--log", &log_s, "--only-rank", "0"],
        ),
    );
    wait_for_log(&mut run, &log, 20);
    let frozen = require!(fs.freeze());
    let done = run.finish(Duration::from_secs(60));
    done.assert_code(75);
    assert_eq!(
        done.culprit(0)["path"],
        log_s.as_str(),
        "the JSON keeps the name exactly"
    );
    let said: Vec<&str> = done
        .stderr
        .lines()
        .filter(|l| !l.starts_with("[rank"))
        .collect();
    assert!(
        said.iter().any(|l| l.contains("\\u{1b}]0;owned")),
        "the name is shown, escaped: {said:#?}"
    );
    assert!(
        said.iter()
            .all(|l| !l.contains('\u{1b}') && !l.contains('\u{7}')),
        "no control character reaches the terminal: {said:#?}"
    );
    frozen.thaw().expect("thaw");
}

#[test]
fn tmpdir_on_a_stopped_filesystem_cannot_hold_run() {
    let backing = tempfile::tempdir().expect("backing dir");
    let fuse = require!(FuseMount::new(backing.path()));
    let report = tempfile::tempdir().expect("report dir");
    let _stopped = require!(fuse.stop_daemon());
    let mut child = hangwatch()
        .env("TMPDIR", fuse.path())
        .env_remove("XDG_RUNTIME_DIR")
        .env("HANGWATCH_STATE_DIR", report.path().join("state"))
        .args(["run", "--report-dir"])
        .arg(report.path())
        .args(["--", "/bin/sh", "-c", "sleep 1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("hangwatch starts");
    let status = wait_with_deadline(&mut child, Duration::from_secs(30));
    if status.is_none() {
        let _ = child.kill();
    }
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "the heartbeat socket goes to a node-local directory, not TMPDIR on the stopped mount"
    );
}
