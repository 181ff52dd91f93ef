//! `hangwatch run --attach PID...`: watching a job that is already running and that hangwatch did not start (what
//! a node service does with every Slurm step). Real ranks started by the test, a really frozen ext4 under rank 0's
//! log: the writer is named and the job ended as `--action` says; a hangwatch that is told to stop, or killed,
//! leaves the job running.

mod common;

use std::time::Duration;

use common::*;
use hangwatch_testkit::{require, wait_until, LoopExt4, RankGroup};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn attach_flags(ranks: &RankGroup) -> Vec<String> {
    ranks
        .pids()
        .into_iter()
        .flat_map(|pid| ["--attach".to_string(), pid.to_string()])
        .collect()
}

/// Running (a zombie is dead: the ranks are the test's children, reaped only when the group is dropped).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.split_whitespace().next().map(|state| state != "Z")
        })
        .unwrap_or(false)
}

#[test]
fn a_running_job_is_watched_from_outside_its_frozen_writer_named_and_the_job_ended() {
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let ranks = RankGroup::builder(2)
        .step_time(Duration::from_millis(100))
        .log(0, &log)
        .spawn()
        .expect("two ranks");
    assert!(
        wait_until(Duration::from_secs(30), POLL, || lines_in(&log) >= 3),
        "rank 0 never logged"
    );
    let mut flags = attach_flags(&ranks);
    flags.extend(["--stall-after".into(), STALL_AFTER.into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut run = HangwatchRun::start(&flags, &[]);
    // Watching: rank numbers from the ranks' own environment.
    std::thread::sleep(Duration::from_secs(2));
    assert!(run.running(), "{}", run.stderr_text());
    let frozen = require!(fs.freeze());
    let done = run.finish(Duration::from_secs(60));
    drop(frozen);
    done.assert_code(75);
    let culprit = done.culprit(0);
    assert_eq!(culprit["syscall"], "write", "{}", done.describe());
    assert_eq!(culprit["state"], "D", "{}", done.describe());
    assert_eq!(culprit["rank_source"], "env:RANK", "{}", done.describe());
    // --action abort (the default) ended the job it did not start.
    assert!(
        wait_until(Duration::from_secs(20), POLL, || ranks
            .pids()
            .into_iter()
            .all(|p| !alive(p))),
        "the watched ranks outlived the verdict: {}",
        done.describe()
    );
}

#[test]
fn a_watch_that_is_told_to_stop_or_killed_leaves_the_job_running() {
    let ranks = RankGroup::builder(2)
        .step_time(Duration::from_millis(100))
        .spawn()
        .expect("two ranks");
    ranks
        .wait_for_line(1, "step 3", Duration::from_secs(30))
        .expect("rank 1 steps");
    for signal in [Signal::SIGTERM, Signal::SIGKILL] {
        let flags = attach_flags(&ranks);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let mut run = HangwatchRun::start(&flags, &[]);
        std::thread::sleep(Duration::from_secs(2));
        assert!(run.running(), "{}", run.stderr_text());
        kill(Pid::from_raw(run.pid() as i32), signal).expect("signal hangwatch");
        let done = run.finish(Duration::from_secs(20));
        if signal == Signal::SIGTERM {
            assert!(
                done.stderr.contains("no longer watching"),
                "says it leaves the job: {}",
                done.stderr
            );
        }
        let before = ranks.last_step(1).unwrap_or(0);
        assert!(
            wait_until(Duration::from_secs(10), POLL, || ranks
                .last_step(1)
                .unwrap_or(0)
                >= before + 5),
            "after {signal:?} to hangwatch the job no longer steps (stuck at {before}): {}",
            done.stderr
        );
        assert!(ranks.pids().into_iter().all(alive));
    }
}

#[test]
fn a_pid_that_is_not_running_is_refused_with_what_to_give() {
    let out = hangwatch()
        .args(["run", "--attach", "999999999"])
        .output()
        .expect("hangwatch runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--attach 999999999: no such process here"),
        "{stderr}"
    );
}

/// The beat socket is bound and removed by the watch itself: never on a filesystem that can stop.
#[test]
fn a_beat_socket_on_a_fuse_mount_is_refused_with_where_to_put_it() {
    let backing = tempfile::tempdir().expect("tempdir");
    let fuse = require!(hangwatch_testkit::FuseMount::new(backing.path()));
    let socket = fuse.path().join("step.sock");
    let pid = std::process::id().to_string();
    let out = hangwatch()
        .args(["run", "--attach", &pid, "--beat-socket"])
        .arg(&socket)
        .output()
        .expect("hangwatch runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is on a network or FUSE filesystem") && stderr.contains("node-local"),
        "{stderr}"
    );
    assert!(!socket.exists(), "nothing was bound there");
}

#[test]
fn a_watched_tree_without_a_rank_is_never_judged_hung() {
    // A batch script waiting for its srun step: a shell and a sleep, no rank variable, silent for long.
    let mut shell = std::process::Command::new("sh");
    shell
        .args(["-c", "sleep 120"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut shell, 0);
    let mut script = shell.spawn().expect("a shell");
    let pid = script.id().to_string();
    let mut run = HangwatchRun::start(&["--attach", &pid, "--stall-after", "2s"], &[]);
    std::thread::sleep(Duration::from_secs(10));
    let still_watching = run.running();
    let stderr = run.stderr_text();
    kill(Pid::from_raw(run.pid() as i32), Signal::SIGTERM).expect("signal hangwatch");
    let done = run.finish(Duration::from_secs(20));
    let alive_after = alive(script.id());
    // The shell and its sleep: the group the test made for them.
    let _ = nix::sys::signal::killpg(Pid::from_raw(script.id() as i32), Signal::SIGKILL);
    let _ = script.wait();
    assert!(
        still_watching,
        "a silent tree without ranks was judged: {stderr}"
    );
    assert!(!done.stderr.contains("roll call"), "{}", done.stderr);
    assert!(alive_after, "the shell was ended: {}", done.stderr);
}
