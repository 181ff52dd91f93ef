//! The link against strangers, over real sockets: a listener that does not hold the job's key learns nothing (the
//! agent's first bytes are a TLS ClientHello, never the token or a call), a recorded session replayed does
//! nothing, 2,000 idle connections do not keep a roll call from being decided, and a flood of handshakes from many
//! addresses does not keep a known node out.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fixtures::incident_node;
use common::{config, register_request, secret, wait_for, Answer, FakeAgent, Server};
use hangwatch_model::VerdictKind;
use hangwatch_rpc::{connect, ConnectError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PER_NODE: u32 = 4;

/// The agent's attempt to join whatever listens at `addr`: it must fail without sending anything of the job.
async fn join_attempt(addr: SocketAddr) -> ConnectError {
    connect(&addr.to_string(), &secret(), Duration::from_secs(10))
        .await
        .expect_err("a listener without the job's key is not joined")
}

/// Bytes that would give the job away if a stranger saw them.
fn assert_nothing_of_the_job(seen: &[u8]) {
    let text = String::from_utf8_lossy(seen);
    for secret in [
        common::TOKEN,
        "PRI * HTTP/2.0",
        "hangwatch.coordinator",
        "Register",
        "authorization",
    ] {
        assert!(
            !text.contains(secret),
            "{secret:?} reached the stranger: {text:?}"
        );
    }
}

/// A plain TCP listener (someone on the coordinator's port) that keeps whatever it is sent.
fn cleartext_listener() -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = StdListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let keep = Arc::clone(&keep);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                // Answers like an HTTP/2 server would start to, to draw the client out.
                let _ = conn.write_all(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00");
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    keep.lock().expect("lock").extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn a_cleartext_listener_on_the_coordinators_address_gets_a_tls_hello_and_nothing_else() {
    let (addr, seen) = cleartext_listener();
    let err = join_attempt(addr).await;
    assert!(
        matches!(err, ConnectError::NotTheJobs { .. }),
        "{}",
        hangwatch_model::error_chain(&err)
    );
    // The listener's thread keeps what it read; the agent may have given up before it ran.
    assert!(
        wait_for(Duration::from_secs(10), || !seen
            .lock()
            .expect("lock")
            .is_empty())
        .await,
        "the listener got nothing at all"
    );
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(
        seen.first(),
        Some(&0x16),
        "the first byte is a TLS handshake record"
    );
    assert_nothing_of_the_job(&seen);
}

/// What a stranger's TLS server saw: the bytes it decrypted, and how each handshake went.
type Decrypted = Arc<Mutex<Vec<u8>>>;
type Handshakes = Arc<Mutex<Vec<String>>>;

/// A TLS server with a key of its own (not the job's) that accepts any client and keeps what it decrypts.
fn tls_listener_with_its_own_key() -> (SocketAddr, Decrypted, Handshakes) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
        .expect("a random key");
    let signing = provider
        .key_provider
        .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            pkcs8.as_ref().to_vec(),
        )))
        .expect("key");
    let spki = signing.public_key().expect("public key");
    let certified = Arc::new(rustls::sign::CertifiedKey::new(
        vec![CertificateDer::from(spki.as_ref().to_vec())],
        signing,
    ));
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls 1.3")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(
            rustls::server::AlwaysResolvesServerRawPublicKeys::new(certified),
        ));
    server.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = StdListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    let decrypted = Arc::new(Mutex::new(Vec::new()));
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let (keep, said) = (Arc::clone(&decrypted), Arc::clone(&outcomes));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, keep, said) = (acceptor.clone(), Arc::clone(&keep), Arc::clone(&said));
            tokio::spawn(async move {
                match acceptor.accept(tcp).await {
                    Err(e) => said.lock().expect("lock").push(format!("handshake: {e}")),
                    Ok(mut tls) => {
                        said.lock().expect("lock").push("handshake done".into());
                        let mut buf = vec![0u8; 4096];
                        while let Ok(Ok(n)) =
                            tokio::time::timeout(Duration::from_secs(2), tls.read(&mut buf)).await
                        {
                            if n == 0 {
                                break;
                            }
                            keep.lock().expect("lock").extend_from_slice(&buf[..n]);
                        }
                    }
                }
            });
        }
    });
    (addr, decrypted, outcomes)
}

#[tokio::test]
async fn a_tls_listener_with_a_key_of_its_own_decrypts_nothing_from_the_agent() {
    let (addr, decrypted, outcomes) = tls_listener_with_its_own_key();
    let err = join_attempt(addr).await;
    let text = err.to_string();
    assert!(
        matches!(err, ConnectError::NotTheJobs { .. })
            && text.contains("did not prove that it holds this job's key"),
        "{}",
        hangwatch_model::error_chain(&err)
    );
    assert!(
        wait_for(Duration::from_secs(5), || !outcomes
            .lock()
            .expect("lock")
            .is_empty())
        .await,
        "the stranger saw a handshake attempt"
    );
    // The agent checks the server's key before it finishes the handshake: the stranger never gets a session to
    // read from, let alone a call.
    assert!(
        outcomes
            .lock()
            .expect("lock")
            .iter()
            .all(|o| o.starts_with("handshake:")),
        "{:?}",
        outcomes.lock().expect("lock")
    );
    assert!(decrypted.lock().expect("lock").is_empty());
}

