//! One coordinator and 128 or 1,250 fake agents (8 ranks each) on loopback: every agent registers, attaches and
//! reports progress at 1 Hz; then one roll call with recorded observations of the incident (rank 0 on n1 in D in
//! write() on an unresponsive /gpfs, everyone else in a barrier). Prints the time from the order to the merged
//! verdict, the coordinator's CPU at 1 Hz progress and its memory, and the bytes per report.
//!
//! The coordinator runs in a child process (this binary again) so that its CPU and memory are its own, not the
//! fake agents'. Run with `cargo bench -p hangwatch-coordinator --bench coordinator`; `HANGWATCH_BENCH_NODES=1250`
//! runs one size, `HANGWATCH_BENCH_WRAP=heaptrack` runs the coordinator under a memory profiler.

// Shared with the component tests, which use more of it than the benchmark does.
#[allow(dead_code)]
#[path = "../tests/common/fixtures.rs"]
mod fixtures;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hangwatch_coordinator::{Config, Coordinator};
use hangwatch_model::{NodeObservations, PythonFrame, ThreadObservation};
use hangwatch_rpc::pb::{self, order};
use hangwatch_rpc::{
    connect, encode_observations, with_deadline, JobSecret, JobToken, PROTOCOL_VERSION,
    REGISTER_DEADLINE,
};
use prost::Message;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

const RANKS_PER_NODE: u32 = 8;
/// A PyTorch rank has a few dozen threads and a deep Python stack.
const THREADS_PER_RANK: usize = 24;
const FRAMES: usize = 25;
const TOKEN: &str = "b7e2c95a01d4f83e6a2c0b9d57f1e428";
const ROLE: &str = "HANGWATCH_BENCH_COORDINATOR";
/// Every wait of the benchmark ends.
const LIMIT: Duration = Duration::from_secs(120);

fn main() {
    if let Ok(nodes) = std::env::var(ROLE) {
        coordinator(nodes.parse().expect("node count"));
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    println!("coordinator with fake agents on loopback, {RANKS_PER_NODE} ranks/node, {THREADS_PER_RANK} threads/rank, progress at 1 Hz");
    // HANGWATCH_BENCH_NODES=1250 runs one size only (e.g. under a memory profiler).
    let sizes: Vec<u32> = match std::env::var("HANGWATCH_BENCH_NODES") {
        Ok(n) => vec![n.parse().expect("HANGWATCH_BENCH_NODES: a node count")],
        Err(_) => vec![128, 1250],
    };
    for nodes in sizes {
        agents(nodes);
    }
}

/// A node's observations grown to a real rank's size.
fn observations(node_rank: u32) -> NodeObservations {
    let mut obs = fixtures::incident_node(node_rank, RANKS_PER_NODE);
    for r in &mut obs.ranks {
        let template: ThreadObservation = r.threads[0].clone();
        let mut futex = template.clone();
        futex.state = 'S';
        futex.wchan = Some("futex_wait_queue".into());
        for i in 1..THREADS_PER_RANK {
            let mut t = futex.clone();
            t.tid = template.tid + i as i32;
            r.threads.push(t);
        }
        if let Some(py) = r.python.as_mut() {
            for depth in py[0].frames.len()..FRAMES {
                py[0].frames.push(PythonFrame {
                    function: format!("forward_{depth}").into(),
                    filename: "/opt/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py".into(),
                    line: 100,
                });
            }
        }
    }
    obs
}

/// The child: serves, waits for every node, measures 1 Hz progress, then one roll call.
fn coordinator(nodes: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut config = Config::new(secret());
        config.expected_nodes = Some(nodes);
        config.silence = Duration::from_secs(10);
        let c = Coordinator::new(config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!("LISTEN {}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(c.clone().serve(listener, std::future::pending()));
        let end = Instant::now() + LIMIT;
        while c.members().len() < nodes && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("REGISTERED {}", c.members().len());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (cpu0, t0) = (cpu_s(), Instant::now());
        tokio::time::sleep(Duration::from_secs(5)).await;
        let cpu = (cpu_s() - cpu0) / t0.elapsed().as_secs_f64();
        println!("PROGRESS_CPU {:.1}%", cpu * 100.0);
        println!("RSS_IDLE {}", rss_kib("VmRSS"));
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..3 {
            let t = Instant::now();
            let outcome = c.roll_call(Duration::from_secs(30)).await;
            times.push(t.elapsed());
            last = Some(outcome.verdict.clone());
            let v = &outcome.verdict;
            let culprit = v.culprits.first().map(|c| (c.rank, c.node.clone()));
            println!(
                "ROLLCALL {:.0} ms answered {} not_answered {} kind {:?} culprit {:?}",
                t.elapsed().as_secs_f64() * 1000.0,
                outcome.answered.len(),
                outcome.not_answered.len(),
                v.kind,
                culprit
            );
        }
        times.sort();
        println!("ROLLCALL_MEDIAN {:.0} ms", times[1].as_secs_f64() * 1000.0);
        println!("RSS_PEAK_BEFORE_TERMINATE {}", rss_kib("VmHWM"));
        if let Some(verdict) = last {
            let full = serde_json::to_vec(&verdict).map_or(0, |b| b.len());
            let one = serde_json::to_vec(&hangwatch_coordinator::verdict_for_node(&verdict, "n7"))
                .map_or(0, |b| b.len());
            let t = Instant::now();
            let ordered = c.terminate("bench", Some(&verdict)).len();
            println!(
                "TERMINATE {:.0} ms to {ordered} nodes; verdict {full} bytes whole, {one} bytes as one node gets it",
                t.elapsed().as_secs_f64() * 1000.0
            );
        }
        println!("RSS_PEAK {}", rss_kib("VmHWM"));
        server.abort();
    });
}

fn cpu_s() -> f64 {
    let u =
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).expect("rusage");
    let s = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    s(u.user_time()) + s(u.system_time())
}

