//! System tests of what hangwatch must not take for a hang (docs/false-alarms.md), with real torch ranks (gloo, CPU)
//! under `hangwatch run --nproc 4` at the defaults: every rank evaluating in silence for 150 s, rank 0 alone
//! preparing data for 150 s while its peers wait in all_reduce. Both must run to exit 0, with the "not ending it"
//! notice and its warning alert once. Work that stops ends the hold; a loop that never ends is still ended, at
//! `--max-stall`; a busy rank under a fixed `--stall-after` is ended at it, as before. Rank 0 downloading from a
//! slow mirror (32 KB/s, almost no CPU) while its peers wait is work too; the same download from a server that
//! stops is not. So is a child of rank 0 copying a file from a slow FUSE mount while rank 0 waits for it.

mod common;

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use hangwatch_testkit::{require, torch_python, AlertReceiver, ChildGuard, FuseMount};
use serde_json::Value;

fn silent_job(python: &Path, mode: &str, silence: &str) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/silent_job.py");
    vec![
        python.to_string_lossy().into_owned(),
        script.to_string_lossy().into_owned(),
        "--mode".into(),
        mode.into(),
        "--silence".into(),
        silence.into(),
    ]
}

const NOT_ENDING: &str = "not ending it";

/// The alerts `receiver` got, by their stage.
fn stages(receiver: &AlertReceiver) -> Vec<String> {
    receiver
        .requests()
        .iter()
        .filter_map(|r| r["body"]["hangwatch"]["stage"].as_str().map(str::to_string))
        .collect()
}

/// A healthy job with a silent phase at the defaults: runs to exit 0, says once that it holds back, alerts once.
fn runs_to_the_end(mode: &str, expect_in_notice: &str) {
    let torch = require!(torch_python());
    let receiver = require!(AlertReceiver::http(0));
    let webhook = format!("{}/hook", receiver.base_url());
    let mut run = HangwatchRun::start(
        &["--nproc", "4", "--quiet", "--webhook", &webhook],
        &silent_job(torch, mode, "150"),
    );
    let done = run.finish(Duration::from_secs(280));
    done.assert_code(0);
    let notices: Vec<&str> = done
        .stderr
        .lines()
        .filter(|l| l.contains(NOT_ENDING))
        .collect();
    assert_eq!(notices.len(), 1, "said once: {}", done.describe());
    assert!(
        notices[0].contains(expect_in_notice),
        "the notice names the work: {}",
        notices[0]
    );
    assert!(
        done.stderr.contains("progress resumed"),
        "{}",
        done.describe()
    );
    // The thresholds were learned from the steps (2 min floor), not fixed or still warming up.
    let thresholds: Value = serde_json::from_str(
        &std::fs::read_to_string(done.report_dir.join("thresholds.json")).expect("thresholds.json"),
    )
    .expect("thresholds.json is JSON");
    assert_eq!(thresholds["basis"], "learned", "{thresholds}");
    let verdict: Value = serde_json::from_str(
        &std::fs::read_to_string(done.report_dir.join("verdict.json")).expect("verdict.json"),
    )
    .expect("verdict.json is JSON");
    assert!(
        verdict["activity"]["summary"]
            .as_str()
            .is_some_and(|s| s.contains(expect_in_notice)),
        "the evidence keeps the activity: {verdict:#}"
    );
    receiver.wait_for(1, Duration::from_secs(10), |_| true);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        stages(&receiver),
        vec!["computing".to_string()],
        "one warning alert, no 'looks hung': {:#?}",
        receiver.requests()
    );
    let alert = &receiver.requests()[0]["body"];
    assert!(
        alert["text"]
            .as_str()
            .is_some_and(|t| t.contains("not ending it")),
        "{alert:#}"
    );
}

#[test]
fn every_rank_evaluating_in_silence_for_150s_is_not_ended() {
    runs_to_the_end("eval", "all 4 ranks compute in evaluate (silent_job.py)");
}

#[test]
fn rank_0_preparing_data_while_its_peers_wait_is_not_ended() {
    runs_to_the_end(
        "prepare",
        "rank 0 computes in prepare_index (silent_job.py) while 3 ranks wait in all_reduce",
    );
}

#[test]
fn ranks_that_spin_forever_are_still_ended_at_max_stall() {
    let torch = require!(torch_python());
    let mut run = HangwatchRun::start(
        &[
            "--nproc",
            "4",
            "--quiet",
            "--min-stall",
            "6s",
            "--max-stall",
            "30s",
        ],
        &silent_job(torch, "spin", "0"),
    );
    let done = run.finish(Duration::from_secs(100));
    done.assert_code(75);
    assert!(
        done.stderr.contains(NOT_ENDING),
        "held back first: {}",
        done.describe()
    );
    assert!(
        done.stderr
            .contains("(--max-stall) although the ranks compute"),
        "{}",
        done.describe()
    );
    let stalled_for = done.json["stalled_for_s"].as_f64().unwrap_or_default();
    assert!(
        (30.0..60.0).contains(&stalled_for),
        "ended at --max-stall, not at the 6 s threshold: {stalled_for} s\n{}",
        done.describe()
    );
    assert!(
        done.json["activity"]["summary"]
            .as_str()
            .is_some_and(|s| s.contains("spin_forever")),
        "{}",
        done.describe()
    );
}

