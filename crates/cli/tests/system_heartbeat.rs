//! The heartbeat socket under `hangwatch run` with real Python ranks and real outsiders: only the job's own
//! processes speak for it (a process outside the job that sends valid beats with the ranks' numbers never hides
//! a hang), a datagram flood from inside the job does not delay the verdict, and a tqdm bar (`\r` redraws, no
//! `\n`) is progress.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use hangwatch_testkit::{python, require, send, wait_until, ChildGuard};
use nix::sys::signal::Signal;
use serde_json::Value;

const POLL: Duration = Duration::from_millis(20);
/// The fixed stall threshold of these tests.
const STALL: Duration = Duration::from_secs(3);
/// What a verdict may take beyond the threshold on a loaded 2-core machine: roll call (stacks of every rank),
/// evidence, the tick. Generous on purpose: the tests check that the verdict comes, not how fast.
const MARGIN: Duration = Duration::from_secs(20);

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/python")
        .join(name)
}

/// Pids of every process below `root` now.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

/// A `hangwatch run` started by the test; on drop it and everything below it is killed (by pid).
struct Run {
    child: Child,
    started: Instant,
    report: tempfile::TempDir,
    stdout: std::sync::mpsc::Receiver<Vec<u8>>,
    stderr: std::sync::mpsc::Receiver<Vec<u8>>,
}

struct Finished {
    status: ExitStatus,
    took: Duration,
    stdout: String,
    stderr: String,
}

fn read_all<R: Read + Send + 'static>(pipe: Option<R>) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = tx.send(bytes);
        });
    }
    rx
}

impl Run {
    fn start(flags: &[&str], job: &[&std::ffi::OsStr]) -> Run {
        let report = tempfile::Builder::new()
            .prefix("hangwatch-heartbeat-test-")
            .tempdir()
            .expect("temporary report directory");
        let mut child = Command::new(env!("CARGO_BIN_EXE_hangwatch"))
            .arg("run")
            .arg("--report-dir")
            .arg(report.path())
            .args(["--json", "--grace", "2s"])
            .args(flags)
            .arg("--")
            .args(job)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("hangwatch starts");
        let stdout = read_all(child.stdout.take());
        let stderr = read_all(child.stderr.take());
        Run {
            child,
            started: Instant::now(),
            report,
            stdout,
            stderr,
        }
    }

