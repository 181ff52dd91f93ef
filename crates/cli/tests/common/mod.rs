//! The harness of the `hangwatch run` system tests: start it as a user would, read its stderr and JSON, and on drop
//! kill by pid (start time checked) everything it started.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the harness"
)]

pub mod slurm;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hangwatch_testkit::{
    is_dead, process_state, python, rank_script, send, wait_until, wait_with_deadline, LoopExt4,
};
use nix::sys::signal::Signal;
use serde_json::Value;

/// The fixed stall threshold of most tests: soft tier (roll call; act when conclusive) at half of it.
pub const STALL_AFTER: &str = "4s";
pub const STALL: Duration = Duration::from_secs(4);
pub const POLL: Duration = Duration::from_millis(20);

/// A process the test is responsible for: its pid and its start time (field 22 of /proc/PID/stat), so that a
/// recycled pid is never signalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tracked {
    pub pid: u32,
    pub start: u64,
}

/// Fields of /proc/PID/stat after the command name: (ppid, start time). Never blocks on a stuck process.
pub fn stat_fields(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

pub fn track(pid: u32) -> Option<Tracked> {
    stat_fields(pid).map(|(_, start)| Tracked { pid, start })
}

/// Every process below `root` now (a scan of /proc; this kernel may lack /proc/PID/task/TID/children).
pub fn descendants(root: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(u32, u32)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, stat_fields(pid)?.0)))
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(pid, ppid)| *ppid == parent && !found.contains(pid))
                .map(|(pid, _)| *pid)
                .collect::<Vec<_>>(),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// How a `hangwatch run` ended.
pub struct Finished {
    pub code: Option<i32>,
    /// The one JSON document of `--json` (`Value::Null` when stdout was not JSON).
    pub json: Value,
    pub stdout: String,
    pub stderr: String,
    /// From the start of `hangwatch run` to its exit.
    pub took: Duration,
    pub report_dir: PathBuf,
}

impl Finished {
    /// The verdict's entry for `rank` in `ranks`.
    pub fn rank(&self, rank: u64) -> &Value {
        self.json["ranks"]
            .as_array()
            .and_then(|ranks| ranks.iter().find(|r| r["rank"] == rank))
            .unwrap_or_else(|| panic!("no rank {rank} in the verdict: {}", self.describe()))
    }

    /// The one culprit, checked to be `rank`.
    pub fn culprit(&self, rank: u64) -> &Value {
        let culprits = self.json["culprits"].as_array();
        assert_eq!(
            culprits.map(Vec::len),
            Some(1),
            "one culprit expected: {}",
            self.describe()
        );
        let c = &self.json["culprits"][0];
        assert_eq!(c["rank"], rank, "wrong culprit: {}", self.describe());
        c
    }

