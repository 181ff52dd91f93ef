//! System test of `hangwatch report`: a real hang (rank 1 writing its log to a frozen loop-mounted ext4) leaves a
//! real evidence bundle; `hangwatch report DIR --html OUT` renders it; headless Chromium (Debian's `chromium`)
//! loads the page without a console error, its DOM marks the frozen rank's cell as the culprit, and a screenshot
//! is kept as a CI artifact (`$HANGWATCH_ARTIFACTS/report.png`, else `target/artifacts/report.png`).

mod common;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;
use hangwatch_testkit::{python, require, LoopExt4, TestkitError};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// Chromium gets this long per page (it starts in 1-3 s on the 2-core VM).
const CHROMIUM_DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn a_real_hang_renders_in_chromium_with_the_frozen_rank_marked() {
    let chromium = require!(chromium());
    require!(python());
    let fs = require!(LoopExt4::new(64));
    let mut run = start_logging_onto(
        hangwatch(),
        &fs,
        1,
        3,
        &["--nproc", "2", "--stall-after", STALL_AFTER, "--quiet"],
    );
    let log_s = fs.path().join("rank1.log").to_string_lossy().into_owned();
    let _frozen = require!(fs.freeze());
    let done = run.finish(STALL + Duration::from_secs(30));
    done.assert_code(75);
    done.culprit(1);

    let out = tempfile::tempdir().expect("tempdir");
    let html = out.path().join("report.html");
    let report = Command::new(env!("CARGO_BIN_EXE_hangwatch"))
        .arg("report")
        .arg(&done.report_dir)
        .arg("--html")
        .arg(&html)
        .output()
        .expect("hangwatch report runs");
    let stdout = String::from_utf8_lossy(&report.stdout);
    assert!(
        report.status.success(),
        "hangwatch report failed: {}\n{stdout}",
        String::from_utf8_lossy(&report.stderr)
    );
    assert!(stdout.starts_with("blocked in kernel: rank 1"), "{stdout}");
    assert!(
        stdout.contains(&format!("report: {}", html.display())),
        "{stdout}"
    );
    let size = std::fs::metadata(&html).expect("the page").len();
    eprintln!("page of the real bundle: {size} bytes");

    let dom = load_without_console_errors(&chromium, &html, out.path());
    let cell = culprit_cell(&dom, 1);
    assert!(
        cell.contains("data-node=\""),
        "the culprit cell names its node: {cell}"
    );
    assert!(
        cell.contains("sD"),
        "the culprit cell shows state D: {cell}"
    );
    assert!(dom.contains(&log_s), "the frozen file is named on the page");

    let png = artifacts_dir().join("report.png");
    screenshot(&chromium, &html, &png, out.path());
    eprintln!("screenshot of the report: {}", png.display());
}

#[test]
fn a_coordinator_bundle_renders_in_chromium() {
    let chromium = require!(chromium());
    let out = tempfile::tempdir().expect("tempdir");
    let bundle = Path::new(env!("CARGO_MANIFEST_DIR")).join("../report/tests/fixtures/coordinator");
    let html = out.path().join("coordinator.html");
    let report = Command::new(env!("CARGO_BIN_EXE_hangwatch"))
        .arg("report")
        .arg(&bundle)
        .arg("--html")
        .arg(&html)
        .output()
        .expect("hangwatch report runs");
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let dom = load_without_console_errors(&chromium, &html, out.path());
    culprit_cell(&dom, 0);
    for rank in [1, 2] {
        assert!(
            dom.contains(&format!("data-rank=\"{rank}\"")),
            "rank {rank}"
        );
    }
    screenshot(
        &chromium,
        &html,
        &artifacts_dir().join("report-coordinator.png"),
        out.path(),
    );
}

