//! Threads of one rank (issue 35, item 3): a rank whose own threads deadlock on Python locks is named with every
//! thread that waits, its name and its line, and the verdict says a deadlock inside the rank is likely. Two real
//! ranks under `hangwatch run --nproc 2`: rank 1 deadlocks after 3 steps, rank 0 waits in the barrier.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use hangwatch_testkit::{python, require};
use serde_json::Value;

/// Rank 1 of 2 does `behaviour` after 3 steps; the job is ended, rank 1 named alone.
/// The run is returned with the verdict: dropping it removes the evidence.
fn rank_1_deadlocks(py: &Path, behaviour: &str) -> (HangwatchRun, Finished) {
    let mut run = HangwatchRun::start(
        &["--nproc", "2", "--stall-after", STALL_AFTER, "--quiet"],
        &rank_job(
            py,
            &[
                "--step-time",
                "0.1",
                "--behaviour",
                behaviour,
                "--after",
                "3",
                "--only-rank",
                "1",
            ],
        ),
    );
    let done = run.finish(Duration::from_secs(45));
    done.assert_code(75);
    assert_eq!(done.json["kind"], "diverged", "{}", done.describe());
    done.culprit(1);
    assert_all_dead(done.rank_pids().into_values(), "ranks");
    (run, done)
}

/// The culprit's listed thread named `name`.
fn thread<'a>(done: &'a Finished, name: &str) -> &'a Value {
    done.json["culprits"][0]["threads"]
        .as_array()
        .and_then(|threads| threads.iter().find(|t| t["name"] == name))
        .unwrap_or_else(|| panic!("no thread {name} listed: {}", done.describe()))
}

/// The function of a listed thread's own code (Python 3.11+ names it qualified: `abba.<locals>.flush`).
fn function_of(t: &Value) -> &str {
    t["code"]["function"].as_str().unwrap_or_default()
}

/// `file:line` of a listed thread's own code.
fn line_of(t: &Value) -> String {
    format!(
        "{}:{}",
        t["code"]["file"].as_str().unwrap_or("?"),
        t["code"]["line"]
    )
}

#[test]
fn two_threads_of_a_rank_in_an_abba_deadlock_are_named_with_their_lines_and_deadlock_said() {
    let py = require!(python());
    let (_run, done) = rank_1_deadlocks(py, "abba");
    let main = thread(&done, "MainThread");
    let flusher = thread(&done, "metrics-flusher");
    for t in [main, flusher] {
        assert_eq!(t["waits_for"], "lock", "{t:#}");
        assert_eq!(t["syscall"], "futex", "{t:#}");
        assert_eq!(t["code"]["file"], "rank.py", "{t:#}");
    }
    assert!(function_of(main).ends_with("abba"), "{main:#}");
    assert!(function_of(flusher).ends_with("flush"), "{flusher:#}");
    assert_eq!(main["held_by"]["name"], "metrics-flusher", "{main:#}");
    let deadlock = &done.json["culprits"][0]["deadlock"];
    assert_eq!(
        deadlock["threads"].as_array().map(Vec::len),
        Some(2),
        "{deadlock:#}"
    );
    let said = format!(
        "a deadlock inside rank 1 is likely: 2 threads of it each wait for a lock: MainThread at {}, \
         metrics-flusher at {}",
        line_of(main),
        line_of(flusher)
    );
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(summary.contains(&said), "`{said}` not in `{summary}`");
    let text = std::fs::read_to_string(done.report_dir.join("verdict.txt"))
        .unwrap_or_else(|e| panic!("verdict.txt: {e}: {}", done.describe()));
    assert!(text.contains(&said), "{text}");
    assert!(
        text.contains("  threads (those idle in a known pool left out):"),
        "{text}"
    );
    assert!(text.contains("metrics-flusher (tid "), "{text}");
}

#[test]
fn an_rlock_whose_owner_waits_elsewhere_names_the_owner() {
    let py = require!(python());
    let (_run, done) = rank_1_deadlocks(py, "rlock");
    let main = thread(&done, "MainThread");
    let saver = thread(&done, "ckpt-saver");
    assert_eq!(main["waits_for"], "lock", "{main:#}");
    assert!(function_of(main).ends_with("rlock_wait"), "{main:#}");
    assert_eq!(saver["waits_for"], "condition", "{saver:#}");
    assert!(function_of(saver).ends_with("save"), "{saver:#}");
    assert_eq!(main["held_by"]["name"], "ckpt-saver", "{main:#}");
    assert_eq!(main["held_by"]["tid"], saver["tid"], "{main:#}");
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("a deadlock inside rank 1 is likely")
            && summary.contains("the lock MainThread waits for is held by ckpt-saver"),
        "{summary}"
    );
}
