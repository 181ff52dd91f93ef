//! The `Prober` on real hung filesystems, in one process: a stuck probe is kept and reported as still stuck
//! instead of being restarted, mounts are probed in parallel, and a stuck probe's leftovers are cleaned up once
//! the filesystem recovers.
//!
//! Probe children are this test binary re-run on [`probe_child_entry_point`] with the request in the
//! environment, since the `hangwatch __probe-child` subcommand lives in the CLI crate.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hangwatch_inspect::probe::{child_main, ChildRequest, ProbeOptions, Prober, PROBE_FILE_PREFIX};
use hangwatch_testkit::{is_dead, require, wait_until, LoopExt4};

const REQUEST_ENV: &str = "HANGWATCH_TEST_PROBE_REQUEST";
const TIMEOUT: Duration = Duration::from_secs(1);

/// Not a test: the probe child. As a normal test run (no request in the environment) it returns at once.
#[test]
fn probe_child_entry_point() {
    let Ok(json) = std::env::var(REQUEST_ENV) else {
        return;
    };
    let request: ChildRequest =
        serde_json::from_str(&json).expect("the parent sends a valid request");
    std::process::exit(child_main(&request));
}

fn prober() -> Prober {
    let exe = std::env::current_exe().expect("test binary path");
    Prober::with_child_command(Arc::new(move |request: &ChildRequest| {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--exact",
            "probe_child_entry_point",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(
            REQUEST_ENV,
            serde_json::to_string(request).expect("request serialises"),
        );
        cmd
    }))
}

fn options() -> ProbeOptions {
    ProbeOptions {
        timeout: TIMEOUT,
        write: true,
    }
}

fn probe_files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(PROBE_FILE_PREFIX))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_healthy_directory_responds_and_keeps_no_probe_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut prober = prober();
    let result = prober.probe(dir.path(), &options()).unwrap();
    assert_eq!(result.responsive, Some(true), "{result:?}");
    let steps: Vec<(&str, &str)> = result
        .steps
        .iter()
        .map(|s| (s.step.as_str(), s.outcome.as_str()))
        .collect();
    assert_eq!(steps, [("stat", "ok"), ("statfs", "ok"), ("write", "ok")]);
    assert!(probe_files_in(dir.path()).is_empty());
    assert!(prober.outstanding().is_empty());
}

#[test]
fn a_stuck_mount_is_reported_still_stuck_at_once_and_probed_again_after_it_recovers() {
    let fs = require!(LoopExt4::new(16));
    std::fs::create_dir(fs.path().join("sub")).unwrap();
    let mut prober = prober();
    let frozen = fs.freeze().unwrap();

    let first = prober.probe(fs.path(), &options()).unwrap();
    assert_eq!(first.responsive, Some(false), "{first:?}");
    assert_eq!(first.detail, "write did not return within 1s");
    assert_eq!(first.fstype.as_deref(), Some("ext4"));
    assert_eq!(first.mount.as_deref(), Some(&*fs.path().to_string_lossy()));
    let outstanding = prober.outstanding();
    assert_eq!(outstanding.len(), 1, "{outstanding:?}");
    assert_eq!(outstanding[0].step.as_deref(), Some("write"));
    let stuck_pid = outstanding[0].pid;

    let started = Instant::now();
    let second = prober.probe(&fs.path().join("sub"), &options()).unwrap();
    let took = started.elapsed();
    println!(
        "second probe of the frozen mount answered in {took:?}: {}",
        second.detail
    );
    assert!(took < Duration::from_millis(200), "took {took:?}");
    assert_eq!(second.responsive, Some(false));
    assert!(
        second.detail.starts_with("still stuck: a probe started"),
        "{}",
        second.detail
    );
    assert!(
        second.detail.contains(&stuck_pid.to_string()),
        "{}",
        second.detail
    );
    assert_eq!(prober.outstanding().len(), 1, "no second child was started");

    drop(frozen);
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            prober.outstanding().is_empty()
        }),
        "the stuck probe child {stuck_pid} did not end after the thaw"
    );
    assert!(is_dead(stuck_pid));
    let left = probe_files_in(fs.path());
    println!("probe files left by the killed child after the thaw: {left:?}");

    let third = prober.probe(fs.path(), &options()).unwrap();
    assert_eq!(third.responsive, Some(true), "{third:?}");
    assert!(
        probe_files_in(fs.path()).is_empty(),
        "the next probe removes what the stuck one left: {:?}",
        probe_files_in(fs.path())
    );
}

#[test]
fn different_mounts_are_probed_in_parallel() {
    let a = require!(LoopExt4::new(16));
    let b = require!(LoopExt4::new(16));
    let healthy = tempfile::tempdir().unwrap();
    let _frozen_a = a.freeze().unwrap();
    let _frozen_b = b.freeze().unwrap();
    let mut prober = prober();

    let started = Instant::now();
    let results = prober.probe_all(&[a.path(), healthy.path(), b.path()], &options());
    let took = started.elapsed();
    println!("three mounts, two frozen, probed in {took:?}");
    assert!(
        took < TIMEOUT + Duration::from_millis(800),
        "took {took:?}: not parallel"
    );
    let responsive: Vec<Option<bool>> = results
        .iter()
        .map(|r| r.as_ref().unwrap().responsive)
        .collect();
    assert_eq!(
        responsive,
        [Some(false), Some(true), Some(false)],
        "results keep the order of the paths"
    );
}
