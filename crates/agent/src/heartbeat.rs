//! The heartbeat socket: a Unix datagram socket the ranks' Python clients send to (`HANGWATCH_SOCKET`).
//! One thread receives, parses and forwards; log records go straight to the log sink.

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use crate::output::LineSink;
use crate::supervise::Event;
use crate::wire::{parse_datagram, ClientMessage};

/// Counters of the heartbeat socket, for the evidence bundle.
#[derive(Debug, Default)]
pub struct HeartbeatStats {
    pub received: AtomicU64,
    pub malformed: AtomicU64,
    /// Messages the clients dropped (gaps in their sequence numbers).
    pub client_dropped: AtomicU64,
}

/// The bound socket; removes its file when dropped.
#[derive(Debug)]
pub struct HeartbeatSocket {
    path: PathBuf,
    pub stats: Arc<HeartbeatStats>,
}

impl HeartbeatSocket {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HeartbeatSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `path` and starts the receiver thread.
pub fn start(
    path: &Path,
    events: Sender<Event>,
    sink: Option<Arc<dyn LineSink>>,
) -> std::io::Result<HeartbeatSocket> {
    let _ = std::fs::remove_file(path);
    let socket = UnixDatagram::bind(path)?;
    // The queue of a Unix datagram socket is bounded by net.unix.max_dgram_qlen (10 by default) whatever the buffer
    // size: this thread does nothing but receive, so that clients rarely find it full (they drop beats rather than
    // block, and keep log records queued on their side).
    let _ = nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBuf, &(4 << 20));
    let stats = Arc::new(HeartbeatStats::default());
    let thread_stats = Arc::clone(&stats);
    std::thread::Builder::new()
        .name("hw-heartbeat".into())
        .spawn(move || receive_loop(socket, events, sink, thread_stats))?;
    Ok(HeartbeatSocket {
        path: path.to_path_buf(),
        stats,
    })
}

fn receive_loop(
    socket: UnixDatagram,
    events: Sender<Event>,
    sink: Option<Arc<dyn LineSink>>,
    stats: Arc<HeartbeatStats>,
) {
    let mut buf = vec![0u8; 66_000];
    let mut drops = DropCounter::default();
    loop {
        let n = match socket.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        let at = Instant::now();
        stats.received.fetch_add(1, Ordering::Relaxed);
        let message = match parse_datagram(&buf[..n]) {
            Ok(m) => m,
            Err(e) => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "ignored a datagram on the heartbeat socket");
                continue;
            }
        };
        let header = message.header();
        drops.observe(header.pid, header.seq);
        stats
            .client_dropped
            .store(drops.dropped(), Ordering::Relaxed);
        if let (ClientMessage::Log { text, .. }, Some(sink)) = (&message, &sink) {
            let mut line = match header.rank {
                Some(r) => format!("[rank {r}] {text}"),
                None => text.clone(),
            };
            if !line.ends_with('\n') {
                line.push('\n');
            }
            sink.push(line.into_bytes());
        }
        if events.send(Event::Client { message, at }).is_err() {
            return;
        }
    }
}

/// Counts the messages clients dropped, from gaps in each sender's sequence numbers. Keeps the highest seq seen:
/// two threads of one rank can send out of order, and a late lower seq fills a gap counted before.
#[derive(Debug, Default)]
pub struct DropCounter {
    highest: HashMap<i32, u64>,
    dropped: u64,
}

impl DropCounter {
    pub fn observe(&mut self, pid: i32, seq: u64) {
        let highest = self.highest.entry(pid).or_insert(0);
        if seq > *highest {
            self.dropped += seq - *highest - 1;
            *highest = seq;
        } else if seq < *highest {
            self.dropped = self.dropped.saturating_sub(1);
        }
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_drops_and_late_arrivals_fill_them() {
        let mut d = DropCounter::default();
        for seq in [1, 2, 5] {
            d.observe(10, seq);
        }
        assert_eq!(d.dropped(), 2);
        d.observe(10, 3);
        assert_eq!(d.dropped(), 1, "seq 3 arrived late: it was not dropped");
        d.observe(11, 1);
        d.observe(11, 2);
        assert_eq!(d.dropped(), 1, "senders are counted apart");
    }

    #[test]
    fn a_first_message_after_drops_counts_them() {
        let mut d = DropCounter::default();
        d.observe(7, 4);
        assert_eq!(d.dropped(), 3);
    }
}
