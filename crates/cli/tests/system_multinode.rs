//! Multi-node system tests, as a cluster runs them: each node a network namespace with its own address and
//! hostname, the coordinator in one of its own, a real agent per node (`hangwatch run --coordinator`), real Python
//! ranks whose barrier crosses the nodes over TCP, and a really frozen loop-mounted ext4 under rank 0's log.
//! Everything is made and removed by the test (thaw, kill by pid, delete the namespaces), also when it fails.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use hangwatch_testkit::{
    free_tcp_port, python, require, wait_until, AlertReceiver, ChildGuard, LoopExt4, TestNetwork,
};
use nix::sys::signal::Signal;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_hangwatch");
const NODES: [&str; 3] = ["n1", "n2", "n3"];

/// A `hangwatch coordinator` in its own namespace, its stderr collected.
struct CoordinatorProc {
    guard: ChildGuard,
    lines: Arc<Mutex<Vec<String>>>,
}

impl CoordinatorProc {
    fn start(net: &TestNetwork, listen: &str, token: &Path, extra: &[&str]) -> CoordinatorProc {
        let mut cmd = net.command("coord", BIN);
        cmd.args([
            "coordinator",
            "--listen",
            listen,
            "--nnodes",
            "3",
            "--token-file",
        ])
        .arg(token)
        .arg("--json")
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut guard = ChildGuard::spawn(&mut cmd, "coordinator").expect("coordinator starts");
        let lines = Arc::new(Mutex::new(Vec::new()));
        if let Some(pipe) = guard.child_mut().stderr.take() {
            let into = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    lock(&into).push(line);
                }
            });
        }
        let c = CoordinatorProc { guard, lines };
        assert!(
            c.wait_for(Duration::from_secs(20), |t| t.contains("listening on")),
            "the coordinator did not start:\n{}",
            c.text()
        );
        c
    }

    fn text(&self) -> String {
        lock(&self.lines).join("\n")
    }

    fn wait_for(&self, timeout: Duration, wanted: impl Fn(&str) -> bool) -> bool {
        wait_until(timeout, POLL, || wanted(&self.text()))
    }

    fn kill(&mut self) {
        let _ = self.guard.signal(Signal::SIGKILL);
        self.guard.kill_and_reap(Duration::from_secs(5));
    }
}

/// The job: a namespace per node and one for the coordinator, a private token file, rank 0's log file.
struct Cluster {
    net: TestNetwork,
    token: PathBuf,
    _dir: tempfile::TempDir,
    coordinator: String,
    master_port: String,
}

impl Cluster {
    fn new(net: TestNetwork) -> Cluster {
        let dir = tempfile::tempdir().expect("temporary directory");
        let token = dir.path().join("token");
        std::fs::write(&token, "5f0c1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f\n")
            .expect("token");
        std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod 600");
        let port = free_tcp_port().expect("a free port");
        let coordinator = format!("{}:{port}", net.addr("coord"));
        Cluster {
            net,
            token,
            _dir: dir,
            coordinator,
            master_port: free_tcp_port().expect("a free port").to_string(),
        }
    }

    fn start_coordinator(&self) -> CoordinatorProc {
        self.start_coordinator_with(&[])
    }

    fn start_coordinator_with(&self, extra: &[&str]) -> CoordinatorProc {
        let listen = self.coordinator.clone();
        CoordinatorProc::start(&self.net, &listen, &self.token, extra)
    }

    /// The agent of node `i` (node rank `i`, one rank: global rank `i`).
    fn start_agent(&self, i: usize, flags: &[&str], job: &[String]) -> HangwatchRun {
        self.start_agent_with(self.net.command(NODES[i], BIN), i, flags, job)
    }

    /// [`Cluster::start_agent`] started through `cmd` (a wrapper that ends by exec-ing hangwatch).
    fn start_agent_with(
        &self,
        cmd: std::process::Command,
        i: usize,
        flags: &[&str],
        job: &[String],
    ) -> HangwatchRun {
        let node_rank = i.to_string();
        let master = self.net.addr(NODES[0]).to_string();
        let token = self.token.to_string_lossy().into_owned();
        let mut all = vec![
            "--coordinator",
            self.coordinator.as_str(),
            "--token-file",
            token.as_str(),
            "--nnodes",
            "3",
            "--node-rank",
            node_rank.as_str(),
            "--nproc",
            "1",
            "--master-addr",
            master.as_str(),
            "--master-port",
            self.master_port.as_str(),
            "--quiet",
        ];
        all.extend_from_slice(flags);
        HangwatchRun::start_in(cmd, &all, job)
    }

