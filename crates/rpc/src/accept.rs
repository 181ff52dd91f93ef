//! The coordinator's side of the link: TCP connections accepted, each taken through the TLS handshake with the
//! job's key under a deadline and within caps on handshakes in flight, and handed to the gRPC server only once
//! the peer has proven the key. A stranger holds at most a few handshake slots for a few seconds and is never
//! read past the handshake.

use std::collections::HashMap;
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

use crate::tls::LinkKey;

/// How long a connection may take to prove the job's key. A handshake takes milliseconds; the rest is a peer that
/// says nothing (an idle stranger) or a wrong one.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// Handshakes in flight at once, all peers together. Beyond it a new connection is closed at once (an agent
/// retries within seconds); those already joined are not affected.
pub const MAX_HANDSHAKES: usize = 1024;

/// Handshakes in flight from one address: one node's agent needs one, so a stranger on one host cannot take the
/// slots of every other node.
pub const MAX_HANDSHAKES_PER_ADDRESS: usize = 64;

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

/// Handshake slots in use, in total and per peer address.
#[derive(Default)]
struct Slots {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

impl Slots {
    fn take(&mut self, ip: IpAddr) -> bool {
        let mine = self.by_address.entry(ip).or_default();
        if self.total >= MAX_HANDSHAKES || *mine >= MAX_HANDSHAKES_PER_ADDRESS {
            return false;
        }
        *mine += 1;
        self.total += 1;
        true
    }

    fn give_back(&mut self, ip: IpAddr) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.by_address.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_address.remove(&ip);
            }
        }
    }
}

/// A slot held for the length of one handshake.
struct Slot {
    slots: Arc<Mutex<Slots>>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.slots).give_back(self.ip);
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
    let slots = Arc::new(Mutex::new(Slots::default()));
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
            if !lock(&slots).take(peer.ip()) {
                drop(tcp);
                lock(&refusals).note(peer, "too many handshakes in flight");
                continue;
            }
            let slot = Slot {
                slots: Arc::clone(&slots),
                ip: peer.ip(),
            };
            let (acceptor, tx, refusals) = (acceptor.clone(), tx.clone(), Arc::clone(&refusals));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_cannot_take_every_handshake_slot() {
        let mut slots = Slots::default();
        let stranger: IpAddr = [10, 0, 0, 9].into();
        let agent: IpAddr = [10, 0, 0, 2].into();
        let taken = (0..1000).filter(|_| slots.take(stranger)).count();
        assert_eq!(taken, MAX_HANDSHAKES_PER_ADDRESS);
        assert!(slots.take(agent), "another node still gets a slot");
        slots.give_back(stranger);
        assert!(slots.take(stranger), "a slot given back is free again");
        for _ in 0..MAX_HANDSHAKES_PER_ADDRESS {
            slots.give_back(stranger);
        }
        slots.give_back(agent);
        assert_eq!(slots.total, 0);
        assert!(slots.by_address.is_empty());
    }
}
