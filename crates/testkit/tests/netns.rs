//! Nodes as network namespaces, checked on real namespaces, sockets and processes: each node has its own address
//! and hostname, nodes talk over TCP, a downed link cuts exactly one node off, and nothing is left behind.

use std::io::{BufRead, BufReader};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use hangwatch_testkit::{
    is_dead, python, require, run_tool, wait_until, wait_with_deadline, ChildGuard, TestNetwork,
};

const PORT: u16 = 7000;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const CLIENT_DEADLINE: Duration = Duration::from_secs(60);

/// Answers every connection with `<what it read> from <hostname>`.
const ECHO_SERVER: &str = r#"
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[2])))
server.listen()
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        conn.settimeout(10)
        data = conn.recv(100)
        conn.sendall(data + b" from " + socket.gethostname().encode())
"#;

/// Connects to `host port` within `timeout` seconds; prints the answer (exit 0) or the error (exit 1).
const CLIENT: &str = r#"
import socket, sys
try:
    conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    conn.sendall(b"hello")
    print(conn.recv(100).decode())
except OSError as e:
    print(f"error: {e!r}")
    sys.exit(1)
"#;

fn py() -> &'static std::path::Path {
    python().expect("python3 is installed")
}

/// Starts the echo server in `node` on its own address and waits until it listens.
fn echo_server(net: &TestNetwork, node: &str) -> ChildGuard {
    let mut command = net.command(node, py());
    command
        .args(["-c", ECHO_SERVER])
        .arg(net.addr(node).to_string())
        .arg(PORT.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut server = ChildGuard::spawn(&mut command, format!("echo server in {node}"))
        .expect("the echo server starts");
    let stdout = server.child_mut().stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(READY_TIMEOUT).unwrap_or_default();
    assert_eq!(
        line.trim(),
        "listening",
        "the echo server in {node} did not start"
    );
    server
}

/// Runs the client in `from` against `to`'s echo server; `Ok(answer)` or `Err(error text)`.
fn connect(net: &TestNetwork, from: &str, to: &str, timeout: Duration) -> Result<String, String> {
    let mut command = net.command(from, py());
    command
        .args(["-c", CLIENT])
        .arg(net.addr(to).to_string())
        .arg(PORT.to_string())
        .arg(timeout.as_secs_f64().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut client = ChildGuard::spawn(&mut command, format!("client {from} -> {to}"))
        .expect("the client starts");
    let status = wait_with_deadline(client.child_mut(), CLIENT_DEADLINE)
        .unwrap_or_else(|| panic!("the client {from} -> {to} did not finish"));
    let mut out = String::new();
    if let Some(stdout) = client.child_mut().stdout.take() {
        let _ = BufReader::new(stdout).read_line(&mut out);
    }
    let out = out.trim().to_string();
    if status.success() {
        Ok(out)
    } else {
        Err(out)
    }
}

fn run_in(net: &TestNetwork, node: &str, program: &str, args: &[&str]) -> String {
    let output = net
        .command(node, program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the program runs");
    assert!(
        output.status.success(),
        "{program} in {node}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn namespaces_named(prefix: &str) -> Vec<String> {
    let listed =
        run_tool("ip", &["netns", "list"], Duration::from_secs(10)).expect("ip netns list");
    listed
        .stdout
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

fn root_interfaces() -> Vec<String> {
    let links = run_tool("ip", &["-o", "link", "show"], Duration::from_secs(10)).expect("ip link");
    let mut names: Vec<String> = links
        .stdout
        .lines()
        .filter_map(|line| line.split(':').nth(1))
        .map(|name| name.trim().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn each_node_has_its_own_hostname_and_address_and_the_nodes_talk_over_tcp() {
    let root_before = root_interfaces();
    let net = require!(TestNetwork::new("hwnet", &["a", "b", "c"]));
    assert_eq!(
        root_interfaces(),
        root_before,
        "the root namespace gained or lost interfaces"
    );
    let our_hostname = run_tool("uname", &["-n"], Duration::from_secs(5))
        .expect("uname")
        .stdout;

    for node in ["a", "b", "c"] {
        assert_eq!(run_in(&net, node, "uname", &["-n"]).trim(), node);
        let addresses = run_in(&net, node, "ip", &["-4", "-o", "addr", "show"]);
        let own = format!("{}/24", net.addr(node));
        assert!(addresses.contains(&own), "{node}: {addresses}");
        assert!(addresses.contains("127.0.0.1/8"), "{node}: {addresses}");
        let default = run_in(&net, node, "ip", &["-4", "route", "show", "default"]);
        assert!(
            default.trim().is_empty(),
            "{node} has a default route: {default}"
        );
    }
    assert_eq!(
        run_tool("uname", &["-n"], Duration::from_secs(5))
            .expect("uname")
            .stdout,
        our_hostname,
        "the test's own hostname changed"
    );
    let addrs: Vec<_> = net.names().map(|n| net.addr(n)).collect();
    assert!(addrs[0] != addrs[1] && addrs[1] != addrs[2], "{addrs:?}");

    let _server_b = echo_server(&net, "b");
    let _server_c = echo_server(&net, "c");
    assert_eq!(
        connect(&net, "a", "b", Duration::from_secs(10)),
        Ok("hello from b".to_string())
    );
    assert_eq!(
        connect(&net, "a", "c", Duration::from_secs(10)),
        Ok("hello from c".to_string())
    );
    assert_eq!(
        connect(&net, "c", "b", Duration::from_secs(10)),
        Ok("hello from b".to_string())
    );
}

#[test]
fn a_node_whose_link_is_down_is_cut_off_until_it_is_up_again() {
    let net = require!(TestNetwork::new("hwnet", &["a", "b", "c"]));
    let _server_b = echo_server(&net, "b");
    let _server_c = echo_server(&net, "c");
    assert_eq!(
        connect(&net, "a", "b", Duration::from_secs(10)),
        Ok("hello from b".to_string())
    );

    net.link_down("b").expect("link down");
    let cut = connect(&net, "a", "b", Duration::from_secs(3));
    println!("a -> b with b's link down: {cut:?}");
    assert!(cut.is_err(), "a still reached b: {cut:?}");
    assert_eq!(
        connect(&net, "a", "c", Duration::from_secs(10)),
        Ok("hello from c".to_string()),
        "a <-> c must not be affected"
    );

    net.link_up("b").expect("link up");
    assert_eq!(
        connect(&net, "a", "b", Duration::from_secs(10)),
        Ok("hello from b".to_string())
    );
}

#[test]
fn the_child_is_the_program_itself_in_the_node_namespaces_with_its_arguments_intact_and_our_mounts()
{
    let net = require!(TestNetwork::new("hwnet", &["coord"]));
    let echoed = run_in(
        &net,
        "coord",
        "sh",
        &["-c", r#"printf '%s|' "$@""#, "sh", "one two", "$HOME", ""],
    );
    assert_eq!(echoed, "one two|$HOME||");

    let mut command = net.command("coord", "sleep");
    command.arg("30").stdin(Stdio::null());
    let sleeper = ChildGuard::spawn(&mut command, "sleep in coord").expect("sleep starts");
    let pid = sleeper.pid();
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(10), || {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
        }),
        "pid {pid} never became sleep"
    );
    for ns in ["net", "uts"] {
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).expect("own ns");
        let its = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).expect("child ns");
        assert_ne!(ours, its, "the child shares our {ns} namespace");
    }
    let ours = std::fs::read_link("/proc/self/ns/mnt").expect("own mnt ns");
    let its = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).expect("child mnt ns");
    assert_eq!(
        ours, its,
        "nodes see the test's mounts (frozen or mounted later) as a shared filesystem"
    );
}

#[test]
fn every_namespace_is_deleted_after_a_panic_while_processes_still_run_inside() {
    let mut prefix = None;
    let mut sleeper: Option<ChildGuard> = None;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let net = require!(TestNetwork::new("hwnet", &["a", "b", "c"]));
        prefix = Some(net.namespace_prefix().to_string());
        assert_eq!(namespaces_named(net.namespace_prefix()).len(), 4);
        let mut command = net.command("b", "sleep");
        command.arg("30").stdin(Stdio::null());
        sleeper = Some(ChildGuard::spawn(&mut command, "sleep in b").expect("sleep starts"));
        panic!("the test body fails with the network up");
    }));
    let Some(prefix) = prefix else {
        return; // skipped: the reason was printed
    };
    assert!(outcome.is_err(), "the body was meant to panic");
    assert_eq!(namespaces_named(&prefix), Vec::<String>::new());
    let mut sleeper = sleeper.expect("the sleeper was started");
    assert!(
        sleeper.try_wait().is_none(),
        "deleting the namespaces must leave their processes to their owners"
    );
    let pid = sleeper.pid();
    drop(sleeper);
    assert!(is_dead(pid));
}

#[test]
fn removing_tolerates_a_namespace_someone_already_deleted() {
    let net = require!(TestNetwork::new("hwnet", &["a", "b"]));
    let prefix = net.namespace_prefix().to_string();
    run_tool(
        "ip",
        &["netns", "del", net.namespace("a")],
        Duration::from_secs(10),
    )
    .expect("ip netns del");
    net.remove().expect("the rest is removed without error");
    assert_eq!(namespaces_named(&prefix), Vec::<String>::new());
}

#[test]
fn unknown_nodes_and_bad_names_are_clear_errors() {
    let net = require!(TestNetwork::new("hwnet", &["a"]));
    assert_eq!(TestNetwork::available(), Ok(()));
    let err = net.link_down("z").unwrap_err().to_string();
    assert!(err.contains("\"z\"") && err.contains('a'), "{err}");
    let err = TestNetwork::new("hwnet", &["a", "a"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("twice"), "{err}");
    let _: Command = net.command("a", "true");
}