    /// The heartbeat socket, as the job sees it (`HANGWATCH_SOCKET` in a rank's environment: the socket lives in
    /// a private runtime directory, not in the report directory).
    fn socket(&self) -> PathBuf {
        let mut found = None;
        wait_until(Duration::from_secs(20), POLL, || {
            found = children_of(self.child.id()).into_iter().find_map(|pid| {
                let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
                environ
                    .split(|b| *b == 0)
                    .find_map(|kv| kv.strip_prefix(b"HANGWATCH_SOCKET="))
                    .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned()))
            });
            found.is_some()
        });
        found.expect("a rank with HANGWATCH_SOCKET in its environment")
    }

    fn report_file(&self, name: &str) -> Value {
        let path = self.report.path().join(name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{} is missing: {e}", path.display()));
        serde_json::from_str(&text).expect("valid JSON")
    }

    fn finish(&mut self, limit: Duration) -> Finished {
        let mut status = None;
        wait_until(limit, POLL, || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        let took = self.started.elapsed();
        let Some(status) = status else {
            self.kill_all();
            let stderr = self
                .stderr
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_default();
            panic!(
                "hangwatch run did not exit within {limit:?}\n--- stderr ---\n{}",
                String::from_utf8_lossy(&stderr)
            );
        };
        let text = |rx: &std::sync::mpsc::Receiver<Vec<u8>>| {
            String::from_utf8_lossy(&rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default())
                .into_owned()
        };
        Finished {
            status,
            took,
            stdout: text(&self.stdout),
            stderr: text(&self.stderr),
        }
    }

    fn kill_all(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        for pid in descendants(self.child.id()) {
            let _ = send(pid, Signal::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.kill_all();
    }
}

impl Finished {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("no JSON on stdout ({e}): {}\n{}", self.stdout, self.stderr))
    }

    fn assert_code(&self, code: i32) {
        assert_eq!(
            self.status.code(),
            Some(code),
            "took {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.took,
            self.stdout,
            self.stderr
        );
    }
}

fn secs(v: &Value) -> Duration {
    Duration::from_secs_f64(v.as_f64().unwrap_or_else(|| panic!("not seconds: {v}")))
}

#[test]
fn beats_forged_by_a_process_outside_the_job_never_hide_a_hang() {
    let py = require!(python());
    let job = script("beating_job.py");
    let mut run = Run::start(
        &["--nproc", "2", "--quiet", "--stall-after", "3s"],
        &[
            py.as_os_str(),
            job.as_os_str(),
            "--steps".as_ref(),
            "20".as_ref(),
            "--hang".as_ref(),
        ],
    );
    // Not a child of hangwatch: started by the test, beside the job, with the job's rank numbers.
    let socket = run.socket();
    let _forger = ChildGuard::spawn(
        Command::new(py)
            .arg(script("forger.py"))
            .arg(&socket)
            .args(["0", "1"])
            .stdout(Stdio::null()),
        "forger.py",
    )
    .expect("the forger starts");
    let done = run.finish(STALL * 4 + MARGIN * 2);
    done.assert_code(75);
    let verdict = done.json();
    assert_eq!(verdict["kind"], "collective_hang", "{verdict:#}");

    let thresholds = run.report_file("thresholds.json");
    assert_eq!(
        thresholds["progress_source"], "heartbeat",
        "the ranks' own beats were heard: {thresholds:#}"
    );
    assert!(
        secs(&thresholds["stalled_for_s"]) < STALL + MARGIN,
        "the stall was seen when it passed the threshold: {thresholds:#}"
    );
    let heartbeats = &run.report_file("run.json")["heartbeats"];
    let rejected = heartbeats["rejected"]["not_in_job"].as_u64().unwrap();
    eprintln!("heartbeats while forged: {heartbeats}");
    assert!(
        rejected > 0,
        "the forged datagrams are counted: {heartbeats:#}"
    );
    assert_eq!(heartbeats["rejected"]["wrong_rank"], 0, "{heartbeats:#}");
}

#[test]
fn a_datagram_flood_from_inside_the_job_does_not_delay_the_verdict() {
    let py = require!(python());
    let job = script("noisy_job.py");
    let mut run = Run::start(
        &["--nproc", "2", "--quiet", "--stall-after", "3s"],
        &[
            py.as_os_str(),
            job.as_os_str(),
            "20".as_ref(),
            "0.05".as_ref(),
        ],
    );
    let done = run.finish(STALL * 4 + MARGIN * 2);
    done.assert_code(75);
    let thresholds = run.report_file("thresholds.json");
    let stalled_for = secs(&thresholds["stalled_for_s"]);
    let heartbeats = &run.report_file("run.json")["heartbeats"];
    let running_for = secs(&run.report_file("run.json")["running_for_s"]);
    let received = heartbeats["received"].as_u64().unwrap();
    eprintln!(
        "flood: {received} datagrams received in {:.1}s ({:.0}/s); stalled for {:.2}s at the roll call (threshold {:?}); \
         hangwatch exited after {:.1}s; {heartbeats}",
        running_for.as_secs_f64(),
        received as f64 / running_for.as_secs_f64().max(0.001),
        stalled_for.as_secs_f64(),
        STALL,
        done.took.as_secs_f64()
    );
    assert!(
        stalled_for >= STALL && stalled_for < STALL + MARGIN,
        "the verdict came when the stall passed the threshold, flood or not: {thresholds:#}"
    );
    assert!(
        heartbeats["rejected"]["wrong_rank"].as_u64().unwrap() > 0
            && heartbeats["malformed"].as_u64().unwrap() > 0,
        "the flood reached the socket: {heartbeats:#}"
    );
}

#[test]
fn a_tqdm_bar_that_only_redraws_with_carriage_returns_is_progress() {
    let py = require!(python());
    let job = script("tqdm_job.py");
    let mut run = Run::start(
        &["--stall-after", "3s"],
        &[py.as_os_str(), job.as_os_str(), "7".as_ref()],
    );
    let done = run.finish(Duration::from_secs(60));
    done.assert_code(0);
    assert_eq!(done.json()["hang"], false, "{}", done.stderr);
    assert!(
        done.stderr.contains("\r100%|####################| "),
        "the bar reaches the console with its carriage returns: {:?}",
        done.stderr
    );
}

/// The direct children of `pid` (a scan of /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}
