//! The `/metrics` HTTP server: its own thread and single-threaded runtime (hyper 1, HTTP/1.1), so that a scrape
//! never competes with the supervision loop, and encoding happens only when someone scrapes.

use std::convert::Infallible;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};

use crate::Exposition;

/// A scrape connection is closed after this long, whatever it is doing: a client that stops reading must not keep
/// a connection forever.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);
/// A connection that has not sent a whole request after this long is closed: idle connections are how a stranger
/// on the network (or a stuck scraper) would hold the agent's descriptors.
const HEADER_DEADLINE: Duration = Duration::from_secs(5);
/// At most this many connections are served at once; one more is accepted and closed at once (a scraper retries at
/// its next interval), so that connections never take the descriptors the agent needs to read /proc and write
/// evidence.
pub const MAX_CONNECTIONS: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("{given:?} is not an address to serve metrics on: give HOST:PORT (127.0.0.1:9400) or :PORT (every interface)")]
    BadAddress { given: String },
    #[error("cannot serve metrics on {addr}: {hint}")]
    Bind {
        addr: SocketAddr,
        hint: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the metrics server's thread")]
    Thread(#[source] std::io::Error),
}

/// `--metrics ADDR`: `HOST:PORT`, or `:PORT` for every interface (0.0.0.0). Port 0 picks a free one.
pub fn parse_listen_addr(given: &str) -> Result<SocketAddr, MetricsError> {
    let bad = || MetricsError::BadAddress {
        given: given.to_string(),
    };
    if let Some(port) = given.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    given
        .to_socket_addrs()
        .map_err(|_| bad())?
        .next()
        .ok_or_else(bad)
}

/// Serves `GET /metrics` (and a hint at `/`) until dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` now (so that a taken port is an error before anything starts) and serves `source` from a
    /// thread of its own.
    pub fn start(addr: SocketAddr, source: Arc<dyn Exposition>) -> Result<Self, MetricsError> {
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|source| MetricsError::Bind {
                addr,
                hint: match source.kind() {
                    std::io::ErrorKind::AddrInUse => {
                        "another process listens there; pick another port (--metrics HOST:PORT)"
                    }
                    std::io::ErrorKind::PermissionDenied => {
                        "ports below 1024 need privileges; pick a port above 1024"
                    }
                    std::io::ErrorKind::AddrNotAvailable => {
                        "that is not an address of this machine; use one of its addresses or :PORT"
                    }
                    _ => "check the address (--metrics HOST:PORT or :PORT)",
                },
                source,
            })?;
        let bound = listener.local_addr().unwrap_or(addr);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("hw-metrics".into())
            .spawn(move || serve(listener, source, stopped))
            .map_err(MetricsError::Thread)?;
        Ok(MetricsServer {
            addr: bound,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens (the port picked, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(
    listener: std::net::TcpListener,
    source: Arc<dyn Exposition>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the metrics server's runtime: /metrics is not served");
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(error = %e, "cannot serve metrics");
                return;
            }
        };
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        loop {
            let stream = tokio::select! {
                _ = &mut stopped => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors, say: wait rather than spin.
                        tracing::debug!(error = %e, "metrics server: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                drop(stream);
                continue;
            };
            let source = Arc::clone(&source);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<_>| {
                    let response = respond(&request, &*source);
                    async move { Ok::<_, Infallible>(response) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_DEADLINE)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                let _ = tokio::time::timeout(CONNECTION_DEADLINE, connection).await;
                drop(slot);
            });
        }
    });
    runtime.shutdown_timeout(Duration::from_millis(500));
}

fn respond<B>(request: &Request<B>, source: &dyn Exposition) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = content_type.parse() {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    };
    let text = "text/plain; charset=utf-8";
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            text,
            "only GET is served here\n".into(),
        );
    }
    match request.uri().path() {
        "/metrics" => reply(StatusCode::OK, crate::CONTENT_TYPE, source.exposition()),
        "/" => reply(
            StatusCode::OK,
            text,
            "hangwatch: the metrics are at /metrics (docs/metrics.md)\n".into(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            text,
            "not found: the metrics are at /metrics\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    }

    #[test]
    fn serves_metrics_a_hint_and_404_then_stops_on_drop() {
        let metrics = Arc::new(crate::AgentMetrics::new("1", "n"));
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), metrics.clone()).unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        let reply = get(addr, "/metrics");
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.contains("text/plain; version=0.0.4"), "{reply}");
        assert!(reply.contains("# TYPE hangwatch_job_up gauge"), "{reply}");
        assert!(get(addr, "/").contains("/metrics"));
        assert!(get(addr, "/nope").starts_with("HTTP/1.1 404"));
        drop(server);
        assert!(std::net::TcpStream::connect(addr).is_err());
    }

    /// This process's open file descriptors.
    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
    }

    #[test]
    fn two_thousand_idle_connections_hold_no_more_than_the_cap_and_a_scrape_is_still_answered() {
        // The test's own end of 2,000 connections needs descriptors too.
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        if hard < 4500 {
            eprintln!(
                "SKIPPED: RLIMIT_NOFILE hard limit {hard} is below what 2,000 connections need"
            );
            return;
        }
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
        let metrics = Arc::new(crate::AgentMetrics::new("1", "n"));
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), metrics).unwrap();
        let addr = server.local_addr();
        let before = open_fds();
        let idle: Vec<std::net::TcpStream> = (0..2000)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        // Both ends live in this process: the client's 2,000, and the server's accepted ones (at most the cap, and a
        // few of its runtime's own).
        let held_by_server = open_fds().saturating_sub(before + idle.len());
        assert!(
            held_by_server <= MAX_CONNECTIONS + 8,
            "the server holds {held_by_server} descriptors for idle connections"
        );
        // The idle ones are closed after the header deadline; then a scrape gets through.
        std::thread::sleep(HEADER_DEADLINE + Duration::from_secs(1));
        let reply = get(addr, "/metrics");
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        drop(idle);
    }

    #[test]
    fn a_taken_port_says_which_address_and_what_to_do() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err =
            MetricsServer::start(addr, Arc::new(crate::AgentMetrics::new("1", "n"))).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&addr.to_string()), "{text}");
        assert!(text.contains("pick another port"), "{text}");
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen_addr(":9400").unwrap(),
            "0.0.0.0:9400".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("127.0.0.1:9400").unwrap(),
            "127.0.0.1:9400".parse().unwrap()
        );
        assert!(parse_listen_addr("9400").is_err());
        assert!(parse_listen_addr(":x").is_err());
    }
}
