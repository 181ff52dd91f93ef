//! System tests of how `hangwatch run` itself starts, is stopped and dies: Slurm's signals on a stuck job (evidence
//! first, then the job ended within its deadlines), hangwatch killed with SIGKILL (no process of the job outlives
//! it), processes that outlive their rank, a stderr nobody reads, a report directory on a frozen filesystem.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use hangwatch_testkit::{
    is_dead, process_state, python, require, send, wait_until, ChildGuard, LoopExt4,
};
use nix::sys::signal::Signal;
use serde_json::Value;

/// Pids printed by the job as `child PID` lines (the job's output is mirrored on hangwatch's stderr).
fn printed_children(run: &HangwatchRun) -> Vec<u32> {
    run.stderr_text()
        .lines()
        .filter_map(|l| l.rsplit_once("child ")?.1.trim().parse().ok())
        .collect()
}

#[test]
fn sigterm_on_a_stuck_job_keeps_the_evidence_then_ends_it_within_the_grace() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let log_s = log.to_string_lossy().into_owned();
    // A threshold far away: only the signal can end this job.
    let mut run = HangwatchRun::start(
        &["--nproc", "4", "--stall-after", "5m", "--quiet"],
        &rank_job(
            py,
            &["--step-time", "0.1", "--log", &log_s, "--only-rank", "0"],
        ),
    );
    assert!(
        wait_until(Duration::from_secs(30), POLL, || lines_in(&log) >= 5),
        "rank 0 never logged 5 steps:\n{}",
        run.stderr_text()
    );
    run.track_descendants();
    let frozen = require!(fs.freeze());
    // Longer than the job's usual step (0.1 s): it is stuck, not between steps.
    std::thread::sleep(Duration::from_secs(3));
    send(run.pid(), Signal::SIGTERM).expect("signal hangwatch");
    let sent = Instant::now();
    let done = run.finish(Duration::from_secs(30));
    let took = sent.elapsed();
    eprintln!(
        "SIGTERM on a stuck job -> hangwatch exit: {:.2}s (grace 2s)",
        took.as_secs_f64()
    );
    done.assert_code(143);
    assert!(
        took < Duration::from_secs(20),
        "Slurm's KillWait is 30 s: {}",
        done.describe()
    );
    assert!(
        done.stderr.contains("keeping the evidence first"),
        "{}",
        done.describe()
    );
    let saved: Value = serde_json::from_str(
        &std::fs::read_to_string(done.report_dir.join("verdict.json")).expect("verdict.json"),
    )
    .expect("verdict.json is JSON");
    assert_eq!(saved["kind"], "blocked_in_kernel", "{saved:#}");
    assert_eq!(saved["culprits"][0]["rank"], 0, "{saved:#}");
    assert_eq!(saved["culprits"][0]["syscall"], "write", "{saved:#}");
    assert!(
        saved["actions"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["action"] == "unkillable")),
        "rank 0 is in D and must be reported unkillable: {saved:#}"
    );
    assert_eq!(done.json["exit_code"], 143, "{}", done.describe());
    let rank0 = saved["culprits"][0]["pid"].as_u64().expect("culprit pid") as u32;
    let peers: Vec<u32> = done
        .rank_pids()
        .into_iter()
        .filter(|(rank, _)| *rank != 0)
        .map(|(_, pid)| pid)
        .collect();
    assert_all_dead(peers, "ranks 1-3");
    frozen.thaw().expect("thaw");
    assert!(
        wait_until(Duration::from_secs(5), POLL, || is_dead(rank0)),
        "rank 0 (pid {rank0}) did not die after the thaw (state {:?})",
        process_state(rank0)
    );
}

#[test]
fn a_second_signal_kills_the_job_at_once() {
    let py = require!(python());
    // Ranks that ignore SIGTERM: only SIGKILL ends them.
    let job = vec![
        py.to_string_lossy().into_owned(),
        "-c".into(),
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n\
         while True:\n    time.sleep(0.1)\n    print('step', flush=True)"
            .into(),
    ];
    let mut run = HangwatchRun::start(
        &["--nproc", "2", "--stall-after", "5m", "--grace", "30s"],
        &job,
    );
    assert!(run.wait_for_stderr(Duration::from_secs(30), |l| l.ends_with("step")));
    send(run.pid(), Signal::SIGTERM).expect("first signal");
    assert!(run.wait_for_stderr(Duration::from_secs(5), |l| l
        .contains("passing signal 15 on")));
    std::thread::sleep(Duration::from_millis(500));
    send(run.pid(), Signal::SIGTERM).expect("second signal");
    let sent = Instant::now();
    let done = run.finish(Duration::from_secs(15));
    done.assert_code(143);
    assert!(
        sent.elapsed() < Duration::from_secs(8),
        "the second signal must not wait for the 30 s grace: {}",
        done.describe()
    );
    assert!(done.stderr.contains("second signal"), "{}", done.describe());
}

