//! The Python client against a real `hangwatch run`: beats set the learned threshold, a phase keeps a long
//! checkpoint from looking like a hang, and log records reach the log file in order.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn job() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/python/beating_job.py"
    )
    .to_string()
}

/// `hangwatch run` with small learned-threshold bounds, so that a test takes seconds.
fn run(report: &std::path::Path, extra: &[&str], job_args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hangwatch"))
        .args([
            "run",
            "--nproc",
            "2",
            "--json",
            "--quiet",
            "--grace",
            "1s",
            "--min-stall",
            "1s",
            "--max-stall",
            "30s",
        ])
        .arg("--report-dir")
        .arg(report)
        .args(extra)
        .args(["--", "python3", &job()])
        .args(job_args)
        .output()
        .expect("run hangwatch")
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn beats_teach_the_threshold_and_a_stop_in_beats_is_caught() {
    let report = tempfile::tempdir().unwrap();
    // 20 ms steps: ten times their p95 stays under the 1 s floor even when a loaded machine doubles a few of them
    // (with 50 ms steps a busy CI host once learned 1.001 s).
    let out = run(
        report.path(),
        &[],
        &["--steps", "60", "--step-time", "0.02", "--hang"],
    );
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["kind"], "collective_hang", "{v:#}");
    assert!(
        v["groups"][0]["where"]
            .as_str()
            .unwrap()
            .starts_with("stuck_forever"),
        "{v:#}"
    );
    let thresholds: Value = serde_json::from_str(
        &std::fs::read_to_string(report.path().join("thresholds.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(thresholds["progress_source"], "heartbeat", "{thresholds:#}");
    assert_eq!(thresholds["basis"], "learned", "{thresholds:#}");
    assert_eq!(
        thresholds["hard_s"], 1.0,
        "10 x 20 ms steps is below the 1 s floor: {thresholds:#}"
    );
    // The 80 beats went through the shared-memory slots: the only datagrams were the two ranks' hellos.
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(report.path().join("run.json")).unwrap())
            .unwrap();
    let datagrams = run["heartbeats"]["received"].as_u64().unwrap_or(u64::MAX);
    assert!(datagrams <= 4, "beats sent as datagrams: {run:#}");
}

#[test]
fn a_checkpoint_phase_is_not_a_hang_but_the_same_pause_without_it_is() {
    let report = tempfile::tempdir().unwrap();
    let out = run(
        report.path(),
        &[],
        &["--steps", "30", "--checkpoint-at", "20:4"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out)["hang"], false);

    let report = tempfile::tempdir().unwrap();
    let out = run(
        report.path(),
        &[],
        &["--steps", "30", "--checkpoint-at", "20:4", "--no-phase"],
    );
    assert_eq!(
        out.status.code(),
        Some(75),
        "without the phase a 4 s pause exceeds the learned 1 s threshold"
    );
}

#[test]
fn log_records_reach_the_log_file_in_order() {
    let report = tempfile::tempdir().unwrap();
    let log: PathBuf = report.path().join("job.log");
    let out = run(
        report.path(),
        &["--log-file", log.to_str().unwrap()],
        &["--steps", "1", "--log-records", "2000"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    for rank in 0..2 {
        let prefix = format!("[rank {rank}] record ");
        let numbers: Vec<usize> = text
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .map(|n| n.trim().parse().unwrap())
            .collect();
        assert_eq!(
            numbers,
            (0..2000).collect::<Vec<_>>(),
            "rank {rank}'s records, in order"
        );
    }
}
