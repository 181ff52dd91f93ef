//! System tests of "a rank is a rank however it was launched" (docs/run.md, "Who is a rank"): real torch jobs whose
//! ranks carry no `RANK` when they start (`torch.multiprocessing.spawn`, srun-style tasks that set it at run time),
//! rank 0's log on a really frozen ext4. The verdict must name rank 0 and say where its number came from; the
//! DataLoader workers below each rank stay workers.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use hangwatch_testkit::{is_dead, process_state, require, torch_python, wait_until, LoopExt4};

/// `python tests/python/launchers.py MODE ARGS`.
fn launchers_job(python: &Path, args: &[&str]) -> Vec<String> {
    [
        python.to_string_lossy().into_owned(),
        hangwatch_testkit::rank_script()
            .with_file_name("launchers.py")
            .to_string_lossy()
            .into_owned(),
    ]
    .into_iter()
    .chain(args.iter().map(|a| a.to_string()))
    .collect()
}

/// Runs `mode` with 4 ranks, freezes rank 0's log and checks the verdict: rank 0 named in its write, ranks 1-3
/// waiting, every rank numbered as it printed, each number's source `expected_source`, no worker a rank.
fn rank_0_is_named(mode: &str, expected_source: &[&str]) {
    let py = require!(torch_python());
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let log_s = log.to_string_lossy().into_owned();
    let job = launchers_job(py, &[mode, "--nproc", "4", "--log", &log_s]);
    frozen_rank_0_is_named(
        HangwatchRun::start(&["--stall-after", STALL_AFTER], &job),
        &fs,
        expected_source,
    );
}

