//! System tests of alerts as an on-call engineer gets them: a real hang (a frozen loop-mounted ext4 under rank 0's
//! log), `hangwatch run` with an HTTPS webhook and an Alertmanager-shaped receiver (a CA made for the test, trusted
//! with --alert-ca-file), and a receiver that never answers, which must not hold up the job's end.

mod common;

use std::time::{Duration, Instant};

use common::*;
use hangwatch_testkit::{python, require, wait_until, AlertReceiver, LoopExt4};
use serde_json::Value;

/// Starts a 3-rank job whose rank 0 logs onto `fs`, waits for it to step, and freezes `fs`.
fn hung_job(
    fs: &LoopExt4,
    flags: &[&str],
) -> (HangwatchRun, hangwatch_testkit::FrozenGuard, Instant) {
    let mut all = vec!["--nproc", "3", "--stall-after", STALL_AFTER, "--quiet"];
    all.extend_from_slice(flags);
    let run = start_logging_onto(hangwatch(), fs, 0, 3, &all);
    let frozen = fs.freeze().expect("freeze");
    (run, frozen, Instant::now())
}

#[test]
fn a_hang_sends_the_suspected_and_the_acted_alert_over_https_to_both_receivers() {
    require!(python());
    let fs = require!(LoopExt4::new(64));
    let receiver = require!(AlertReceiver::https(1));
    let webhook = format!("{}/hooks/T0/B0/secret-token", receiver.base_url());
    let ca = receiver.ca_file();
    let (mut run, frozen, _) = hung_job(
        &fs,
        &[
            "--webhook",
            &webhook,
            "--alertmanager",
            &receiver.base_url(),
            "--alert-ca-file",
            ca.to_str().unwrap(),
            "--job-id",
            "4242",
            "--node-name",
            "n1",
        ],
    );
    let done = run.finish(STALL + Duration::from_secs(60));
    done.assert_code(75);

    let delivered = |path: &'static str| move |r: &Value| r["answered"] == 200 && r["path"] == path;
    let hooks = receiver.wait_for(
        2,
        Duration::from_secs(10),
        delivered("/hooks/T0/B0/secret-token"),
    );
    assert_eq!(
        hooks.len(),
        2,
        "{:#?}\n{}",
        receiver.requests(),
        done.describe()
    );
    let stage = |h: &Value| {
        h["body"]["hangwatch"]["stage"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let suspected = hooks
        .iter()
        .find(|h| stage(h) == "suspected")
        .expect("a suspected alert");
    let acted = hooks
        .iter()
        .find(|h| stage(h) == "acted")
        .expect("an acted alert");
    let text = suspected["body"]["text"].as_str().unwrap();
    assert!(
        text.starts_with("hangwatch: job 4242 looks hung — blocked in kernel: rank 0 (node n1"),
        "{text}"
    );
    assert!(text.contains("in write() on"), "{text}");
    assert!(
        text.contains(&format!("Evidence: n1:{}", done.report_dir.display())),
        "{text}"
    );
    assert_eq!(
        suspected["body"]["hangwatch"]["verdict"]["culprits"][0]["syscall"],
        "write"
    );
    let acted_text = acted["body"]["text"].as_str().unwrap();
    assert!(acted_text.contains("Done: terminate ("), "{acted_text}");
    assert!(
        acted_text.contains("unkillable (FAILED: pid"),
        "{acted_text}"
    );

    let am = receiver.wait_for(2, Duration::from_secs(10), delivered("/api/v2/alerts"));
    assert_eq!(am.len(), 2, "{:#?}", receiver.requests());
    for post in &am {
        let labels = &post["body"][0]["labels"];
        assert_eq!(labels["job"], "4242");
        assert_eq!(labels["node"], "n1");
        assert_eq!(labels["kind"], "blocked_in_kernel");
    }
    let severities: Vec<&str> = am
        .iter()
        .map(|p| p["body"][0]["labels"]["severity"].as_str().unwrap())
        .collect();
    assert!(
        severities.contains(&"warning") && severities.contains(&"critical"),
        "{severities:?}"
    );

    // Kept in the evidence: four deliveries, one of them retried after the 503, no secret.
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(done.report_dir.join("alerts.json")).expect("alerts.json"),
    )
    .unwrap();
    let deliveries = record["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 4, "{record:#}");
    assert!(deliveries.iter().all(|d| d["ok"] == true), "{record:#}");
    assert_eq!(
        deliveries
            .iter()
            .map(|d| d["attempts"].as_u64().unwrap())
            .sum::<u64>(),
        5
    );
    assert!(!record.to_string().contains("secret-token"), "{record:#}");
    assert_eq!(record["in_flight_at_exit"], 0);
    frozen.thaw().expect("thaw");
}

#[test]
fn a_receiver_that_never_answers_does_not_hold_up_the_end_and_the_failure_is_kept() {
    require!(python());
    let fs = require!(LoopExt4::new(64));
    // Accepts connections (the kernel's backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}/hook", silent.local_addr().unwrap());
    // Refuses connections: fails at once, retried until its deadline.
    let refused_port = hangwatch_testkit::free_tcp_port().unwrap();
    let refused_url = format!("http://127.0.0.1:{refused_port}");
    let textfiles = tempfile::tempdir().unwrap();
    let (mut run, frozen, frozen_at) = hung_job(
        &fs,
        &[
            "--webhook",
            &silent_url,
            "--alertmanager",
            &refused_url,
            "--alert-deadline",
            "4s",
            "--job-id",
            "77",
            "--node-name",
            "n1",
            "--metrics-textfile",
            textfiles.path().to_str().unwrap(),
        ],
    );
    let done = run.finish(STALL + Duration::from_secs(60));
    let took = frozen_at.elapsed();
    done.assert_code(75);
    eprintln!(
        "freeze -> exit with a silent receiver: {:.1}s",
        took.as_secs_f64()
    );
    // The job was ended while the alerts were still being tried: the termination is in the verdict.
    assert!(done.action("terminate").is_some(), "{}", done.describe());
    let stderr = done.stderr.clone();
    assert!(stderr.contains("alert to http://127.0.0.1:"), "{stderr}");
    assert!(stderr.contains("failed after"), "{stderr}");
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(done.report_dir.join("alerts.json")).expect("alerts.json"),
    )
    .unwrap();
    let failed: Vec<&Value> = record["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["ok"] == false)
        .collect();
    assert!(failed.len() >= 2, "{record:#}");
    assert!(
        failed
            .iter()
            .any(|d| d["target"] == "alertmanager" && d["attempts"].as_u64() > Some(1)),
        "{record:#}"
    );
    frozen.thaw().expect("thaw");
}

#[test]
fn a_hang_decided_again_at_each_tier_sends_one_suspected_alert() {
    require!(python());
    let fs = require!(LoopExt4::new(64));
    let receiver = require!(AlertReceiver::http(0));
    let webhook = format!("{}/hooks/T0/B0/secret-token", receiver.base_url());
    // Observed, not ended: the fast path's roll call, the soft tier's and the hard tier's each reach the same
    // verdict, and the hang stays for as long as the test wants.
    let (mut run, frozen, _) = hung_job(
        &fs,
        &[
            "--action",
            "observe",
            "--webhook",
            &webhook,
            "--job-id",
            "4242",
            "--node-name",
            "n1",
        ],
    );
    let hooks = |r: &AlertReceiver| -> Vec<Value> {
        r.requests()
            .into_iter()
            .filter(|h| h["path"] == "/hooks/T0/B0/secret-token")
            .collect()
    };
    assert!(
        wait_until(STALL + Duration::from_secs(30), POLL, || !hooks(&receiver)
            .is_empty()),
        "no alert: {}",
        run.stderr_text()
    );
    // Past every tier, and several roll calls.
    std::thread::sleep(STALL * 5);
    let suspected: Vec<Value> = hooks(&receiver)
        .into_iter()
        .filter(|h| h["body"]["hangwatch"]["stage"] == "suspected")
        .collect();
    assert_eq!(
        suspected.len(),
        1,
        "the same verdict was alerted {} times: {:#?}\n{}",
        suspected.len(),
        receiver.requests(),
        run.stderr_text()
    );
    // Ended by a signal: the repeats it held back are counted in the evidence.
    hangwatch_testkit::send(run.pid(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let done = run.finish(Duration::from_secs(60));
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(done.report_dir.join("alerts.json")).expect("alerts.json"),
    )
    .unwrap();
    assert!(
        record["not_sent"]["repeats"].as_u64() >= Some(1),
        "{record:#}\n{}",
        done.describe()
    );
    assert_eq!(record["not_sent"]["dropped"], 0, "{record:#}");
    frozen.thaw().expect("thaw");
}
