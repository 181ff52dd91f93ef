//! `hangwatch probe` as a user runs it, on healthy, frozen, read-only and FUSE-stopped filesystems: the verdict,
//! the step that hung, the mount and filesystem type, the time it takes, the exit code, and nothing left behind.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hangwatch_testkit::{
    is_dead, is_mount_point, require, run_tool, wait_until, wait_with_deadline, ChildGuard,
    FuseMount, LoopExt4,
};
use serde_json::Value;

/// What one run of the binary came to.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

/// Runs `hangwatch ARGS`, failing the test (instead of hanging it) if the binary itself does not return.
fn hangwatch(args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut guard = ChildGuard::spawn(&mut cmd, "hangwatch").expect("hangwatch starts");
    let stdout = reader(guard.child_mut().stdout.take());
    let stderr = reader(guard.child_mut().stderr.take());
    let status = wait_with_deadline(guard.child_mut(), Duration::from_secs(20))
        .unwrap_or_else(|| panic!("hangwatch {args:?} did not return within 20 s"));
    Run {
        code: status.code(),
        took: started.elapsed(),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

fn reader<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    })
}

fn steps(probe: &Value) -> Vec<(String, String)> {
    probe["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["step"].as_str().unwrap_or_default().to_string(),
                s["outcome"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// Pids of probe children still running for `path` (their command line names it). Only `hangwatch` processes'
/// command lines are read: reading another process's can block (a rank in an mmap stall, in another test).
fn probe_children_of(path: &Path) -> Vec<u32> {
    let wanted = path.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "hangwatch")
        })
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
                let args: Vec<String> = raw
                    .split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                args.iter().any(|a| a == "__probe-child") && args.contains(&wanted)
            })
        })
        .filter(|pid| !is_dead(*pid))
        .collect()
}

fn assert_no_probe_children_left(path: &Path) {
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            probe_children_of(path).is_empty()
        }),
        "probe children of {} still alive: {:?}",
        path.display(),
        probe_children_of(path)
    );
}

#[test]
fn a_healthy_directory_is_responsive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_string_lossy().into_owned();

    let run = hangwatch(&["probe", "--json", &path]);
    assert_eq!(run.code, Some(0), "stderr: {}", run.stderr);
    let doc = run.json();
    assert_eq!(doc["version"], 1);
    let probe = &doc["probes"][0];
    assert_eq!(probe["path"], path.as_str());
    assert_eq!(probe["responsive"], true);
    assert!(
        probe["mount"].is_string() && probe["fstype"].is_string(),
        "{probe}"
    );
    assert_eq!(
        steps(probe),
        pairs(&[("stat", "ok"), ("statfs", "ok"), ("write", "ok")])
    );

    let run = hangwatch(&["probe", &path]);
    assert_eq!(run.code, Some(0));
    assert!(
        run.stdout.starts_with(&format!("{path}: mount ")),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(" responding (stat ok"),
        "{}",
        run.stdout
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the probe file was removed"
    );
}

#[test]
fn a_frozen_ext4_is_not_responding_and_the_write_step_is_named() {
    let fs = require!(LoopExt4::new(16));
    let file = fs.path().join("data.bin");
    std::fs::write(&file, b"x").unwrap();
    let frozen = fs.freeze().unwrap();
    let file_s = file.to_string_lossy().into_owned();

    let run = hangwatch(&["probe", "--timeout", "1s", "--json", &file_s]);
    println!("probe of the frozen ext4 took {:?}", run.took);
    assert_eq!(run.code, Some(1), "stderr: {}", run.stderr);
    assert!(
        run.took < Duration::from_secs(2),
        "took {:?} with a 1s timeout",
        run.took
    );
    let probe = &run.json()["probes"][0];
    assert_eq!(probe["responsive"], false);
    assert_eq!(probe["mount"], fs.path().to_string_lossy().as_ref());
    assert_eq!(probe["fstype"], "ext4");
    assert_eq!(
        steps(probe),
        pairs(&[("stat", "ok"), ("statfs", "ok"), ("write", "timeout")])
    );
    assert_eq!(probe["detail"], "write did not return within 1s");

    let run = hangwatch(&["probe", "--timeout", "1s", &file_s]);
    assert_eq!(run.code, Some(1));
    let expected = format!(
        "{file_s}: mount {} (ext4) NOT RESPONDING: write did not return within 1s (stat ok ",
        fs.path().display()
    );
    assert!(run.stdout.starts_with(&expected), "{}", run.stdout);

    drop(frozen);
    assert_no_probe_children_left(&file);
}

