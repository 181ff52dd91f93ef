//! `hangwatch run` under a real Slurm (tests/slurm/start-slurm.sh: slurmctld and one slurmd per emulated node on
//! this machine): an sbatch job of 3 nodes, one agent per node through `srun`, node rank 0's agent hosting the
//! coordinator, MASTER_ADDR and the ports from Slurm's environment. Rank 0's log is on a loop-mounted ext4 that
//! freezes: the job must end with 75 and every node's output must name rank 0's node. The cluster is stopped and
//! the filesystem thawed and unmounted when the test ends, also when it fails.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::slurm::*;
use common::*;
use hangwatch_testkit::{python, require, wait_until, LoopExt4};

const BIN: &str = env!("CARGO_BIN_EXE_hangwatch");

/// The id of the attempt that `first`'s hangwatch submitted, read from the batch output in `out` (within 2 min).
fn second_attempt(cluster: &SlurmCluster, first: &str, out: &Path) -> String {
    let output = || std::fs::read_to_string(out.join("batch.out")).unwrap_or_default();
    let next = |text: &str| {
        text.lines()
            .find_map(|l| l.split("attempt 2 submitted as job ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string)
    };
    assert!(
        wait_until(Duration::from_secs(120), Duration::from_millis(200), || {
            next(&output()).is_some()
        }),
        "no second attempt: {}\n{}",
        cluster.job(first),
        output()
    );
    next(&output()).unwrap_or_default()
}

#[test]
fn an_sbatch_job_of_three_nodes_ends_with_75_and_every_node_names_the_frozen_node() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let Some(cluster) = SlurmCluster::start_or_skip(3) else {
        return;
    };
    let work = tempfile::tempdir().expect("temporary directory");
    let token = work.path().join("token");
    std::fs::write(&token, "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6071\n").expect("token");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod 600");
    let log = fs.path().join("rank0.log");
    let out = work.path();
    // The sbatch example of docs/multi-node.md, with a short threshold and a stand-in for train.py.
    let script = format!(
        "#!/bin/bash\n\
         srun --ntasks-per-node=1 --output={out}/task-%t.out --error={out}/task-%t.err \\\n  \
         {BIN} run --host-coordinator --token-file {token} --nproc 1 --stall-after {STALL_AFTER} --grace 2s --quiet \\\n  \
         -- {py} {rank} --step-time 0.1 --log {log} --only-rank 0\n",
        out = out.display(),
        token = token.display(),
        py = py.display(),
        rank = hangwatch_testkit::rank_script().display(),
        log = log.display(),
    );
    let job = cluster.submit(out, &script, &["--nodes=3", "--ntasks-per-node=1"]);
    let tasks_err =
        |t: u32| std::fs::read_to_string(out.join(format!("task-{t}.err"))).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(120), POLL, || lines_in(&log) >= 3),
        "rank 0 never logged 3 steps; job: {}\ntask 0:\n{}",
        cluster.job(&job),
        tasks_err(0)
    );
    let frozen = require!(fs.freeze());
    let frozen_at = Instant::now();
    let ended = wait_until(Duration::from_secs(90), POLL, || {
        let line = cluster.job(&job);
        !matches!(
            SlurmCluster::field(&line, "JobState").as_deref(),
            Some("RUNNING" | "PENDING" | "CONFIGURING") | None
        )
    });
    let line = cluster.job(&job);
    eprintln!(
        "freeze -> Slurm job over: {:.2}s ({})",
        frozen_at.elapsed().as_secs_f64(),
        SlurmCluster::field(&line, "JobState").unwrap_or_default()
    );
    let all: String = (0..3)
        .map(|t| format!("--- task {t} ---\n{}\n", tasks_err(t)))
        .collect();
    assert!(ended, "the job did not end: {line}\n{all}");
    assert_eq!(
        SlurmCluster::field(&line, "ExitCode").as_deref(),
        Some("75:0"),
        "{line}\n{all}"
    );
    // Rank 0 runs on node rank 0, the job's first node: every node names it.
    let first = tasks_err(0)
        .lines()
        .find_map(|l| {
            let rest = l.split(" as node ").nth(1)?;
            rest.split_whitespace().next().map(str::to_string)
        })
        .unwrap_or_else(|| panic!("task 0 never joined:\n{all}"));
    for t in 0..3 {
        let text = tasks_err(t);
        assert!(
            text.contains("blocked in kernel: storage incident: ")
                && text.contains(&format!("; rank 0 (node {first}, pid")),
            "task {t} does not name rank 0 on {first}:\n{all}"
        );
        assert!(
            text.contains("in write() on") && text.contains("(ext4) does not respond"),
            "task {t}:\n{all}"
        );
    }
    drop(frozen);
}

