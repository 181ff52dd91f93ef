//! `hangwatch node`, the service on each node, under a real Slurm (three emulated nodes on this machine, one
//! service per node): a 2-node batch job that knows nothing of hangwatch (srun starts 4 ranks; rank 0 logs onto a
//! loop-mounted ext4 that freezes) leaves RUNNING at the defaults, cancelled through Slurm with the verdict as its
//! admin comment, and n1's service names rank 0, the write and the mount; a healthy job on the third node runs to
//! COMPLETED beside it. The services are killed and the filesystem thawed when the test ends, also on failure.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::slurm::{scripts, SlurmCluster};
use common::*;
use hangwatch_testkit::{python, require, wait_until, ChildGuard, LoopExt4};

/// Where node `node`'s service meets the others: emulated nodes share one machine, so each listens on a port of
/// its own, and every service is told every node's (`--peer`).
fn peer_port(node: &str) -> u16 {
    let base = 17_900 + (std::process::id() % 50) as u16 * 4;
    base + node.trim_start_matches('n').parse::<u16>().unwrap_or(0)
}

fn service(cluster: &SlurmCluster, node: &str, out: &Path) -> ChildGuard {
    service_with(cluster, node, out, Path::new("/dev/null"))
}

fn service_with(cluster: &SlurmCluster, node: &str, out: &Path, config: &Path) -> ChildGuard {
    service_at(cluster, node, out, config, Some(out))
}

/// Node `node`'s service, its log and state in `out`; the evidence under `report_root`, else where a site's goes
/// (each owner's `/var/tmp/hangwatch-<uid>`).
fn service_at(
    cluster: &SlurmCluster,
    node: &str,
    out: &Path,
    config: &Path,
    report_root: Option<&Path>,
) -> ChildGuard {
    // Appended: a restarted service writes after the one before it.
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out.join(format!("service-{node}.err")))
        .expect("service log");
    let child = hangwatch()
        // The test cluster's configuration; a real node's Slurm has its own at the default place.
        .env("SLURM_CONF", &cluster.conf)
        .env("HANGWATCH_STATE_DIR", out.join(format!("state-{node}")))
        .arg("--config")
        .arg(config)
        .args([
            "node",
            "--node-name",
            node,
            "--scan-every",
            "1s",
            "--peer-listen",
            &format!("127.0.0.1:{}", peer_port(node)),
        ])
        .args(["n1", "n2", "n3"].iter().flat_map(|n| {
            [
                "--peer".to_string(),
                format!("{n}=127.0.0.1:{}", peer_port(n)),
            ]
        }))
        // The cluster's munged: how the services of one job agree on its coordinator's secret.
        .arg("--munge-socket")
        .arg(cluster.dir.join("run/munge/munge.socket.2"))
        .args(
            report_root
                .iter()
                .flat_map(|r| [std::ffi::OsStr::new("--report-root"), r.as_os_str()]),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("hangwatch node starts");
    ChildGuard::new(child, format!("hangwatch node {node}"))
}

/// For a failure's message: whether rank 0 went on logging after the freeze (then the filesystem did not stay
/// frozen, and no watcher could have seen it stuck).
fn logging_since(log: &Path, at_freeze: usize) -> String {
    let now = lines_in(log);
    if now > at_freeze + 1 {
        format!(
            "rank 0 logged {} lines after the freeze: the filesystem did not stay frozen",
            now - at_freeze
        )
    } else {
        "rank 0 logged nothing after the freeze".into()
    }
}

/// For scripts/accuracy: the verdict of the watcher that named a culprit (n1's), from the evidence the services
/// handed over under `out`, with the `thresholds.json` beside it. Nothing when none was handed over yet.
fn record_watchers_verdict(out: &Path, took: Duration) {
    if std::env::var_os("HANGWATCH_ACCURACY_DIR").is_none() {
        return;
    }
    fn verdicts(dir: &Path, depth: u32, found: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.file_name().is_some_and(|n| n == "verdict.json") {
                found.push(path);
            } else if depth > 0 && entry.file_type().is_ok_and(|t| t.is_dir()) {
                verdicts(&path, depth - 1, found);
            }
        }
    }
    let mut found = Vec::new();
    wait_until(Duration::from_secs(20), POLL, || {
        found.clear();
        verdicts(out, 5, &mut found);
        !found.is_empty()
    });
    let named = found.iter().find_map(|path| {
        let verdict: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
        let dir = path.parent()?.to_path_buf();
        let named = verdict["culprits"]
            .as_array()
            .is_some_and(|c| !c.is_empty());
        named.then_some((verdict, dir))
    });
    if let Some((verdict, dir)) = named {
        record_for_accuracy(&verdict, None, &dir, took);
    }
}