    fn start_agents(&self, flags: &[&str], job: &[String]) -> Vec<HangwatchRun> {
        (0..NODES.len())
            .map(|i| self.start_agent(i, flags, job))
            .collect()
    }
}

fn network() -> Result<TestNetwork, hangwatch_testkit::TestkitError> {
    let mut names = vec!["coord"];
    names.extend(NODES);
    TestNetwork::new("hwmn", &names)
}

/// Waits until every agent says it joined (`joined` or `rejoined`, as given).
fn wait_joined(agents: &[HangwatchRun], word: &str) {
    for (i, a) in agents.iter().enumerate() {
        assert!(
            wait_until(Duration::from_secs(30), POLL, || a
                .stderr_text()
                .contains(&format!("{word} the coordinator"))),
            "node {} never said `{word} the coordinator`:\n{}",
            NODES[i],
            a.stderr_text()
        );
    }
}

/// Every rank of the job took `steps` steps (rank 0's log has that many lines).
fn wait_steps(log: &Path, steps: usize, agents: &[HangwatchRun]) {
    assert!(
        wait_until(Duration::from_secs(60), POLL, || lines_in(log) >= steps),
        "rank 0 logged {} of {steps} steps; node 1 said:\n{}",
        lines_in(log),
        agents[0].stderr_text()
    );
}

/// The incident's job: rank 0 logs every step to `rank0.log` on `fs`; every rank meets the others in a barrier.
fn incident_job(py: &Path, fs: &LoopExt4) -> (PathBuf, String, Vec<String>) {
    let log = fs.path().join("rank0.log");
    let log_s = log.to_string_lossy().into_owned();
    let job = rank_job(
        py,
        &["--step-time", "0.1", "--log", &log_s, "--only-rank", "0"],
    );
    (log, log_s, job)
}

/// Once every agent joined and rank 0 took 3 steps: freezes `fs` under it, waits for every agent to exit (each
/// within `timeout`), and thaws.
fn freeze_and_finish(
    agents: &mut [HangwatchRun],
    log: &Path,
    fs: &LoopExt4,
    timeout: Duration,
) -> Vec<Finished> {
    wait_joined(agents, "joined");
    wait_steps(log, 3, agents);
    for a in agents.iter_mut() {
        a.track_descendants();
    }
    let frozen = fs.freeze().expect("freeze");
    let done: Vec<Finished> = agents.iter_mut().map(|a| a.finish(timeout)).collect();
    drop(frozen);
    done
}

fn said(agent: &HangwatchRun, timeout: Duration, text: &str) -> bool {
    wait_until(timeout, POLL, || agent.stderr_text().contains(text))
}