#[test]
fn srun_tasks_each_under_its_own_hangwatch_are_known_by_slurm_procid_and_rank_0_is_named() {
    let torch = require!(hangwatch_testkit::torch_python());
    let fs = require!(LoopExt4::new(64));
    // Two emulated nodes of 2 CPUs each: 2 tasks on each.
    let Some(cluster) = SlurmCluster::start_or_skip(2) else {
        return;
    };
    let work = tempfile::tempdir().expect("temporary directory");
    let out = work.path();
    let log = fs.path().join("rank0.log");
    let port = hangwatch_testkit::free_tcp_port().expect("a free port");
    let launchers = scripts().join("../python/launchers.py");
    // No hangwatch flag says who is which rank: each task's SLURM_PROCID does, and the script copies it into RANK
    // at run time (as idr_torch does).
    let script = format!(
        "#!/bin/bash\n\
         export MASTER_ADDR=127.0.0.1 MASTER_PORT={port}\n\
         srun --ntasks=4 --output={out}/task-%t.out --error={out}/task-%t.err \\\n  \
         {BIN} run --json --stall-after {STALL_AFTER} --grace 2s --quiet \\\n  \
         -- {torch} {launchers} task --step-time 0.1 --log {log}\n",
        out = out.display(),
        torch = torch.display(),
        launchers = launchers.display(),
        log = log.display(),
    );
    let job = cluster.submit(
        out,
        &script,
        &["--nodes=2", "--ntasks=4", "--ntasks-per-node=2"],
    );
    let task = |t: u32, ext: &str| {
        std::fs::read_to_string(out.join(format!("task-{t}.{ext}"))).unwrap_or_default()
    };
    assert!(
        wait_until(Duration::from_secs(120), POLL, || lines_in(&log) >= 3),
        "rank 0 never logged 3 steps; job: {}\ntask 0:\n{}",
        cluster.job(&job),
        task(0, "err")
    );
    let frozen = require!(fs.freeze());
    let ended = wait_until(Duration::from_secs(90), POLL, || {
        !matches!(
            SlurmCluster::field(&cluster.job(&job), "JobState").as_deref(),
            Some("RUNNING" | "PENDING" | "CONFIGURING") | None
        )
    });
    let all: String = (0..4)
        .map(|t| format!("--- task {t} ---\n{}\n{}\n", task(t, "out"), task(t, "err")))
        .collect();
    assert!(ended, "the job did not end: {}\n{all}", cluster.job(&job));
    drop(frozen);
    // Task 0's hangwatch names rank 0, and says where its number came from.
    let verdict: serde_json::Value = serde_json::from_str(&task(0, "out"))
        .unwrap_or_else(|e| panic!("task 0's JSON: {e}\n{all}"));
    assert_eq!(verdict["kind"], "blocked_in_kernel", "{all}");
    assert_eq!(verdict["culprits"][0]["rank"], 0, "{all}");
    assert_eq!(verdict["culprits"][0]["syscall"], "write", "{all}");
    assert_eq!(
        verdict["culprits"][0]["rank_source"], "env:SLURM_PROCID",
        "{all}"
    );
    // The others know their own number too.
    for t in 1..4u64 {
        let theirs: serde_json::Value =
            serde_json::from_str(&task(t as u32, "out")).unwrap_or_default();
        let ranks: Vec<u64> = theirs["ranks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["rank"].as_u64())
            .collect();
        assert_eq!(ranks, vec![t], "task {t}: {all}");
    }
}

/// The job's tasks' output (every attempt appends to the same files).
fn task_output(out: &Path) -> String {
    let mut all = String::new();
    for t in 0..3 {
        for ext in ["out", "err"] {
            let text =
                std::fs::read_to_string(out.join(format!("task-{t}.{ext}"))).unwrap_or_default();
            all.push_str(&format!("--- task {t} {ext} ---\n{text}\n"));
        }
    }
    all.push_str(&format!(
        "--- batch ---\n{}\n",
        std::fs::read_to_string(out.join("batch.out")).unwrap_or_default()
    ));
    all
}

/// The first step of the attempt after `attempt`'s start line: `resumed at step S (attempt A)`.
fn resumed_at(output: &str, attempt: u32) -> Option<u64> {
    output.lines().find_map(|l| {
        let rest = l.split("resumed at step ").nth(1)?;
        let (step, tail) = rest.split_once(' ')?;
        tail.contains(&format!("(attempt {attempt})"))
            .then(|| step.parse().ok())
            .flatten()
    })
}

/// How long the storage stays frozen in the storage-incident test: longer than an attempt takes to hang, be ended
/// and be submitted again, as a real storage outage is.
const STORAGE_OUTAGE: Duration = Duration::from_secs(120);

#[test]
fn a_storage_freeze_ends_the_attempt_and_the_next_one_waits_for_the_storage_then_resumes() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let Some(cluster) = SlurmCluster::start_or_skip(3) else {
        return;
    };
    let work = tempfile::tempdir().expect("temporary directory");
    let out = work.path();
    let token = out.join("token");
    std::fs::write(&token, "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6071\n").expect("token");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod 600");
    // Each node's ranks log under logs/<node>; n2's logs are on the loop-mounted ext4 that will freeze.
    let logs = out.join("logs");
    for node in ["n1", "n3"] {
        std::fs::create_dir_all(logs.join(node)).expect("log directory");
    }
    std::os::unix::fs::symlink(fs.path(), logs.join("n2")).expect("n2's logs on the loop mount");
    let checkpoint = out.join("checkpoint");
    let steps = 60;
    let script = format!(
        "#!/bin/bash\n\
         srun --ntasks-per-node=1 --open-mode=append --output={out}/task-%t.out --error={out}/task-%t.err \\\n  \
         {BIN} run --host-coordinator --token-file {token} --nproc 1 --stall-after {STALL_AFTER} --grace 2s \\\n  \
         --action requeue -- {py} {rank} --step-time 0.2 --steps {steps} --beat \\\n  \
         --log {logs}/{{host}}/rank{{rank}}.log --checkpoint {checkpoint} --checkpoint-every 5\n",
        out = out.display(),
        token = token.display(),
        py = py.display(),
        rank = hangwatch_testkit::rank_script().display(),
        logs = logs.display(),
        checkpoint = checkpoint.display(),
    );
    let job = cluster.submit(
        out,
        &script,
        &[
            "--requeue",
            "--open-mode=append",
            "--nodes=2",
            "--ntasks-per-node=1",
        ],
    );
    let saved = || {
        std::fs::read_to_string(&checkpoint)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    assert!(
        wait_until(Duration::from_secs(120), POLL, || {
            saved() >= Some(10)
                || SlurmCluster::field(&cluster.job(&job), "JobState").as_deref() == Some("FAILED")
        }) && saved() >= Some(10),
        "no checkpoint at step 10; job: {}\n{}",
        cluster.job(&job),
        task_output(out)
    );
    let line = cluster.job(&job);
    let nodes = SlurmCluster::field(&line, "NodeList").unwrap_or_default();
    assert!(
        nodes.contains("n2") || nodes == "n[1-2]" || nodes == "n[2-3]",
        "the first attempt is not on n2 (the test freezes n2's logs): {line}"
    );
    let frozen = require!(fs.freeze());
    let frozen_at = Instant::now();

    // Ended, the next attempt submitted; it waits for the storage and does not start the job meanwhile.
    assert!(
        wait_until(Duration::from_secs(90), Duration::from_millis(200), || {
            task_output(out).contains("waiting for the storage that hung the last attempt")
        }),
        "the next attempt does not wait for the storage: {}\n{}",
        cluster.job(&job),
        task_output(out)
    );
    let waiting_after = frozen_at.elapsed();
    assert!(
        resumed_at(&task_output(out), 2).is_none(),
        "the job started on a frozen filesystem:\n{}",
        task_output(out)
    );
    std::thread::sleep(STORAGE_OUTAGE.saturating_sub(frozen_at.elapsed()));
    let waiting = task_output(out);
    assert!(
        resumed_at(&waiting, 2).is_none(),
        "the job started before the thaw:\n{waiting}"
    );
    drop(frozen);
    let thawed_at = Instant::now();
    let resumed = wait_until(Duration::from_secs(60), Duration::from_millis(200), || {
        resumed_at(&task_output(out), 2).is_some()
    });
    let all = task_output(out);
    assert!(
        resumed,
        "no second attempt resumed after the thaw: {}\n{all}",
        cluster.job(&job)
    );
    eprintln!(
        "freeze -> next attempt waiting: {:.1}s; thaw -> first step of the next attempt: {:.1}s",
        waiting_after.as_secs_f64(),
        thawed_at.elapsed().as_secs_f64()
    );
    let step = resumed_at(&all, 2).unwrap_or_default();
    assert!(step > 0, "the next attempt started from scratch:\n{all}");
    let next = all
        .lines()
        .find_map(|l| l.split("attempt 2 submitted as job ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no next attempt was submitted:\n{all}"))
        .to_string();
    // The old job was ended at once (its rank on n2 cannot be killed, and would hold n1 too).
    let old = cluster.job(&job);
    assert!(
        matches!(
            SlurmCluster::field(&old, "JobState").as_deref(),
            Some("CANCELLED" | "COMPLETING")
        ),
        "{old}"
    );
    let line = cluster.job(&next);
    // At most the node whose rank could not be killed is kept out: n2, whose rank sits in D until the thaw.
    let excluded = SlurmCluster::field(&line, "ExcNodeList").unwrap_or_default();
    assert!(
        excluded == "n2" || excluded == "(null)" || excluded.is_empty(),
        "more than the unkillable rank's node is excluded: {line}"
    );
    assert!(
        all.contains(
            "previous attempt (1) ended by hangwatch (blocked_in_kernel): rank 1 on n2 in write()"
        ),
        "the next attempt does not say what happened to the previous one:\n{all}"
    );
    // The record says what it was and what the next attempt waits for; the storage spent no budget.
    let record = cluster.job(&next);
    assert!(
        record.contains("scope=filesystem")
            && record.contains(&format!("mounts={}", fs.path().display())),
        "{record}"
    );
    assert!(
        record.contains("without_progress=0"),
        "a storage hang spent the budget: {record}"
    );
    assert!(
        wait_until(Duration::from_secs(120), Duration::from_millis(200), || {
            SlurmCluster::field(&cluster.job(&next), "JobState").as_deref() == Some("COMPLETED")
        }),
        "the resumed job did not finish: {}\n{}",
        cluster.job(&next),
        task_output(out)
    );
}

#[test]
fn a_job_that_hangs_again_without_progress_stops_after_its_restart_budget_with_76() {
    let py = require!(python());
    let Some(cluster) = SlurmCluster::start_or_skip(2) else {
        return;
    };
    let work = tempfile::tempdir().expect("temporary directory");
    let out = work.path();
    // Rank 0 deadlocks at step 3 of every attempt: a hang that follows the job wherever it runs.
    let script = format!(
        "#!/bin/bash\n\
         {BIN} run --nproc 3 --stall-after {STALL_AFTER} --grace 2s --action requeue --max-requeues 1 \\\n  \
         -- {py} {rank} --step-time 0.1 --beat --behaviour lock --after 3 --only-rank 0\n",
        py = py.display(),
        rank = hangwatch_testkit::rank_script().display(),
    );
    let first = cluster.submit(
        out,
        &script,
        &["--requeue", "--open-mode=append", "--nodes=1"],
    );
    let second = second_attempt(&cluster, &first, out);
    let output = || std::fs::read_to_string(out.join("batch.out")).unwrap_or_default();
    let over = |id: &str| {
        !matches!(
            SlurmCluster::field(&cluster.job(id), "JobState").as_deref(),
            Some("RUNNING" | "PENDING" | "CONFIGURING" | "COMPLETING") | None
        )
    };
    assert!(
        wait_until(
            Duration::from_secs(120),
            Duration::from_millis(200),
            || over(&first) && over(&second)
        ),
        "the attempts did not end: {}\n{}\n{}",
        cluster.job(&first),
        cluster.job(&second),
        output()
    );
    let text = output();
    let one = cluster.job(&first);
    let two = cluster.job(&second);
    assert_eq!(
        SlurmCluster::field(&one, "ExitCode").as_deref(),
        Some("75:0"),
        "{one}\n{text}"
    );
    assert_eq!(
        SlurmCluster::field(&two, "ExitCode").as_deref(),
        Some("76:0"),
        "{two}\n{text}"
    );
    assert!(
        text.contains(
            "hung 2 times in a row without progress (--max-requeues 1): no next attempt (exit 76)"
        ),
        "{text}"
    );
    assert!(
        !text.contains("attempt 3 submitted"),
        "a third attempt was submitted:\n{text}"
    );
    assert!(
        text.contains("previous attempt (1) ended by hangwatch (diverged)"),
        "the second attempt does not say what happened to the first:\n{text}"
    );
}

/// Runs `scontrol ARGS` on the test cluster as its administrator; panics with Slurm's words when it refuses.
fn scontrol_admin(cluster: &SlurmCluster, args: &[&str]) {
    let out = cluster
        .command("scontrol")
        .args(args)
        .output()
        .expect("scontrol runs");
    assert!(
        out.status.success(),
        "scontrol {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_requeued_job_keeps_every_option_it_was_submitted_with() {
    let py = require!(python());
    let Some(cluster) = SlurmCluster::start_or_skip_with_gpus(2, 1) else {
        return;
    };
    // What a real cluster has and this one lacks: node features to constrain on, a reservation to run in. Both
    // go with the cluster when it is stopped.
    scontrol_admin(
        &cluster,
        &[
            "update",
            "NodeName=n[1-2]",
            "AvailableFeatures=fast,ib",
            "ActiveFeatures=fast,ib",
        ],
    );
    scontrol_admin(
        &cluster,
        &[
            "create",
            "reservation",
            "ReservationName=hw-test",
            "Users=root",
            "StartTime=now",
            "Duration=60",
            "Nodes=n[1-2]",
        ],
    );
    let work = tempfile::tempdir().expect("temporary directory");
    let out = work.path();
    // Rank 0 deadlocks at step 3: the attempt hangs and is requeued (a deadlock keeps no node out).
    let script = format!(
        "#!/bin/bash\n\
         {BIN} run --nproc 2 --stall-after {STALL_AFTER} --grace 2s --action requeue --max-requeues 1 \\\n  \
         -- {py} {rank} --step-time 0.1 --beat --behaviour lock --after 3 --only-rank 0\n",
        py = py.display(),
        rank = hangwatch_testkit::rank_script().display(),
    );
    // A dependency is not among them: Slurm drops a met dependency before the job runs, so a running job has
    // none left to keep (the unit tests over Slurm's JSON cover one that is still listed).
    let first = cluster.submit(
        out,
        &script,
        &[
            "--requeue",
            "--open-mode=append",
            "--nodes=1",
            "--job-name=keep-options",
            "--constraint=fast&ib",
            "--exclusive",
            "--mem-per-cpu=100M",
            "--reservation=hw-test",
            "--time=00:20:00",
            "--array=2",
            "--mail-type=END",
            "--mail-user=ops@example.org",
            "--gpus=1",
            "--gpus-per-task=1",
            "--cpus-per-gpu=1",
        ],
    );
    let second = second_attempt(&cluster, &first, out);
    let output = || std::fs::read_to_string(out.join("batch.out")).unwrap_or_default();
    let one = cluster.job(&first);
    let two = cluster.job(&second);
    for (field, want) in [
        ("JobName", "keep-options"),
        ("Features", "fast&ib"),
        ("OverSubscribe", "NO"),
        ("MinMemoryCPU", "100M"),
        ("Reservation", "hw-test"),
        ("TimeLimit", "00:20:00"),
        ("ArrayTaskId", "2"),
        ("Requeue", "1"),
        ("MailType", "END"),
        ("MailUser", "ops@example.org"),
        ("TresPerJob", "gres:gpu:1"),
        ("TresPerTask", "gres:gpu:1"),
        ("CpusPerTres", "gres:gpu:1"),
        // The same output file, appended to.
        ("StdOut", &out.join("batch.out").display().to_string()),
    ] {
        assert_eq!(
            SlurmCluster::field(&one, field).as_deref(),
            Some(want),
            "the first attempt was not submitted as the test meant: {one}"
        );
        assert_eq!(
            SlurmCluster::field(&two, field).as_deref(),
            Some(want),
            "the next attempt lost {field}={want}:\n{two}\n{}",
            output()
        );
    }
    assert!(
        !output().contains("Slurm gives no JSON"),
        "Slurm's JSON was not used:\n{}",
        output()
    );
}
