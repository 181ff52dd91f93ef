//! `hangwatch doctor --json` in a deliberately bad environment, for real: a user without rights or capabilities,
//! PyTorch's NCCL error handling off, a huge watchdog timeout, the report directory on a FUSE mount (bindfs; FUSE
//! counts as remote); and as root in a clean environment. On a node with the node service, the TaskProlog that
//! slurm.conf names (a real slurm.conf, the test cluster's, through `$SLURM_CONF`). The sysctl checks are covered by
//! the crate's fake-/proc tests: changing this machine's sysctls in a test is not worth the risk.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use hangwatch_testkit::{
    require, require_root, strict_mode, wait_with_deadline, ChildGuard, FuseMount,
};
use serde_json::Value;

/// Runs a doctor command line to its end (20 s at most): (exit code, the JSON document, stderr).
fn run(cmd: Command) -> (Option<i32>, Value, String) {
    let (code, out, err) = run_text(cmd);
    let json =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}\n{err}"));
    (code, json, err)
}

/// Runs a doctor command line to its end (20 s at most): (exit code, stdout, stderr).
fn run_text(mut cmd: Command) -> (Option<i32>, String, String) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn(&mut cmd, "hangwatch doctor").expect("hangwatch starts");
    let mut stdout = guard.child_mut().stdout.take().expect("piped stdout");
    let mut stderr = guard.child_mut().stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let status = wait_with_deadline(guard.child_mut(), Duration::from_secs(20))
        .expect("hangwatch doctor did not return within 20 s");
    (
        status.code(),
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

fn finding<'a>(doc: &'a Value, check: &str) -> &'a Value {
    doc["findings"]
        .as_array()
        .expect("findings is a list")
        .iter()
        .find(|f| f["check"] == check)
        .unwrap_or_else(|| panic!("no {check} finding: {doc:#}"))
}

/// A failed check of this severity, with a fix.
fn assert_problem(doc: &Value, check: &str, severity: &str) {
    let f = finding(doc, check);
    assert_eq!(f["ok"], false, "{check} passed: {f:#}");
    assert_eq!(f["severity"], severity, "{f:#}");
    assert!(
        f["fix"].as_str().is_some_and(|fix| !fix.is_empty()),
        "{check} has no fix: {f:#}"
    );
}

fn assert_passed(doc: &Value, check: &str) {
    let f = finding(doc, check);
    assert_eq!(f["ok"], true, "{check} failed: {f:#}");
    assert!(f.get("fix").is_none(), "{f:#}");
}

