//! The seed incident on this machine, end to end (`hangwatch demo`).
//!
//! A loop-mounted ext4 stands in for the shared filesystem; four ranks step through a barrier and rank 0 logs to
//! that filesystem; the demo freezes it (`fsfreeze -f`, as GPFS froze), hangwatch notices the stall, names rank 0
//! in `write()` on the frozen mount, keeps the evidence and ends the job. Then the demo thaws, waits for the
//! ranks to go and unmounts, whatever happened before (a guard does it on every path out, Ctrl-C included).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use hangwatch_agent::launch::LaunchSpec;
use hangwatch_agent::supervise::{run as supervise, OnHang, RunConfig, EXIT_HUNG};
use hangwatch_diagnosis::DetectorConfig;
use hangwatch_model::VerdictKind;

use hangwatch_agent::human::say;

use crate::usage;

/// The demo job's rank: compute, rank 0 logs, a barrier (written for a reader: it is what a user of the demo
/// sees; the system tests' richer stand-in is tests/python/rank.py).
const RANK_SCRIPT: &str = include_str!("demo_rank.py");

/// What `hangwatch demo` was asked for.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Ranks to start (at least 2).
    pub nproc: u32,
    /// The stall threshold (a real job learns its own).
    pub stall_after: Duration,
    /// The filesystem is frozen this long after the ranks start.
    pub freeze_after: Duration,
    /// Where the evidence goes; `None`: a new demo directory under the per-user report root.
    pub report_dir: Option<PathBuf>,
    /// Print the verdict as one JSON document on stdout.
    pub json: bool,
}

/// Everything the demo set up, torn down on drop in the safe order: thaw, unmount, remove.
struct Stage {
    dir: PathBuf,
    mount: PathBuf,
    mounted: bool,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

fn tool(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program} (install util-linux and e2fsprogs)"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Stage {
    fn new() -> anyhow::Result<Stage> {
        // A fresh, unpredictable directory (mkdtemp, 0700): a fixed name in /tmp could be planted by another user.
        let dir = tempfile::Builder::new()
            .prefix("hangwatch-demo-")
            .tempdir()
            .context("cannot create a temporary directory for the demo")?
            .keep();
        let mut stage = Stage {
            mount: dir.join("shared"),
            dir,
            mounted: false,
            frozen: Default::default(),
        };
        let image = stage.dir.join("shared.img");
        let file = std::fs::File::create(&image)
            .with_context(|| format!("cannot create {}", image.display()))?;
        file.set_len(64 << 20)?;
        drop(file);
        tool("mkfs.ext4", &["-q", "-F", &image.to_string_lossy()])?;
        std::fs::create_dir_all(&stage.mount)?;
        tool(
            "mount",
            &[
                "-o",
                "loop",
                &image.to_string_lossy(),
                &stage.mount.to_string_lossy(),
            ],
        )?;
        stage.mounted = true;
        std::fs::create_dir_all(stage.mount.join("run"))?;
        Ok(stage)
    }