/// Freezes rank 0's log under a started `run` of 4 ranks and checks the verdict (see [`rank_0_is_named`]).
fn frozen_rank_0_is_named(mut run: HangwatchRun, fs: &LoopExt4, expected_source: &[&str]) {
    let log = fs.path().join("rank0.log");
    let log_s = log.to_string_lossy().into_owned();
    let printed = run.wait_for_ranks(4, Duration::from_secs(90));
    assert!(
        wait_until(Duration::from_secs(60), POLL, || lines_in(&log) >= 20),
        "rank 0 never logged 20 steps:\n{}",
        run.stderr_text()
    );
    run.track_descendants();
    let frozen = require!(fs.freeze());
    let done = run.finish(STALL + Duration::from_secs(40));
    done.assert_code(75);
    assert_eq!(
        done.json["kind"],
        "blocked_in_kernel",
        "{}",
        done.describe()
    );
    let c = done.culprit(0);
    assert_eq!(c["pid"], printed[&0], "{}", done.describe());
    assert_eq!(c["syscall"], "write", "{}", done.describe());
    assert_eq!(c["path"], log_s.as_str());
    assert!(
        expected_source.contains(&c["rank_source"].as_str().unwrap_or("")),
        "rank 0's number should come from {expected_source:?}: {}",
        done.describe()
    );
    assert_eq!(
        done.rank_pids()
            .iter()
            .map(|(r, p)| (*r as u32, *p))
            .collect::<BTreeMap<u32, u32>>(),
        printed,
        "the ranks are the processes that said so, workers are not: {}",
        done.describe()
    );
    let waiting: Vec<u64> = done.json["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["ranks"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r.as_u64())
        .filter(|r| *r != 0)
        .collect();
    let mut waiting_sorted = waiting.clone();
    waiting_sorted.sort_unstable();
    assert_eq!(waiting_sorted, vec![1, 2, 3], "{}", done.describe());
    for r in done.json["ranks"].as_array().into_iter().flatten() {
        assert!(
            r["workers"].as_array().is_some_and(|w| !w.is_empty()),
            "each rank's DataLoader workers are its workers: {}",
            done.describe()
        );
    }
    let rank0 = printed[&0];
    frozen.thaw().expect("thaw");
    assert!(
        wait_until(Duration::from_secs(10), POLL, || is_dead(rank0)),
        "rank 0 (pid {rank0}) did not die after the thaw (state {:?})",
        process_state(rank0)
    );
}

#[test]
fn mp_spawn_ranks_frozen_log_names_rank_0() {
    // The structure numbers them first; each rank's client says its number once torch.distributed is up.
    rank_0_is_named("mp-spawn", &["client", "structure"]);
}

#[test]
fn srun_style_tasks_with_slurm_procid_only_frozen_log_names_rank_0() {
    rank_0_is_named("srun-tasks", &["env:SLURM_PROCID"]);
}

#[test]
fn mpirun_tasks_frozen_log_names_rank_0() {
    let py = require!(torch_python());
    let mpirun = require!(installed(
        "/usr/bin/mpirun",
        "apt-get install openmpi-bin (scripts/test does)"
    ));
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let log_s = log.to_string_lossy().into_owned();
    let port = hangwatch_testkit::free_tcp_port()
        .expect("a free port")
        .to_string();
    let mut job: Vec<String> = [
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        "4",
        "-x",
        "MASTER_PORT",
        "-x",
        "PATH",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    job.insert(0, mpirun.to_string_lossy().into_owned());
    job.extend(launchers_job(py, &["mpi-task", "--log", &log_s]));
    let mut cmd = hangwatch();
    cmd.env("MASTER_PORT", &port);
    let run = HangwatchRun::start_in(cmd, &["--stall-after", STALL_AFTER], &job);
    frozen_rank_0_is_named(run, &fs, &["env:OMPI_COMM_WORLD_RANK", "client"]);
}

/// Lightning 2.x `Trainer(devices=2, strategy="ddp")` run as `python job.py`: rank 0 is the original process,
/// Lightning starts rank 1 with `LOCAL_RANK=1`. The checkpoint directory freezes under rank 0's next checkpoint.
/// `callback`: the job adds hangwatch's callback itself; `instrument`: `run` adds it (the zero-code bootstrap);
/// with neither, the ranks are known by the process tree alone.
fn lightning_rank_0_is_named(callback: bool, instrument: bool, expected_source: &str) {
    let py = require!(torch_python());
    let has_lightning = std::process::Command::new(py)
        .args(["-c", "import lightning.pytorch"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_lightning {
        assert!(
            !hangwatch_testkit::strict_mode(),
            "Lightning is not installed in {} (scripts/test installs it)",
            py.display()
        );
        eprintln!("skipped: Lightning is not installed in {}", py.display());
        return;
    }
    let fs = require!(LoopExt4::new(64));
    let log = fs.path().join("rank0.log");
    let ckpt = fs.path().join("ckpt");
    let log_s = log.to_string_lossy().into_owned();
    let mut args = vec!["lightning", "--log", &log_s];
    if callback {
        args.push("--callback");
    }
    let flags: &[&str] = if instrument {
        &["--stall-after", "30s"]
    } else {
        &["--stall-after", "30s", "--no-instrument"]
    };
    let mut run = HangwatchRun::start(flags, &launchers_job(py, &args));
    let printed = run.wait_for_ranks(2, Duration::from_secs(100));
    assert!(
        wait_until(Duration::from_secs(60), POLL, || std::fs::read_dir(&ckpt)
            .is_ok_and(|d| d.count() >= 1)),
        "no checkpoint was written:\n{}",
        run.stderr_text()
    );
    run.track_descendants();
    let frozen = require!(fs.freeze());
    let done = run.finish(Duration::from_secs(60));
    done.assert_code(75);
    assert_eq!(
        done.json["kind"],
        "blocked_in_kernel",
        "{}",
        done.describe()
    );
    let c = done.culprit(0);
    assert_eq!(c["pid"], printed[&0], "{}", done.describe());
    assert_eq!(c["rank_source"], expected_source, "{}", done.describe());
    assert_eq!(
        done.rank_pids()
            .iter()
            .map(|(r, p)| (*r as u32, *p))
            .collect::<BTreeMap<u32, u32>>(),
        printed,
        "{}",
        done.describe()
    );
    // Rank 1 waits in Lightning's barrier behind rank 0 in D, and Lightning's SIGTERM handler only records the
    // signal: the grace is not spent waiting on it (it was 10 of the 32 s from the freeze to the end).
    assert!(
        done.stderr.contains("no grace is spent on rank 1"),
        "{}",
        done.describe()
    );
    let rank0 = printed[&0];
    frozen.thaw().expect("thaw");
    assert!(
        wait_until(Duration::from_secs(10), POLL, || is_dead(rank0)),
        "rank 0 (pid {rank0}) did not die after the thaw (state {:?})",
        process_state(rank0)
    );
}

#[test]
fn lightning_ddp_frozen_checkpoint_names_rank_0_without_the_callback() {
    lightning_rank_0_is_named(false, false, "structure");
}

#[test]
fn lightning_ddp_frozen_checkpoint_names_rank_0_with_the_callback() {
    lightning_rank_0_is_named(true, false, "client");
}

#[test]
fn lightning_ddp_frozen_checkpoint_names_rank_0_with_the_callback_run_added() {
    lightning_rank_0_is_named(false, true, "client");
}