fn ranks_on(json: &Value, node: &str) -> Vec<u32> {
    json["ranks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["node"] == node)
        .filter_map(|r| u32::try_from(r["pid"].as_u64()?).ok())
        .collect()
}

#[test]
fn the_incident_across_three_nodes_every_node_names_rank_0_on_n1_in_write_and_exits_75() {
    let py = require!(python());
    let net = require!(network());
    let fs = require!(LoopExt4::new(64));
    let cluster = Cluster::new(net);
    let (log, log_s, job) = incident_job(py, &fs);
    let mut coordinator = cluster.start_coordinator();
    let mut agents = cluster.start_agents(&["--stall-after", STALL_AFTER], &job);
    wait_joined(&agents, "joined");
    assert!(
        coordinator.wait_for(Duration::from_secs(10), |t| NODES
            .iter()
            .all(|n| t.contains(&format!("node {n} joined")))),
        "{}",
        coordinator.text()
    );
    wait_steps(&log, 3, &agents);
    for a in agents.iter_mut() {
        a.track_descendants();
    }
    let frozen = require!(fs.freeze());
    let frozen_at = Instant::now();

    let done: Vec<_> = agents
        .iter_mut()
        .map(|a| a.finish(STALL + Duration::from_secs(30)))
        .collect();
    eprintln!(
        "freeze -> last agent exit: {:.2}s (stall-after {STALL_AFTER}, grace 2s)",
        frozen_at.elapsed().as_secs_f64()
    );
    for (i, d) in done.iter().enumerate() {
        let node = NODES[i];
        d.assert_code(75);
        let v = &d.json;
        assert_eq!(v["kind"], "blocked_in_kernel", "{node}: {}", d.describe());
        let c = d.culprit(0);
        assert_eq!(c["node"], "n1", "{node}: {}", d.describe());
        assert_eq!(c["state"], "D");
        assert_eq!(c["syscall"], "write");
        assert_eq!(c["path"], log_s.as_str());
        assert_eq!(c["mount"], fs.path().to_str().unwrap());
        assert_eq!(c["fstype"], "ext4");
        // Every node probed the mount: it does not answer from n2 and n3 either, where no rank is stuck.
        assert_eq!(v["scope"], "filesystem", "{node}: {}", d.describe());
        let evidence = v["scope_evidence"].to_string();
        assert!(
            evidence.contains("does not answer from n2, n3, where no rank is stuck"),
            "{node}: {evidence}"
        );
        assert!(
            v["summary"]
                .as_str()
                .is_some_and(|s| s.starts_with("storage incident: ")
                    && s.contains("(ext4) does not respond from n1, n2, n3")),
            "{node}: {}",
            v["summary"]
        );
        // The same story on every node's stderr, also where nothing is wrong.
        assert!(
            d.stderr
                .contains("the coordinator ends the job: blocked in kernel: storage incident: ")
                && d.stderr.contains("in write() on"),
            "{node}: {}",
            d.describe()
        );
        // Every node's evidence holds the job-wide verdict and this node's own observations.
        let saved: Value = serde_json::from_str(
            &std::fs::read_to_string(d.report_dir.join("verdict.json")).expect("verdict.json"),
        )
        .expect("verdict.json is JSON");
        assert_eq!(saved["culprits"][0]["node"], "n1", "{node}");
        let ranks_json =
            std::fs::read_to_string(d.report_dir.join("ranks.json")).unwrap_or_default();
        assert!(
            ranks_json.contains("rank.py"),
            "{node}: its own observations in ranks.json: {ranks_json}"
        );
        // This node's ranks are gone (rank 0, in D, dies at the thaw).
        let mine = ranks_on(v, node);
        assert_eq!(mine.len(), 1, "{node}: {}", d.describe());
        if node != "n1" {
            assert_all_dead(mine, &format!("the ranks of {node}"));
        }
    }
    assert!(
        coordinator.wait_for(Duration::from_secs(15), |t| t
            .contains("every node has left")),
        "{}",
        coordinator.text()
    );
    // The coordinator keeps the verdict on its own node-local disk.
    let kept = coordinator
        .text()
        .lines()
        .find_map(|l| l.split("verdict kept in ").nth(1).map(PathBuf::from))
        .unwrap_or_else(|| panic!("no verdict kept:\n{}", coordinator.text()));
    let kept: Value = serde_json::from_str(
        &std::fs::read_to_string(kept.join("verdict.json"))
            .expect("the coordinator's verdict.json"),
    )
    .expect("JSON");
    assert_eq!(kept["culprits"][0]["node"], "n1");
    assert_eq!(
        kept["ranks"].as_array().map(Vec::len),
        Some(3),
        "the coordinator's copy has every rank"
    );
    assert_eq!(
        coordinator.guard.try_wait().and_then(|s| s.code()),
        Some(75),
        "the coordinator exits 75 when it ended a hung job:\n{}",
        coordinator.text()
    );
    drop(frozen);
    let rank0 = ranks_on(&done[0].json, "n1");
    assert_all_dead(rank0, "rank 0 after the thaw");
    coordinator.kill();
}

#[test]
fn a_mount_that_only_the_culprits_node_has_and_that_stops_is_that_nodes_fault() {
    let py = require!(python());
    let net = require!(network());
    let fs = require!(LoopExt4::new(64));
    let cluster = Cluster::new(net);
    let (log, _, job) = incident_job(py, &fs);
    let mount = fs.path().to_string_lossy().into_owned();
    let _coordinator = cluster.start_coordinator();
    let flags = ["--stall-after", STALL_AFTER];
    // n2 and n3 have something else at the same path (a tmpfs of their own, in a mount namespace of their own):
    // the frozen ext4 is n1's alone.
    let mut agents = vec![cluster.start_agent(0, &flags, &job)];
    for (i, node) in NODES.iter().enumerate().skip(1) {
        let mut cmd = cluster.net.command(node, "unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            r#"mount -t tmpfs hw-node-local "$HW_LOCAL" && exec "$0" "$@""#,
            BIN,
        ])
        .env("HW_LOCAL", &mount);
        agents.push(cluster.start_agent_with(cmd, i, &flags, &job));
    }
    let done = freeze_and_finish(&mut agents, &log, &fs, STALL + Duration::from_secs(30));
    for (i, d) in done.iter().enumerate() {
        d.assert_code(75);
        let v = &d.json;
        assert_eq!(d.culprit(0)["node"], "n1", "{}: {}", NODES[i], d.describe());
        assert_eq!(v["scope"], "node", "{}: {}", NODES[i], d.describe());
        assert!(
            v["scope_evidence"]
                .to_string()
                .contains("answers from n2, n3 but not from n1"),
            "{}: {}",
            NODES[i],
            v["scope_evidence"]
        );
    }
}