    fn thaw(&self) {
        if self.frozen.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let _ = tool("fsfreeze", &["-u", &self.mount.to_string_lossy()]);
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        self.thaw();
        if self.mounted {
            // Ranks that were in D die once thawed (SIGKILL was pending); give them a moment to release the mount.
            let until = Instant::now() + Duration::from_secs(10);
            while tool("umount", &[&self.mount.to_string_lossy()]).is_err() {
                if Instant::now() > until {
                    let _ = tool("umount", &["-l", &self.mount.to_string_lossy()]);
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn step(n: u32, text: &str) {
    say(format!("\n[demo {n}/4] {text}"));
}

/// Runs the demo; `true` when hangwatch named rank 0 blocked in `write()` and ended the job.
pub fn run(args: Settings) -> anyhow::Result<bool> {
    if !nix::unistd::geteuid().is_root() {
        return Err(usage(
            "the demo needs root: it loop-mounts an ext4 image and freezes it with fsfreeze, which only root may do \
             (run `sudo hangwatch demo`)",
        ));
    }
    if args.nproc < 2 {
        return Err(usage(
            "--nproc must be at least 2: the demo needs peers waiting for rank 0",
        ));
    }
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| hangwatch_agent::launch::check_program(&(*p).into()).is_ok())
        .ok_or_else(|| usage("the demo's ranks are Python processes, and no python3 is on PATH"))?;

    step(
        1,
        "creating a loop-mounted ext4 to stand in for the shared filesystem (GPFS in the incident)",
    );
    let stage = Stage::new()?;
    let script = stage.dir.join("rank.py");
    std::fs::write(&script, RANK_SCRIPT)?;
    let log = stage.mount.join("run").join("log.txt");
    say(format!(
        "  {} (ext4 on a loop device)",
        stage.mount.display()
    ));

    step(
        2,
        &format!(
            "starting {} ranks under hangwatch; rank 0 writes its log to {}",
            args.nproc,
            log.display()
        ),
    );
    let report = crate::dirs::open_report_dir(args.report_dir.as_deref(), "demo").map_err(usage)?;
    let report_dir = report.path().to_path_buf();
    let freezer = {
        let mount = stage.mount.clone();
        let frozen = std::sync::Arc::clone(&stage.frozen);
        let after = args.freeze_after;
        std::thread::spawn(move || {
            std::thread::sleep(after);
            step(
                3,
                &format!(
                    "freezing {} (fsfreeze -f): rank 0's next write() will never return",
                    mount.display()
                ),
            );
            match tool("fsfreeze", &["-f", &mount.to_string_lossy()]) {
                Ok(()) => frozen.store(true, std::sync::atomic::Ordering::SeqCst),
                Err(e) => {
                    say(format!("  could not freeze: {e:#}"));
                }
            }
        })
    };
    let launch = LaunchSpec {
        command: vec![
            python.into(),
            script.clone().into(),
            "--step-time".into(),
            "0.2".into(),
            "--log".into(),
            log.clone().into(),
        ],
        nproc: Some(args.nproc),
        socket: None,
        beats: None,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: None,
        env: Vec::new(),
        attach: Vec::new(),
        python_bootstrap: None,
        beat_socket: None,
    };
    let config = RunConfig {
        detector: DetectorConfig {
            fixed: Some(args.stall_after),
            ..DetectorConfig::default()
        },
        on_hang: OnHang::Abort,
        grace: Duration::from_secs(2),
        kill_wait: Duration::from_secs(2),
        console: Some(true),
        prefix: true,
        tick: Duration::from_millis(100),
        window: Duration::from_millis(300),
        node: hangwatch_inspect::rollcall::hostname(),
        // The demo's staged hang is not this machine's history.
        history_db: None,
        failed_rank_grace: Duration::from_secs(10),
        ..RunConfig::new(launch, report_dir.clone())
    };
    let started = Instant::now();
    let outcome = supervise(config)?;
    let _ = freezer.join();
    step(4, "thawing the filesystem and cleaning up");
    stage.thaw();
    drop(stage);

    let verdict = outcome.verdict.as_ref();
    let named_rank0 = verdict.is_some_and(|v| {
        v.kind == VerdictKind::BlockedInKernel
            && v.culprits
                .iter()
                .any(|c| c.rank == Some(0) && c.state == "D")
    });
    if args.json {
        match verdict {
            Some(v) => hangwatch_agent::human::print_json(v)?,
            None => hangwatch_agent::human::print_json(&hangwatch_model::NoHang::DOCUMENT)?,
        }
    }
    if outcome.exit_code == EXIT_HUNG && named_rank0 {
        say(format!(
            "\ndemo: hangwatch named rank 0 blocked in write() on the frozen filesystem and ended the job {:.0}s after \
             it started (the job would have exited 75 = retryable); evidence in {}",
            started.elapsed().as_secs_f64(),
            report_dir.display()
        ));
        Ok(true)
    } else {
        say(format!(
            "\ndemo: hangwatch did not reach the expected verdict (exit code {}); see {}",
            outcome.exit_code,
            report_dir.display()
        ));
        Ok(false)
    }
}
