//! The heartbeat socket: a Unix datagram socket the ranks' Python clients send to (`HANGWATCH_SOCKET`).
//! One thread receives, checks that the sender is a process of the job (`SCM_CREDENTIALS`, [`JobMembers`]),
//! parses, and passes on: beats to the [`ProgressBoard`], phases to the supervision loop on its bounded channel,
//! log records straight to the log sink. Everything else is dropped and counted in [`HeartbeatStats`].

use std::collections::HashMap;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use hangwatch_diagnosis::ProgressSource;
use nix::sys::socket::{
    self, sockopt, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};

use crate::collectives::CollectivesDesk;
use crate::events::Event;
pub use crate::events::{ClientRank, PhaseMessage};
use crate::members::JobMembers;
use crate::output::LineSink;
use crate::progress::ProgressBoard;
use crate::wire::{parse_datagram, ClientMessage};

/// Counters of the heartbeat socket, for the evidence bundle.
#[derive(Debug, Default)]
pub struct HeartbeatStats {
    pub received: AtomicU64,
    pub malformed: AtomicU64,
    /// Messages the clients dropped (gaps in their sequence numbers).
    pub client_dropped: AtomicU64,
    /// Datagrams from a process that is not a registered process of the job nor a descendant of one.
    pub rejected_not_in_job: AtomicU64,
    /// Datagrams whose rank field is not the rank of the job process the sender descends from.
    pub rejected_wrong_rank: AtomicU64,
    /// Datagrams without the sender's credentials (they carried file descriptors, or the kernel gave none).
    pub rejected_no_credentials: AtomicU64,
    /// Phase messages dropped because the supervision loop's channel was full (their progress still counts).
    pub phases_dropped: AtomicU64,
}

/// [`HeartbeatStats`] at one moment, as the evidence's `run.json` has it under `heartbeats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HeartbeatCounts {
    pub received: u64,
    pub malformed: u64,
    pub dropped_by_clients: u64,
    pub rejected: RejectedCounts,
    pub phases_dropped: u64,
}

/// Datagrams refused, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RejectedCounts {
    pub not_in_job: u64,
    pub wrong_rank: u64,
    pub no_credentials: u64,
}

impl HeartbeatStats {
    pub fn counts(&self) -> HeartbeatCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        HeartbeatCounts {
            received: get(&self.received),
            malformed: get(&self.malformed),
            dropped_by_clients: get(&self.client_dropped),
            rejected: RejectedCounts {
                not_in_job: get(&self.rejected_not_in_job),
                wrong_rank: get(&self.rejected_wrong_rank),
                no_credentials: get(&self.rejected_no_credentials),
            },
            phases_dropped: get(&self.phases_dropped),
        }
    }
}

/// Where the receiver passes messages on.
#[derive(Clone)]
pub struct HeartbeatContext {
    /// The supervision loop's bounded event channel (phases only; `try_send`, never blocks).
    pub events: SyncSender<Event>,
    pub board: Arc<ProgressBoard>,
    pub members: Arc<JobMembers>,
    pub sink: Option<Arc<dyn LineSink>>,
}

