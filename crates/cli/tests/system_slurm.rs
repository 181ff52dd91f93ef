//! `hangwatch run` under a real Slurm (tests/slurm/start-slurm.sh: slurmctld and one slurmd per emulated node on
//! this machine): an sbatch job of 3 nodes, one agent per node through `srun`, node rank 0's agent hosting the
//! coordinator, MASTER_ADDR and the ports from Slurm's environment. Rank 0's log is on a loop-mounted ext4 that
//! freezes: the job must end with 75 and every node's output must name rank 0's node. The cluster is stopped and
//! the filesystem thawed and unmounted when the test ends, also when it fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use hangwatch_testkit::{python, require, require_root, wait_until, LoopExt4};

const BIN: &str = env!("CARGO_BIN_EXE_hangwatch");

/// A Slurm cluster of its own: its directory, config and ports; stopped on drop.
struct SlurmCluster {
    dir: PathBuf,
    conf: PathBuf,
}

impl SlurmCluster {
    fn start(nodes: u32) -> Result<SlurmCluster, String> {
        require_root()?;
        let dir = std::env::temp_dir().join(format!("hangwatch-slurm-test-{}", std::process::id()));
        let cluster = SlurmCluster {
            conf: dir.join("etc/slurm.conf"),
            dir,
        };
        let out = Command::new("bash")
            .arg(scripts().join("start-slurm.sh"))
            .env("SLURM_NODES", nodes.to_string())
            .env("SLURM_DIR", &cluster.dir)
            // Away from the default ports, where a developer's own cluster may run.
            .env("SLURM_PORT_BASE", "17817")
            .output()
            .map_err(|e| format!("cannot run start-slurm.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "start-slurm.sh failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(cluster)
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    /// `scontrol show job ID -o`, one line of KEY=VALUE.
    fn job(&self, id: &str) -> String {
        self.command("scontrol")
            .args(["show", "job", id, "-o"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    fn field(line: &str, key: &str) -> Option<String> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(scripts().join("stop-slurm.sh"))
            .env("SLURM_DIR", &self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/slurm")
}

#[test]
fn an_sbatch_job_of_three_nodes_ends_with_75_and_every_node_names_the_frozen_node() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let cluster = match SlurmCluster::start(3) {
        Ok(c) => c,
        Err(why) if !hangwatch_testkit::strict_mode() => {
            eprintln!("SKIPPED: no Slurm here: {why}");
            return;
        }
        Err(why) => panic!("{why}"),
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
    let script_path = out.join("job.sh");
    std::fs::write(&script_path, script).expect("job script");
    let submitted = cluster
        .command("sbatch")
        .args(["--parsable", "--nodes=3", "--ntasks-per-node=1", "-o"])
        .arg(out.join("batch.out"))
        .arg(&script_path)
        .output()
        .expect("sbatch runs");
    assert!(
        submitted.status.success(),
        "sbatch: {}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let job = String::from_utf8_lossy(&submitted.stdout)
        .trim()
        .to_string();
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
            text.contains(&format!("blocked in kernel: rank 0 (node {first}, pid")),
            "task {t} does not name rank 0 on {first}:\n{all}"
        );
        assert!(
            text.contains("in write() on") && text.contains("(ext4) does not respond"),
            "task {t}:\n{all}"
        );
    }
    drop(frozen);
}
