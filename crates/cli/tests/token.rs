//! Job tokens as a user meets them: `run` and `coordinator` refuse a weak one (exit 2, naming `hangwatch token
//! new`), and `hangwatch token new FILE` makes a private file (and its missing directory) whose token a real
//! one-node run accepts.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use hangwatch_testkit::{wait_with_deadline, ChildGuard};

/// Runs hangwatch with `args` to its end (at most 60 s), with its stdout and stderr.
fn hangwatch(args: &[&str], cwd: &Path) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hangwatch"));
    cmd.args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn(&mut cmd, "hangwatch").expect("hangwatch starts");
    let mut stdout = guard.child_mut().stdout.take().expect("stdout");
    let mut stderr = guard.child_mut().stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut s).map(|_| s)
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).map(|_| s)
    });
    let status = wait_with_deadline(guard.child_mut(), Duration::from_secs(60))
        .unwrap_or_else(|| panic!("hangwatch {args:?} ends within 60 s"));
    let text = |h: std::thread::JoinHandle<std::io::Result<String>>| {
        h.join().expect("reader").expect("output")
    };
    (status.code(), text(out), text(err))
}

/// A loopback address with a port nothing listens on now (the hosted coordinator takes it).
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").to_string()
}

fn run_one_node(token: &Path, cwd: &Path) -> (Option<i32>, String, String) {
    let coordinator = free_address();
    let token = token.to_str().expect("utf-8 path");
    hangwatch(
        &[
            "run",
            "--host-coordinator",
            "--coordinator",
            &coordinator,
            "--token-file",
            token,
            "--nnodes",
            "1",
            "--node-rank",
            "0",
            "--job-id",
            "token-test",
            "--",
            "true",
        ],
        cwd,
    )
}

#[test]
fn a_weak_token_is_refused_by_run_and_coordinator_with_exit_2_and_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let weak = dir.path().join("weak.token");
    std::fs::write(&weak, "abc\n").expect("write");
    std::fs::set_permissions(&weak, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (code, _, stderr) = run_one_node(&weak, dir.path());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("too weak")
            && stderr.contains("about 12 bits")
            && stderr.contains("hangwatch token new FILE"),
        "{stderr}"
    );
    let weak_path = weak.to_str().expect("utf-8");
    let (code, _, stderr) = hangwatch(
        &[
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            weak_path,
        ],
        dir.path(),
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("hangwatch token new FILE"), "{stderr}");
}

#[test]
fn token_new_makes_a_private_file_that_run_accepts_and_never_overwrites_it_unasked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(".hangwatch/job-42.token");
    let path = file.to_str().expect("utf-8");
    let (code, stdout, stderr) = hangwatch(&["token", "new", path], dir.path());
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.is_empty(), "the token is not printed: {stdout}");
    assert!(
        stderr.contains(&format!("wrote a new job token to {path} (mode 0600)")),
        "{stderr}"
    );
    let meta = std::fs::metadata(&file).expect("token file");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let token = std::fs::read_to_string(&file).expect("read");
    assert!(
        token.len() == 65 && token.trim().bytes().all(|b| b.is_ascii_hexdigit()),
        "{token:?}"
    );

    let (code, _, stderr) = run_one_node(&file, dir.path());
    assert_eq!(code, Some(0), "a one-node run with the new token: {stderr}");
    assert!(
        stderr.contains("hosted by this agent, listening on"),
        "the coordinator's key was derived from the new token: {stderr}"
    );

    let (code, _, stderr) = hangwatch(&["token", "new", path], dir.path());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("already exists") && stderr.contains("--force"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        token,
        "untouched"
    );
    let (code, _, stderr) = hangwatch(&["token", "new", "--force", path], dir.path());
    assert_eq!(code, Some(0), "{stderr}");
    assert_ne!(
        std::fs::read_to_string(&file).expect("read"),
        token,
        "replaced"
    );

    let (code, stdout, stderr) = hangwatch(&["token", "new", "-"], dir.path());
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim().len(), 64, "{stdout}");
    assert!(stderr.contains("chmod 600"), "{stderr}");
}