fn service_log(out: &Path, node: &str) -> String {
    std::fs::read_to_string(out.join(format!("service-{node}.err"))).unwrap_or_default()
}

/// A job that knows nothing of hangwatch (real torch ranks: gloo, a DataLoader with 2 workers each, an all_reduce
/// per step; RANK set from SLURM_PROCID by the job itself), and no TaskProlog: the watchers' only sign of life is the ranks' CPU time, and ranks waiting in gloo's barrier keep
/// using a little of it in gloo's event loop thread. That is not progress, and the job is ended within 40 s of the
/// freeze, as `run` ends it.
#[test]
fn a_torch_job_without_the_task_prolog_is_ended_within_40_s_of_its_writer_freezing() {
    let py = hangwatch_testkit::torch_python().expect("torch (run ./scripts/test)");
    let job = scripts().join("../python/torch_job.py");
    frozen_writer_under_the_services(
        |log| {
            format!(
                "exec {py} {job} --step-time 0.05 --rank0-log {log}",
                py = py.display(),
                job = job.display(),
                log = log.display(),
            )
        },
        Duration::from_secs(40),
    );
}

/// A 2-node batch job (srun starts 4 ranks, `rank` the command of each, given rank 0's log on a loop ext4) under
/// the three services; the ext4 freezes once rank 0 logs: the job leaves RUNNING within `within` of the freeze,
/// cancelled through Slurm, n1's service names rank 0, the write and the mount, n2's names n1's rank 0, n1 is
/// drained, and a healthy job on n3 completes.
fn frozen_writer_under_the_services(rank: impl Fn(&Path) -> String, within: Duration) {
    let py = python().expect("python3");
    let fs = require!(LoopExt4::new(64));
    let Some(cluster) = SlurmCluster::start_or_skip(3) else {
        return;
    };
    let work = tempfile::tempdir().expect("temporary directory");
    let out = work.path();
    let _services: Vec<ChildGuard> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| service(&cluster, n, out))
        .collect();
    let log = fs.path().join("rank0.log");
    let port = hangwatch_testkit::free_tcp_port().expect("a free port");
    let hung = cluster.submit(
        out,
        &format!(
            "#!/bin/bash\n\
             export MASTER_ADDR=127.0.0.1 MASTER_PORT={port}\n\
             srun --ntasks=4 --ntasks-per-node=2 bash -c 'export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID \
             WORLD_SIZE=$SLURM_NTASKS; {command}'\n",
            command = rank(&log),
        ),
        &["--nodes=2", "--ntasks=4", "-w", "n[1-2]"],
    );
    let healthy_out = out.join("healthy");
    std::fs::create_dir_all(&healthy_out).expect("healthy job's directory");
    let healthy = cluster.submit(
        &healthy_out,
        &format!(
            "#!/bin/bash\nsrun --ntasks=1 {py} -c 'import time\nfor i in range(40): print(i, flush=True); time.sleep(1)'\n",
            py = py.display()
        ),
        &["--nodes=1", "--ntasks=1", "-w", "n3"],
    );
    assert!(
        wait_until(Duration::from_secs(120), POLL, || lines_in(&log) >= 3),
        "rank 0 never logged; job: {}\nn1: {}",
        cluster.job(&hung),
        service_log(out, "n1")
    );
    assert!(
        wait_until(Duration::from_secs(30), POLL, || service_log(out, "n1")
            .contains(&format!("watching step {hung}.0"))
            && service_log(out, "n2")
                .contains(&format!("watching step {hung}.0"))),
        "the services never watched the step:\nn1: {}\nn2: {}",
        service_log(out, "n1"),
        service_log(out, "n2")
    );
    // One coordinator for the step, hosted by its first node's watcher; n2's joins with the key n1 gave.
    assert!(
        service_log(out, "n1").contains("hosting its coordinator")
            && service_log(out, "n2").contains("joining its coordinator"),
        "n1:\n{}\nn2:\n{}",
        service_log(out, "n1"),
        service_log(out, "n2")
    );
    let frozen = require!(fs.freeze());
    let frozen_at = std::time::Instant::now();
    let at_freeze = lines_in(&log);
    let state = |id: &str| SlurmCluster::field(&cluster.job(id), "JobState");
    let left_running = wait_until(within, POLL, || {
        !matches!(state(&hung).as_deref(), Some("RUNNING" | "PENDING") | None)
    });
    // For the record (the closing numbers of a run): how long the services took.
    eprintln!(
        "the job left RUNNING {:.1} s after the freeze",
        frozen_at.elapsed().as_secs_f64()
    );
    let n1 = service_log(out, "n1");
    assert!(
        left_running,
        "the hung job is still RUNNING {} s after the freeze ({}): {}\nn1:\n{n1}\nn2:\n{}",
        within.as_secs(),
        logging_since(&log, at_freeze),
        cluster.job(&hung),
        service_log(out, "n2")
    );
    record_watchers_verdict(out, frozen_at.elapsed());
    let job = cluster.job(&hung);
    assert!(
        job.contains("AdminComment=hangwatch:"),
        "the verdict is the job's admin comment: {job}"
    );
    assert!(
        n1.contains("rank 0")
            && n1.contains("write")
            && n1.contains(&fs.path().display().to_string()),
        "n1's service names rank 0, the write and the mount:\n{n1}"
    );
    // One verdict: n2, whose ranks only wait, names n1's rank 0 and why, as n1 does.
    let says_it = |log: &str| {
        log.lines()
            .any(|l| l.contains("rank 0 (node n1") && l.contains("write"))
    };
    assert!(
        wait_until(Duration::from_secs(30), POLL, || says_it(&service_log(
            out, "n2"
        ))),
        "n2's service names n1's rank 0 and the write:\n{}",
        service_log(out, "n2")
    );
    assert!(
        wait_until(Duration::from_secs(30), POLL, || service_log(out, "n1")
            .contains(&format!("job {hung} cancelled through Slurm"))),
        "{}",
        service_log(out, "n1")
    );
    // Rank 0 stays in D after SIGKILL: n1 is drained, with why, so that no job lands on it.
    let node = || {
        cluster
            .command("scontrol")
            .args(["show", "node", "n1", "-o"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    assert!(
        wait_until(Duration::from_secs(30), POLL, || {
            let n = node();
            n.contains("DRAIN") && n.contains("Reason=hangwatch: rank 0 unkillable")
        }),
        "n1 is drained with the reason: {}\nn1's service:\n{}",
        node(),
        service_log(out, "n1")
    );
    drop(frozen);
    // The job beside it was watched and left alone.
    assert!(
        wait_until(Duration::from_secs(90), POLL, || state(&healthy).as_deref()
            == Some("COMPLETED")),
        "the healthy job on n3: {}\nn3:\n{}",
        cluster.job(&healthy),
        service_log(out, "n3")
    );
    assert!(service_log(out, "n3").contains(&format!("watching step {healthy}.0")));
}

/// A real torch job that knows nothing of hangwatch, started with the shipped TaskProlog (`srun --task-prolog`, as
/// a site's `TaskProlog=` would): its ranks beat on every optimizer step to the step's watcher, so the threshold is
/// learned from steps, and a deadlock after 60 steps is ended at it.
#[test]
fn a_torch_job_under_the_task_prolog_beats_to_the_service_and_its_deadlock_is_ended_at_the_learned_threshold(
) {
    let torch = require!(hangwatch_testkit::torch_python());
    let Some(cluster) = SlurmCluster::start_or_skip(3) else {
        return;
    };
    let work = tempfile::tempdir().expect("temporary directory");
    let out = work.path();
    let config = out.join("config.toml");
    std::fs::write(&config, "[run]\nmin_stall = \"4s\"\n").expect("config");
    let _service = service_with(&cluster, "n1", out, &config);
    let prolog =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/hangwatch-taskprolog.sh");
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/plain_torch_job.py");
    let port = hangwatch_testkit::free_tcp_port().expect("a free port");
    let hung = cluster.submit(
        out,
        &format!(
            "#!/bin/bash\n\
             export MASTER_ADDR=127.0.0.1 MASTER_PORT={port}\n\
             srun --ntasks=2 --task-prolog={prolog} bash -c 'export RANK=$SLURM_PROCID WORLD_SIZE=2; \
             exec {py} {job} --step-time 0.2 --deadlock-after 60 --deadlock-rank 1'\n",
            prolog = prolog.display(),
            py = torch.display(),
            job = job.display(),
        ),
        &["--nodes=1", "--ntasks=2", "-w", "n1"],
    );
    let state = || SlurmCluster::field(&cluster.job(&hung), "JobState");
    assert!(
        wait_until(Duration::from_secs(180), POLL, || !matches!(
            state().as_deref(),
            Some("RUNNING" | "PENDING") | None
        )),
        "the deadlocked job is still {:?}: {}\nn1:\n{}",
        state(),
        cluster.job(&hung),
        service_log(out, "n1")
    );
    // The watcher ends the ranks itself, so the job may leave RUNNING before the service has said why.
    assert!(
        wait_until(Duration::from_secs(30), POLL, || service_log(out, "n1")
            .contains(&format!("step {hung}.0 hung:"))),
        "n1's service says the step hung:\n{}",
        service_log(out, "n1")
    );
    let n1 = service_log(out, "n1");
    assert!(
        n1.contains("rank 1 never joined") || n1.contains("rank 1 (node n1"),
        "n1's service names rank 1:\n{n1}"
    );
    let evidence = std::fs::read_dir(out)
        .expect("report root")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("step-{hung}.0-")))
        })
        .unwrap_or_else(|| {
            panic!(
                "no evidence directory for step {hung}.0 in {}",
                out.display()
            )
        });
    let thresholds: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(evidence.join("thresholds.json")).expect("thresholds.json"),
    )
    .expect("JSON");
    assert_eq!(
        thresholds["progress_source"], "heartbeat",
        "{thresholds:#}\nn1:\n{n1}"
    );
    assert_eq!(thresholds["basis"], "learned", "{thresholds:#}");
    assert!(thresholds["hard_s"].as_f64() < Some(60.0), "{thresholds:#}");
}

