//! The verdict history as a user and `run` meet it: two real verdicts with the same cause (a frozen ext4 write,
//! seen on node n1 then on n2, each under its own temporary mount) recorded through the `__record-history` child
//! that `run` uses; `hangwatch history` (table, `--json`, `--by-cause`, `--since`) lists them with their
//! recurrence; an empty history, a file that is not a database and a newer schema are each said clearly.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hangwatch_history::{HistoryRequest, Recurrence};
use hangwatch_model::Verdict;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_hangwatch");
/// Generous: the machine running the tests is shared and slow.
const DEADLINE: Duration = Duration::from_secs(60);

fn fixture(name: &str) -> Verdict {
    let path = format!(
        "{}/../history/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("a verdict")
}

fn history(state_dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("history")
        .args(args)
        .env("HANGWATCH_STATE_DIR", state_dir)
        .output()
        .expect("run hangwatch history")
}

fn ok_stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}, stderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("utf-8")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn record(db: &Path, verdict: &Verdict, node: &str, at: f64) -> Result<Recurrence, String> {
    let request = HistoryRequest::new(
        verdict,
        node,
        Some("777".into()),
        Some(PathBuf::from(format!("/var/tmp/hangwatch-0/run-{node}"))),
        at,
    );
    let started = Instant::now();
    let answer =
        hangwatch_agent::history::record_abandonable(Path::new(BIN), db, &request, DEADLINE);
    println!(
        "record through the child: {:.1} ms",
        started.elapsed().as_secs_f64() * 1000.0
    );
    answer
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

#[test]
fn the_same_cause_on_two_nodes_is_a_recurrence_and_history_lists_both() {
    let state = tempfile::tempdir().expect("tempdir");
    let state_dir = state.path().join("state");
    let db = state_dir.join("history.sqlite");
    let (on_n1, on_n2) = (
        fixture("blocked-write-n1.json"),
        fixture("blocked-write-n2.json"),
    );
    // Different nodes, ranks and temporary mounts: the same cause all the same.
    assert_ne!(on_n1.culprits[0].mount, on_n2.culprits[0].mount);

    let t = now();
    let first = record(&db, &on_n1, "n1", t - 60.0).expect("first recorded");
    assert_eq!(first.seen_before, 0);
    assert_eq!(
        first.sentence(),
        "first time this cause is seen on this machine"
    );
    let second = record(&db, &on_n2, "n2", t).expect("second recorded");
    assert_eq!(second.seen_before, 1);
    assert_eq!(second.last_nodes, ["n1"]);
    let sentence = second.sentence();
    assert!(
        sentence.starts_with("seen 1 time before, on node n1 on "),
        "{sentence}"
    );

    let listed: Value =
        serde_json::from_str(&ok_stdout(&history(&state_dir, &["--json"]))).expect("json");
    assert_eq!(listed["database"], db.to_string_lossy().as_ref());
    let verdicts = listed["verdicts"].as_array().expect("verdicts");
    assert_eq!(verdicts.len(), 2, "{listed:#}");
    assert_eq!(verdicts[0]["culprit_nodes"], serde_json::json!(["n2"]));
    assert_eq!(verdicts[1]["culprit_nodes"], serde_json::json!(["n1"]));
    for v in verdicts {
        assert_eq!(v["count"], 2, "{v:#}");
        assert_eq!(v["kind"], "blocked_in_kernel");
        assert_eq!(v["fingerprint"], first.fingerprint.as_str());
        assert_eq!(v["job_id"], "777");
    }

    let table = history(&state_dir, &[]);
    ok_stdout(&table);
    let text = stderr(&table);
    let rows: Vec<&str> = text.lines().filter(|l| l.contains(" x2 ")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(rows[0].contains("n2") && rows[1].contains("n1"), "{text}");
    for row in rows {
        assert!(
            row.contains("write() on /tmp/*/mnt (ext4), waiting in percpu_rwsem_wait, at write_log (rank.py)"),
            "{row}"
        );
    }
    assert!(text.contains(&db.display().to_string()), "{text}");

    let causes: Value =
        serde_json::from_str(&ok_stdout(&history(&state_dir, &["--by-cause", "--json"])))
            .expect("json");
    assert_eq!(causes["causes"][0]["count"], 2, "{causes:#}");
    assert_eq!(
        causes["causes"][0]["nodes"],
        serde_json::json!(["n1", "n2"])
    );
    let by_cause = history(&state_dir, &["--by-cause"]);
    ok_stdout(&by_cause);
    assert!(stderr(&by_cause).contains("x2"), "{}", stderr(&by_cause));

    let recent: Value = serde_json::from_str(&ok_stdout(&history(
        &state_dir,
        &["--since", "30s", "--json"],
    )))
    .expect("json");
    assert_eq!(recent["verdicts"].as_array().map(Vec::len), Some(1));
    let later = history(&state_dir, &["--since", "2099-01-01"]);
    ok_stdout(&later);
    assert!(
        stderr(&later).contains("no verdicts recorded on this node since 2099-01-01"),
        "{}",
        stderr(&later)
    );
}

#[test]
fn an_empty_history_says_so_and_where_the_database_is() {
    let state = tempfile::tempdir().expect("tempdir");
    let out = history(state.path(), &[]);
    ok_stdout(&out);
    let text = stderr(&out);
    assert!(text.contains("no verdicts recorded on this node"), "{text}");
    assert!(
        text.contains(&state.path().join("history.sqlite").display().to_string()),
        "{text}"
    );
    assert!(text.contains("does not exist yet"), "{text}");
    let doc: Value =
        serde_json::from_str(&ok_stdout(&history(state.path(), &["--json"]))).expect("json");
    assert_eq!(doc["verdicts"], serde_json::json!([]));
}

#[test]
fn a_bad_database_file_is_named_with_what_to_do() {
    let state = tempfile::tempdir().expect("tempdir");
    let db = state.path().join("history.sqlite");
    std::fs::write(
        &db,
        "these are not the bytes of an SQLite database\n".repeat(100),
    )
    .expect("write");

    let out = history(state.path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.contains("is not a hangwatch history database") && text.contains("move it away"),
        "{text}"
    );
    let err = record(&db, &fixture("blocked-write-n1.json"), "n1", now()).expect_err("refused");
    assert!(err.contains("is not a hangwatch history database"), "{err}");
}

#[test]
fn a_database_from_a_newer_hangwatch_is_refused_not_rewritten() {
    let state = tempfile::tempdir().expect("tempdir");
    let db = state.path().join("history.sqlite");
    record(&db, &fixture("blocked-write-n1.json"), "n1", now()).expect("recorded");
    // SQLite's header keeps `PRAGMA user_version` at bytes 60..64, big-endian.
    let mut bytes = std::fs::read(&db).expect("read");
    bytes[60..64].copy_from_slice(&99u32.to_be_bytes());
    std::fs::write(&db, &bytes).expect("write");

    let out = history(state.path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("schema version 99, newer than this hangwatch knows"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(&db).expect("read"), bytes, "left as it was");
}

#[test]
fn bad_since_is_a_usage_error_with_examples() {
    let state = tempfile::tempdir().expect("tempdir");
    let out = history(state.path(), &["--since", "last tuesday"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("7d"), "{}", stderr(&out));
}

#[test]
fn concurrent_recorders_from_several_processes_each_get_a_distinct_count() {
    let state = tempfile::tempdir().expect("tempdir");
    let db = state.path().join("history.sqlite");
    let verdict = fixture("blocked-write-n1.json");
    let t = now();
    let recorders: Vec<_> = (0..6)
        .map(|i| {
            let (db, verdict) = (db.clone(), verdict.clone());
            std::thread::spawn(move || {
                record(&db, &verdict, &format!("n{i}"), t + f64::from(i))
                    .expect("recorded")
                    .seen_before
            })
        })
        .collect();
    let mut seen: Vec<u64> = recorders
        .into_iter()
        .map(|r| r.join().expect("recorder thread"))
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
}

#[test]
fn a_recorder_that_cannot_finish_is_abandoned_at_its_deadline() {
    let state = tempfile::tempdir().expect("tempdir");
    let db = state.path().join("history.sqlite");
    let verdict = fixture("blocked-write-n1.json");
    record(&db, &verdict, "n1", now()).expect("recorded");
    // Another process holds the write lock longer than the recorder may take (its busy timeout is 5 s).
    let holder = rusqlite::Connection::open(&db).expect("open");
    holder.execute_batch("BEGIN EXCLUSIVE").expect("lock");
    let request = HistoryRequest::new(&verdict, "n2", None, None, now());
    let err = hangwatch_agent::history::record_abandonable(
        Path::new(BIN),
        &db,
        &request,
        Duration::from_secs(1),
    )
    .expect_err("abandoned");
    assert!(
        err.contains("did not finish within 1.0s: abandoned"),
        "{err}"
    );
    holder.execute_batch("COMMIT").expect("unlock");
    let again = record(&db, &verdict, "n2", now()).expect("recorded after the lock");
    assert_eq!(again.seen_before, 1, "the abandoned recording left nothing");
}