/// The console check is only worth something if Chromium reports a console error the way it is looked for.
#[test]
fn chromium_console_errors_are_noticed() {
    let chromium = require!(chromium());
    let dir = tempfile::tempdir().expect("tempdir");
    let page = dir.path().join("bad.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><title>t</title><script>console.error('deliberate'); missingFunction();</script>",
    )
    .expect("write");
    let run = run_chromium(&chromium, &["--dump-dom"], &page, dir.path());
    let errors = console_errors(&run.stderr);
    assert!(
        errors.iter().any(|l| l.contains("deliberate"))
            && errors.iter().any(|l| l.contains("Uncaught")),
        "Chromium's console messages were not seen:\n{}",
        run.stderr
    );
}

fn chromium() -> Result<PathBuf, TestkitError> {
    let program = std::env::var_os("HANGWATCH_TEST_CHROMIUM").unwrap_or_else(|| "chromium".into());
    let found = Command::new(&program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match found {
        Ok(status) if status.success() => Ok(PathBuf::from(program)),
        _ => Err(TestkitError::Missing {
            tool: "chromium".into(),
            hint: "install Debian's chromium (scripts/test does)",
        }),
    }
}

/// Lines in which Chromium (`--enable-logging=stderr`) reports the page's console: `INFO:CONSOLE` for
/// `console.*` calls, `Uncaught ...` for exceptions.
fn console_errors(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught"))
        .collect()
}

/// Loads `html` in headless Chromium and returns the DOM it built; fails on any console message.
fn load_without_console_errors(chromium: &Path, html: &Path, scratch: &Path) -> String {
    let run = run_chromium(chromium, &["--dump-dom"], html, scratch);
    let errors = console_errors(&run.stderr);
    assert!(
        errors.is_empty(),
        "console messages while loading {}:\n{}",
        html.display(),
        errors.join("\n")
    );
    assert!(
        run.stdout.contains("</html>"),
        "no DOM from Chromium:\n{}",
        run.stderr
    );
    run.stdout
}

/// The `<i ...>` element of `rank`'s grid cell, checked to be marked as the culprit.
fn culprit_cell(dom: &str, rank: u32) -> String {
    let needle = format!("data-rank=\"{rank}\"");
    let at = dom
        .find(&needle)
        .unwrap_or_else(|| panic!("no cell for rank {rank} in the DOM"));
    let start = dom[..at].rfind("<i ").expect("cell start");
    let end = at + dom[at..].find('>').expect("cell end");
    let cell = &dom[start..=end];
    let class = cell
        .split("class=\"")
        .nth(1)
        .and_then(|c| c.split('"').next())
        .unwrap_or("");
    assert!(
        class.split(' ').any(|c| c == "culprit"),
        "rank {rank}'s cell is not marked as the culprit: {cell}"
    );
    cell.to_string()
}

fn screenshot(chromium: &Path, html: &Path, png: &Path, scratch: &Path) {
    std::fs::create_dir_all(png.parent().expect("artifact dir")).expect("artifact dir");
    let _ = std::fs::remove_file(png);
    let arg = format!("--screenshot={}", png.display());
    run_chromium(
        chromium,
        &[&arg, "--window-size=1400,2000", "--hide-scrollbars"],
        html,
        scratch,
    );
    let bytes = std::fs::read(png).expect("the screenshot was written");
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        png.display()
    );
    // An empty white 1400x2000 page compresses to a few kilobytes; the report is far more.
    assert!(
        bytes.len() > 30_000,
        "{} is only {} bytes",
        png.display(),
        bytes.len()
    );
}

fn artifacts_dir() -> PathBuf {
    match std::env::var_os("HANGWATCH_ARTIFACTS") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/artifacts"),
    }
}

struct ChromiumRun {
    stdout: String,
    stderr: String,
}