#[test]
fn a_job_that_opts_out_is_only_observed_a_job_with_its_own_hangwatch_is_left_to_it_and_a_restart_picks_up(
) {
    let py = python().expect("python3");
    let fs = require!(LoopExt4::new(64));
    let Some(cluster) = SlurmCluster::start_or_skip(3) else {
        return;
    };
    let work = tempfile::tempdir().expect("temporary directory");
    let out = work.path();
    let mut services: Vec<ChildGuard> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| service(&cluster, n, out))
        .collect();
    let rank = scripts().join("../python/rank.py");
    let log = fs.path().join("rank0.log");
    let port = hangwatch_testkit::free_tcp_port().expect("a free port");
    let job_dir = |name: &str| {
        let dir = out.join(name);
        std::fs::create_dir_all(&dir).expect("job directory");
        dir
    };
    // A: asks for observe; its rank 0 will block on the frozen filesystem.
    let observed = cluster.submit(
        &job_dir("observed"),
        &format!(
            "#!/bin/bash
export HANGWATCH_ACTION=observe MASTER_ADDR=127.0.0.1 MASTER_PORT={port}
\
             srun --ntasks=2 bash -c 'export RANK=$SLURM_PROCID WORLD_SIZE=2; exec {py} {rank} --step-time 0.1 \
             --log {log} --only-rank 0'\n",
            py = py.display(),
            rank = rank.display(),
            log = log.display(),
        ),
        &["--nodes=1", "--ntasks=2", "-w", "n1"],
    );
    // B: watched by its own hangwatch run.
    let own = cluster.submit(
        &job_dir("own"),
        &format!(
            "#!/bin/bash\nsrun --ntasks=1 {bin} run --quiet -- {py} -c 'import time; time.sleep(60)'\n",
            bin = env!("CARGO_BIN_EXE_hangwatch"),
            py = py.display(),
        ),
        &["--nodes=1", "--ntasks=1", "-w", "n2"],
    );
    // C: healthy, 40 s; its node's service is killed and started again meanwhile.
    let healthy = cluster.submit(
        &job_dir("healthy"),
        &format!(
            "#!/bin/bash\nsrun --ntasks=1 {py} -c 'import time\nfor i in range(40): print(i, flush=True); time.sleep(1)'\n",
            py = py.display()
        ),
        &["--nodes=1", "--ntasks=1", "-w", "n3"],
    );
    let logged = |node: &str, text: &str| service_log(out, node).contains(text);
    assert!(
        wait_until(Duration::from_secs(60), POLL, || logged(
            "n1",
            &format!("watching step {observed}.0")
        ) && logged(
            "n3",
            &format!("watching step {healthy}.0")
        ) && lines_in(&log) >= 3),
        "n1:\n{}\nn3:\n{}",
        service_log(out, "n1"),
        service_log(out, "n3")
    );
    assert!(
        wait_until(Duration::from_secs(60), POLL, || logged(
            "n2",
            &format!("step {own}.0 runs its own hangwatch")
        )),
        "n2 stands back from a job that runs its own hangwatch:\n{}",
        service_log(out, "n2")
    );
    assert!(!logged("n2", &format!("watching step {own}.0")));

    // The service on n3 is killed: its watcher leaves the job; a new service watches the step again.
    let n3 = services.pop().expect("n3's service");
    drop(n3);
    services.push(service(&cluster, "n3", out));
    assert!(
        wait_until(Duration::from_secs(30), POLL, || service_log(out, "n3")
            .matches(&format!("watching step {healthy}.0"))
            .count()
            == 2),
        "the restarted service picks the step up again:\n{}",
        service_log(out, "n3")
    );

    let frozen = require!(fs.freeze());
    let at_freeze = lines_in(&log);
    let state = |id: &str| SlurmCluster::field(&cluster.job(id), "JobState");
    assert!(
        wait_until(Duration::from_secs(60), POLL, || logged(
            "n1",
            "blocked in kernel: rank 0"
        )),
        "n1 names the hang of the observed job ({}):\n{}",
        logging_since(&log, at_freeze),
        service_log(out, "n1")
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        state(&observed).as_deref(),
        Some("RUNNING"),
        "a job that asked for observe is not ended:\n{}",
        service_log(out, "n1")
    );
    assert!(!logged("n1", "cancelled through Slurm"));
    drop(frozen);
    assert!(
        wait_until(Duration::from_secs(90), POLL, || state(&healthy).as_deref()
            == Some("COMPLETED")),
        "the healthy job: {}",
        cluster.job(&healthy)
    );
}

