//! `hangwatch coordinator` as a user starts it: a token file others can read is refused (exit 2, what to do);
//! with a private one it says where it listens, accepts connections, and stops cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use hangwatch_testkit::{send, wait_with_deadline, ChildGuard};
use nix::sys::signal::Signal;

fn token_file(dir: &Path, mode: u32) -> std::path::PathBuf {
    let path = dir.join("token");
    std::fs::write(&path, "8e1f4c07a39d2b65f0c7e4a19b3d5862\n").expect("write token");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

fn coordinator(token: &Path) -> ChildGuard {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
    cmd.args(["coordinator", "--listen", "127.0.0.1:0", "--token-file"])
        .arg(token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    ChildGuard::spawn(&mut cmd, "hangwatch coordinator").expect("hangwatch starts")
}

#[test]
fn a_token_file_others_can_read_is_refused_with_exit_2_and_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    for mode in [0o644, 0o640, 0o604] {
        let token = token_file(dir.path(), mode);
        let mut guard = coordinator(&token);
        let status = wait_with_deadline(guard.child_mut(), Duration::from_secs(30))
            .expect("the coordinator refuses at once instead of serving");
        let mut stderr = String::new();
        if let Some(mut e) = guard.child_mut().stderr.take() {
            std::io::Read::read_to_string(&mut e, &mut stderr).expect("stderr");
        }
        assert_eq!(status.code(), Some(2), "mode {mode:o}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "is accessible to its group or others (mode {mode:03o})"
            )),
            "{stderr}"
        );
        assert!(stderr.contains("chmod 600"), "{stderr}");
    }
}

#[test]
fn with_a_private_token_file_it_says_where_it_listens_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = token_file(dir.path(), 0o600);
    let mut guard = coordinator(&token);
    let stderr = guard.child_mut().stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let first = lines
        .next()
        .and_then(Result::ok)
        .expect("a first line on stderr");
    let addr = first
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {first:?}"));
    assert!(addr.starts_with("127.0.0.1:"), "{first}");
    std::net::TcpStream::connect(addr).expect("it accepts connections");
    send(guard.pid(), Signal::SIGTERM).expect("SIGTERM");
    let status = wait_with_deadline(guard.child_mut(), Duration::from_secs(30))
        .expect("it stops on SIGTERM");
    assert_eq!(status.code(), Some(0));
}