/// The bound socket; removes its file when dropped.
pub struct HeartbeatSocket {
    path: PathBuf,
    pub stats: Arc<HeartbeatStats>,
    /// Where roll calls ask the ranks for their Flight Recorder (requests leave from this socket).
    pub collectives: Arc<CollectivesDesk>,
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

/// Binds `path` (mode 0600, with `SO_PASSCRED`) and starts the receiver thread.
pub fn start(path: &Path, ctx: HeartbeatContext) -> std::io::Result<HeartbeatSocket> {
    let _ = std::fs::remove_file(path);
    let socket = bind_private(path)?;
    let stats = Arc::new(HeartbeatStats::default());
    let thread_stats = Arc::clone(&stats);
    let collectives = Arc::new(CollectivesDesk::new(socket.try_clone()?));
    let desk = Arc::clone(&collectives);
    std::thread::Builder::new()
        .name("hw-heartbeat".into())
        .spawn(move || receive_loop(socket, ctx, thread_stats, &desk))?;
    Ok(HeartbeatSocket {
        path: path.to_path_buf(),
        stats,
        collectives,
    })
}

/// A datagram socket bound at `path` whose file is 0600 from the moment it exists: the mode is set on the
/// unbound socket, and Linux creates the file with it (less the umask), so there is no moment when another user
/// could connect. The kernel attaches every sender's credentials (`SO_PASSCRED`, set before anyone can send).
fn bind_private(path: &Path) -> std::io::Result<UnixDatagram> {
    let fd: OwnedFd = socket::socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    nix::sys::stat::fchmod(
        fd.as_raw_fd(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )?;
    socket::setsockopt(&fd, sockopt::PassCred, &true)?;
    // The queue of a Unix datagram socket is bounded by net.unix.max_dgram_qlen (10 by default) whatever the buffer
    // size: this thread does nothing but receive, so that clients rarely find it full (they drop beats rather than
    // block, and keep log records queued on their side).
    let _ = socket::setsockopt(&fd, sockopt::RcvBuf, &(4 << 20));
    socket::bind(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    let mode = std::fs::symlink_metadata(path)?.permissions().mode() & 0o777;
    if mode != 0o600 {
        // Not Linux's behaviour; SO_PASSCRED still keeps strangers out, so tighten it and carry on.
        tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "the heartbeat socket was not created 0600; fixing its mode");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(UnixDatagram::from(fd))
}

/// One datagram, the pid the kernel says sent it, and the address it came from.
fn receive(
    socket: &UnixDatagram,
    buf: &mut [u8],
    cmsg: &mut Vec<u8>,
) -> std::io::Result<(usize, Option<i32>, Option<UnixAddr>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<UnixAddr>(
        socket.as_raw_fd(),
        &mut iov,
        Some(cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    // Control data cut short (the sender passed file descriptors besides): no trusted credentials.
    let pid = msg.cmsgs().ok().and_then(|mut cmsgs| {
        cmsgs.find_map(|c| match c {
            ControlMessageOwned::ScmCredentials(creds) => Some(creds.pid()),
            _ => None,
        })
    });
    Ok((msg.bytes, pid.filter(|p| *p > 0), msg.address))
}

fn receive_loop(
    socket: UnixDatagram,
    ctx: HeartbeatContext,
    stats: Arc<HeartbeatStats>,
    collectives: &CollectivesDesk,
) {
    let mut buf = vec![0u8; 66_000];
    let mut cmsg = nix::cmsg_space!(nix::sys::socket::UnixCredentials);
    let mut drops = DropCounter::default();
    loop {
        let (n, sender, address) = match receive(&socket, &mut buf, &mut cmsg) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::error!(error = %e, "the heartbeat socket failed; beats are no longer received");
                return;
            }
        };
        let at = Instant::now();
        stats.received.fetch_add(1, Ordering::Relaxed);
        let Some(sender) = sender else {
            stats
                .rejected_no_credentials
                .fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let Some(member) = ctx.members.who(sender) else {
            stats.rejected_not_in_job.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                pid = sender,
                "ignored a datagram from a process outside the job"
            );
            continue;
        };
        let message = match parse_datagram(&buf[..n]) {
            Ok(m) => m,
            Err(e) => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "ignored a datagram on the heartbeat socket");
                continue;
            }
        };
        let header = message.header();
        if let ClientMessage::Rank {
            rank,
            local_rank,
            world_size,
            ..
        } = message
        {
            // The process says who it is: this is how a guess from the tree is corrected, so its number is not
            // checked against the one known so far.
            drops.observe(sender, header.seq);
            let report = ClientRank {
                pid: sender,
                rank,
                local_rank,
                world_size,
            };
            if let Err(TrySendError::Disconnected(_)) =
                ctx.events.try_send(Event::ClientRank(report))
            {
                return;
            }
            continue;
        }
        let rank = match (member.rank, header.rank) {
            (Some(known), Some(said)) if known != said => {
                stats.rejected_wrong_rank.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    pid = sender,
                    known,
                    said,
                    "ignored a datagram with another rank's number"
                );
                continue;
            }
            (known, said) => known.or(said),
        };
        drops.observe(sender, header.seq);
        stats
            .client_dropped
            .store(drops.dropped(), Ordering::Relaxed);
        match message {
            ClientMessage::Beat { step, .. } => {
                ctx.board.record(rank, ProgressSource::Heartbeat, at, step);
            }
            ClientMessage::Phase { begin, name, .. } => {
                let phase = PhaseMessage {
                    rank,
                    begin,
                    name,
                    at,
                };
                match ctx.events.try_send(Event::Phase(phase)) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => {
                        // The phase is lost, its progress is not.
                        ctx.board.record(rank, ProgressSource::Heartbeat, at, None);
                        let dropped = stats.phases_dropped.fetch_add(1, Ordering::Relaxed) + 1;
                        if dropped.is_power_of_two() {
                            tracing::warn!(
                                dropped,
                                "the supervision loop is behind; phase messages were dropped"
                            );
                        }
                    }
                    Err(TrySendError::Disconnected(_)) => return,
                }
            }
            ClientMessage::Log { text, .. } => {
                if let Some(sink) = &ctx.sink {
                    let mut line = match rank {
                        Some(r) => format!("[rank {r}] {text}"),
                        None => text,
                    };
                    if !line.ends_with('\n') {
                        line.push('\n');
                    }
                    sink.push(line.into_bytes());
                }
            }
            ClientMessage::Listen { what, .. } => {
                if let (true, Some(address)) = (what == "collectives", address) {
                    collectives.listening(sender, address);
                }
            }
            ClientMessage::Collectives { request, json, .. } => {
                collectives.answer(sender, request, json.into_bytes());
            }
            ClientMessage::Hello { .. } | ClientMessage::Rank { .. } => {}
        }
    }
}

/// The most senders whose sequence numbers are followed. When a new sender comes and the table is full, the one
/// heard from longest ago is forgotten (senders come and go: DataLoader workers exit every epoch); if it speaks
/// again its numbers are followed afresh, and the gap before its next number counts as dropped.
pub const MAX_SENDERS: usize = 4096;