#[test]
fn at_the_default_settings_the_coordinator_ends_the_incident_across_three_nodes_within_seconds() {
    let py = require!(python());
    let net = require!(network());
    let fs = require!(LoopExt4::new(64));
    let cluster = Cluster::new(net);
    let (log, log_s, job) = incident_job(py, &fs);
    let coordinator = cluster.start_coordinator();
    // No --stall-after: the node holding rank 0 reports its fast path, and the coordinator confirms it.
    let mut agents = cluster.start_agents(&[], &job);
    wait_joined(&agents, "joined");
    wait_steps(&log, 3, &agents);
    for a in agents.iter_mut() {
        a.track_descendants();
    }
    let frozen = require!(fs.freeze());
    let frozen_at = Instant::now();
    let done: Vec<_> = agents
        .iter_mut()
        .map(|a| a.finish(Duration::from_secs(90)))
        .collect();
    let took = frozen_at.elapsed();
    eprintln!(
        "defaults, 3 nodes: freeze -> last agent exit {:.1}s",
        took.as_secs_f64()
    );
    drop(frozen);
    for (i, d) in done.iter().enumerate() {
        d.assert_code(75);
        let c = d.culprit(0);
        assert_eq!(c["node"], "n1", "{}: {}", NODES[i], d.describe());
        assert_eq!(c["path"], log_s.as_str());
    }
    assert!(took < Duration::from_secs(45), "took {took:?}");
    assert!(
        coordinator
            .text()
            .contains("a rank stopped or in a filesystem wait"),
        "{}",
        coordinator.text()
    );
}

