//! The coordinator's side of the link: TCP connections accepted, each taken through the TLS handshake with the
//! job's key under a deadline and within a fair budget of handshakes in flight (crate::budget), and handed to the
//! gRPC server only once the peer has proven the key. A stranger holds at most a few handshake slots for a few
//! seconds and is never read past the handshake.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::budget::{Admission, HandshakeBudget};
use crate::tls::LinkKey;

/// How long a connection may take to prove the job's key. A handshake takes milliseconds; the rest is a peer that
/// says nothing (an idle stranger) or a wrong one.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// How often a refused-connection summary is logged at most.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// One accepted connection whose peer proved the job's key.
pub struct LinkConnection {
    tls: TlsStream<TcpStream>,
    info: TcpConnectInfo,
}

impl Connected for LinkConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for LinkConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for LinkConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }
}

/// A slot held for the length of one handshake.
struct Slot {
    budget: Arc<Mutex<HandshakeBudget>>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.budget).finished(self.ip);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Connections refused since the last summary, so that a port scan or a flood is one log line a minute.
#[derive(Default)]
struct Refusals {
    since_last: u64,
    last_logged: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, peer: SocketAddr, why: &str) {
        self.since_last += 1;
        let now = Instant::now();
        if self
            .last_logged
            .is_some_and(|t| now.duration_since(t) < REFUSAL_LOG_EVERY)
        {
            return;
        }
        tracing::warn!(
            %peer,
            why,
            refused = self.since_last,
            "refused connections that did not prove the job's key (at most one such line a minute)"
        );
        self.since_last = 0;
        self.last_logged = Some(now);
    }
}

/// Why a peer failed the handshake, in words that point at the usual cause.
fn handshake_failure(e: &io::Error) -> String {
    match crate::tls::tls_error(e) {
        Some(rustls::Error::InvalidMessage(_)) => {
            format!(
                "it does not speak TLS: an agent older than the link's TLS, or not hangwatch ({e})"
            )
        }
        Some(rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_)) => {
            format!("it holds another key, or refused this one: another token file or job id ({e})")
        }
        _ => e.to_string(),
    }
}

/// Accepts on `listener` until the returned stream is dropped: each connection goes through the TLS handshake with
/// `key` in a task of its own, and only those that complete it come out of the stream.
pub fn accept_link(
    listener: TcpListener,
    key: &LinkKey,
) -> ReceiverStream<io::Result<LinkConnection>> {
    let (tx, rx) = mpsc::channel::<io::Result<LinkConnection>>(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(key.server_config());
    let budget = Arc::new(Mutex::new(HandshakeBudget::new()));
    let refusals = Arc::new(Mutex::new(Refusals::default()));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, most likely: let some connections end before trying again.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let admission = lock(&budget).admit(peer.ip());
            if admission != Admission::Admitted {
                drop(tcp);
                lock(&refusals).note(peer, admission.reason());
                continue;
            }
            let slot = Slot {
                budget: Arc::clone(&budget),
                ip: peer.ip(),
            };
            let (acceptor, tx, refusals) = (acceptor.clone(), tx.clone(), Arc::clone(&refusals));
            let budget_after = Arc::clone(&budget);
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let info = TcpConnectInfo {
                    local_addr: tcp.local_addr().ok(),
                    remote_addr: Some(peer),
                };
                let handshake =
                    tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp)).await;
                drop(slot);
                match handshake {
                    Ok(Ok(tls)) => {
                        tracing::debug!(%peer, "a peer proved the job's key");
                        lock(&budget_after).proved(peer.ip());
                        let _ = tx.send(Ok(LinkConnection { tls, info })).await;
                    }
                    Ok(Err(e)) => lock(&refusals).note(peer, &handshake_failure(&e)),
                    Err(_) => lock(&refusals).note(peer, "no TLS handshake in time"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
