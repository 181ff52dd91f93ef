//! The fast path at the default settings (no `--stall-after`): a rank stuck on a filesystem that does not answer
//! is caught in seconds, not at the soft tier of the 2-minute floor (60 s) nor at a first-seen phase's 30-minute
//! ceiling; a rank that is merely slow (in D for 20+ s behind a throttled device, bytes still flowing) is not
//! ended. Real frozen loop ext4, real blkio throttle, real Python ranks; everything is thawed, unthrottled,
//! killed by pid and unmounted when a test ends, also when it fails.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use hangwatch_testkit::{process_state, python, require, require_root, wait_until, LoopExt4};

/// Far below the soft tier at the defaults (60 s): only the fast path ends a job this soon.
const FAST: Duration = Duration::from_secs(40);

fn script(name: &str) -> String {
    format!("{}/../../tests/python/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_incident_at_the_default_settings_is_ended_within_seconds_of_the_freeze() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let log_s = log.to_string_lossy().into_owned();
    let mut run = HangwatchRun::start(
        &["--nproc", "4", "--quiet"],
        &rank_job(
            py,
            &["--step-time", "0.1", "--log", &log_s, "--only-rank", "0"],
        ),
    );
    assert!(
        wait_until(Duration::from_secs(30), POLL, || lines_in(&log) >= 3),
        "rank 0 never logged:\n{}",
        run.stderr_text()
    );
    run.track_descendants();
    let frozen = require!(fs.freeze());
    let frozen_at = Instant::now();
    let done = run.finish(Duration::from_secs(90));
    let took = frozen_at.elapsed();
    eprintln!(
        "defaults: freeze -> hangwatch exit {:.1}s",
        took.as_secs_f64()
    );
    drop(frozen);
    done.assert_code(75);
    assert!(took < FAST, "took {took:?}: {}", done.describe());
    let c = done.culprit(0);
    assert_eq!(c["state"], "D");
    assert_eq!(c["syscall"], "write");
    assert_eq!(c["path"], log_s.as_str());
    assert!(
        done.stderr
            .contains("rank 0 in a filesystem wait, its I/O still"),
        "the fast path took the roll call: {}",
        done.describe()
    );
}

#[test]
fn a_rank_frozen_in_the_checkpoint_mkdir_inside_a_first_seen_phase_is_ended_within_seconds() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let dir = fs.path().join("checkpoints");
    std::fs::create_dir_all(&dir).expect("checkpoint directory");
    let dir_s = dir.to_string_lossy().into_owned();
    let job = vec![
        py.to_string_lossy().into_owned(),
        script("beating_job.py"),
        "--steps".into(),
        "100000".into(),
        "--step-time".into(),
        "0.05".into(),
        "--checkpoint-at".into(),
        "60:0".into(),
        "--checkpoint-dir".into(),
        dir_s.clone(),
    ];
    let mut run = HangwatchRun::start(&["--nproc", "2", "--quiet"], &job);
    // Frozen while the job still beats: its first checkpoint (a phase never seen before, whose threshold is the
    // 30-minute ceiling) then blocks in mkdir.
    std::thread::sleep(Duration::from_secs(1));
    run.track_descendants();
    let frozen = require!(fs.freeze());
    let frozen_at = Instant::now();
    let done = run.finish(Duration::from_secs(90));
    let took = frozen_at.elapsed();
    eprintln!(
        "defaults, checkpoint phase: freeze -> hangwatch exit {:.1}s",
        took.as_secs_f64()
    );
    drop(frozen);
    done.assert_code(75);
    assert!(took < FAST, "took {took:?}: {}", done.describe());
    let c = &done.json["culprits"][0];
    assert_eq!(c["state"], "D", "{}", done.describe());
    assert_eq!(c["syscall"], "mkdir", "{}", done.describe());
    assert!(
        c["path"]
            .as_str()
            .is_some_and(|p| p.starts_with(&format!("{dir_s}/checkpoint-60"))),
        "{}",
        done.describe()
    );
    assert_eq!(c["mount"], &*fs.path().to_string_lossy());
}