    /// Pid of every rank in the verdict.
    pub fn rank_pids(&self) -> BTreeMap<u64, u32> {
        self.json["ranks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| Some((r["rank"].as_u64()?, u32::try_from(r["pid"].as_u64()?).ok()?)))
            .collect()
    }

    pub fn action(&self, name: &str) -> Option<&Value> {
        self.json["actions"]
            .as_array()?
            .iter()
            .find(|a| a["action"] == name)
    }

    pub fn describe(&self) -> String {
        format!(
            "exit {:?} after {:.1}s\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code,
            self.took.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }

    pub fn assert_code(&self, code: i32) {
        assert_eq!(self.code, Some(code), "{}", self.describe());
    }
}

/// A `hangwatch run` started by the test. On drop: hangwatch and every process that was ever seen below it (or
/// named by its verdict) is killed by pid, SIGCONT first so that a stopped rank dies too; a process stuck in D is
/// left (it dies at the thaw, which the `FrozenGuard` declared after this does first).
pub struct HangwatchRun {
    child: Child,
    started: Instant,
    report: tempfile::TempDir,
    pub stderr: Arc<Mutex<Vec<String>>>,
    pub stdout: Arc<Mutex<Vec<u8>>>,
    stdout_closed: Arc<AtomicBool>,
    tracked: Vec<Tracked>,
    finished: bool,
}

impl HangwatchRun {
    /// `hangwatch run --report-dir <tempdir> --json --grace 2s FLAGS -- JOB`.
    pub fn start(flags: &[&str], job: &[String]) -> HangwatchRun {
        Self::start_in(Command::new(env!("CARGO_BIN_EXE_hangwatch")), flags, job)
    }

    /// The same, with `cmd` as the hangwatch program: a wrapper that execs it (in a network namespace, say).
    pub fn start_in(mut cmd: Command, flags: &[&str], job: &[String]) -> HangwatchRun {
        let report = tempfile::Builder::new()
            .prefix("hangwatch-run-test-")
            .tempdir()
            .expect("temporary report directory");
        // Each run records its verdicts in a history of its own, unless the test shares one on purpose.
        if !cmd.get_envs().any(|(k, _)| k == "HANGWATCH_STATE_DIR") {
            cmd.env("HANGWATCH_STATE_DIR", report.path().join("state"));
        }
        cmd.arg("run")
            .arg("--report-dir")
            .arg(report.path())
            .args(["--json", "--grace", "2s"])
            .args(flags)
            .arg("--")
            .args(job)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd.spawn().expect("hangwatch starts");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stdout_closed = Arc::new(AtomicBool::new(false));
        if let Some(pipe) = child.stderr.take() {
            let into = Arc::clone(&stderr);
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    match line {
                        Ok(line) => lock(&into).push(line),
                        Err(_) => break,
                    }
                }
            });
        }
        if let Some(mut pipe) = child.stdout.take() {
            let into = Arc::clone(&stdout);
            let closed = Arc::clone(&stdout_closed);
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    lock(&into).extend_from_slice(&buf[..n]);
                }
                closed.store(true, Ordering::SeqCst);
            });
        }
        let mut run = HangwatchRun {
            tracked: track(child.id()).into_iter().collect(),
            child,
            started,
            report,
            stderr,
            stdout,
            stdout_closed,
            finished: false,
        };
        run.track_descendants();
        run
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn report_dir(&self) -> &Path {
        self.report.path()
    }

    pub fn stderr_text(&self) -> String {
        lock(&self.stderr).join("\n")
    }

    pub fn remember(&mut self, pid: u32) {
        if self.tracked.iter().any(|t| t.pid == pid) {
            return;
        }
        if let Some(t) = track(pid) {
            self.tracked.push(t);
        }
    }

    /// Remembers every process below hangwatch now (ranks, launcher, hangwatch's helper children).
    pub fn track_descendants(&mut self) {
        if self.finished {
            return;
        }
        for pid in descendants(self.pid()) {
            self.remember(pid);
        }
    }

    /// Waits until a line of hangwatch's stderr (the job's output is mirrored there, `[rank R] ` first, unless
    /// `--quiet`) satisfies `wanted`.
    pub fn wait_for_stderr(&mut self, timeout: Duration, wanted: impl Fn(&str) -> bool) -> bool {
        let end = Instant::now() + timeout;
        loop {
            if lock(&self.stderr).iter().any(|l| wanted(l)) {
                return true;
            }
            self.track_descendants();
            if Instant::now() >= end || self.child.try_wait().ok().flatten().is_some() {
                return lock(&self.stderr).iter().any(|l| wanted(l));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Rank -> pid, from the ranks' own `rank R of N ready (pid P)` lines on hangwatch's stderr.
    pub fn printed_rank_pids(&self) -> BTreeMap<u32, u32> {
        lock(&self.stderr)
            .iter()
            .filter_map(|line| parse_ready(line))
            .collect()
    }

    /// Waits until every one of `world` ranks said it is ready, and returns their pids.
    pub fn wait_for_ranks(&mut self, world: u32, timeout: Duration) -> BTreeMap<u32, u32> {
        let end = Instant::now() + timeout;
        loop {
            let pids = self.printed_rank_pids();
            if pids.len() == world as usize {
                for pid in pids.values() {
                    self.remember(*pid);
                }
                return pids;
            }
            assert!(
                Instant::now() < end,
                "not all {world} ranks started within {timeout:?}:\n{}",
                self.stderr_text()
            );
            self.track_descendants();
            std::thread::sleep(POLL);
        }
    }

    /// Whether hangwatch is still running (without reaping it into a result).
    pub fn running(&mut self) -> bool {
        !self.finished && self.child.try_wait().ok().flatten().is_none()
    }

    /// Waits for hangwatch to exit; fails the test (everything is cleaned up by drop) if it does not in time.
    pub fn finish(&mut self, timeout: Duration) -> Finished {
        let end = Instant::now() + timeout;
        let status = loop {
            self.track_descendants();
            if let Some(status) = self.child.try_wait().ok().flatten() {
                break status;
            }
            if Instant::now() >= end {
                panic!(
                    "hangwatch run did not exit within {timeout:?}\n--- stderr ---\n{}",
                    self.stderr_text()
                );
            }
            std::thread::sleep(POLL);
        };
        let took = self.started.elapsed();
        self.finished = true;
        // A helper child of hangwatch stuck on the frozen filesystem could hold stdout open: do not wait forever.
        wait_until(Duration::from_secs(3), POLL, || {
            self.stdout_closed.load(Ordering::SeqCst)
        });
        std::thread::sleep(Duration::from_millis(50));
        let stdout = String::from_utf8_lossy(&lock(&self.stdout)).into_owned();
        let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
        let finished = Finished {
            code: status.code(),
            json,
            stdout,
            stderr: self.stderr_text(),
            took,
            report_dir: self.report_dir().to_path_buf(),
        };
        let named = ["ranks", "culprits"]
            .iter()
            .flat_map(|k| finished.json[*k].as_array().into_iter().flatten())
            .filter_map(|r| u32::try_from(r["pid"].as_u64()?).ok())
            .collect::<Vec<_>>();
        for pid in named.into_iter().chain(run_json_pids(self.report_dir())) {
            self.remember(pid);
        }
        finished.record_for_accuracy();
        finished
    }
}

/// What scripts/accuracy reads of one run: the verdict as `run --json` printed it, and when it was made.
#[derive(serde::Serialize)]
struct AccuracyRecord<'a> {
    test: &'a str,
    exit_code: Option<i32>,
    verdict: &'a Value,
    /// How long progress had stopped when the verdict was made (thresholds.json).
    stalled_for_s: Option<f64>,
    /// From the start of `hangwatch run` to its exit.
    run_s: f64,
}

impl Finished {
    /// With `HANGWATCH_ACCURACY_DIR` set (scripts/accuracy), writes what this run decided there (see
    /// [`record_for_accuracy`]).
    fn record_for_accuracy(&self) {
        record_for_accuracy(&self.json, self.code, &self.report_dir, self.took);
    }
}

/// With `HANGWATCH_ACCURACY_DIR` set (scripts/accuracy), writes what one run decided there, under the test's name:
/// the verdict's kind, scope and culprits, the exit code, and how long progress had stopped when the verdict was
/// made (the `thresholds.json` beside it in `report_dir`). scripts/accuracy compares them with the faults the
/// tests inject (docs/accuracy.md). Also for runs that are not `hangwatch run` (the node service's watchers).
pub fn record_for_accuracy(
    verdict: &Value,
    exit_code: Option<i32>,
    report_dir: &Path,
    took: Duration,
) {
    let Some(dir) = std::env::var_os("HANGWATCH_ACCURACY_DIR") else {
        return;
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .replace("::", "-");
    let thresholds: Value = std::fs::read_to_string(report_dir.join("thresholds.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let record = AccuracyRecord {
        test: &test,
        exit_code,
        verdict,
        stalled_for_s: thresholds["stalled_for_s"].as_f64(),
        run_s: took.as_secs_f64(),
    };
    let dir = PathBuf::from(dir);
    let _ = std::fs::create_dir_all(&dir);
    // One file per run, numbered in order (a test may run hangwatch more than once).
    let mut n = 1;
    let mut path = dir.join(format!("{test}.{n:02}.json"));
    while path.exists() {
        n += 1;
        path = dir.join(format!("{test}.{n:02}.json"));
    }
    let _ = std::fs::write(path, serde_json::to_vec_pretty(&record).unwrap_or_default());
}

impl Drop for HangwatchRun {
    fn drop(&mut self) {
        self.track_descendants();
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            if wait_with_deadline(&mut self.child, Duration::from_secs(3)).is_none() {
                eprintln!("test: hangwatch (pid {}) did not die", self.child.id());
            }
        }
        let alive =
            |t: &Tracked| track(t.pid).is_some_and(|now| now.start == t.start) && !is_dead(t.pid);
        let ours: Vec<Tracked> = self.tracked.iter().filter(|t| alive(t)).copied().collect();
        for t in &ours {
            let _ = send(t.pid, Signal::SIGCONT);
            let _ = send(t.pid, Signal::SIGKILL);
        }
        wait_until(Duration::from_secs(3), POLL, || !ours.iter().any(alive));
        for t in ours.iter().filter(|t| alive(t)) {
            eprintln!(
                "test: pid {} is still there after SIGKILL (state {:?}); leaving it",
                t.pid,
                process_state(t.pid)
            );
        }
    }
}

/// `rank R of N ready (pid P)`, as rank.py prints it (hangwatch puts `[rank R] ` in front).
pub fn parse_ready(line: &str) -> Option<(u32, u32)> {
    let at = line.find("rank ")?;
    let rest = line[at..].rsplit_once("rank ")?.1;
    let (rank, rest) = rest.split_once(" of ")?;
    let pid = rest.split_once("ready (pid ")?.1.strip_suffix(')')?;
    Some((rank.trim().parse().ok()?, pid.trim().parse().ok()?))
}

/// Pids in `<report-dir>/run.json` (written with the evidence).
pub fn run_json_pids(report_dir: &Path) -> Vec<u32> {
    let Ok(text) = std::fs::read_to_string(report_dir.join("run.json")) else {
        return Vec::new();
    };
    let run: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    run["pids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| u32::try_from(p["pid"].as_u64()?).ok())
        .collect()
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `python3 tests/python/rank.py ARGS`.
pub fn rank_job(python: &Path, args: &[&str]) -> Vec<String> {
    [
        python.to_string_lossy().into_owned(),
        rank_script().to_string_lossy().into_owned(),
    ]
    .into_iter()
    .chain(args.iter().map(|a| a.to_string()))
    .collect()
}

pub fn lines_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

pub fn assert_all_dead(pids: impl IntoIterator<Item = u32>, what: &str) {
    let pids: Vec<u32> = pids.into_iter().collect();
    assert!(!pids.is_empty(), "no pids to check for {what}");
    let gone = wait_until(Duration::from_secs(2), POLL, || {
        pids.iter().all(|&p| is_dead(p))
    });
    let left: Vec<(u32, Option<char>)> = pids
        .iter()
        .filter(|&&p| !is_dead(p))
        .map(|&p| (p, process_state(p)))
        .collect();
    assert!(gone, "{what} still alive (pid, state): {left:?}");
}

/// `hangwatch run FLAGS` (started as `cmd`) over a rank.py job stepping every 0.1 s whose rank `rank` (and only
/// it) logs onto `fs`; returns once that rank has logged `steps` lines, with the job's processes tracked. The
/// caller freezes `fs` to make the hang.
pub fn start_logging_onto(
    cmd: Command,
    fs: &LoopExt4,
    rank: u32,
    steps: usize,
    flags: &[&str],
) -> HangwatchRun {
    let py = python().expect("python");
    let log = fs.path().join(format!("rank{rank}.log"));
    let log_s = log.to_string_lossy().into_owned();
    let only = rank.to_string();
    let mut run = HangwatchRun::start_in(
        cmd,
        flags,
        &rank_job(
            py,
            &["--step-time", "0.1", "--log", &log_s, "--only-rank", &only],
        ),
    );
    assert!(
        wait_until(Duration::from_secs(30), POLL, || lines_in(&log) >= steps),
        "rank {rank} never logged {steps} steps:\n{}",
        run.stderr_text()
    );
    run.track_descendants();
    run
}

/// The hangwatch binary under test, as a command to start.
pub fn hangwatch() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hangwatch"))
}

/// `program`, when installed; else the testkit's "missing tool" (a skip, or a failure in strict mode), with how to
/// install it. Use as `let tool = require!(installed("/usr/bin/bwrap", "apt-get install bubblewrap"));`.
pub fn installed(
    program: &'static str,
    install: &'static str,
) -> hangwatch_testkit::Result<&'static Path> {
    let path = Path::new(program);
    if path.exists() {
        Ok(path)
    } else {
        Err(hangwatch_testkit::TestkitError::Missing {
            tool: program.into(),
            hint: install,
        })
    }
}

/// Waits (30 s at most) until `log` has `lines` lines, failing the test with hangwatch's stderr otherwise; then
/// tracks the job's processes (so that they are ended whatever happens next).
pub fn wait_for_log(run: &mut HangwatchRun, log: &Path, lines: usize) {
    assert!(
        wait_until(Duration::from_secs(30), POLL, || lines_in(log) >= lines),
        "{} never reached {lines} lines:\n{}",
        log.display(),
        run.stderr_text()
    );
    run.track_descendants();
}

/// Runs 2 ranks; rank 0 does `op` in `dir` every step; `stop` makes `dir`'s filesystem stop answering and
/// returns a guard that makes it answer again. Returns the finished run.
pub fn rank_0_blocked_in<G>(py: &Path, op: &str, dir: &Path, stop: impl FnOnce() -> G) -> Finished {
    let dir_s = dir.to_string_lossy().into_owned();
    rank_0_stopped_by(py, &["--fs-op", op, "--fs-dir", &dir_s], stop)
}

/// Runs 2 ranks of tests/python/rank.py; `rank_0` are the arguments that only rank 0 follows (`--fs-op ...`,
/// `--behaviour ...`); after 3 steps `stop` makes its filesystem stop answering and returns a guard that makes it
/// answer again. Returns the finished run.
pub fn rank_0_stopped_by<G>(py: &Path, rank_0: &[&str], stop: impl FnOnce() -> G) -> Finished {
    let args: Vec<&str> = ["--step-time", "0.1"]
        .into_iter()
        .chain(rank_0.iter().copied())
        .chain(["--only-rank", "0"])
        .collect();
    let mut run = HangwatchRun::start(
        &["--nproc", "2", "--stall-after", STALL_AFTER, "--quiet"],
        &rank_job(py, &args),
    );
    // The job's output (quiet on the console) is in the report directory's log.
    let output = run.report_dir().join("output.log");
    assert!(
        wait_until(Duration::from_secs(30), POLL, || std::fs::read_to_string(
            &output
        )
        .is_ok_and(|t| t.contains("step 3"))),
        "rank 0 never did 3 steps of {rank_0:?}:\n{}",
        run.stderr_text()
    );
    run.track_descendants();
    let guard = stop();
    let done = run.finish(STALL + Duration::from_secs(30));
    drop(guard);
    done
}
