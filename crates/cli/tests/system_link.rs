//! System test of the link against a squatter: someone else holds the port a hosted coordinator would take (it is
//! derived from the job). Node rank 0 says it cannot host and decides alone; node 1 finds that the listener cannot
//! prove the job's key, says so and decides alone; both jobs run to their end, and the squatter learns nothing.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

const TOKEN: &str = "squat-test-token-5f2c9a";

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
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let token = token.to_string_lossy().into_owned();
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