#[test]
fn the_coordinator_alerts_once_for_the_job_although_every_node_was_given_the_webhook() {
    let py = require!(python());
    let net = require!(network());
    let fs = require!(LoopExt4::new(64));
    let cluster = Cluster::new(net);
    // The receiver lives in the coordinator's namespace, on its address: every node reaches it.
    let host = cluster.net.addr("coord").to_string();
    let receiver = require!(AlertReceiver::http_via(
        cluster.net.command("coord", py),
        &host
    ));
    let webhook = format!("{}/hook", receiver.base_url());
    let (log, _, job) = incident_job(py, &fs);
    let coordinator =
        cluster.start_coordinator_with(&["--webhook", &webhook, "--job-id", "job-4242"]);
    let flags = [
        "--stall-after",
        STALL_AFTER,
        "--webhook",
        webhook.as_str(),
        "--job-id",
        "job-4242",
    ];
    let mut agents = cluster.start_agents(&flags, &job);
    let done = freeze_and_finish(&mut agents, &log, &fs, STALL + Duration::from_secs(40));
    for d in &done {
        d.assert_code(75);
    }
    let stage = |r: &Value| {
        r["body"]["hangwatch"]["stage"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let both = receiver.wait_for(2, Duration::from_secs(20), |r| r["path"] == "/hook");
    // Give a duplicate from an agent time to arrive: there must be none.
    std::thread::sleep(Duration::from_secs(2));
    let all = receiver.requests();
    assert_eq!(all.len(), 2, "{all:#?}\n{}", coordinator.text());
    assert_eq!(both.len(), 2);
    let suspected = all
        .iter()
        .find(|r| stage(r) == "suspected")
        .expect("a suspected alert");
    let acted = all
        .iter()
        .find(|r| stage(r) == "acted")
        .expect("an acted alert");
    let text = suspected["body"]["text"].as_str().unwrap();
    assert!(
        text.starts_with(
            "hangwatch: job job-4242 looks hung — blocked in kernel: storage incident: "
        ) && text.contains("; rank 0 (node n1")
            && text.contains(". Scope: filesystem ("),
        "{text}"
    );
    let acted_text = acted["body"]["text"].as_str().unwrap();
    assert!(
        acted_text.contains("Done: terminate (ok: ordered every node to end its ranks"),
        "{acted_text}"
    );
}

#[test]
fn a_killed_agent_is_named_unreachable_within_seconds_and_its_stalled_peers_end_with_node_unreachable(
) {
    let py = require!(python());
    let net = require!(network());
    let cluster = Cluster::new(net);
    let job = rank_job(py, &["--step-time", "0.1"]);
    let mut coordinator = cluster.start_coordinator();
    let mut agents = cluster.start_agents(&["--stall-after", "6s"], &job);
    wait_joined(&agents, "joined");
    // A few steps together first (a rank that fails to start would end its node by itself).
    std::thread::sleep(Duration::from_secs(3));
    for (i, a) in agents.iter_mut().enumerate() {
        assert!(a.running(), "{} ended early: {}", NODES[i], a.stderr_text());
    }
    for a in agents.iter_mut() {
        a.track_descendants();
    }
    let killed = agents.pop().expect("n3's agent");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(killed.pid() as i32),
        Signal::SIGKILL,
    );
    let killed_at = Instant::now();
    assert!(
        coordinator.wait_for(Duration::from_secs(15), |t| t
            .contains("node_unreachable: n3")),
        "n3 was not named unreachable:\n{}",
        coordinator.text()
    );
    let named_after = killed_at.elapsed();
    eprintln!(
        "kill -9 of n3's agent -> named unreachable: {:.2}s",
        named_after.as_secs_f64()
    );
    assert!(
        named_after < Duration::from_secs(12),
        "named only after {named_after:?}"
    );
    // Rank 2 died with its agent; ranks 0 and 1 wait for it in the barrier: the job is ended, and says why.
    for (i, a) in agents.iter_mut().enumerate() {
        let d = a.finish(Duration::from_secs(40));
        d.assert_code(75);
        assert_eq!(
            d.json["kind"],
            "node_unreachable",
            "{}: {}",
            NODES[i],
            d.describe()
        );
        assert!(
            d.json["nodes_not_seen"]
                .as_array()
                .is_some_and(|n| n.iter().any(|x| x == "n3")),
            "{}",
            d.describe()
        );
    }
    drop(killed);
    coordinator.kill();
}

#[test]
fn a_rank_that_exits_on_one_node_is_named_exited_by_the_nodes_left_waiting() {
    let py = require!(python());
    let net = require!(network());
    let cluster = Cluster::new(net);
    let job = rank_job(
        py,
        &[
            "--step-time",
            "0.05",
            "--behaviour",
            "exit",
            "--after",
            "10",
            "--only-rank",
            "2",
        ],
    );
    let coordinator = cluster.start_coordinator();
    let mut agents = cluster.start_agents(&["--stall-after", STALL_AFTER], &job);
    let done: Vec<_> = agents
        .iter_mut()
        .map(|a| a.finish(STALL + Duration::from_secs(40)))
        .collect();
    // n3's job ended by itself with its rank's code; it said so when it left, and was not called unreachable.
    done[2].assert_code(3);
    for (i, d) in done.iter().enumerate().take(2) {
        d.assert_code(75);
        assert_eq!(d.json["kind"], "exited", "{}: {}", NODES[i], d.describe());
        let c = d.culprit(2);
        assert_eq!(c["node"], "n3", "{}", d.describe());
    }
    assert!(
        coordinator.wait_for(Duration::from_secs(10), |t| t
            .contains("node n3 left (its agent exits 3)")),
        "{}",
        coordinator.text()
    );
    assert!(
        !coordinator.text().contains("node_unreachable: n3"),
        "a node that left is not unreachable:\n{}",
        coordinator.text()
    );
}

#[test]
fn node_rank_0_hosts_the_coordinator_and_it_still_decides_when_its_own_node_holds_the_stuck_rank() {
    let py = require!(python());
    let net = require!(network());
    let fs = require!(LoopExt4::new(64));
    let cluster = Cluster::new(net);
    let (log, _, job) = incident_job(py, &fs);
    // No coordinator of its own: n1 (node rank 0, rank 0's node) hosts it at MASTER_ADDR:MASTER_PORT+1.
    let token = cluster.token.to_string_lossy().into_owned();
    let master = cluster.net.addr(NODES[0]).to_string();
    let mut agents: Vec<HangwatchRun> = (0..NODES.len())
        .map(|i| {
            let node_rank = i.to_string();
            HangwatchRun::start_in(
                cluster.net.command(NODES[i], BIN),
                &[
                    "--host-coordinator",
                    "--token-file",
                    &token,
                    "--nnodes",
                    "3",
                    "--node-rank",
                    &node_rank,
                    "--nproc",
                    "1",
                    "--master-addr",
                    &master,
                    "--master-port",
                    &cluster.master_port,
                    "--stall-after",
                    STALL_AFTER,
                    "--quiet",
                ],
                &job,
            )
        })
        .collect();
    wait_joined(&agents, "joined");
    assert!(
        said(&agents[0], Duration::from_secs(5), "hosted by this agent"),
        "{}",
        agents[0].stderr_text()
    );
    wait_steps(&log, 3, &agents);
    for a in agents.iter_mut() {
        a.track_descendants();
    }
    let frozen = require!(fs.freeze());
    let done: Vec<_> = agents
        .iter_mut()
        .map(|a| a.finish(STALL + Duration::from_secs(40)))
        .collect();
    for (i, d) in done.iter().enumerate() {
        d.assert_code(75);
        let c = d.culprit(0);
        assert_eq!(c["node"], "n1", "{}: {}", NODES[i], d.describe());
        assert_eq!(c["state"], "D");
        assert_eq!(c["syscall"], "write");
        assert!(
            d.stderr.contains("the coordinator ends the job"),
            "{}: decided by the hosted coordinator: {}",
            NODES[i],
            d.describe()
        );
    }
    drop(frozen);
}

#[test]
fn a_cut_link_is_named_unreachable_and_the_job_goes_on_when_it_heals() {
    let py = require!(python());
    let net = require!(network());
    let cluster = Cluster::new(net);
    let job = rank_job(py, &["--step-time", "0.05"]);
    let mut coordinator = cluster.start_coordinator();
    // A long threshold: the cut stalls the barrier for a few seconds, which is not a hang.
    let mut agents = cluster.start_agents(&["--stall-after", "60s"], &job);
    wait_joined(&agents, "joined");
    cluster.net.link_down("n2").expect("link down");
    assert!(
        coordinator.wait_for(Duration::from_secs(15), |t| t
            .contains("node_unreachable: n2")),
        "n2 was not named unreachable:\n{}",
        coordinator.text()
    );
    cluster.net.link_up("n2").expect("link up");
    assert!(
        coordinator.wait_for(Duration::from_secs(30), |t| t
            .contains("n2 heard from again")),
        "n2 did not come back:\n{}",
        coordinator.text()
    );
    std::thread::sleep(Duration::from_secs(2));
    for (i, a) in agents.iter_mut().enumerate() {
        assert!(a.running(), "{} ended: {}", NODES[i], a.stderr_text());
    }
    assert!(
        !coordinator.text().contains("ending the job"),
        "a healthy job was ended:\n{}",
        coordinator.text()
    );
    coordinator.kill();
}

#[test]
fn without_its_coordinator_every_node_carries_on_rejoins_a_restarted_one_and_still_catches_a_local_hang(
) {
    let py = require!(python());
    let net = require!(network());
    let fs = require!(LoopExt4::new(64));
    let cluster = Cluster::new(net);
    let (log, log_s, job) = incident_job(py, &fs);
    let mut coordinator = cluster.start_coordinator();
    let mut agents = cluster.start_agents(&["--stall-after", STALL_AFTER], &job);
    wait_joined(&agents, "joined");
    coordinator.kill();
    for a in &agents {
        assert!(
            said(a, Duration::from_secs(30), "lost the coordinator"),
            "{}",
            a.stderr_text()
        );
    }
    // Healthy without it: steps go on, nobody is ended.
    let before = lines_in(&log);
    wait_steps(&log, before + 10, &agents);
    for (i, a) in agents.iter_mut().enumerate() {
        assert!(
            a.running(),
            "{} ended without its coordinator: {}",
            NODES[i],
            a.stderr_text()
        );
    }
    // A restarted coordinator gets every node back.
    let mut coordinator = cluster.start_coordinator();
    wait_joined(&agents, "rejoined");
    assert!(
        coordinator.wait_for(Duration::from_secs(10), |t| NODES
            .iter()
            .all(|n| t.contains(&format!("node {n} joined")))),
        "{}",
        coordinator.text()
    );
    // Gone again, and now the filesystem freezes: each node decides alone, and rank 0's node names the cause.
    coordinator.kill();
    for a in agents.iter_mut() {
        a.track_descendants();
    }
    let frozen = require!(fs.freeze());
    let done: Vec<_> = agents
        .iter_mut()
        .map(|a| a.finish(STALL + Duration::from_secs(30)))
        .collect();
    for d in &done {
        d.assert_code(75);
    }
    let c = done[0].culprit(0);
    assert_eq!(c["state"], "D", "{}", done[0].describe());
    assert_eq!(c["syscall"], "write");
    assert_eq!(c["path"], log_s.as_str());
    drop(frozen);
}

#[test]
fn an_agent_with_the_wrong_token_is_refused_says_so_and_changes_nothing() {
    let py = require!(python());
    let net = require!(network());
    let cluster = Cluster::new(net);
    let coordinator = cluster.start_coordinator();
    let dir = tempfile::tempdir().expect("temporary directory");
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "e3a95c18f07b42d6a1c8e05f9b372d4c6e81a0f57c3b9d24\n").expect("token");
    std::fs::set_permissions(&wrong, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod 600");
    let wrong_s = wrong.to_string_lossy().into_owned();
    let master = cluster.net.addr(NODES[0]).to_string();
    let job = rank_job(py, &["--step-time", "0.05", "--steps", "20"]);
    let mut intruder = HangwatchRun::start_in(
        cluster.net.command("n1", BIN),
        &[
            "--coordinator",
            &cluster.coordinator,
            "--token-file",
            &wrong_s,
            "--nproc",
            "1",
            "--master-addr",
            &master,
            "--quiet",
        ],
        &job,
    );
    assert!(
        wait_until(Duration::from_secs(30), POLL, || intruder
            .stderr_text()
            .contains("did not prove that it holds this job's key")),
        "{}",
        intruder.stderr_text()
    );
    // The job itself runs to its end on its own.
    let d = intruder.finish(Duration::from_secs(60));
    d.assert_code(0);
    assert!(
        !coordinator.text().contains("node n1 joined"),
        "{}",
        coordinator.text()
    );
    assert!(
        coordinator
            .text()
            .contains("refused connections that did not prove the job's key"),
        "the refusal is logged by the coordinator:\n{}",
        coordinator.text()
    );
}

#[test]
fn a_second_agent_under_a_taken_node_name_is_refused_with_what_to_fix() {
    let py = require!(python());
    let net = require!(network());
    let cluster = Cluster::new(net);
    let coordinator = cluster.start_coordinator();
    let job = rank_job(py, &["--step-time", "0.05"]);
    let first = cluster.start_agent(0, &["--stall-after", "60s"], &job);
    wait_joined(std::slice::from_ref(&first), "joined");
    // Node n2 calls itself n1 (two nodes sharing a hostname): refused, and its own job still runs.
    let mut second = cluster.start_agent(1, &["--stall-after", "60s", "--node-name", "n1"], &job);
    assert!(
        said(
            &second,
            Duration::from_secs(30),
            "refused this node: node n1 is already registered"
        ),
        "{}",
        second.stderr_text()
    );
    assert!(second.running(), "{}", second.stderr_text());
    assert!(
        !coordinator.text().contains("node n1 joined (node rank 1"),
        "{}",
        coordinator.text()
    );
}