/// Counts the messages clients dropped, from gaps in each sender's sequence numbers. Keeps the highest seq seen:
/// two threads of one rank can send out of order, and a late lower seq fills a gap counted before.
#[derive(Debug, Default)]
pub struct DropCounter {
    /// pid -> (highest seq, when last heard, in messages observed).
    highest: HashMap<i32, (u64, u64)>,
    observed: u64,
    dropped: u64,
}

impl DropCounter {
    /// `pid` is the sender's pid as the kernel gives it.
    pub fn observe(&mut self, pid: i32, seq: u64) {
        self.observed += 1;
        if self.highest.len() >= MAX_SENDERS && !self.highest.contains_key(&pid) {
            let oldest = self
                .highest
                .iter()
                .min_by_key(|(_, (_, heard))| *heard)
                .map(|(pid, _)| *pid);
            if let Some(oldest) = oldest {
                self.highest.remove(&oldest);
            }
        }
        let (highest, heard) = self.highest.entry(pid).or_insert((0, 0));
        *heard = self.observed;
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

    /// How many senders are followed.
    pub fn senders(&self) -> usize {
        self.highest.len()
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

    #[test]
    fn senders_are_bounded_and_the_longest_silent_is_forgotten_first() {
        let mut d = DropCounter::default();
        d.observe(1, 1);
        for pid in 2..(MAX_SENDERS as i32 + 1) {
            d.observe(pid, 1);
        }
        d.observe(1, 2);
        assert_eq!(d.senders(), MAX_SENDERS);
        d.observe(100_000, 1);
        assert_eq!(d.senders(), MAX_SENDERS);
        assert_eq!(d.dropped(), 0);
        d.observe(1, 3);
        assert_eq!(d.dropped(), 0, "pid 1 spoke recently: still followed");
        d.observe(2, 2);
        assert_eq!(
            d.dropped(),
            1,
            "pid 2 was silent longest and forgotten: its next number counts from 0"
        );
    }

    /// A real socket, with this test process as the sender.
    fn socket_with(
        members: JobMembers,
    ) -> (
        tempfile::TempDir,
        HeartbeatSocket,
        Arc<ProgressBoard>,
        std::sync::mpsc::Receiver<Event>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let board = Arc::new(ProgressBoard::new());
        let ctx = HeartbeatContext {
            events: tx,
            board: Arc::clone(&board),
            members: Arc::new(members),
            sink: None,
        };
        let socket = start(&dir.path().join("hb.sock"), ctx).unwrap();
        (dir, socket, board, rx)
    }

    fn wait_received(socket: &HeartbeatSocket, n: u64) {
        let end = Instant::now() + std::time::Duration::from_secs(20);
        while socket.stats.received.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < end, "the receiver never got {n} datagrams");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn the_socket_file_is_private_and_strangers_are_counted_not_heard() {
        let (_dir, socket, board, _rx) = socket_with(JobMembers::new());
        let mode = std::fs::metadata(socket.path())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        let client = UnixDatagram::unbound().unwrap();
        client.send_to(b"hw1 beat 0 1 1 5", socket.path()).unwrap();
        wait_received(&socket, 1);
        assert_eq!(socket.stats.counts().rejected.not_in_job, 1);
        assert!(board.take_updates().is_empty());
    }

    #[test]
    fn a_member_is_heard_as_its_own_rank_and_may_not_speak_for_another() {
        let members = JobMembers::new();
        assert!(members.register_live(std::process::id() as i32, Some(2)));
        let (_dir, socket, board, rx) = socket_with(members);
        let client = UnixDatagram::unbound().unwrap();
        for msg in [
            &b"hw1 beat 2 1 1 7"[..],
            b"hw1 beat 3 1 2 8",
            b"hw1 beat - 1 3 9",
            b"hw1 phase 2 1 4 begin save",
            b"hw1 phase 2 1 5 end save",
        ] {
            client.send_to(msg, socket.path()).unwrap();
        }
        wait_received(&socket, 5);
        let end = Instant::now() + std::time::Duration::from_secs(20);
        while socket.stats.counts().phases_dropped == 0 {
            assert!(
                Instant::now() < end,
                "the last phase message was never handled"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let counts = socket.stats.counts();
        assert_eq!(counts.rejected.wrong_rank, 1, "{counts:?}");
        assert_eq!(
            counts.phases_dropped, 1,
            "the channel holds one: the end was dropped"
        );
        let updates = board.take_updates();
        assert_eq!(updates.len(), 1, "{updates:?}");
        let beats = updates[0];
        assert_eq!(
            (beats.rank, beats.source, beats.count, beats.step),
            (Some(2), ProgressSource::Heartbeat, 3, Some(9)),
            "a rank-less beat is the sender's rank's; a dropped phase still counts as progress"
        );
        let Ok(Event::Phase(phase)) = rx.try_recv() else {
            panic!("the phase begin is an event")
        };
        assert_eq!(
            (phase.rank, phase.begin, phase.name.as_str()),
            (Some(2), true, "save")
        );
    }
}
