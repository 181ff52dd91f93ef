//! `hangwatch steps` under a real Slurm (two emulated nodes on this machine): a batch job that knows nothing of
//! hangwatch runs a 4-task srun step (2 per node) and, in its batch step, a launcher that starts two ranks with
//! RANK; from outside the job, each node's steps and ranks are found with their numbers and where the numbers
//! came from.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use common::slurm::SlurmCluster;
use common::*;
use hangwatch_testkit::{python, wait_until};
use serde_json::Value;

/// `hangwatch steps --json` (of one node, when given), as (step name -> [(rank, source)]).
fn steps(node: Option<&str>) -> (BTreeMap<String, Vec<(u64, String)>>, Value) {
    let mut cmd: Command = hangwatch();
    cmd.args(["steps", "--json"]);
    if let Some(node) = node {
        cmd.args(["--node-name", node]);
    }
    let out = cmd.output().expect("hangwatch steps runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let found = doc["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let name = format!(
                "{}.{}@{}",
                s["job_id"].as_str().unwrap_or("?"),
                s["step"].as_str().unwrap_or("?"),
                s["node"].as_str().unwrap_or("?")
            );
            let ranks = s["ranks"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    (
                        r["rank"].as_u64().unwrap_or(u64::MAX),
                        r["source"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            (name, ranks)
        })
        .collect();
    (found, doc)
}

#[test]
fn the_steps_of_a_job_that_knows_nothing_of_hangwatch_are_found_with_their_ranks_on_each_node() {
    let py = python().expect("python3");
    let Some(cluster) = SlurmCluster::start_or_skip(2) else {
        return;
    };
    let work = tempfile::tempdir().expect("temporary directory");
    // The batch step's launcher starts two ranks as torchrun would (RANK in their environment) and waits.
    let launcher = "import os, subprocess, sys\n\
         ranks = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],\n\
                  env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE='2')) for r in range(2)]\n\
         [p.wait() for p in ranks]\n";
    std::fs::write(work.path().join("launcher.py"), launcher).expect("launcher");
    let script = format!(
        "#!/bin/bash\n\
         srun --ntasks=4 --ntasks-per-node=2 {py} -c 'import time; time.sleep(300)' &\n\
         {py} {launcher}\n\
         wait\n",
        py = py.display(),
        launcher = work.path().join("launcher.py").display(),
    );
    let job = cluster.submit(work.path(), &script, &["--nodes=2", "--ntasks=4"]);
    let env_rank = "env:RANK".to_string();
    let procid = "env:SLURM_PROCID".to_string();
    let wanted_n1 = BTreeMap::from([
        (
            format!("{job}.0@n1"),
            vec![(0, procid.clone()), (1, procid.clone())],
        ),
        (
            format!("{job}.batch@n1"),
            vec![(0, env_rank.clone()), (1, env_rank.clone())],
        ),
    ]);
    let mut last = BTreeMap::new();
    let found = wait_until(Duration::from_secs(90), POLL, || {
        last = steps(Some("n1")).0;
        last == wanted_n1
    });
    assert!(found, "n1's steps: {last:?}\njob: {}", cluster.job(&job));
    let (n2, doc) = steps(Some("n2"));
    assert_eq!(
        n2,
        BTreeMap::from([(
            format!("{job}.0@n2"),
            vec![(2, procid.clone()), (3, procid)]
        )]),
        "{doc:#}"
    );
    // The owner is the job's, and the batch step's ranks are the launcher's children, not the launcher.
    let (_, doc) = steps(Some("n1"));
    let batch = doc["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["step"] == "batch")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        batch["uid"].as_u64(),
        Some(u64::from(nix::unistd::geteuid().as_raw()))
    );
    let task = batch["tasks"][0].as_i64().unwrap_or_default() as i32;
    for rank in batch["ranks"].as_array().into_iter().flatten() {
        let pid = rank["pid"].as_i64().unwrap_or_default() as u32;
        let launcher_pid = stat_fields(pid).map(|(ppid, _)| ppid);
        assert_ne!(
            launcher_pid,
            Some(task as u32),
            "a rank below the launcher, not the launcher: {doc:#}"
        );
    }
    // Every step on the machine without --node-name.
    assert_eq!(steps(None).0.len(), 3);
}
