//! System tests of the site configuration: the real binary reading a system file (`--config`), a user file
//! (`XDG_CONFIG_HOME`), `HANGWATCH_*` variables and flags, in that order; `hangwatch config` saying where each
//! value comes from; a bad file refused with its line before anything of the job starts; and a user file on a
//! stopped filesystem that cannot hold `run`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use hangwatch_testkit::{require, wait_with_deadline, FuseMount};
use serde_json::Value;

/// A hangwatch whose files are the ones given: `system` for /etc's, `user_dir` as XDG_CONFIG_HOME.
fn configured(system: &Path, user_dir: &Path) -> Command {
    let mut cmd = hangwatch();
    cmd.env("XDG_CONFIG_HOME", user_dir)
        .env_remove("HANGWATCH_CONFIG")
        .arg("--config")
        .arg(system);
    cmd
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a file in a directory")).expect("its directory");
    std::fs::write(path, text).expect("the file written");
}

/// Runs `cmd` (a `run -- /bin/true`) and insists it succeeded; its output.
fn succeeds(mut cmd: Command) -> std::process::Output {
    let out = cmd.stdin(Stdio::null()).output().expect("hangwatch starts");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn option<'a>(doc: &'a Value, command: &str, key: &str) -> &'a Value {
    let options = doc["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["command"] == command)
        .flat_map(|c| c["options"].as_array().into_iter().flatten());
    options
        .into_iter()
        .find(|o| o["key"] == key)
        .unwrap_or_else(|| panic!("no {command}.{key} in {doc:#}"))
}

