//! System tests of the zero-code instrumentation (docs/inside-evidence.md): real torch ranks (gloo, CPU) that never
//! import hangwatch and print nothing, under `hangwatch run`. Their optimizer steps become beats, so thresholds are
//! learned from real steps and a deadlock is ended at the learned threshold; the job's own `sitecustomize` still
//! runs; `--no-instrument` leaves the ranks' environment as it was.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use hangwatch_testkit::{require, torch_python, FuseMount};
use serde_json::Value;

fn plain_job(python: &Path, args: &[&str]) -> Vec<String> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/plain_torch_job.py");
    [
        python.to_string_lossy().into_owned(),
        script.to_string_lossy().into_owned(),
    ]
    .into_iter()
    .chain(args.iter().map(|a| a.to_string()))
    .collect()
}

/// A directory with a `sitecustomize.py` of the job's own: it leaves a file named after its process in `marks`.
fn jobs_own_sitecustomize(root: &Path) -> (PathBuf, PathBuf) {
    let site = root.join("site");
    let marks = root.join("marks");
    std::fs::create_dir_all(&site).expect("site dir");
    std::fs::create_dir_all(&marks).expect("marks dir");
    std::fs::write(
        site.join("sitecustomize.py"),
        format!(
            "import os\nopen(os.path.join({:?}, str(os.getpid())), 'w').close()\n",
            marks.to_string_lossy()
        ),
    )
    .expect("sitecustomize.py");
    (site, marks)
}

#[test]
fn a_silent_torch_job_learns_from_its_optimizer_steps_and_a_deadlock_is_ended_at_the_learned_threshold(
) {
    let torch = require!(torch_python());
    let tmp = tempfile::tempdir().expect("tempdir");
    let (site, marks) = jobs_own_sitecustomize(tmp.path());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
    cmd.env("PYTHONPATH", &site);
    // A floor of 4 s: the learned threshold (10 x the 0.2 s step, 3 x the longest) is what applies, not the 15 min
    // warm-up that a job without beats would get.
    let mut run = HangwatchRun::start_in(
        cmd,
        &["--nproc", "3", "--min-stall", "4s", "--quiet"],
        &plain_job(
            torch,
            &[
                "--step-time",
                "0.2",
                "--deadlock-after",
                "25",
                "--deadlock-rank",
                "1",
            ],
        ),
    );
    let done = run.finish(Duration::from_secs(120));
    done.assert_code(75);
    done.culprit(1);
    let thresholds: Value = serde_json::from_str(
        &std::fs::read_to_string(done.report_dir.join("thresholds.json")).expect("thresholds.json"),
    )
    .expect("thresholds.json is JSON");
    assert_eq!(thresholds["basis"], "learned", "{thresholds:#}");
    assert_eq!(thresholds["progress_source"], "heartbeat", "{thresholds:#}");
    assert!(
        thresholds["samples"].as_u64() >= Some(8),
        "learned from the optimizer steps: {thresholds:#}"
    );
    assert!(
        thresholds["hard_s"].as_f64() < Some(60.0),
        "not the warm-up: {thresholds:#}"
    );
    // The job's own sitecustomize ran in every rank.
    let ran = std::fs::read_dir(&marks).expect("marks").count();
    assert!(ran >= 3, "the job's sitecustomize ran in {ran} processes");
}

