//! System test of who owns a rank's beat slot: a rank beats through its shared-memory slot while DataLoader
//! workers started by spawn, forkserver and fork come and go, each importing the Python client with the rank's
//! environment and logging through `hangwatch.LoggingHandler`. No worker may take the slot (once such a worker
//! exited, the agent ignored the rank's beats and declared a stall the rank did not have); the rank's real stop is
//! still caught. Real torch (its DataLoader) where the test venv has it, else `multiprocessing` pools.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use hangwatch_testkit::{python, require, torch_python};

fn job() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/python/slot_workers_job.py")
        .to_string_lossy()
        .into_owned()
}

/// How long the rank beats while workers come and go: several times the stall threshold, so that a worker that
/// took the slot in the first epoch would have made a stall long before the rank stops.
const BEATING_S: &str = "16";
const STALL_AFTER: &str = "4s";

#[test]
fn workers_started_by_spawn_forkserver_and_fork_never_take_the_ranks_beat_slot() {
    let py = require!(torch_python().or_else(|_| python()));
    let mut run = HangwatchRun::start(
        &[
            "--nproc",
            "1",
            "--stall-after",
            STALL_AFTER,
            "--grace",
            "1s",
        ],
        &[
            py.to_string_lossy().into_owned(),
            job(),
            "--seconds".into(),
            BEATING_S.into(),
        ],
    );
    let finished = run.finish(Duration::from_secs(240));
    finished.assert_code(75);
    let output = std::fs::read_to_string(finished.report_dir.join("output.log"))
        .unwrap_or_else(|e| panic!("output.log: {e}\n{}", finished.describe()));
    let done = output
        .lines()
        .find_map(|l| l.split_once("workers done after ").map(|(_, rest)| rest))
        .unwrap_or_else(|| {
            panic!(
                "hangwatch ended the job while its rank was still beating (a worker took its slot)\n\
                 --- output.log ---\n{output}\n{}",
                finished.describe()
            )
        });
    let epochs: u32 = done
        .split_once(' ')
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("{done}"));
    assert!(epochs >= 3, "one epoch per start method at least: {done}");
    assert!(
        done.ends_with("beat slot: owned"),
        "the rank held its slot throughout: {done}"
    );
    for method in ["spawn", "forkserver", "fork"] {
        assert!(
            output.contains(&format!("with {method} workers done")),
            "{method}: {output}"
        );
    }
    assert!(
        output.contains("made in worker"),
        "the workers' log records reach the log: {output}"
    );
    // The stop that followed was caught, from the slot's beats.
    let stalled = finished.json["stalled_for_s"].as_f64().unwrap_or(0.0);
    assert!(stalled >= 3.5, "{}", finished.describe());
    let thresholds: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(finished.report_dir.join("thresholds.json")).unwrap_or_default(),
    )
    .unwrap_or_default();
    assert_eq!(thresholds["progress_source"], "heartbeat", "{thresholds:#}");
}