/// Headless Chromium on one page with a throwaway profile; checked to exit 0 within the deadline.
fn run_chromium(chromium: &Path, args: &[&str], page: &Path, scratch: &Path) -> ChromiumRun {
    let profile = tempfile::tempdir_in(scratch).expect("profile dir");
    let mut cmd = Command::new(chromium);
    cmd.args([
        "--headless",
        // Root cannot use Chromium's sandbox; the pages are our own.
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--enable-logging=stderr",
        "--v=0",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(args)
    .arg(format!("file://{}", page.display()))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    // Its own process group, so that the guard can end Chromium's helper processes with it.
    .process_group(0);
    let mut guard = GroupGuard(cmd.spawn().expect("chromium starts"));
    let stdout = read_in_background(guard.0.stdout.take());
    let stderr = read_in_background(guard.0.stderr.take());
    let status = guard.wait(CHROMIUM_DEADLINE);
    let run = ChromiumRun {
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    match status {
        Some(s) if s.success() => run,
        Some(s) => panic!("chromium exited with {s}:\n{}", run.stderr),
        None => panic!(
            "chromium did not finish within {CHROMIUM_DEADLINE:?}:\n{}",
            run.stderr
        ),
    }
}

fn read_in_background<R: Read + Send + 'static>(
    pipe: Option<R>,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

/// Chromium and its helpers (one process group, led by the pid we started): killed on drop if still there.
struct GroupGuard(Child);

impl GroupGuard {
    fn wait(&mut self, deadline: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + deadline;
        loop {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Some(status);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        // Only while the leader is unreaped: then its pid, the group's id, cannot belong to anyone else.
        if matches!(self.0.try_wait(), Ok(None)) {
            if let Ok(leader) = i32::try_from(self.0.id()) {
                let _ = killpg(Pid::from_raw(leader), Signal::SIGKILL);
            }
            let _ = self.0.wait();
        }
    }
}

/// What a user gets without `--html`, with `-`, and for a wrong DIR or OUT (no browser needed).
#[test]
fn report_writes_beside_the_evidence_by_default_and_says_what_is_wrong() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../report/tests/fixtures/node");
    let work = tempfile::tempdir().expect("tempdir");
    let bundle = work.path().join("bundle");
    std::fs::create_dir(&bundle).expect("mkdir");
    for name in ["verdict.json", "verdict.txt", "probes.json"] {
        std::fs::copy(fixture.join(name), bundle.join(name)).expect("copy");
    }
    let hangwatch = |args: &[&std::ffi::OsStr]| {
        Command::new(env!("CARGO_BIN_EXE_hangwatch"))
            .arg("report")
            .args(args)
            .output()
            .expect("hangwatch report runs")
    };

    let default = hangwatch(&[bundle.as_os_str()]);
    assert_eq!(default.status.code(), Some(0));
    let page = bundle.join("report.html");
    assert!(
        String::from_utf8_lossy(&default.stdout).contains(&format!("report: {}", page.display()))
    );
    assert!(std::fs::read_to_string(&page)
        .expect("DIR/report.html")
        .contains("data-rank=\"0\""));

    let stdout = hangwatch(&[bundle.as_os_str(), "--html".as_ref(), "-".as_ref()]);
    assert_eq!(stdout.status.code(), Some(0));
    assert!(stdout.stdout.starts_with(b"<!DOCTYPE html>"));
    assert!(String::from_utf8_lossy(&stdout.stderr).starts_with("blocked in kernel"));

    let missing = hangwatch(&[work.path().join("nope").as_os_str()]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("does not exist"));

    let not_bundle = hangwatch(&[work.path().as_os_str()]);
    assert_eq!(not_bundle.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&not_bundle.stderr).contains("has no verdict.json"));

    let unwritable = work.path().join("no/such/dir/page.html");
    let bad_out = hangwatch(&[
        bundle.as_os_str(),
        "--html".as_ref(),
        unwritable.as_os_str(),
    ]);
    assert_eq!(bad_out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad_out.stderr);
    assert!(
        err.contains(&format!("cannot write {}", unwritable.display())) && err.contains("--html"),
        "{err}"
    );
}