/// Rank 0 saves a checkpoint with `torch.save` onto a slow filesystem (a FUSE daemon that runs 20 ms in every 2 s)
/// for much longer than the threshold learned from the steps, while its peers wait in the next all_reduce: the
/// injected `checkpoint` phase makes that a checkpoint, not a hang, and the job runs to its end.
#[test]
fn a_long_torch_save_to_a_slow_filesystem_is_a_checkpoint_not_a_hang() {
    let torch = require!(torch_python());
    let tmp = tempfile::tempdir().expect("tempdir");
    let backing = tmp.path().join("backing");
    std::fs::create_dir(&backing).expect("backing dir");
    let fuse = require!(FuseMount::new(&backing));
    let ckpt_dir = fuse.path().join("ckpt");
    std::fs::create_dir(&ckpt_dir).expect("checkpoint dir on the mount");
    let seconds_file = tmp.path().join("save.seconds");
    let _slow = fuse.slow_down(Duration::from_millis(1_980), Duration::from_millis(20));
    let save_to = ckpt_dir.join("step40.pt");
    // Any alert leaves its stage here: a checkpoint must not page anyone.
    let alerts = tmp.path().join("alerts");
    let alert_command = format!("echo $HANGWATCH_STAGE >> {}", alerts.display());
    let mut run = HangwatchRun::start(
        &[
            "--nproc",
            "3",
            "--min-stall",
            "4s",
            "--quiet",
            "--alert-command",
            &alert_command,
        ],
        &plain_job(
            torch,
            &[
                "--steps",
                "60",
                "--step-time",
                "0.2",
                "--save-at",
                "40",
                "--save-mb",
                "128",
                "--save-to",
                &save_to.to_string_lossy(),
                "--save-seconds-to",
                &seconds_file.to_string_lossy(),
            ],
        ),
    );
    let done = run.finish(Duration::from_secs(240));
    done.assert_code(0);
    assert_eq!(
        done.json["actions"],
        serde_json::json!([]),
        "{}",
        done.describe()
    );
    let saved: f64 = std::fs::read_to_string(&seconds_file)
        .expect("the job timed its save")
        .trim()
        .parse()
        .expect("seconds");
    // Else this test proves nothing: the save must outlast by far the threshold the 0.2 s steps teach (held to
    // the 4 s floor).
    assert!(saved > 20.0, "the save took only {saved:.1} s");
    assert_eq!(
        std::fs::read_to_string(&alerts).unwrap_or_default(),
        "",
        "no alert for a checkpoint"
    );
    // One writev of the whole tensor: the I/O counters stand still until it returns, so the fast path may take a
    // look; when it does, the checkpoint's threshold is the one in force and the mount answers its probe.
    if let Ok(text) = std::fs::read_to_string(done.report_dir.join("thresholds.json")) {
        let thresholds: Value = serde_json::from_str(&text).expect("thresholds.json is JSON");
        assert_eq!(thresholds["phase"], "checkpoint", "{thresholds:#}");
    }
    assert!(
        std::fs::metadata(&save_to).map(|m| m.len()).unwrap_or(0) > 128 << 20,
        "the checkpoint was written whole"
    );
}

/// Ranks that wrote their own Flight Recorder dumps (`<TORCH_FR_DUMP_TEMP_FILE><rank>`: real pickles recorded from
/// torch, where rank 2 never joined all_reduce #6) and then wait alike, without hangwatch's client to ask: the roll
/// call reads the dumps and names rank 2 from them.
#[test]
fn dumps_the_job_wrote_itself_are_read_when_its_ranks_cannot_be_asked() {
    let py = hangwatch_testkit::python().expect("python3");
    let tmp = tempfile::tempdir().expect("tempdir");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../diagnosis/tests/fixtures/flight_recorder/pickled");
    let prefix = tmp.path().join("fr_trace_rank_");
    let script = format!(
        "import os, shutil, time\n\
         rank = os.environ['RANK']\n\
         shutil.copy(os.path.join({fixtures:?}, 'rank' + rank + '.pickle'), os.environ['TORCH_FR_DUMP_TEMP_FILE'] + rank)\n\
         time.sleep(600)\n",
        fixtures = fixtures.display().to_string(),
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
    cmd.env("TORCH_FR_DUMP_TEMP_FILE", &prefix);
    let mut run = HangwatchRun::start_in(
        cmd,
        &[
            "--nproc",
            "3",
            "--no-instrument",
            "--stall-after",
            "4s",
            "--quiet",
        ],
        &[py.display().to_string(), "-c".into(), script],
    );
    let done = run.finish(Duration::from_secs(90));
    done.assert_code(75);
    done.culprit(2);
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("rank 2 never joined all_reduce #6 of process group 0"),
        "{summary}\n{}",
        done.describe()
    );
}

