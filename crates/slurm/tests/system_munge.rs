//! The key exchange between node services on real munged daemons: two that share a key stand for two nodes of
//! one cluster, one with a key of its own for a stranger. A node's service gets the step's key from the first
//! node's; a stranger, a replayed credential and a credential made by a user other than root get nothing.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;

use hangwatch_slurm::munge::{answer, ask, KeyGrant, KeyRequest, Munge, MungeError, SECRET_BYTES};
use hangwatch_testkit::{require, MungeDaemon};

fn request() -> KeyRequest {
    KeyRequest {
        job: "41".into(),
        step: "0".into(),
        node: "n2".into(),
    }
}

fn grant() -> KeyGrant {
    KeyGrant {
        job: "41".into(),
        step: "0".into(),
        port: 40_123,
        secret: [7; SECRET_BYTES],
    }
}

/// The first node's service: answers `times` requests on a loopback port with `munge`, giving [`grant`].
fn first_node(
    munge: Munge,
    times: usize,
) -> (SocketAddr, JoinHandle<Vec<Result<KeyRequest, String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let served = std::thread::spawn(move || {
        (0..times)
            .map(|_| {
                let (stream, _) = listener.accept().expect("accept");
                answer(stream, &munge, |_| Some(grant())).map_err(|e| e.to_string())
            })
            .collect()
    });
    (addr, served)
}

/// Sends `credential` as the asking service would and returns the first line of the answer.
fn send_raw(addr: SocketAddr, credential: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .write_all(format!("{credential}\n").as_bytes())
        .expect("send");
    let mut line = String::new();
    let _ = BufReader::new(stream).read_line(&mut line);
    line
}

#[test]
fn a_node_of_the_cluster_gets_the_steps_key_from_the_first_node() {
    let n1 = require!(MungeDaemon::start());
    let n2 = require!(MungeDaemon::sharing_key_with(&n1));
    let (addr, served) = first_node(Munge::at(Some(&n1.socket())), 1);
    let got = ask(addr, &Munge::at(Some(&n2.socket())), &request()).expect("the key");
    assert_eq!(got, grant());
    let served = served.join().expect("server");
    assert_eq!(served[0].as_ref().expect("answered"), &request());
}

#[test]
fn a_stranger_a_replayed_credential_and_a_user_get_nothing() {
    let n1 = require!(MungeDaemon::start());
    let n2 = require!(MungeDaemon::sharing_key_with(&n1));
    let stranger = require!(MungeDaemon::start());
    let (addr, served) = first_node(Munge::at(Some(&n1.socket())), 4);

    // Another cluster's key: munged on n1 cannot read its credential.
    let refused = ask(addr, &Munge::at(Some(&stranger.socket())), &request());
    assert!(refused.is_err(), "{refused:?}");

    // A credential of n2's root, sent twice: the second time munged knows it.
    let credential = Munge::at(Some(&n2.socket()))
        .encode(&request().payload())
        .expect("credential");
    let first = send_raw(addr, &credential);
    assert!(
        first.starts_with("MUNGE:"),
        "the first is answered: {first:?}"
    );
    assert_eq!(send_raw(addr, &credential), "", "a replay gets nothing");

    // A user's credential (uid nobody), through n2's munged: well made, but not root's.
    let by_user = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "munge",
            "--socket",
        ])
        .arg(n2.socket())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(request().payload().as_bytes())?;
            child.wait_with_output()
        })
        .expect("munge as nobody");
    let by_user = String::from_utf8_lossy(&by_user.stdout).trim().to_string();
    assert!(by_user.starts_with("MUNGE:"), "{by_user:?}");
    assert_eq!(send_raw(addr, &by_user), "");

    let served = served.join().expect("server");
    assert!(served[0].is_err(), "the stranger: {:?}", served[0]);
    assert!(served[1].is_ok());
    assert!(
        served[2]
            .as_ref()
            .is_err_and(|e| e.contains("unmunge refused")),
        "the replay: {:?}",
        served[2]
    );
    assert_eq!(
        served[3].as_ref().err().map(String::as_str),
        Some(MungeError::NotRoot(65534).to_string().as_str())
    );
}