#[test]
fn the_shipped_systemd_unit_passes_systemd_analyze_verify() {
    let analyze = require!(installed(
        "/usr/bin/systemd-analyze",
        "apt-get install systemd"
    ));
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/hangwatch-node.service"),
    )
    .expect("the unit file");
    assert!(unit.contains("Type=notify") && unit.contains("WatchdogSec="));
    // Verified with the binary under test where the package would put /usr/bin/hangwatch.
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("hangwatch-node.service");
    std::fs::write(
        &path,
        unit.replace("/usr/bin/hangwatch", env!("CARGO_BIN_EXE_hangwatch")),
    )
    .expect("unit copy");
    let out = std::process::Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Puts back what was at a user's `/var/tmp/hangwatch-<uid>` before the test took the name, also on failure.
struct UsersRootGuard {
    path: std::path::PathBuf,
    kept: Option<std::path::PathBuf>,
}

impl UsersRootGuard {
    fn take(uid: u32) -> UsersRootGuard {
        let path = std::path::PathBuf::from(format!("/var/tmp/hangwatch-{uid}"));
        let kept = std::fs::symlink_metadata(&path).is_ok().then(|| {
            let aside = path.with_extension(format!("kept-{}", std::process::id()));
            std::fs::rename(&path, &aside).expect("move the user's evidence root aside");
            aside
        });
        UsersRootGuard { path, kept }
    }
}