#[test]
fn a_stopped_rank_at_the_default_settings_is_ended_within_seconds() {
    let py = require!(python());
    let mut run = HangwatchRun::start(&["--nproc", "2"], &rank_job(py, &["--step-time", "0.1"]));
    let pids = run.wait_for_ranks(2, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    let stopped_at = Instant::now();
    hangwatch_testkit::send(pids[&1], nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP rank 1");
    let done = run.finish(Duration::from_secs(90));
    let took = stopped_at.elapsed();
    eprintln!(
        "defaults: SIGSTOP -> hangwatch exit {:.1}s",
        took.as_secs_f64()
    );
    done.assert_code(75);
    assert!(took < FAST, "took {took:?}: {}", done.describe());
    assert_eq!(done.json["kind"], "stopped", "{}", done.describe());
    assert_eq!(done.culprit(1)["state"], "T");
    // Issue 25: the line that says why the roll call was taken says what was seen, not "on its filesystem".
    assert!(
        done.stderr.contains("hangwatch: no output for ")
            && done.stderr.contains("(rank 1 stopped (T) for "),
        "{}",
        done.describe()
    );
    assert!(
        !done.stderr.contains("filesystem wait"),
        "{}",
        done.describe()
    );
}

/// A blkio (cgroup v1) group that throttles writes to one device; removed on drop (after its processes are
/// gone: the test's run is dropped first).
struct Throttle {
    dir: PathBuf,
    device: String,
}

impl Throttle {
    fn new(mount: &Path, bytes_per_s: u64) -> Result<Throttle, String> {
        require_root()?;
        let root = Path::new("/sys/fs/cgroup/blkio");
        if !root.join("blkio.throttle.write_bps_device").exists() {
            return Err("no cgroup v1 blkio throttle at /sys/fs/cgroup/blkio".into());
        }
        let dev = std::os::unix::fs::MetadataExt::dev(
            &std::fs::metadata(mount).map_err(|e| e.to_string())?,
        );
        let device = format!(
            "{}:{}",
            nix::sys::stat::major(dev),
            nix::sys::stat::minor(dev)
        );
        let dir = root.join(format!("hangwatch-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let t = Throttle { dir, device };
        t.limit(bytes_per_s)?;
        Ok(t)
    }

    fn limit(&self, bytes_per_s: u64) -> Result<(), String> {
        std::fs::write(
            self.dir.join("blkio.throttle.write_bps_device"),
            format!("{} {bytes_per_s}", self.device),
        )
        .map_err(|e| format!("cannot set the throttle: {e}"))
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .expect("rank 0 moves into the throttled group");
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let _ = self.limit(0);
        // Processes left in the group (none once the run is dropped) go back to the root group first.
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/blkio/cgroup.procs", pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn ranks_writing_through_a_throttled_device_stay_in_d_for_20_s_and_are_not_ended() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let dir = fs.path().join("run");
    std::fs::create_dir_all(&dir).expect("directory");
    let dir_s = dir.to_string_lossy().into_owned();
    // 1 MiB per O_DIRECT write at 32 KiB/s: 32 s in D inside one write(), its I/O counters still meanwhile.
    let throttle = match Throttle::new(fs.path(), 32 * 1024) {
        Ok(t) => t,
        Err(why) if !hangwatch_testkit::strict_mode() => {
            eprintln!("SKIPPED: {why}");
            return;
        }
        Err(why) => panic!("{why}"),
    };
    let mut run = HangwatchRun::start(
        &["--nproc", "2"],
        &rank_job(
            py,
            &[
                "--step-time",
                "0.1",
                "--steps",
                "8",
                "--fs-op",
                "odirect",
                "--fs-dir",
                &dir_s,
                "--only-rank",
                "0",
            ],
        ),
    );
    let pids = run.wait_for_ranks(2, Duration::from_secs(30));
    let rank0 = pids[&0];
    throttle.add(rank0);
    let entered = wait_until(Duration::from_secs(20), POLL, || {
        process_state(rank0) == Some('D')
    });
    assert!(
        entered,
        "rank 0 never waited on the throttled device:\n{}",
        run.stderr_text()
    );
    let since = Instant::now();
    // 22 s in D: past --fs-stall (15 s), so the fast path looks, and its probe of the mount answers.
    while since.elapsed() < Duration::from_secs(22) {
        assert!(
            run.running(),
            "a slow filesystem was taken for a stuck one:\n{}",
            run.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let in_d_for = since.elapsed();
    eprintln!(
        "rank 0 in D behind the throttle for {:.1}s; hangwatch said: {}",
        in_d_for.as_secs_f64(),
        run.stderr_text()
            .lines()
            .filter(|l| l.starts_with("hangwatch:"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    throttle.limit(0).expect("unthrottled");
    let done = run.finish(Duration::from_secs(60));
    done.assert_code(0);
    drop(throttle);
}