/// A TCP proxy in front of `to` that keeps what the client sent.
async fn recording_proxy(to: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&recorded);
    tokio::spawn(async move {
        // One session is recorded: the first connection.
        let Ok((client, _)) = listener.accept().await else {
            return;
        };
        let Ok(server) = tokio::net::TcpStream::connect(to).await else {
            return;
        };
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = server.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        });
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = client_read.read(&mut buf).await {
            if n == 0 || server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
            keep.lock().expect("lock").extend_from_slice(&buf[..n]);
        }
    });
    (addr, recorded)
}

#[tokio::test]
async fn a_recorded_session_replayed_to_the_coordinator_registers_nothing() {
    let first = Server::start(config()).await;
    let (proxy, recorded) = recording_proxy(first.addr).await;
    let client = connect(&proxy.to_string(), &secret(), Duration::from_secs(10))
        .await
        .expect("through the proxy");
    let agent = FakeAgent::join(
        client,
        register_request("n1", 0, PER_NODE),
        Duration::from_millis(100),
        Answer::Never,
    )
    .await;
    assert_eq!(first.coordinator.members().len(), 1, "the original joined");
    drop(agent);
    let recorded = recorded.lock().expect("lock").clone();
    assert!(recorded.len() > 500, "a whole session was recorded");
    assert_nothing_of_the_job(&recorded);

    // The same job's coordinator, started again, is sent the recording byte for byte.
    let second = Server::start(config()).await;
    let mut replay = tokio::net::TcpStream::connect(second.addr)
        .await
        .expect("connect");
    let _ = replay.write_all(&recorded).await;
    let mut answer = Vec::new();
    let hung_up =
        tokio::time::timeout(Duration::from_secs(10), replay.read_to_end(&mut answer)).await;
    // The coordinator answers the hello with a fresh handshake, finds the rest does not fit it, and hangs up.
    assert!(
        hung_up.is_ok(),
        "the coordinator did not hang up on the replay within 10 s"
    );
    assert!(!answer.is_empty(), "it answered the hello");
    assert!(
        second.coordinator.members().is_empty(),
        "a replayed registration must not register anyone: {:?}",
        second.coordinator.members()
    );
    second.shutdown().await;
    first.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_connections_do_not_keep_a_roll_call_from_its_verdict() {
    raise_open_file_limit(4096 + 512);
    let server = Server::start(config()).await;
    let agents = common::join_agents(&server, 3, PER_NODE, Duration::from_millis(100), |r| {
        Answer::Now(incident_node(r, PER_NODE))
    })
    .await;
    // Strangers that connect and say nothing: most are closed at once (cap per address), the rest at the
    // handshake deadline.
    let mut idle = Vec::new();
    for _ in 0..2000 {
        match tokio::net::TcpStream::connect(server.addr).await {
            Ok(s) => idle.push(s),
            Err(e) => panic!("connection {} failed: {e}", idle.len()),
        }
    }
    let started = std::time::Instant::now();
    let outcome = server.coordinator.roll_call(Duration::from_secs(8)).await;
    let took = started.elapsed();
    assert_eq!(outcome.answered, vec!["n1", "n2", "n3"], "{took:?}");
    assert_eq!(outcome.verdict.kind, VerdictKind::BlockedInKernel);
    // An agent that (re)joins now gets in: from the strangers' own address it may be closed while they hold
    // that address's handshake slots, and gets in once the deadline has closed theirs, as a real agent retrying.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let rejoined = loop {
        match connect(&server.addr.to_string(), &secret(), Duration::from_secs(5)).await {
            Ok(_) => break Ok(()),
            Err(e) if std::time::Instant::now() > deadline => break Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    assert!(rejoined.is_ok(), "{:?}", rejoined.err());
    drop(idle);
    drop(agents);
    server.shutdown().await;
}

/// The flood: 16 addresses holding 64 handshakes each used to take every slot (1,024), so a node of the job
/// could not even rejoin until the deadline closed theirs. Now each address's share shrinks as slots run out, and
/// a slot is kept for an address that proved the key before: the node gets in at its first try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_flooding_addresses_do_not_keep_a_known_node_from_rejoining_at_once() {
    raise_open_file_limit(4096);
    let server = Server::start(config()).await;
    drop(server.client(&secret()).await);
    let from = |last: u8| {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from(([127, 0, 0, last], 0)))
            .expect("bind a loopback address");
        socket
    };
    let mut idle = Vec::new();
    for last in 2..=17u8 {
        for _ in 0..64 {
            idle.push(from(last).connect(server.addr).await.expect("connect"));
        }
    }
    // A connection after the flood from its first address is closed at once: the flood's are all held.
    let mut probe = from(2).connect(server.addr).await.expect("connect");
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(2), probe.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "the flooding address is over its share: {closed:?}"
    );
    let started = std::time::Instant::now();
    let rejoined = connect(&server.addr.to_string(), &secret(), Duration::from_secs(3)).await;
    assert!(
        rejoined.is_ok(),
        "a known node gets a slot at once: {:?}",
        rejoined.err()
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    drop(idle);
    server.shutdown().await;
}

fn raise_open_file_limit(want: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < want {
        setrlimit(Resource::RLIMIT_NOFILE, want.min(hard), hard).expect("setrlimit");
    }
}