#[test]
fn no_process_of_the_job_outlives_a_killed_hangwatch() {
    // Each rank leaves a grandchild in its process group (a DataLoader worker, say) and sleeps.
    let job: Vec<String> = ["sh", "-c", "sleep 1000 & echo child $!; exec sleep 1000"]
        .map(String::from)
        .to_vec();
    let mut run = HangwatchRun::start(&["--nproc", "2", "--stall-after", "5m"], &job);
    assert!(
        wait_until(Duration::from_secs(20), POLL, || printed_children(&run)
            .len()
            == 2),
        "{}",
        run.stderr_text()
    );
    run.track_descendants();
    let job_pids: Vec<u32> = descendants(run.pid())
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep")
        })
        .collect();
    assert_eq!(job_pids.len(), 4, "2 ranks and their 2 children");
    send(run.pid(), Signal::SIGKILL).expect("kill hangwatch");
    let gone = wait_until(Duration::from_secs(5), POLL, || {
        job_pids.iter().all(|&p| is_dead(p))
    });
    let left: Vec<u32> = job_pids.iter().copied().filter(|&p| !is_dead(p)).collect();
    assert!(gone, "processes of the job outlived hangwatch: {left:?}");
}

#[test]
fn processes_that_outlive_their_rank_end_with_the_job() {
    let job: Vec<String> = ["sh", "-c", "sleep 1000 & echo child $!; sleep 0.5"]
        .map(String::from)
        .to_vec();
    let mut run = HangwatchRun::start(&["--nproc", "1"], &job);
    assert!(
        wait_until(Duration::from_secs(20), POLL, || !printed_children(&run)
            .is_empty()),
        "{}",
        run.stderr_text()
    );
    let child = printed_children(&run)[0];
    run.remember(child);
    let done = run.finish(Duration::from_secs(15));
    done.assert_code(0);
    assert!(
        wait_until(Duration::from_secs(2), POLL, || is_dead(child)),
        "the rank's child {child} outlived the job (state {:?})",
        process_state(child)
    );
}

#[test]
fn a_stderr_nobody_reads_never_keeps_the_hang_from_being_caught() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let report = tempfile::tempdir().expect("report dir");
    // hangwatch's stderr is a pipe whose reader reads nothing: the job's output mirrored there fills it at once.
    let mut hangwatch = incident_run(
        report.path(),
        &["--nproc", "4"],
        rank_job(
            py,
            &[
                "--step-time",
                "0.05",
                "--log",
                &log.to_string_lossy(),
                "--only-rank",
                "0",
            ],
        ),
    );
    let mut guard = ChildGuard::spawn(&mut hangwatch, "hangwatch run").expect("hangwatch starts");
    let stderr_unread = guard.child_mut().stderr.take();
    let stdout = read_in_background(guard.child_mut().stdout.take());
    assert!(
        wait_until(Duration::from_secs(30), POLL, || lines_in(&log) >= 50),
        "rank 0 never logged"
    );
    let frozen = require!(fs.freeze());
    let status = hangwatch_testkit::wait_with_deadline(guard.child_mut(), Duration::from_secs(40));
    let stdout = collected(&stdout);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(75),
        "hangwatch did not end the hung job while its stderr was not read; stdout:\n{stdout}"
    );
    let verdict: Value = serde_json::from_str(&stdout).expect("the verdict on stdout");
    assert_eq!(verdict["culprits"][0]["rank"], 0, "{verdict:#}");
    drop(stderr_unread);
    drop(frozen);
}

#[test]
fn a_report_directory_on_a_frozen_filesystem_costs_a_warning_not_the_verdict() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let report = fs.path().join("report");
    let output_log = tempfile::NamedTempFile::new().expect("log file");
    let log_file = output_log.path().to_string_lossy().into_owned();
    let mut hangwatch = incident_run(
        &report,
        &["--nproc", "3", "--quiet", "--log-file", &log_file],
        rank_job(
            py,
            &[
                "--step-time",
                "0.1",
                "--log",
                &log.to_string_lossy(),
                "--only-rank",
                "0",
            ],
        ),
    );
    let mut guard = ChildGuard::spawn(&mut hangwatch, "hangwatch run").expect("hangwatch starts");
    let stderr_lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    if let Some(err) = guard.child_mut().stderr.take() {
        let into = std::sync::Arc::clone(&stderr_lines);
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                lock(&into).push(line);
            }
        });
    }
    assert!(
        wait_until(Duration::from_secs(30), POLL, || lines_in(&log) >= 5),
        "rank 0 never logged"
    );
    let stdout = read_in_background(guard.child_mut().stdout.take());
    let frozen = require!(fs.freeze());
    let status = hangwatch_testkit::wait_with_deadline(guard.child_mut(), Duration::from_secs(45));
    let stdout = collected(&stdout);
    let stderr = lock(&stderr_lines).join("\n");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(75),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let verdict: Value = serde_json::from_str(&stdout).expect("the verdict on stdout");
    assert_eq!(verdict["kind"], "blocked_in_kernel", "{verdict:#}");
    assert!(
        stderr.contains("did not answer within"),
        "a warning names the frozen report directory:\n{stderr}"
    );
    frozen.thaw().expect("thaw");
}