#[test]
fn ranks_that_stop_computing_are_ended_once_the_stop_is_confirmed() {
    let torch = require!(torch_python());
    let mut run = HangwatchRun::start(
        &["--nproc", "4", "--quiet", "--min-stall", "6s"],
        &silent_job(torch, "stop", "20"),
    );
    let done = run.finish(Duration::from_secs(120));
    done.assert_code(75);
    assert!(
        done.stderr.contains(NOT_ENDING),
        "held back while they computed: {}",
        done.describe()
    );
    assert!(
        done.stderr
            .contains("the ranks stopped computing and there is still no progress"),
        "{}",
        done.describe()
    );
    assert!(
        done.json["activity"].is_null(),
        "the kept verdict is the one after the work stopped: {}",
        done.describe()
    );
    let stalled_for = done.json["stalled_for_s"].as_f64().unwrap_or_default();
    assert!(
        stalled_for >= 20.0,
        "not ended while they computed: {stalled_for} s\n{}",
        done.describe()
    );
}

#[test]
fn a_busy_rank_under_a_fixed_stall_after_is_ended_at_it() {
    let torch = require!(torch_python());
    let mut run = HangwatchRun::start(
        &["--nproc", "4", "--quiet", "--stall-after", "8s"],
        &silent_job(torch, "prepare", "120"),
    );
    let done = run.finish(Duration::from_secs(90));
    done.assert_code(75);
    assert_eq!(done.json["kind"], "busy", "{}", done.describe());
    done.culprit(0);
    assert!(
        !done.stderr.contains(NOT_ENDING),
        "--stall-after is the user's word: no hold: {}",
        done.describe()
    );
    assert!(
        done.took < Duration::from_secs(60),
        "ended at the fixed threshold: {}",
        done.describe()
    );
}