fn sysctl(name: &str) -> Option<i64> {
    std::fs::read_to_string(Path::new("/proc/sys").join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn skip_unless_root() -> bool {
    if let Err(why) = require_root() {
        assert!(!strict_mode(), "{why}");
        eprintln!("SKIPPED: {why}");
        return true;
    }
    false
}

#[test]
fn a_user_without_rights_with_nccl_handling_off_and_reports_on_fuse_is_flagged() {
    if skip_unless_root() {
        return;
    }
    let backing = tempfile::tempdir().unwrap();
    let fuse = require!(FuseMount::new(backing.path()));
    // The test's target directory may not be readable by nobody: a copy readable by all.
    let bin_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = bin_dir.path().join("hangwatch");
    std::fs::copy(env!("CARGO_BIN_EXE_hangwatch"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let report_dir = fuse.path().join("reports");

    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
    ])
    .arg(&bin)
    .args(["doctor", "--json", "--report-dir"])
    .arg(&report_dir)
    .current_dir(bin_dir.path())
    .env_clear()
    .env("PATH", "/usr/bin:/bin")
    .env("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    .env("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "86400");
    let (code, doc, stderr) = run(cmd);

    assert_eq!(doc["version"], 1);
    assert_eq!(doc["facts"]["euid"], 65534, "{doc:#}");
    assert_problem(&doc, "kernel_stacks", "blind");
    assert_problem(&doc, "report_dir", "blind");
    let report = finding(&doc, "report_dir")["what"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        report.contains(&report_dir.display().to_string()) && report.contains("(fuse"),
        "{report}"
    );
    assert!(
        !report_dir.exists(),
        "doctor must not create (or touch) the report directory"
    );
    assert_problem(&doc, "nccl_async_error_handling", "silent");
    assert_problem(&doc, "collective_timeout", "silent");
    assert!(finding(&doc, "collective_timeout")["what"]
        .as_str()
        .unwrap()
        .contains("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=86400 (24 h)"));
    // Python stacks: same-user ranks stay readable unless Yama says otherwise.
    match sysctl("kernel/yama/ptrace_scope") {
        Some(scope) if scope >= 2 => assert_problem(&doc, "ptrace", "blind"),
        _ => assert_passed(&doc, "ptrace"),
    }
    if sysctl("kernel/dmesg_restrict") == Some(1) {
        assert_problem(&doc, "kernel_log", "blind");
    }
    assert!(doc["problems"].as_u64().unwrap() >= 4, "{doc:#}");
    assert_eq!(code, Some(1), "problems found means exit 1: {stderr}");
}

#[test]
fn root_with_a_clean_environment_has_the_rights_and_no_job_settings_problems() {
    if skip_unless_root() {
        return;
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
    cmd.args(["doctor", "--json"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    let (code, doc, stderr) = run(cmd);

    assert_eq!(doc["facts"]["euid"], 0);
    for check in [
        "kernel_stacks",
        "nccl_async_error_handling",
        "nccl_monitoring",
        "collective_timeout",
        "nccl_blocking_wait",
    ] {
        assert_passed(&doc, check);
    }
    if sysctl("kernel/yama/ptrace_scope") != Some(3) {
        assert_passed(&doc, "ptrace");
    }
    let problems = doc["problems"].as_u64().unwrap();
    assert_eq!(code, Some(if problems == 0 { 0 } else { 1 }), "{stderr}");
}

#[test]
fn the_checklist_shows_passed_checks_and_the_fix_under_each_problem() {
    let out = Command::new(env!("CARGO_BIN_EXE_hangwatch"))
        .arg("doctor")
        .env("TORCH_NCCL_ENABLE_MONITORING", "0")
        .env("LANG", "C")
        .env_remove("LC_ALL")
        .env_remove("LC_CTYPE")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.stdout.is_empty(), "human output goes to stderr");
    assert!(
        text.contains("Silent (a hang would go unreported):"),
        "{text}"
    );
    let line = text
        .lines()
        .position(|l| l.contains("XX nccl_monitoring: TORCH_NCCL_ENABLE_MONITORING=0"))
        .unwrap_or_else(|| panic!("{text}"));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[line + 1].trim_start().starts_with("why: "), "{text}");
    assert_eq!(
        lines[line + 2].trim(),
        "fix: unset TORCH_NCCL_ENABLE_MONITORING   (or export TORCH_NCCL_ENABLE_MONITORING=1)"
    );
    assert!(text.contains("ok nccl_async_error_handling:"), "{text}");
    assert_eq!(out.status.code(), Some(1));
}

/// `run` says the Blind and Silent findings before the job starts, one line each; here the report directory on a
/// FUSE mount (the check that used to live in run.rs) and NCCL error handling switched off.
#[test]
fn run_says_the_problems_at_start_one_line_each() {
    if skip_unless_root() {
        return;
    }
    let backing = tempfile::tempdir().unwrap();
    let fuse = require!(FuseMount::new(backing.path()));
    let report_dir = fuse.path().join("report");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
    cmd.args(["run", "--report-dir"])
        .arg(&report_dir)
        .args(["--", "true"])
        .env("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn(&mut cmd, "hangwatch run").expect("hangwatch starts");
    let mut stderr = guard.child_mut().stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let status = wait_with_deadline(guard.child_mut(), Duration::from_secs(60))
        .expect("hangwatch run -- true did not return within 60 s");
    let text = reader.join().unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{text}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("hangwatch: doctor: "))
        .collect();
    assert!(
        lines.iter().any(
            |l| l.contains(&format!("the report directory {}", report_dir.display()))
                && l.contains("(fix: --report-dir on a node-local disk")
        ),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("TORCH_NCCL_ASYNC_ERROR_HANDLING=0")
                && l.contains("(fix: export TORCH_NCCL_ASYNC_ERROR_HANDLING=3")),
        "{text}"
    );
    assert!(
        !text.contains("advice") && !text.contains("max_dgram_qlen"),
        "only Blind and Silent findings are said at start: {text}"
    );
}

/// slurm.conf as tests/slurm/start-slurm.sh writes it for 3 emulated nodes: no TaskProlog.
const TEST_CLUSTER_CONF: &str = include_str!("../../doctor/tests/fixtures/slurm/test-cluster.conf");
const TASK_PROLOG_LINE: &str = "TaskProlog=/usr/share/hangwatch/hangwatch-taskprolog.sh";

/// On a node with the node service (here shown by a `[node]` section in the site's file), doctor reads slurm.conf
/// from `$SLURM_CONF` and prints the TaskProlog line to add when it is missing; once slurm.conf's TaskProlog (in an
/// included file, a site script that runs hangwatch's) is there, the line is not printed.
#[test]
fn on_a_node_service_node_doctor_prints_the_missing_task_prolog_line_until_it_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[node]\naction = \"observe\"\n").unwrap();
    let conf = dir.path().join("slurm.conf");
    std::fs::write(&conf, TEST_CLUSTER_CONF).unwrap();
    let doctor = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
        cmd.arg("doctor")
            .args(json.then_some("--json"))
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LANG", "C")
            .env("HANGWATCH_CONFIG", &config)
            .env("SLURM_CONF", &conf);
        cmd
    };

    let (_, doc, stderr) = run(doctor(true));
    let f = finding(&doc, "task_prolog");
    assert_eq!(f["ok"], false, "{f:#}\n{stderr}");
    assert_eq!(f["severity"], "advice", "{f:#}");
    let what = f["what"].as_str().unwrap();
    assert!(
        what.contains(&format!("[node] in {}", config.display()))
            && what.contains(&format!("{} has no TaskProlog line", conf.display())),
        "{what}"
    );
    assert!(
        f["fix"].as_str().unwrap().contains(TASK_PROLOG_LINE),
        "{f:#}"
    );
    assert_eq!(
        doc["facts"]["node_service"]["slurm_conf_from"], "$SLURM_CONF",
        "{doc:#}"
    );
    let (_, out, text) = run_text(doctor(false));
    assert!(out.is_empty(), "human output goes to stderr: {out}");
    let fix = text
        .lines()
        .find(|l| l.trim_start().starts_with("fix: add this line to"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        fix.contains(&conf.display().to_string()) && fix.trim_end().ends_with(TASK_PROLOG_LINE),
        "{text}"
    );

    let site_prolog = dir.path().join("taskprolog.sh");
    std::fs::write(
        &site_prolog,
        "#!/bin/sh\necho \"export TMPDIR=/local/$SLURM_JOB_ID\"\n/usr/share/hangwatch/hangwatch-taskprolog.sh\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("prologs.conf"),
        format!("TaskProlog={}\n", site_prolog.display()),
    )
    .unwrap();
    std::fs::write(&conf, format!("{TEST_CLUSTER_CONF}Include prologs.conf\n")).unwrap();

    let (_, doc, stderr) = run(doctor(true));
    let f = finding(&doc, "task_prolog");
    assert_eq!(f["ok"], true, "{f:#}\n{stderr}");
    assert!(
        f["what"]
            .as_str()
            .unwrap()
            .contains("runs hangwatch's (its line 3)"),
        "{f:#}"
    );
    let (_, _, text) = run_text(doctor(false));
    assert!(
        text.contains("ok task_prolog:") && !text.contains(TASK_PROLOG_LINE),
        "{text}"
    );
}
