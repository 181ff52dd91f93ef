//! A rank waiting on a socket names whom it waits for (issue 35): rank 0 uploads a checkpoint to a local store
//! (HTTP over TCP, then over a Unix socket) that is stopped, and the verdict names the endpoint, the store's pid
//! and state and the bytes it did not take; a rank connecting to an address that never answers (in a network
//! namespace the test makes, its peer's link down) is said to get no answer. Each test continues and kills only
//! the server it started, and removes its namespaces, also when it fails (the guards).

mod common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use hangwatch_testkit::{python, require, run_tool, ChildGuard, TestNetwork};
use nix::sys::signal::Signal;
use serde_json::Value;

fn script(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/python")
        .join(name);
    path.canonicalize().unwrap_or(path)
}

/// The store the test started: stopped while the rank uploads, continued and killed on drop.
struct Store {
    guard: ChildGuard,
    /// `127.0.0.1:PORT` or `unix:/PATH`.
    address: String,
    /// Its output lines after the first.
    lines: std::sync::mpsc::Receiver<String>,
}

impl Store {
    fn start(py: &Path, args: &[&str]) -> Store {
        let mut guard = ChildGuard::spawn(
            Command::new(py)
                .arg(script("store_server.py"))
                .args(args)
                .stdout(Stdio::piped()),
            "store server",
        )
        .expect("the store starts");
        let stdout = guard.child_mut().stdout.take().expect("its stdout");
        let mut reader = std::io::BufReader::new(stdout);
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .expect("the store says where it listens");
        let address = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("unexpected first line from the store: {line:?}"))
            .to_string();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Store {
            guard,
            address,
            lines,
        }
    }

    fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// Whether the store said `receiving` (an upload is in flight) within `timeout`.
    fn receiving(&self, timeout: Duration) -> bool {
        let until = std::time::Instant::now() + timeout;
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line == "receiving" => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        false
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.guard.signal(Signal::SIGCONT);
    }
}

/// Runs 2 ranks of socket_rank.py uploading to `store`; once an upload is in flight, the store is stopped.
fn upload_to_stopped(py: &Path, store: &mut Store, url: &str) -> Finished {
    let job: Vec<String> = [
        py.to_string_lossy().into_owned(),
        script("socket_rank.py").to_string_lossy().into_owned(),
        "--op".into(),
        "upload".into(),
        "--target".into(),
        url.into(),
    ]
    .into();
    let mut run = HangwatchRun::start(
        &["--nproc", "2", "--stall-after", STALL_AFTER, "--quiet"],
        &job,
    );
    assert!(
        store.receiving(Duration::from_secs(30)),
        "rank 0 never started uploading:\n{}",
        run.stderr_text()
    );
    run.track_descendants();
    store.guard.signal(Signal::SIGSTOP).expect("stop the store");
    run.finish(STALL + Duration::from_secs(30))
}

/// The culprit is rank 0, in sendto(), waiting on the stopped store at `address`, with bytes it did not take.
fn assert_waits_on_stopped_store(done: &Finished, store: &Store, address: &str) -> Value {
    done.assert_code(75);
    let culprit = done.culprit(0).clone();
    let wait = &culprit["waits_on_peer"];
    assert_eq!(wait["syscall"], "sendto", "{}", done.describe());
    assert_eq!(wait["finding"], "peer_stopped", "{}", done.describe());
    assert_eq!(wait["address"], address, "{}", done.describe());
    assert_eq!(
        wait["peer"]["pid"].as_u64(),
        Some(u64::from(store.pid())),
        "the store's pid: {}",
        done.describe()
    );
    assert_eq!(wait["peer"]["state"], "T", "{}", done.describe());
    assert_eq!(wait["peer"]["in_job"], false, "{}", done.describe());
    let queued = wait["socket"]["unsent_bytes"]
        .as_u64()
        .or_else(|| wait["socket"]["send_queue_bytes"].as_u64())
        .unwrap_or(0);
    assert!(
        queued > 64 * 1024,
        "bytes the store did not take: {}",
        done.describe()
    );
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("sends to")
            && summary.contains(address)
            && summary.contains(&format!("pid {}", store.pid()))
            && summary.contains("stopped (T)"),
        "the summary says it: {summary}"
    );
    culprit
}

#[test]
fn a_rank_uploading_to_a_stopped_local_store_names_the_endpoint_the_stores_pid_and_the_bytes_unsent(
) {
    let py = python().expect("python3");
    let mut store = Store::start(py, &["tcp"]);
    let url = format!("http://{}/checkpoint", store.address);
    let done = upload_to_stopped(py, &mut store, &url);
    let address = store.address.clone();
    let culprit = assert_waits_on_stopped_store(&done, &store, &address);
    assert_eq!(culprit["waits_on_peer"]["socket"]["protocol"], "tcp");
    assert_eq!(culprit["waits_on_peer"]["socket"]["source"], "sock_diag");
}

#[test]
fn a_rank_uploading_to_a_stopped_store_on_a_unix_socket_names_the_path_and_the_stores_pid() {
    let py = python().expect("python3");
    let dir = tempfile::tempdir().expect("socket directory");
    let path = dir.path().join("store.sock");
    let path_s = path.to_string_lossy().into_owned();
    let mut store = Store::start(py, &["unix", &path_s]);
    let url = store.address.clone();
    let done = upload_to_stopped(py, &mut store, &url);
    let culprit = assert_waits_on_stopped_store(&done, &store, &path_s);
    assert_eq!(
        culprit["waits_on_peer"]["socket"]["protocol"],
        "unix_stream"
    );
}

/// Rank 0 (in node a's network namespace, hangwatch outside it) connects to node b, whose link is down and whose
/// address node a sends to a MAC nobody has: its SYNs go unanswered, and the verdict says so.
#[test]
fn a_rank_connecting_to_an_address_that_never_answers_says_no_answer() {
    let py = python().expect("python3");
    let net = require!(TestNetwork::new("hwsock", &["a", "b"]));
    net.link_down("b").expect("unplug b");
    let target = net.addr("b");
    // A permanent neighbour entry: no ARP, so the connect waits for SYN answers instead of failing unreachable.
    run_tool(
        "ip",
        &[
            "-n",
            net.namespace("a"),
            "neigh",
            "replace",
            &target.to_string(),
            "lladdr",
            "02:00:00:00:00:99",
            "dev",
            "eth0",
            "nud",
            "permanent",
        ],
        Duration::from_secs(10),
    )
    .expect("the neighbour entry");
    let ns = format!("--net=/run/netns/{}", net.namespace("a"));
    let job: Vec<String> = [
        "nsenter".to_string(),
        ns,
        "--".into(),
        py.to_string_lossy().into_owned(),
        script("socket_rank.py").to_string_lossy().into_owned(),
        "--op".into(),
        "connect".into(),
        "--target".into(),
        format!("{target}:8080"),
    ]
    .into();
    let mut run = HangwatchRun::start(
        &["--nproc", "2", "--stall-after", STALL_AFTER, "--quiet"],
        &job,
    );
    run.track_descendants();
    let done = run.finish(STALL + Duration::from_secs(30));
    done.assert_code(75);
    let culprit = done.culprit(0);
    let wait = &culprit["waits_on_peer"];
    assert_eq!(wait["syscall"], "connect", "{}", done.describe());
    assert_eq!(wait["finding"], "no_answer", "{}", done.describe());
    assert_eq!(
        wait["socket"]["tcp_state"],
        "syn_sent",
        "{}",
        done.describe()
    );
    let summary = done.json["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(&format!("no answer from {target}:8080")),
        "the summary says it: {summary}"
    );
}
