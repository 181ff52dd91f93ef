//! System tests of the link against strangers. A squatter holds the port a hosted coordinator would take (it is
//! derived from the job): node rank 0 says it cannot host and decides alone; node 1 finds that the listener cannot
//! prove the job's key, says so and decides alone; both jobs run to their end, and the squatter learns nothing.
//! Strangers hold 2,000 idle connections to the hosted coordinator and 2,000 to `/metrics`: a deadlock is still
//! decided and ended in time.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use hangwatch_testkit::{python, require};

const TOKEN: &str = "4b8d1e6f2a9c05e7d3b1f8a64c2e9d70";

fn private_token(dir: &std::path::Path) -> String {
    let token = dir.join("token");
    std::fs::write(&token, TOKEN).expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    token.to_string_lossy().into_owned()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn raise_open_file_limit(want: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < want {
        setrlimit(Resource::RLIMIT_NOFILE, want.min(hard), hard).expect("setrlimit");
    }
}

/// Connections that say nothing, as a stranger (or a broken client) holds them. Under the flood the kernel may
/// refuse some (the listener's backlog): the stranger's problem; the count is returned.
fn idle_connections(addr: &str, n: usize) -> Vec<std::net::TcpStream> {
    (0..n)
        .filter_map(|_| std::net::TcpStream::connect(addr).ok())
        .collect()
}

#[test]
fn a_deadlock_is_decided_and_ended_while_strangers_hold_two_thousand_idle_connections_to_the_coordinator_and_to_metrics(
) {
    let py = require!(python());
    raise_open_file_limit(8192);
    let dir = tempfile::tempdir().expect("dir");
    let token = private_token(dir.path());
    let master_port = free_port();
    let coordinator = format!("127.0.0.1:{}", master_port + 1);
    let master_port = master_port.to_string();
    let mut run = HangwatchRun::start(
        &[
            "--host-coordinator",
            "--token-file",
            &token,
            "--nnodes",
            "1",
            "--node-name",
            "solo",
            "--nproc",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &master_port,
            "--metrics",
            "127.0.0.1:0",
            "--stall-after",
            "3s",
        ],
        &rank_job(
            py,
            &[
                "--step-time",
                "0.1",
                "--behaviour",
                "lock",
                "--after",
                "400",
                "--only-rank",
                "1",
            ],
        ),
    );
    assert!(
        run.wait_for_stderr(Duration::from_secs(30), |l| l
            .contains("joined the coordinator")),
        "{}",
        run.stderr_text()
    );
    let metrics = lock(&run.stderr)
        .iter()
        .find_map(|l| {
            let rest = l.split("metrics on http://").nth(1)?;
            Some(rest.strip_suffix("/metrics")?.to_string())
        })
        .expect("the metrics address");
    // Rank 1 deadlocks after 400 steps (about 40 s); the strangers are in place well before.
    let flood = std::thread::spawn(move || idle_connections(&metrics, 2000));
    let at_coordinator = idle_connections(&coordinator, 2000);
    let at_metrics = flood.join().expect("flood");
    assert!(
        run.running(),
        "the strangers were to be in place before the hang: {}",
        run.stderr_text()
    );
    assert!(
        at_coordinator.len() >= 1000 && at_metrics.len() >= 1000,
        "the flood did not happen: {} and {} connections",
        at_coordinator.len(),
        at_metrics.len()
    );
    let end = run.finish(Duration::from_secs(90));
    end.assert_code(75);
    // The roll call read where each rank waits (rank 1 on the lock in load_batch, rank 0 in the barrier).
    let summary = end.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("load_batch") && summary.contains("barrier"),
        "{}",
        end.describe()
    );
    // A deadlock at about 40 s, a 3 s threshold, the roll call and the ending: within 75 s, as without the
    // strangers.
    assert!(
        end.took < Duration::from_secs(75),
        "the hang was decided late: {}",
        end.describe()
    );
    drop((at_coordinator, at_metrics));
}

#[test]
fn a_squatted_hosted_coordinator_port_leaves_every_node_deciding_alone_and_the_squatter_learns_nothing(
) {
    let squatter = TcpListener::bind("0.0.0.0:0").expect("bind a port");
    let port = squatter.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in squatter.incoming() {
            let Ok(mut conn) = conn else { return };
            let keep = Arc::clone(&keep);
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = conn.write_all(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00");
                let mut buf = [0u8; 4096];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    lock(&keep).extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    let dir = tempfile::tempdir().expect("dir");
    let token = private_token(dir.path());
    // The hosted coordinator takes the port after the master port.
    let master_port = (port - 1).to_string();
    let job = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        "sleep 4; echo done".to_string(),
    ];
    let node = |rank: &str, name: &str| {
        HangwatchRun::start(
            &[
                "--host-coordinator",
                "--token-file",
                &token,
                "--job-id",
                "squat-1",
                "--nnodes",
                "2",
                "--node-rank",
                rank,
                "--node-name",
                name,
                "--nproc",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &master_port,
            ],
            &job,
        )
    };
    let mut host = node("0", "sq0");
    let mut other = node("1", "sq1");
    let host_end = host.finish(Duration::from_secs(60));
    let other_end = other.finish(Duration::from_secs(60));
    host_end.assert_code(0);
    other_end.assert_code(0);
    let host_said = host.stderr_text();
    assert!(
        host_said.contains("cannot host the coordinator")
            && host_said.contains(&format!("port {port} is taken"))
            && host_said.contains("each node deciding alone"),
        "{host_said}"
    );
    let other_said = other.stderr_text();
    assert!(
        other_said.contains("did not prove that it holds this job's key")
            && other_said.contains("this node decides alone"),
        "{other_said}"
    );
    let seen = lock(&seen).clone();
    assert_eq!(
        seen.first(),
        Some(&0x16),
        "node 1 opened with a TLS hello: {seen:?}"
    );
    let text = String::from_utf8_lossy(&seen);
    for secret in [TOKEN, "PRI * HTTP/2.0", "Register", "sq1"] {
        assert!(!text.contains(secret), "{secret:?} reached the squatter");
    }
}
