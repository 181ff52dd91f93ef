//! System tests of hangwatch's Prometheus metrics as a site uses them: `run --metrics` scraped over a real TCP
//! connection while real Python ranks run and then deadlock, `--metrics-textfile` read after the run, and
//! `coordinator --metrics` with an agent joined. Every exposition is parsed by the Prometheus project's own Python
//! parser (`prometheus_client.parser`), not by the code that wrote it.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use hangwatch_testkit::{python, require, send, wait_until, ChildGuard, TestkitError};
use nix::sys::signal::Signal;
use serde_json::Value;

/// Parses Prometheus text with `prometheus_client.parser.text_string_to_metric_families`; prints
/// {family: {"type": T, "samples": [[name, labels, value], ...]}}.
const PARSER: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for f in text_string_to_metric_families(sys.stdin.read()):
    out[f.name] = {"type": f.type, "samples": [[s.name, s.labels, s.value] for s in f.samples]}
print(json.dumps(out))
"#;

fn parser_available(py: &Path) -> Result<(), TestkitError> {
    let ok = Command::new(py)
        .args(["-c", "import prometheus_client.parser"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(())
    } else {
        Err(TestkitError::Missing {
            tool: "the Python package prometheus-client".into(),
            hint: "python3 -m pip install prometheus-client (scripts/test does)",
        })
    }
}

/// The parsed exposition; panics (with the text) when the parser refuses it.
fn parse(py: &Path, text: &str) -> Value {
    let mut child = Command::new(py)
        .args(["-c", PARSER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed the parser");
    let out = child.wait_with_output().expect("the parser ends");
    assert!(
        out.status.success(),
        "the Prometheus parser refused the exposition: {}\n--- text ---\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the parser's JSON")
}

/// `GET /metrics` over TCP: the body, checked to be a 200 in the Prometheus text format.
fn scrape(addr: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to /metrics");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read the reply");
    let (head, body) = reply.split_once("\r\n\r\n").expect("headers and body");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    body.to_string()
}

/// The value of the sample `name` whose labels include all of `labels`.
fn value(parsed: &Value, family: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    parsed[family]["samples"]
        .as_array()?
        .iter()
        .find(|s| s[0] == name && labels.iter().all(|(k, v)| s[1][*k].as_str() == Some(*v)))
        .and_then(|s| s[2].as_f64())
}

/// The sum of a family's samples named `name`.
fn total(parsed: &Value, family: &str, name: &str) -> f64 {
    parsed[family]["samples"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s[0] == name)
        .filter_map(|s| s[2].as_f64())
        .sum()
}

/// The address in `<who>: metrics on http://ADDR/metrics`.
fn metrics_addr(line: &str) -> Option<String> {
    let rest = line.split("metrics on http://").nth(1)?;
    Some(rest.strip_suffix("/metrics")?.to_string())
}

#[test]
fn run_metrics_parse_show_the_ranks_then_the_stall_and_the_textfile_keeps_the_end() {
    let py = require!(python());
    require!(parser_available(py));
    let textfiles = tempfile::tempdir().expect("textfile dir");
    let textfile_dir = textfiles.path().to_string_lossy().into_owned();
    let mut run = HangwatchRun::start(
        &[
            "--nproc",
            "2",
            "--stall-after",
            "3s",
            "--action",
            "observe",
            "--job-id",
            "metrics-test",
            "--node-name",
            "node-a",
            "--metrics",
            "127.0.0.1:0",
            "--metrics-textfile",
            &textfile_dir,
        ],
        &rank_job(
            py,
            &[
                "--step-time",
                "0.1",
                "--behaviour",
                "lock",
                "--after",
                "30",
                "--only-rank",
                "1",
            ],
        ),
    );
    assert!(
        run.wait_for_stderr(Duration::from_secs(30), |l| metrics_addr(l).is_some()),
        "hangwatch did not say where its metrics are:\n{}",
        run.stderr_text()
    );
    let addr = lock(&run.stderr)
        .iter()
        .find_map(|l| metrics_addr(l))
        .expect("the address");
    run.wait_for_ranks(2, Duration::from_secs(30));

    // While the ranks step: both ranks' series, the node healthy, the fixed thresholds.
    let mut parsed = Value::Null;
    let healthy = wait_until(Duration::from_secs(30), POLL, || {
        parsed = parse(py, &scrape(&addr));
        let rank_seen = |rank| {
            value(
                &parsed,
                "hangwatch_rank_seconds_since_progress",
                "hangwatch_rank_seconds_since_progress",
                &[
                    ("rank", rank),
                    ("node", "node-a"),
                    ("job_id", "metrics-test"),
                ],
            )
            .is_some()
        };
        rank_seen("0")
            && rank_seen("1")
            && value(
                &parsed,
                "hangwatch_stall_state",
                "hangwatch_stall_state",
                &[("state", "healthy")],
            ) == Some(1.0)
    });
    assert!(healthy, "no healthy scrape with ranks 0 and 1: {parsed:#}");
    assert_eq!(parsed["hangwatch_stall_state"]["type"], "gauge");
    assert_eq!(
        total(&parsed, "hangwatch_stall_state", "hangwatch_stall_state"),
        1.0,
        "exactly one stall state: {parsed:#}"
    );
    let threshold = |p: &Value, tier| {
        value(
            p,
            "hangwatch_threshold_seconds",
            "hangwatch_threshold_seconds",
            &[("tier", tier)],
        )
    };
    assert_eq!(threshold(&parsed, "hard"), Some(3.0), "{parsed:#}");
    assert_eq!(threshold(&parsed, "soft"), Some(1.5), "{parsed:#}");
    assert_eq!(
        value(
            &parsed,
            "hangwatch_threshold_basis",
            "hangwatch_threshold_basis",
            &[("basis", "fixed")]
        ),
        Some(1.0)
    );
    assert_eq!(parsed["hangwatch_verdicts"]["type"], "counter");
    assert_eq!(
        total(&parsed, "hangwatch_verdicts", "hangwatch_verdicts_total"),
        0.0
    );
    assert_eq!(
        value(&parsed, "hangwatch_job_up", "hangwatch_job_up", &[]),
        Some(1.0)
    );

    // Rank 1 deadlocks, rank 0 waits for it in the barrier: stalled, and the roll call's verdict counted.
    let stalled = wait_until(Duration::from_secs(60), Duration::from_millis(250), || {
        parsed = parse(py, &scrape(&addr));
        value(
            &parsed,
            "hangwatch_stall_state",
            "hangwatch_stall_state",
            &[("state", "stalled")],
        ) == Some(1.0)
            && total(&parsed, "hangwatch_verdicts", "hangwatch_verdicts_total") >= 1.0
    });
    assert!(
        stalled,
        "never stalled with a verdict: {parsed:#}\n{}",
        run.stderr_text()
    );
    assert_eq!(
        value(
            &parsed,
            "hangwatch_rank_state",
            "hangwatch_rank_state",
            &[("rank", "1"), ("state", "stalled")]
        ),
        Some(1.0),
        "{parsed:#}"
    );
    let quiet = value(
        &parsed,
        "hangwatch_rank_seconds_since_progress",
        "hangwatch_rank_seconds_since_progress",
        &[("rank", "1")],
    )
    .expect("rank 1's time without progress");
    assert!(quiet >= 3.0, "rank 1 quiet for {quiet}s only: {parsed:#}");
    eprintln!("verdicts: {}", parsed["hangwatch_verdicts"]["samples"]);

    // --action observe kept the job; a signal ends it, and the textfile keeps its last state.
    send(run.pid(), Signal::SIGTERM).expect("SIGTERM to hangwatch");
    let done = run.finish(Duration::from_secs(60));
    let file = textfiles.path().join("hangwatch_metrics-test_node-a.prom");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "no textfile {} ({e}); dir has {:?}\n{}",
            file.display(),
            std::fs::read_dir(textfiles.path()).map(|d| d.count()),
            done.describe()
        )
    });
    let mode = std::fs::metadata(&file).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "node_exporter must be able to read it");
    let last = parse(py, &text);
    assert_eq!(
        value(&last, "hangwatch_job_up", "hangwatch_job_up", &[]),
        Some(0.0),
        "{text}"
    );
    assert!(
        total(&last, "hangwatch_verdicts", "hangwatch_verdicts_total") >= 1.0,
        "{text}"
    );
    let leftovers: Vec<String> = std::fs::read_dir(textfiles.path())
        .expect("list")
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .filter(|n| !n.ends_with(".prom"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn coordinator_metrics_parse_and_count_the_node_that_joined() {
    let py = require!(python());
    require!(parser_available(py));
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "8e1f4c07a39d2b65f0c7e4a19b3d5862\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
    cmd.args([
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
        "--nnodes",
        "1",
        "--job-id",
        "cj",
        "--report-dir",
    ])
    .arg(dir.path().join("coordinator"))
    .arg("--token-file")
    .arg(&token)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut coordinator = ChildGuard::spawn(&mut cmd, "hangwatch coordinator").expect("starts");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let stderr = coordinator.child_mut().stderr.take().expect("stderr");
    let into = Arc::clone(&lines);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            lock(&into).push(line);
        }
    });
    let find = |what: &dyn Fn(&str) -> Option<String>| lock(&lines).iter().find_map(|l| what(l));
    let listen = |l: &str| {
        let rest = l.split("listening on ").nth(1)?;
        Some(rest.split_whitespace().next()?.to_string())
    };
    assert!(
        wait_until(Duration::from_secs(30), POLL, || find(&listen).is_some()
            && find(&metrics_addr).is_some()),
        "the coordinator did not say where it listens and serves metrics: {:?}",
        lock(&lines)
    );
    let (agents_addr, addr) = (
        find(&listen).expect("listen"),
        find(&metrics_addr).expect("metrics"),
    );

    let before = parse(py, &scrape(&addr));
    assert_eq!(
        value(
            &before,
            "hangwatch_coordinator_nodes_expected",
            "hangwatch_coordinator_nodes_expected",
            &[("job_id", "cj")]
        ),
        Some(1.0),
        "{before:#}"
    );
    assert_eq!(
        before["hangwatch_coordinator_roll_calls"]["type"],
        "counter"
    );

    let token_s = token.to_string_lossy().into_owned();
    let mut run = HangwatchRun::start(
        &[
            "--nproc",
            "1",
            "--coordinator",
            &agents_addr,
            "--token-file",
            &token_s,
            "--job-id",
            "cj",
            "--node-name",
            "node-a",
        ],
        &rank_job(py, &["--step-time", "0.1"]),
    );
    let mut parsed = Value::Null;
    let joined = wait_until(Duration::from_secs(60), Duration::from_millis(200), || {
        parsed = parse(py, &scrape(&addr));
        value(
            &parsed,
            "hangwatch_coordinator_nodes",
            "hangwatch_coordinator_nodes",
            &[("state", "joined")],
        ) == Some(1.0)
    });
    assert!(
        joined,
        "the node never counted as joined: {parsed:#}\n{}",
        run.stderr_text()
    );
    let seen = value(
        &parsed,
        "hangwatch_coordinator_node_last_seen_seconds",
        "hangwatch_coordinator_node_last_seen_seconds",
        &[("node", "node-a")],
    )
    .expect("node-a's last-seen");
    assert!(seen < 30.0, "{parsed:#}");
    assert_eq!(
        total(
            &parsed,
            "hangwatch_coordinator_verdicts",
            "hangwatch_coordinator_verdicts_total"
        ),
        0.0
    );
    send(run.pid(), Signal::SIGTERM).expect("SIGTERM to the agent");
    run.finish(Duration::from_secs(60));
    send(coordinator.pid(), Signal::SIGTERM).expect("SIGTERM to the coordinator");
    hangwatch_testkit::wait_with_deadline(coordinator.child_mut(), Duration::from_secs(30))
        .expect("the coordinator stops");
}