/// `hangwatch run --report-dir DIR --json --grace 2s --stall-after 4s FLAGS -- JOB`, every stream piped, for the
/// tests that watch hangwatch's own streams rather than go through the harness.
fn incident_run(report: &std::path::Path, flags: &[&str], job: Vec<String>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
    command
        .arg("run")
        .arg("--report-dir")
        .arg(report)
        .args(["--json", "--grace", "2s", "--stall-after", "4s"])
        .args(flags)
        .arg("--")
        .args(job)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

type Collected = std::sync::Arc<std::sync::Mutex<Vec<u8>>>;

/// Reads a pipe to its end in a thread (a child stuck on the frozen filesystem may hold it open: never wait).
fn read_in_background(pipe: Option<impl Read + Send + 'static>) -> Collected {
    let into = Collected::default();
    if let Some(mut pipe) = pipe {
        let theirs = std::sync::Arc::clone(&into);
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                lock(&theirs).extend_from_slice(&buf[..n]);
            }
        });
    }
    into
}

/// What was read so far, after a moment for the last bytes.
fn collected(from: &Collected) -> String {
    std::thread::sleep(Duration::from_millis(300));
    String::from_utf8_lossy(&lock(from)).into_owned()
}

#[test]
fn children_abandoned_on_a_frozen_filesystem_are_reaped_after_the_thaw() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let log_s = log.to_string_lossy().into_owned();
    let mut run = HangwatchRun::start(
        &[
            "--nproc",
            "2",
            "--stall-after",
            "3s",
            "--action",
            "observe",
            "--quiet",
        ],
        &rank_job(
            py,
            &["--step-time", "0.1", "--log", &log_s, "--only-rank", "0"],
        ),
    );
    assert!(
        wait_until(Duration::from_secs(30), POLL, || lines_in(&log) >= 3),
        "rank 0 never logged:\n{}",
        run.stderr_text()
    );
    let frozen = require!(fs.freeze());
    // The roll call's write probe of the frozen mount is abandoned in D.
    assert!(
        run.wait_for_stderr(Duration::from_secs(30), |l| l
            .contains("uninterruptible sleep")),
        "no verdict:\n{}",
        run.stderr_text()
    );
    let stuck_children = |pid: u32, state: char| {
        descendants(pid)
            .into_iter()
            .filter(|p| process_state(*p) == Some(state))
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .ok()
                    .and_then(|s| {
                        s.rsplit_once(')')?
                            .1
                            .split_whitespace()
                            .nth(1)?
                            .parse()
                            .ok()
                    })
                    == Some(pid)
            })
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(10), POLL, || stuck_children(
            run.pid(),
            'D'
        ) > 0),
        "expected an abandoned child of hangwatch in D on the frozen mount"
    );
    frozen.thaw().expect("thaw");
    std::thread::sleep(Duration::from_secs(3));
    let zombies = stuck_children(run.pid(), 'Z');
    send(run.pid(), Signal::SIGTERM).expect("end the run");
    let done = run.finish(Duration::from_secs(20));
    assert_eq!(
        zombies,
        0,
        "children abandoned during the freeze were left as zombies: {}",
        done.describe()
    );
}

#[test]
fn a_launcher_that_waits_for_a_rank_in_d_does_not_hold_the_grace() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let port = hangwatch_testkit::free_tcp_port().expect("a free port");
    // Like torchrun: on SIGTERM it passes the signal to its ranks and waits for them, so with rank 0 in D it
    // would wait forever.
    let launcher = format!(
        "trap 'kill -TERM $pids 2>/dev/null; wait' TERM; \
         for r in 0 1 2 3; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT={port} \
         '{py}' '{script}' --step-time 0.1 --log '{log}' --only-rank 0 & pids=\"$pids $!\"; done; wait",
        py = py.display(),
        script = hangwatch_testkit::rank_script().display(),
        log = log.display(),
    );
    let mut run = HangwatchRun::start(
        &["--stall-after", "4s", "--grace", "30s", "--quiet"],
        &["sh".to_string(), "-c".to_string(), launcher],
    );
    assert!(
        wait_until(Duration::from_secs(30), POLL, || lines_in(&log) >= 3),
        "rank 0 never logged:\n{}",
        run.stderr_text()
    );
    run.track_descendants();
    let frozen = require!(fs.freeze());
    let frozen_at = Instant::now();
    let done = run.finish(Duration::from_secs(60));
    let took = frozen_at.elapsed();
    eprintln!(
        "launcher waiting on a rank in D: freeze -> exit {:.2}s (grace 30s)",
        took.as_secs_f64()
    );
    done.assert_code(75);
    assert_eq!(done.culprit(0)["state"], "D", "{}", done.describe());
    assert!(
        took < Duration::from_secs(25),
        "the 30 s grace was spent waiting on a launcher that waits on a rank in D: {}",
        done.describe()
    );
    frozen.thaw().expect("thaw");
}
