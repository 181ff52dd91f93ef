//! The node's verdict history as an admin meets it: two real hangs with the same cause (rank 0's log on an ext4
//! that freezes, a new loop mount each time), one after the other on this machine; the second verdict says the
//! cause was seen before, and `hangwatch history` lists both as one recurring cause; two unrelated hangs whose only
//! common trait is a futex wait are not. One hang looked at twice by the
//! loop is one row. A real hang's verdict reaches the fleet database (a PostgreSQL server of the test's own) only
//! through verified TLS, set up by the site's configuration file; against a server without TLS it stays local
//! and says what to do.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use hangwatch_testkit::{python, require, LoopExt4, PostgresServer};
use serde_json::Value;

/// One hang: a 2-rank job whose rank 0 logs onto a fresh ext4 that freezes; the history in `state`.
/// The run is returned with its result: its report directory lives as long as it does.
fn hang_once(state: &Path) -> (HangwatchRun, Finished) {
    let fs = LoopExt4::new(64).expect("loop ext4");
    let mut cmd = hangwatch();
    cmd.env("HANGWATCH_STATE_DIR", state);
    let mut run = start_logging_onto(
        cmd,
        &fs,
        0,
        3,
        &["--nproc", "2", "--stall-after", STALL_AFTER, "--quiet"],
    );
    let frozen = fs.freeze().expect("freeze");
    let done = run.finish(STALL + Duration::from_secs(40));
    frozen.thaw().expect("thaw");
    (run, done)
}

#[test]
fn the_same_cause_twice_is_a_recurrence_in_the_verdict_and_in_hangwatch_history() {
    require!(python());
    require!(LoopExt4::new(16));
    let state = tempfile::tempdir().unwrap();

    let (_first_run, first) = hang_once(state.path());
    first.assert_code(75);
    assert_eq!(
        first.json["kind"],
        "blocked_in_kernel",
        "{}",
        first.describe()
    );
    assert_eq!(
        first.json["recurrence"]["seen_before"],
        0,
        "{}",
        first.describe()
    );

    let (_second_run, second) = hang_once(state.path());
    second.assert_code(75);
    let recurrence = &second.json["recurrence"];
    assert_eq!(recurrence["seen_before"], 1, "{}", second.describe());
    assert_eq!(
        recurrence.get("placeless"),
        None,
        "a frozen mount is a place"
    );
    assert_eq!(
        recurrence["fingerprint"],
        first.json["recurrence"]["fingerprint"]
    );
    assert!(
        second.stderr.contains("this cause was seen 1 time before"),
        "{}",
        second.stderr
    );
    let text = std::fs::read_to_string(second.report_dir.join("verdict.txt")).unwrap();
    assert!(text.contains("this cause was seen 1 time before"), "{text}");

    let history = hangwatch()
        .args(["history", "--json"])
        .env("HANGWATCH_STATE_DIR", state.path())
        .output()
        .unwrap();
    assert!(
        history.status.success(),
        "{}",
        String::from_utf8_lossy(&history.stderr)
    );
    let listed: Value = serde_json::from_slice(&history.stdout).unwrap();
    let entries = listed
        .as_array()
        .or_else(|| listed["verdicts"].as_array())
        .unwrap_or_else(|| panic!("history --json: {listed:#}"));
    assert_eq!(entries.len(), 2, "{listed:#}");
    let dirs: Vec<String> = [&first, &second]
        .iter()
        .map(|d| d.report_dir.display().to_string())
        .collect();
    for entry in entries {
        assert_eq!(entry["kind"], "blocked_in_kernel", "{entry:#}");
        assert!(entry.to_string().contains("\"write\""), "{entry:#}");
        assert!(
            dirs.iter().any(|d| entry.to_string().contains(d.as_str())),
            "{entry:#} names neither bundle {dirs:?}"
        );
    }
    let table = hangwatch()
        .args(["history", "--by-cause"])
        .env("HANGWATCH_STATE_DIR", state.path())
        .output()
        .unwrap();
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&table.stdout),
        String::from_utf8_lossy(&table.stderr)
    );
    assert!(shown.contains("write"), "{shown}");
    assert!(shown.contains('2'), "{shown}");
}

/// Issue 36: two unrelated hangs whose ranks wait in a futex, with no file and no mount (a lock taken twice in one
/// job, an event never set in another, at two places of their code), are not one cause: the second verdict says
/// nothing of the first, its recurrence is marked placeless, and the history lists two causes.
#[test]
fn two_unrelated_futex_only_hangs_are_not_a_recurrence() {
    let py = require!(python());
    let state = tempfile::tempdir().unwrap();
    let hang = |code: &str| {
        let mut cmd = hangwatch();
        cmd.env("HANGWATCH_STATE_DIR", state.path());
        let job = vec![py.display().to_string(), "-c".to_string(), code.to_string()];
        let mut run = HangwatchRun::start_in(
            cmd,
            &["--nproc", "2", "--stall-after", "5s", "--quiet"],
            &job,
        );
        let done = run.finish(Duration::from_secs(60));
        done.assert_code(75);
        (run, done)
    };
    let (_a, first) =
        hang("import threading\nlock = threading.Lock()\nlock.acquire()\nlock.acquire()\n");
    let (_b, second) = hang(
        "import threading\ndef wait_for_data():\n    threading.Event().wait()\nwait_for_data()\n",
    );
    for done in [&first, &second] {
        let recurrence = &done.json["recurrence"];
        assert_eq!(recurrence["seen_before"], 0, "{}", done.describe());
        assert_eq!(recurrence["placeless"], true, "{}", done.describe());
        assert!(!done.stderr.contains("was seen"), "{}", done.stderr);
    }
    assert_ne!(
        first.json["recurrence"]["fingerprint"],
        second.json["recurrence"]["fingerprint"]
    );
    let history = hangwatch()
        .args(["history", "--json"])
        .env("HANGWATCH_STATE_DIR", state.path())
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&history.stdout).unwrap();
    let entries = listed["verdicts"]
        .as_array()
        .unwrap_or_else(|| panic!("history --json: {listed:#}"));
    assert_eq!(entries.len(), 2, "{listed:#}");
    for entry in entries {
        assert_eq!(entry["count"], 1, "{entry:#}");
    }
}