/// A slow mirror: tests/python/slow_server.py sending `bytes` at about `rate` bytes per second to every GET;
/// killed when the guard drops.
fn slow_server(python: &Path, bytes: u64, rate: u64) -> (ChildGuard, u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/slow_server.py");
    let mut child = Command::new(python)
        .arg(script)
        .args(["--bytes", &bytes.to_string(), "--rate", &rate.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the slow server starts");
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    let guard = ChildGuard::new(child, "slow server");
    let port = line
        .trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the slow server says its port: {line:?}"));
    (guard, port)
}

fn download_job(python: &Path, port: u16) -> Vec<String> {
    let mut job = silent_job(python, "download", "0");
    job.extend(["--url".into(), format!("http://127.0.0.1:{port}/shard")]);
    job
}

#[test]
fn rank_0_downloading_from_a_slow_mirror_while_its_peers_wait_is_not_ended() {
    let torch = require!(torch_python());
    // 6 MB at 32 KB/s: about 3 minutes, past the 2-minute floor of the defaults.
    let (_server, port) = slow_server(torch, 6_000_000, 32_768);
    let mut run = HangwatchRun::start(&["--nproc", "4", "--quiet"], &download_job(torch, port));
    let done = run.finish(Duration::from_secs(330));
    done.assert_code(0);
    let notice = done
        .stderr
        .lines()
        .find(|l| l.contains(NOT_ENDING))
        .unwrap_or_else(|| panic!("held back, said: {}", done.describe()));
    assert!(
        notice.contains("rank 0 moves data") && notice.contains("fetch_shard (silent_job.py)"),
        "the notice names the download: {notice}"
    );
    let output = std::fs::read_to_string(done.report_dir.join("output.log")).unwrap_or_default();
    assert!(
        output.contains("rank 0 fetched 6000000 bytes"),
        "the whole shard arrived: {}",
        done.describe()
    );
}

/// The same download from a mirror that stops answering once the hard tier is held back for it: the next look
/// finds nothing moving, a second confirms it, and the job is ended with rank 0 named; the hold is kept as ended by
/// the work that stopped, and the verdict says why it came about 35 s past the 6 s threshold.
#[test]
fn a_download_whose_server_stops_is_ended_with_rank_0_named() {
    let torch = require!(torch_python());
    let (server, port) = slow_server(torch, 100_000_000, 32_768);
    let mut run = HangwatchRun::start(
        &["--nproc", "4", "--quiet", "--min-stall", "6s"],
        &download_job(torch, port),
    );
    assert!(
        run.wait_for_stderr(Duration::from_secs(90), |s| s.contains(NOT_ENDING)),
        "held back while the bytes moved: {}",
        run.stderr_text()
    );
    // The hard tier's look too sees the bytes move (its evidence is the second kept): the hold looks again every
    // 30 s from there.
    let hard_look_done =
        |run: &HangwatchRun| run.stderr_text().matches("hangwatch: evidence in").count() >= 2;
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while !hard_look_done(&run) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        hard_look_done(&run) && run.stderr_text().contains("(hard threshold;"),
        "the hard tier's look: {}",
        run.stderr_text()
    );
    // The mirror stops answering: rank 0's bytes stop, and nothing else moves.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.pid() as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .expect("stop the server");
    let done = run.finish(Duration::from_secs(120));
    done.assert_code(75);
    done.culprit(0);
    assert!(
        done.json["activity"].is_null(),
        "the kept verdict is the one after the bytes stopped: {}",
        done.describe()
    );
    // Said once, kept with what moved, ended when the bytes stopped; the verdict says why it came late.
    let kept = thresholds(&done);
    assert_eq!(kept["holds"][0]["ended"], "work_stopped", "{kept:#}");
    assert!(
        kept["holds"][0]["activity"]["summary"]
            .as_str()
            .is_some_and(|s| s.contains("rank 0 moves data")),
        "{kept:#}"
    );
    let late = kept["late"]["words"].as_str().unwrap_or_default();
    assert!(
        late.contains("held back while rank 0 moves data")
            && late.contains("for a second look confirming the work stopped"),
        "{kept:#}"
    );
    assert!(
        done.stderr.contains(late),
        "said before the job is ended: {}",
        done.describe()
    );
}

/// Rank 0 runs a child process that copies a file off a slow FUSE mount (the daemon stopped 200 ms in every 250 ms;
/// the child asks for a page at a time, paced to 64 KB/s) and waits for it, while its peers wait in all_reduce. The
/// child spends most of its time in the mount's request wait, so a roll call mostly finds it there: its bytes
/// still move and the mount answers its probe, so it is work, and rank 0 is not ended for waiting on it.
#[test]
fn a_child_of_rank_0_copying_from_a_slow_fuse_mount_while_its_peers_wait_is_not_ended() {
    let torch = require!(torch_python());
    let tmp = tempfile::tempdir().expect("tempdir");
    let backing = tmp.path().join("backing");
    std::fs::create_dir(&backing).expect("backing dir");
    // 12 MB at 64 KB/s: about 3 minutes of copying, past the 2-minute floor of the defaults.
    std::fs::write(backing.join("shard.bin"), vec![7u8; 12_000_000]).expect("the shard");
    let fuse = require!(FuseMount::new(&backing));
    let src = fuse.path().join("shard.bin");
    let _slow = fuse.slow_down(Duration::from_millis(200), Duration::from_millis(50));
    let mut job = silent_job(torch, "child-copy", "0");
    job.extend([
        "--src".into(),
        src.to_string_lossy().into_owned(),
        "--rate".into(),
        "65536".into(),
    ]);
    let mut run = HangwatchRun::start(&["--nproc", "4", "--quiet"], &job);
    let done = run.finish(Duration::from_secs(330));
    done.assert_code(0);
    let notices: Vec<&str> = done
        .stderr
        .lines()
        .filter(|l| l.contains(NOT_ENDING))
        .collect();
    assert_eq!(notices.len(), 1, "said once: {}", done.describe());
    assert!(
        notices[0].contains("rank 0 moves data")
            && notices[0].contains("through a child process in copy_from_mount (silent_job.py)"),
        "the notice names the copy: {}",
        notices[0]
    );
    let output = std::fs::read_to_string(done.report_dir.join("output.log")).unwrap_or_default();
    assert!(
        output.contains("rank 0 copied 12000000 bytes"),
        "the whole file was copied: {}",
        done.describe()
    );
    // The hold is kept once, with what moved, ended by the progress that came back.
    let holds = thresholds(&done)["holds"].clone();
    assert_eq!(
        holds.as_array().map(Vec::len),
        Some(1),
        "one hold: {holds:#}"
    );
    assert_eq!(holds[0]["ended"], "progress_resumed", "{holds:#}");
    assert!(
        holds[0]["activity"]["summary"]
            .as_str()
            .is_some_and(|s| s.contains("rank 0 moves data") && s.contains("copy_from_mount")),
        "{holds:#}"
    );
    assert!(holds[0]["held_for_s"].as_f64() > Some(10.0), "{holds:#}");
}

/// The bundle's `thresholds.json`.
fn thresholds(done: &Finished) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(done.report_dir.join("thresholds.json")).expect("thresholds.json"),
    )
    .expect("thresholds.json is JSON")
}