fn rss_kib(field: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .map(|l| l[field.len() + 1..].trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The parent: starts the coordinator child, then `nodes` fake agents, and relays what the child measured.
fn agents(nodes: u32) {
    let exe = std::env::current_exe().expect("exe");
    // HANGWATCH_BENCH_WRAP=heaptrack runs the coordinator under that program.
    let mut command = match std::env::var("HANGWATCH_BENCH_WRAP") {
        Ok(wrap) => {
            let mut c = Command::new(wrap);
            c.arg(exe);
            c
        }
        Err(_) => Command::new(exe),
    };
    let mut child = Kill(
        command
            .env(ROLE, nodes.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("coordinator child"),
    );
    let mut lines = BufReader::new(child.0.stdout.take().expect("stdout")).lines();
    // A wrapper may print lines of its own first.
    let first = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("LISTEN "))
        .unwrap_or_default();
    let addr = first
        .strip_prefix("LISTEN ")
        .expect("the child says where it listens")
        .to_string();
    // As a real agent sends them: idle threads folded (its own bundle keeps them all).
    let payloads: Vec<Vec<u8>> = (0..nodes)
        .map(|n| {
            let mut obs = observations(n);
            hangwatch_diagnosis::answer::fold_idle_threads(&mut obs);
            encode_observations(&obs)
        })
        .collect();
    let report_bytes = payloads[1].len();
    let progress = pb::ProgressReport {
        session_id: "f".repeat(32),
        ranks: (0..RANKS_PER_NODE)
            .map(|rank| pb::RankProgress {
                rank,
                step: Some(123_456),
                last_progress_age_ms: 850,
            })
            .collect(),
        ..pb::ProgressReport::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    let handles: Vec<_> = payloads
        .into_iter()
        .enumerate()
        .map(|(n, payload)| rt.spawn(agent(addr.clone(), n as u32, payload)))
        .collect();
    let mut out = String::new();
    for line in lines.map_while(Result::ok) {
        if line.starts_with("REGISTERED") {
            out.push_str(&format!(
                "  {line} in {:.1} s\n",
                started.elapsed().as_secs_f64()
            ));
        } else {
            out.push_str(&format!("  {line}\n"));
        }
        if line.starts_with("RSS_PEAK ") {
            break;
        }
    }
    for h in handles {
        h.abort();
    }
    drop(rt);
    println!("{nodes} nodes x {RANKS_PER_NODE} ranks: roll-call answer {report_bytes} bytes/node (JSON observations), progress report {} bytes/node/s", progress.encoded_len());
    print!("{out}");
}

fn secret() -> JobSecret {
    JobSecret::new(JobToken::new(TOKEN).expect("token"), "bench").expect("link key")
}

async fn agent(addr: String, node_rank: u32, payload: Vec<u8>) {
    // As a real agent does: a connection closed by the coordinator's cap on handshakes in flight (every bench
    // agent dials from 127.0.0.1) is tried again shortly.
    let secret = secret();
    let end = Instant::now() + LIMIT;
    let mut client = loop {
        match connect(&addr, &secret, LIMIT).await {
            Ok(c) => break c,
            Err(_) if Instant::now() < end => {
                tokio::time::sleep(Duration::from_millis(50 + u64::from(node_rank % 50))).await;
            }
            Err(_) => return,
        }
    };
    let ranks: Vec<u32> = (node_rank * RANKS_PER_NODE..(node_rank + 1) * RANKS_PER_NODE).collect();
    let req = pb::RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        job_id: "bench".into(),
        node: fixtures::node_name(node_rank),
        node_rank,
        ranks: ranks.clone(),
    };
    let Ok(reply) = client
        .register(with_deadline(req, REGISTER_DEADLINE * 6))
        .await
    else {
        return;
    };
    let session_id = reply.into_inner().session_id;
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    let sid = session_id.clone();
    let report = move || pb::ProgressReport {
        session_id: sid.clone(),
        ranks: ranks
            .iter()
            .map(|&rank| pb::RankProgress {
                rank,
                step: Some(123_456),
                last_progress_age_ms: 850,
            })
            .collect(),
        ..pb::ProgressReport::default()
    };
    let _ = tx.send(report()).await;
    let Ok(orders) = client.attach(ReceiverStream::new(rx)).await else {
        return;
    };
    let mut orders = orders.into_inner();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            if tx.send(report()).await.is_err() {
                break;
            }
        }
    });
    while let Some(Ok(o)) = orders.next().await {
        if let Some(order::Kind::RollCall(rc)) = o.kind {
            let msg = pb::RollCallReport {
                session_id: session_id.clone(),
                roll_call_id: rc.roll_call_id,
                observations_json: payload.clone(),
            };
            let _ = client
                .report_roll_call(with_deadline(
                    msg,
                    Duration::from_millis(rc.deadline_ms.into()),
                ))
                .await;
        }
    }
}