#[test]
fn two_paths_on_one_frozen_mount_start_one_probe_and_report_the_second_as_still_stuck() {
    let fs = require!(LoopExt4::new(16));
    let frozen = fs.freeze().unwrap();
    let mount = fs.path().to_string_lossy().into_owned();
    let lost = fs.path().join("lost+found").to_string_lossy().into_owned();

    let run = hangwatch(&["probe", "--timeout", "1s", "--json", &mount, &lost]);
    assert_eq!(run.code, Some(1));
    assert!(run.took < Duration::from_secs(2), "took {:?}", run.took);
    let doc = run.json();
    assert_eq!(doc["probes"][0]["detail"], "write did not return within 1s");
    let second = doc["probes"][1]["detail"].as_str().unwrap_or_default();
    assert!(
        second.starts_with("still stuck: a probe started"),
        "{second}"
    );

    drop(frozen);
    assert_no_probe_children_left(fs.path());
}

#[test]
fn a_read_only_probe_cannot_see_a_freeze_which_is_why_the_write_step_exists() {
    let fs = require!(LoopExt4::new(16));
    let frozen = fs.freeze().unwrap();
    let run = hangwatch(&[
        "probe",
        "--read-only",
        "--timeout",
        "1s",
        "--json",
        &fs.path().to_string_lossy(),
    ]);
    assert_eq!(run.code, Some(0), "stderr: {}", run.stderr);
    let probe = &run.json()["probes"][0];
    assert_eq!(probe["responsive"], true);
    assert_eq!(
        steps(probe),
        pairs(&[
            ("stat", "ok"),
            ("statfs", "ok"),
            ("write", "skipped: read-only probe (--read-only)")
        ])
    );
    drop(frozen);
}

#[test]
fn a_read_only_filesystem_is_judged_on_its_reads() {
    let fs = require!(LoopExt4::new(16));
    let mount = fs.path().to_string_lossy().into_owned();
    run_tool(
        "mount",
        &["-o", "remount,ro", &mount],
        Duration::from_secs(10),
    )
    .unwrap();
    let run = hangwatch(&["probe", "--json", &mount]);
    assert_eq!(run.code, Some(0), "stderr: {}", run.stderr);
    let probe = &run.json()["probes"][0];
    assert_eq!(probe["responsive"], true);
    let write = &steps(probe)[2];
    assert!(
        write.1.starts_with("skipped: read-only filesystem"),
        "{write:?}"
    );
}

#[test]
fn a_fuse_mount_with_a_stopped_daemon_is_not_responding_from_the_first_step() {
    let backing = tempfile::tempdir().unwrap();
    std::fs::write(backing.path().join("file"), b"x").unwrap();
    let fuse = require!(FuseMount::new(backing.path()));
    let mount = fuse.path().to_path_buf();
    let stopped = fuse.stop_daemon().unwrap();

    let run = hangwatch(&[
        "probe",
        "--timeout",
        "1s",
        "--json",
        &fuse.path().join("file").to_string_lossy(),
    ]);
    println!("probe of the stopped FUSE mount took {:?}", run.took);
    assert_eq!(run.code, Some(1), "stderr: {}", run.stderr);
    assert!(run.took < Duration::from_secs(2), "took {:?}", run.took);
    let probe = &run.json()["probes"][0];
    assert_eq!(probe["responsive"], false);
    assert_eq!(probe["mount"], mount.to_string_lossy().as_ref());
    assert!(
        probe["fstype"]
            .as_str()
            .is_some_and(|t| t.starts_with("fuse")),
        "{probe}"
    );
    assert_eq!(steps(probe), pairs(&[("stat", "timeout")]));

    drop(stopped);
    assert_no_probe_children_left(&mount);
    drop(fuse);
    assert!(!is_mount_point(&mount));
}

#[test]
fn a_path_that_does_not_exist_is_a_usage_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir
        .path()
        .join("no-such-dir")
        .to_string_lossy()
        .into_owned();
    let run = hangwatch(&["probe", &missing]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains(&format!("{missing} does not exist")),
        "{}",
        run.stderr
    );
    assert!(run.stdout.is_empty());
}

#[test]
fn a_bad_timeout_is_a_usage_error() {
    for timeout in ["soon", "0s"] {
        let run = hangwatch(&["probe", "--timeout", timeout, "/"]);
        assert_eq!(run.code, Some(2), "--timeout {timeout}: {}", run.stderr);
        assert!(run.stderr.contains("timeout"), "{}", run.stderr);
    }
}

#[test]
fn help_documents_the_exit_codes() {
    let run = hangwatch(&["probe", "--help"]);
    assert_eq!(run.code, Some(0));
    assert!(run.stdout.contains("Exit status: 0"), "{}", run.stdout);
}