impl Drop for UsersRootGuard {
    fn drop(&mut self) {
        // Only the symlink the test planted is removed (a directory there would be evidence: left alone).
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.file_type().is_symlink()) {
            let _ = std::fs::remove_file(&self.path);
        }
        if let Some(kept) = &self.kept {
            let _ = std::fs::rename(kept, &self.path);
        }
    }
}

/// The node service runs as root and acts on what it finds; a job can write anything into its own environment and
/// its own directories. A real unprivileged user (uid 1001) runs a job whose tasks `exec` themselves with uid
/// 1000's job id, another node's name (n2, where uid 1000's job runs), a `../` step id and a 127 KiB host list;
/// its rank 0 logs onto an ext4 that then freezes (rank 0 in D: a hang whose rank no signal ends, so the service
/// cancels the job and drains the node). The user swaps their `/var/tmp/hangwatch-1001` for a symlink to a
/// root-owned directory before the step ends. uid 1000's job keeps running, n2 is never drained nor asked for a
/// key, the attacker's own job is the one cancelled and their own node (n1) the one drained, the service says what
/// it did not believe, its memory stays small, and nothing in the root-owned directory changes owner.
#[test]
fn a_job_that_forges_another_jobs_identity_and_plants_a_symlink_turns_root_against_nobody() {
    // The system's: another user cannot run root's own Python (a pyenv under /root, say).
    let system_python = Path::new("/usr/bin/python3");
    let py = if system_python.exists() {
        system_python
    } else {
        python().expect("python3")
    };
    let fs = require!(LoopExt4::new(64));
    let Some(cluster) = SlurmCluster::start_or_skip(2) else {
        return;
    };
    let (victim_uid, attacker_uid) = (1000, 1001);
    let victim = common::slurm::user_with_uid(victim_uid);
    let attacker = common::slurm::user_with_uid(attacker_uid);
    let _users_root = UsersRootGuard::take(attacker_uid);
    let work = tempfile::tempdir().expect("temporary directory");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = work.path().join("services");
    std::fs::create_dir(&out).expect("services' directory");
    let jobs = |who: &str| {
        let dir = work.path().join(who);
        std::fs::create_dir(&dir).expect("job directory");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        dir
    };
    let (victim_out, attacker_out) = (jobs("victim"), jobs("attacker"));
    // The attacker's rank 0 logs there (theirs to write, like a scratch filesystem).
    std::fs::set_permissions(fs.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let log = fs.path().join("attack.log");
    let port = hangwatch_testkit::free_tcp_port().expect("a free port");
    // Without `..` in it: the service's log must show none but the forged step id's.
    let rank = std::fs::canonicalize(scripts().join("../python/rank.py")).expect("rank.py");
    // What root must never hand over: a root-owned directory with a file in it.
    let precious = work.path().join("precious");
    std::fs::create_dir(&precious).expect("precious dir");
    std::fs::write(precious.join("shadow"), "root's\n").expect("precious file");
    let mut services: Vec<ChildGuard> = ["n1", "n2"]
        .iter()
        .map(|n| service_at(&cluster, n, &out, Path::new("/dev/null"), None))
        .collect();
    let victim_job = cluster.submit_as(
        &victim,
        &victim_out,
        &format!(
            "#!/bin/bash\nsrun --ntasks=1 {py} -u -c 'import time\nfor i in range(600): print(i, flush=True); time.sleep(1)'\n",
            py = py.display()
        ),
        &["--nodes=1", "--ntasks=1", "-w", "n2"],
    );
    // The attacker's tasks rewrite every Slurm variable the service used to believe, then run as ranks.
    let attack = attacker_out.join("attack.py");
    std::fs::write(
        &attack,
        format!(
            "import os, sys\n\
             env = dict(os.environ, SLURM_JOB_ID='{victim_job}', SLURMD_NODENAME='n2',\n\
                        SLURM_STEP_ID='../../../tmp/hangwatch-escape',\n\
                        SLURM_STEP_NODELIST='n[' + '0' * (127 * 1024) + '-99999]',\n\
                        RANK=os.environ['SLURM_PROCID'], LOCAL_RANK=os.environ['SLURM_LOCALID'],\n\
                        WORLD_SIZE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT='{port}')\n\
             os.execve(sys.executable, [sys.executable, '{rank}', '--step-time', '0.1', '--log', '{log}',\n\
                                        '--only-rank', '0'], env)\n",
            rank = rank.display(),
            log = log.display(),
        ),
    )
    .expect("attack script");
    let attacker_job = cluster.submit_as(
        &attacker,
        &attacker_out,
        &format!(
            "#!/bin/bash\nsrun --ntasks=2 {py} {attack}\n",
            py = py.display(),
            attack = attack.display()
        ),
        &["--nodes=1", "--ntasks=2", "-w", "n1"],
    );
    // The attacker, as themselves, puts a symlink where root will hand over the evidence.
    let planted = std::process::Command::new("runuser")
        .args(["-u", &attacker, "--", "ln", "-s"])
        .arg(&precious)
        .arg(format!("/var/tmp/hangwatch-{attacker_uid}"))
        .status()
        .expect("runuser ln");
    assert!(planted.success(), "the attacker plants the symlink");
    let state = |id: &str| SlurmCluster::field(&cluster.job(id), "JobState");
    let logs = || {
        format!(
            "n1:\n{}\nn2:\n{}",
            service_log(&out, "n1"),
            service_log(&out, "n2")
        )
    };
    assert!(
        wait_until(Duration::from_secs(60), POLL, || service_log(&out, "n1")
            .contains(&format!(
                "watching step {attacker_job}.0 on n1 (uid {attacker_uid}"
            ))),
        "n1 watches the attacker's step as the attacker's, on n1: {}\n{}",
        cluster.job(&attacker_job),
        logs()
    );
    let n1 = service_log(&out, "n1");
    assert!(
        n1.contains(&format!("SLURM_JOB_ID={victim_job}")) && n1.contains("not believed"),
        "the service says what it did not believe:\n{n1}"
    );
    assert!(
        wait_until(Duration::from_secs(60), POLL, || lines_in(&log) >= 3),
        "the attacker's rank 0 never logged: {}\n{}",
        cluster.job(&attacker_job),
        logs()
    );
    let frozen = require!(fs.freeze());
    // 127 KiB of zeros in a host list: read as text, never expanded.
    let rss_kb = std::fs::read_to_string(format!("/proc/{}/status", services[0].pid()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .expect("the service's VmRSS");
    assert!(rss_kb < 50 * 1024, "n1's service holds {rss_kb} kB");
    assert!(
        wait_until(Duration::from_secs(90), POLL, || service_log(&out, "n1")
            .contains(&format!("job {attacker_job} cancelled through Slurm"))),
        "the attacker's own hung job is the one ended: {}\n{}",
        cluster.job(&attacker_job),
        logs()
    );
    assert!(
        wait_until(Duration::from_secs(30), POLL, || service_log(&out, "n1")
            .contains("node n1 drained: rank 0 could not be killed")),
        "the attacker's own node is the one drained, for its unkillable rank:\n{}",
        logs()
    );
    assert_eq!(
        state(&victim_job).as_deref(),
        Some("RUNNING"),
        "uid {victim_uid}'s job runs on: {}\n{}",
        cluster.job(&victim_job),
        logs()
    );
    let (n1, n2) = (service_log(&out, "n1"), service_log(&out, "n2"));
    assert!(!n1.contains(&format!("job {victim_job} cancelled")), "{n1}");
    assert!(
        !n2.contains(&format!("step {attacker_job}")),
        "n2 never took the attacker's step:\n{n2}"
    );
    assert!(
        !n1.contains("hosting its coordinator") && !n2.contains("gave") && !n1.contains("gave"),
        "no key left any service for a claimed node list:\n{}",
        logs()
    );
    // Only the line that quotes the disbelieved claim may show it.
    assert!(
        !n1.lines()
            .any(|l| l.contains("../") && !l.contains("not believed")),
        "no `../` reached a name the service made:\n{n1}"
    );
    assert!(
        wait_until(Duration::from_secs(30), POLL, || service_log(&out, "n1")
            .contains(&format!(
                "cannot hand step {attacker_job}.0's evidence to uid {attacker_uid}"
            ))),
        "the planted symlink is refused, the evidence kept root's:\n{}",
        logs()
    );
    for path in [precious.clone(), precious.join("shadow")] {
        let meta = std::fs::symlink_metadata(&path).expect("still there");
        assert_eq!(meta.uid(), 0, "{} keeps uid 0", path.display());
    }
    let node = |name: &str| {
        cluster
            .command("scontrol")
            .args(["show", "node", name, "-o"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    assert!(
        !node("n2").contains("DRAIN"),
        "n2 is not drained: {}",
        node("n2")
    );
    drop(frozen);
    assert!(
        !Path::new("/tmp/hangwatch-escape").exists(),
        "nothing was made where the forged step id pointed"
    );
    services.clear();
}