fn printed_python_path(flags: &[&str], torch: &Path) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
    cmd.env("PYTHONPATH", "/opt/job-lib");
    let mut run = HangwatchRun::start_in(
        cmd,
        &[&["--nproc", "1"], flags].concat(),
        &plain_job(torch, &["--steps", "1", "--step-time", "0", "--print-path"]),
    );
    let done = run.finish(Duration::from_secs(60));
    done.assert_code(0);
    let out = run.stderr_text();
    out.lines()
        .find_map(|l| l.split("PYTHONPATH=").nth(1))
        .unwrap_or_else(|| panic!("the job printed no PYTHONPATH: {out}"))
        .trim()
        .to_string()
}

#[test]
fn no_instrument_leaves_the_ranks_python_path_as_it_was() {
    let torch = require!(torch_python());
    let instrumented = printed_python_path(&[], torch);
    assert!(
        instrumented.ends_with(":/opt/job-lib") && instrumented.contains("hangwatch-"),
        "the bootstrap goes first, the job's path after it: {instrumented}"
    );
    assert_eq!(
        printed_python_path(&["--no-instrument"], torch),
        "/opt/job-lib"
    );
}

/// Every rank waits for an async collective at one line, where rank 2 issued an all_gather and the others an
/// all_reduce: /proc sees the same stack everywhere; the ranks' Flight Recorders (switched on by `run`) name rank 2
/// and what it entered.
#[test]
fn a_collective_mismatch_that_every_stack_hides_is_named_from_the_flight_recorders() {
    let torch = require!(torch_python());
    let mut run = HangwatchRun::start(
        &["--nproc", "3", "--min-stall", "4s", "--quiet"],
        &plain_job(
            torch,
            &[
                "--step-time",
                "0.2",
                "--mismatch-after",
                "20",
                "--mismatch-rank",
                "2",
            ],
        ),
    );
    let done = run.finish(Duration::from_secs(120));
    done.assert_code(75);
    let verdict = &done.json;
    assert_eq!(verdict["kind"], "diverged", "{}", done.describe());
    done.culprit(2);
    let summary = verdict["summary"].as_str().unwrap_or_default();
    assert!(
        summary.starts_with("rank 2 entered all_gather #")
            && summary
                .contains("of process group 0 ([4] float32) where ranks 0-1 entered all_reduce #"),
        "{summary}"
    );
    assert_eq!(
        verdict["collectives"]["findings"][0]["kind"], "mismatch",
        "{:#}",
        verdict["collectives"]
    );
    assert_eq!(verdict["collectives"]["unanswered"], serde_json::json!([]));
}

/// Rank 1 enters a C call that holds the GIL: its thread cannot answer for its Flight Recorder, and the roll call
/// does not wait for it; the ranks that answered are in the verdict beside the kernel view's culprit.
#[test]
fn a_rank_holding_the_gil_does_not_return_its_flight_recorder_and_is_still_named() {
    let torch = require!(torch_python());
    let mut run = HangwatchRun::start(
        &["--nproc", "3", "--stall-after", "4s", "--quiet"],
        &plain_job(
            torch,
            &[
                "--step-time",
                "0.2",
                "--hold-gil-after",
                "10",
                "--hold-gil-rank",
                "1",
            ],
        ),
    );
    let done = run.finish(Duration::from_secs(120));
    done.assert_code(75);
    assert_eq!(done.json["kind"], "busy", "{}", done.describe());
    done.culprit(1);
    let collectives = &done.json["collectives"];
    assert_eq!(
        collectives["unanswered"],
        serde_json::json!([1]),
        "{collectives:#}"
    );
    assert_eq!(
        collectives["findings"][0]["ranks"],
        serde_json::json!([0, 2]),
        "{collectives:#}"
    );
    let warned = done.json["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|w| w.starts_with("rank 1 did not return its Flight Recorder in time"));
    assert!(warned, "{}", done.describe());
}
