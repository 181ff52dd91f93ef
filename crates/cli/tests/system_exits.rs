//! System tests of "exits that cannot hang": every external program hangwatch starts (`scontrol`, `sbatch`,
//! `scancel`, an alert command's shell) is started through `hangwatch __exec`, so that finding it through a `PATH`
//! whose first directory is on a stopped filesystem (the job's venv on a frozen GPFS, here a FUSE mount whose
//! daemon is stopped) blocks only that child, which is abandoned at the deadline, never `run` itself.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use hangwatch_testkit::{require, wait_with_deadline, FuseMount};

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