#[test]
fn files_then_variables_then_flags_and_config_says_where_each_value_comes_from() {
    let dir = tempfile::tempdir().unwrap();
    let system = dir.path().join("site.toml");
    let user_dir = dir.path().join("user");
    let site_reports = dir.path().join("site-reports");
    let user_reports = dir.path().join("user-reports");
    write(
        &system,
        &format!(
            "# the site's defaults\nmax_stall = \"40m\"\n\n[run]\naction = \"observe\"\nreport_dir = \"{}\"\n\
             json = true\n\n[coordinator]\nalert_deadline = \"20s\"\n",
            site_reports.display()
        ),
    );
    write(
        &user_dir.join("hangwatch/config.toml"),
        &format!("[run]\nreport_dir = \"{}\"\n", user_reports.display()),
    );

    let out = configured(&system, &user_dir)
        .env("HANGWATCH_GRACE", "3s")
        .args(["config", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["files"][0]["state"], "read");
    assert_eq!(doc["files"][1]["state"], "read");
    let origin = |command: &str, key: &str| {
        let o = option(&doc, command, key);
        (
            o["values"][0].as_str().unwrap_or("").to_string(),
            o["origin"].clone(),
        )
    };
    let (value, from) = origin("run", "max_stall");
    assert_eq!(value, "40m");
    assert_eq!(
        (from["kind"].as_str(), from["line"].as_u64()),
        (Some("file"), Some(2))
    );
    assert_eq!(
        origin("coordinator", "max_stall").0,
        "40m",
        "a key above the sections is for every command"
    );
    let (value, from) = origin("run", "report_dir");
    assert_eq!(
        value,
        user_reports.to_str().unwrap(),
        "the user's file wins over the site's"
    );
    assert_eq!(
        from["path"],
        user_dir.join("hangwatch/config.toml").to_str().unwrap()
    );
    let (value, from) = origin("run", "grace");
    assert_eq!(
        (value.as_str(), from["variable"].as_str()),
        ("3s", Some("HANGWATCH_GRACE"))
    );
    assert_eq!(origin("run", "fs_stall").1["kind"], "default");
    assert_eq!(origin("coordinator", "alert_deadline").0, "20s");

    // `run` takes them: --json from the site's file (the summary on stdout), the user's report directory.
    let mut cmd = configured(&system, &user_dir);
    cmd.args(["run", "--", "/bin/true"]);
    let out = succeeds(cmd);
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "json = true in the site's file gives a JSON summary: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert!(summary.is_object());
    assert!(
        user_reports.join("output.log").exists(),
        "report_dir from the user's file"
    );
    assert!(
        !site_reports.exists(),
        "the site's report_dir lost to the user's"
    );

    // A variable beats both files; a flag beats the variable.
    let env_reports = dir.path().join("env-reports");
    let flag_reports = dir.path().join("flag-reports");
    let mut cmd = configured(&system, &user_dir);
    cmd.env("HANGWATCH_REPORT_DIR", &env_reports)
        .args(["run", "--", "/bin/true"]);
    succeeds(cmd);
    assert!(env_reports.join("output.log").exists());
    let mut cmd = configured(&system, &user_dir);
    cmd.env("HANGWATCH_REPORT_DIR", &env_reports)
        .args(["run", "--report-dir"])
        .arg(&flag_reports)
        .args(["--", "/bin/true"]);
    succeeds(cmd);
    assert!(flag_reports.join("output.log").exists());
}

#[test]
fn a_bad_file_is_refused_with_its_line_and_what_is_expected_before_the_job_starts() {
    let dir = tempfile::tempdir().unwrap();
    let user_dir = dir.path().join("user");
    let marker = dir.path().join("job-ran");
    let cases = [
        ("[run]\n\nstal_after = \"5m\"\n", "line 3: `stal_after` is not an option of `hangwatch run`; did you mean `stall_after`?"),
        ("[run]\naction = \"kill\"\n", "line 2: action = \"kill\": invalid value 'kill' for '--action <ACTION>' [possible values: observe, abort, requeue]"),
        ("[run]\ngrace = \"10 parsecs\"\n", "line 2: grace = \"10 parsecs\": invalid value '10 parsecs' for '--grace <GRACE>'"),
        ("stall_after = 5m\n", "line 1: not valid TOML"),
        ("[rnu]\nquiet = true\n", "line 2: [rnu] is not a hangwatch command"),
        ("[run]\nwebhook = \"https://hooks.example.com/T/B/secret\"\n", "line 2: `webhook` cannot be set in a file: a webhook URL is a secret"),
    ];
    for (text, wanted) in cases {
        let system = dir.path().join("site.toml");
        write(&system, text);
        let out = configured(&system, &user_dir)
            .args(["run", "--", "touch"])
            .arg(&marker)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {stderr}");
        assert!(
            stderr.contains(&format!("{} {wanted}", system.display())),
            "{text}: wanted {wanted:?} in {stderr}"
        );
        assert!(
            !marker.exists(),
            "the job must not start with a bad configuration"
        );
    }
    // --config names a file that must exist; the system file may be absent.
    let out = configured(&dir.path().join("absent.toml"), &user_dir)
        .args(["run", "--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("absent.toml (--config or HANGWATCH_CONFIG) does not exist"));
}

/// Issue 36: `hangwatch node --config FILE` was refused ("unexpected argument '--config'"): `--config` is taken
/// after the command's name as before it, the file is applied, and the job's own `--config` stays the job's.
#[test]
fn config_after_the_commands_name_is_applied_and_the_jobs_own_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let user_dir = dir.path().join("user");
    let system = dir.path().join("site.toml");
    let log = dir.path().join("job.log");
    write(
        &system,
        &format!("[run]\nlog_file = \"{}\"\nquiet = true\n", log.display()),
    );
    let out = succeeds({
        let mut cmd = hangwatch();
        cmd.env("XDG_CONFIG_HOME", &user_dir)
            .env_remove("HANGWATCH_CONFIG")
            .arg("run")
            .arg("--config")
            .arg(&system)
            .args([
                "--",
                "sh",
                "-c",
                "echo configured-after-the-name",
                "job",
                "--config",
                "job.toml",
            ]);
        cmd
    });
    let written = std::fs::read_to_string(&log).unwrap_or_else(|e| {
        panic!(
            "the file's log_file was not applied ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(written.contains("configured-after-the-name"), "{written}");

    // A bad file named after the command's name is read, and refused as one before it.
    write(&system, "[run]\naction = \"kill\"\n");
    for command in ["run", "node"] {
        let mut cmd = hangwatch();
        cmd.env("XDG_CONFIG_HOME", &user_dir)
            .env_remove("HANGWATCH_CONFIG")
            .arg(command)
            .arg(format!("--config={}", system.display()));
        if command == "run" {
            cmd.args(["--", "/bin/true"]);
        }
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains(&format!("{} line 2: action", system.display())),
            "{command}: {stderr}"
        );
        assert!(
            !stderr.contains("unexpected argument"),
            "{command}: {stderr}"
        );
    }

    // `hangwatch node --config FILE --help` is help, not a usage error.
    write(&system, "[run]\nquiet = true\n");
    let out = succeeds({
        let mut cmd = hangwatch();
        cmd.env("XDG_CONFIG_HOME", &user_dir)
            .env_remove("HANGWATCH_CONFIG")
            .arg("node")
            .arg("--config")
            .arg(&system)
            .arg("--help");
        cmd
    });
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("--config <FILE>"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_user_file_on_a_stopped_filesystem_is_skipped_within_the_deadline_and_run_goes_on() {
    let backing = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(backing.path().join("hangwatch")).unwrap();
    std::fs::write(
        backing.path().join("hangwatch/config.toml"),
        "[run]\nquiet = true\n",
    )
    .unwrap();
    let fuse = require!(FuseMount::new(backing.path()));
    let dir = tempfile::tempdir().unwrap();
    let system = dir.path().join("site.toml");
    write(&system, "[run]\naction = \"observe\"\n");
    let _stopped = require!(fuse.stop_daemon());
    let started = Instant::now();
    let mut child = configured(&system, fuse.path())
        .args(["run", "--report-dir"])
        .arg(dir.path().join("reports"))
        .args(["--", "/bin/true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_with_deadline(&mut child, Duration::from_secs(60));
    let took = started.elapsed();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    let Some(status) = status else {
        let _ = child.kill();
        panic!("run is held by the user's configuration file on the stopped filesystem ({took:?})");
    };
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("configuration file skipped") && stderr.contains("did not return within"),
        "says which file was skipped and why: {stderr}"
    );
}