/// A hang the loop looks at twice (past the soft threshold, where sleeping ranks are not conclusive, then past the
/// hard one, where it acts) is one hang: one row in the history, and the run's own first look is not called a
/// recurrence of it.
#[test]
fn one_hang_looked_at_twice_is_one_row_and_not_its_own_recurrence() {
    let py = require!(python());
    let state = tempfile::tempdir().unwrap();
    let mut cmd = hangwatch();
    cmd.env("HANGWATCH_STATE_DIR", state.path());
    let job = vec![
        py.display().to_string(),
        "-c".to_string(),
        "import time; time.sleep(120)".to_string(),
    ];
    let mut run = HangwatchRun::start_in(
        cmd,
        &["--nproc", "2", "--stall-after", "3s", "--quiet"],
        &job,
    );
    let done = run.finish(Duration::from_secs(60));
    done.assert_code(75);
    assert_eq!(
        done.json["recurrence"]["seen_before"],
        0,
        "{}",
        done.describe()
    );
    assert!(
        !done.stderr.contains("was seen 1 time before"),
        "{}",
        done.stderr
    );

    let history = hangwatch()
        .args(["history", "--json"])
        .env("HANGWATCH_STATE_DIR", state.path())
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&history.stdout).unwrap();
    let entries = listed["verdicts"]
        .as_array()
        .unwrap_or_else(|| panic!("history --json: {listed:#}"));
    assert_eq!(entries.len(), 1, "one hang, one row: {listed:#}");
    assert!(
        entries[0]
            .to_string()
            .contains(&done.report_dir.display().to_string()),
        "{listed:#}"
    );
}

/// A 2-rank job whose ranks sleep (a hang found at 3 s) under `hangwatch run`, with `site` as the site's
/// configuration file.
fn sleeping_job_with_site(site: &str) -> (tempfile::TempDir, Finished) {
    let py = python().expect("python");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("config.toml");
    std::fs::write(&file, site).expect("site configuration");
    let mut cmd = hangwatch();
    cmd.env("HANGWATCH_CONFIG", &file)
        .env("XDG_CONFIG_HOME", dir.path())
        .env_remove("HANGWATCH_HISTORY_URL");
    let job = vec![
        py.display().to_string(),
        "-c".to_string(),
        "import time; time.sleep(120)".to_string(),
    ];
    let mut run = HangwatchRun::start_in(
        cmd,
        &["--nproc", "2", "--stall-after", "3s", "--quiet"],
        &job,
    );
    let done = run.finish(Duration::from_secs(60));
    (dir, done)
}

#[test]
fn a_real_verdict_ships_to_the_fleet_over_verified_tls_and_never_to_a_server_without_it() {
    require!(python());
    let server = require!(PostgresServer::start());
    let ca = server.ca_file().expect("a CA");
    let password_file = server.password_file().expect("password file");
    let site = format!(
        "history_url = {:?}\nhistory_ca = {:?}\nhistory_password_file = {:?}\n",
        server.bare_url(),
        ca.display().to_string(),
        password_file.display().to_string()
    );
    let (_dir, done) = sleeping_job_with_site(&site);
    done.assert_code(75);
    let recurrence = &done.json["recurrence"];
    assert_eq!(recurrence["source"], "fleet", "{}", done.describe());
    assert_eq!(
        server
            .psql("SELECT count(*) FROM fleet_verdicts")
            .expect("psql"),
        "1"
    );
    let log = server.log().expect("server log");
    let connections: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("connection authorized") && l.contains("application_name=hangwatch"))
        .collect();
    assert!(!connections.is_empty(), "{log}");
    for line in connections {
        assert!(line.contains("SSL enabled (protocol=TLSv1."), "{line}");
    }

    // The same site against a server without TLS: the verdict is the node's own, and says why and what to do.
    let plain = require!(PostgresServer::start_without_tls());
    plain.set_host_lines("host", "trust").expect("trust");
    let site = format!("history_url = {:?}\n", plain.bare_url());
    let (_dir, done) = sleeping_job_with_site(&site);
    done.assert_code(75);
    let recurrence = &done.json["recurrence"];
    assert_eq!(recurrence["source"], "local", "{}", done.describe());
    let why = recurrence["fleet_unavailable"].as_str().unwrap_or_default();
    assert!(
        why.contains("does not offer TLS") && why.contains("insecure_history = true"),
        "{}",
        done.describe()
    );
    assert!(plain.log().expect("server log").lines().all(|l| !(l
        .contains("connection authorized")
        && l.contains("application_name=hangwatch"))));
}
