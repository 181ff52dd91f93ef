//! Sockets a rank waits on, as the rank's own network namespace describes them, and the process at the other end
//! when this node has it: the next hop of a rank waiting in a socket call (docs/next-hops.md).

use serde::{Deserialize, Serialize};

use crate::ProcessObservation;

/// A thread of a process blocked in a socket call (`sendto`, `recvfrom`, `connect`, `accept`, `read`/`write` on a
/// socket, `epoll_wait` over a few sockets), with the socket found and described.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SocketWait {
    pub tid: i32,
    /// The system call by name.
    pub call: String,
    /// The socket's descriptor in the waiting process.
    pub fd: i32,
    /// The socket's inode (`socket:[INODE]`).
    pub inode: u64,
    /// The epoll descriptor the socket was found registered in, when the call is an `epoll_wait`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via_epoll: Option<i32>,
    /// The socket as the kernel describes it; `None` when it could not be found (see `unreadable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<SocketState>,
    /// The process holding the other end, when this node has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<SocketPeer>,
    /// Why the socket or its peer could not be described.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// Which kind of socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SocketProtocol {
    Tcp,
    Udp,
    UnixStream,
    UnixDgram,
    UnixSeqpacket,
    #[default]
    Other,
}

impl SocketProtocol {
    /// How people name it.
    pub fn words(self) -> &'static str {
        match self {
            SocketProtocol::Tcp => "TCP",
            SocketProtocol::Udp => "UDP",
            SocketProtocol::UnixStream => "Unix stream",
            SocketProtocol::UnixDgram => "Unix datagram",
            SocketProtocol::UnixSeqpacket => "Unix seqpacket",
            SocketProtocol::Other => "socket",
        }
    }

    pub fn is_unix(self) -> bool {
        matches!(
            self,
            SocketProtocol::UnixStream | SocketProtocol::UnixDgram | SocketProtocol::UnixSeqpacket
        )
    }
}

/// A TCP connection's state (`include/net/tcp_states.h`); Unix sockets use `Established`, `Listen` and `Close`
/// (their `SS_*` states mapped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpState {
    Established,
    SynSent,
    SynRecv,
    FinWait1,
    FinWait2,
    TimeWait,
    Close,
    CloseWait,
    LastAck,
    Listen,
    Closing,
    NewSynRecv,
    Unknown,
}

impl TcpState {
    /// From the kernel's number (`TCP_ESTABLISHED` is 1).
    pub fn from_kernel(state: u8) -> TcpState {
        match state {
            1 => TcpState::Established,
            2 => TcpState::SynSent,
            3 => TcpState::SynRecv,
            4 => TcpState::FinWait1,
            5 => TcpState::FinWait2,
            6 => TcpState::TimeWait,
            7 => TcpState::Close,
            8 => TcpState::CloseWait,
            9 => TcpState::LastAck,
            10 => TcpState::Listen,
            11 => TcpState::Closing,
            12 => TcpState::NewSynRecv,
            _ => TcpState::Unknown,
        }
    }

    /// As `ss` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            TcpState::Established => "ESTAB",
            TcpState::SynSent => "SYN-SENT",
            TcpState::SynRecv => "SYN-RECV",
            TcpState::FinWait1 => "FIN-WAIT-1",
            TcpState::FinWait2 => "FIN-WAIT-2",
            TcpState::TimeWait => "TIME-WAIT",
            TcpState::Close => "CLOSE",
            TcpState::CloseWait => "CLOSE-WAIT",
            TcpState::LastAck => "LAST-ACK",
            TcpState::Listen => "LISTEN",
            TcpState::Closing => "CLOSING",
            TcpState::NewSynRecv => "NEW-SYN-RECV",
            TcpState::Unknown => "UNKNOWN",
        }
    }
}

/// Where a socket's description came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SocketSource {
    /// Netlink `sock_diag` in the process's network namespace (with `tcp_info`).
    #[default]
    SockDiag,
    /// `/proc/PID/net/{tcp,tcp6,udp,udp6,unix}`: queues and retransmissions, no `tcp_info`, no Unix peer.
    ProcNet,
}

/// A socket as its network namespace describes it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SocketState {
    pub protocol: SocketProtocol,
    /// `127.0.0.1:9000`, `[::1]:9000`, or a Unix socket's path (`@name` for an abstract one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_state: Option<TcpState>,
    /// Bytes written and not yet acknowledged by the peer (TCP, sent or not), or not yet read by it (a Unix
    /// stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_queue_bytes: Option<u64>,
    /// Of those, bytes not even sent yet (TCP, `tcpi_notsent_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsent_bytes: Option<u64>,
    /// Bytes received and not yet read by this process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recv_queue_bytes: Option<u64>,
    /// Retransmission timeouts in a row without an acknowledgement (`tcpi_retransmits`; SYNs for a connect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retransmits: Option<u32>,
    /// Segments retransmitted over the connection's life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_retransmits: Option<u32>,
    /// Zero-window (or keepalive) probes sent without an answer that opened the window (`tcpi_probes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<u32>,
    /// The peer's advertised receive window in bytes (`tcpi_snd_wnd`, Linux 6.2+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_window_bytes: Option<u64>,
    /// Milliseconds since data was last sent, received, and since the peer last acknowledged anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_data_sent_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_data_received_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ack_received_ms: Option<u64>,
    /// The inode of the socket at the other end, when the namespace has it (a Unix socket's peer, a TCP
    /// connection or listener on this node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_inode: Option<u64>,
    pub source: SocketSource,
}

impl SocketState {
    /// Whether the peer's window is known to be closed: zero advertised, or probes sent into it with data waiting.
    pub fn peer_window_zero(&self) -> bool {
        self.peer_window_bytes == Some(0)
            || (self.probes.is_some_and(|p| p > 0)
                && self.unsent_bytes.or(self.send_queue_bytes).unwrap_or(0) > 0
                && self.retransmits.unwrap_or(0) == 0)
    }
}

/// The process holding the other end of a socket a rank waits on.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SocketPeer {
    pub pid: i32,
    /// The peer socket's inode.
    pub inode: u64,
    /// It holds the listening socket the connection waits to be accepted by, not the connection itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub listener: bool,
    pub comm: Option<String>,
    /// One of the job's processes (its observation is then the roll call's own, not repeated here).
    pub in_job: bool,
    /// The peer observed as a rank is (its threads, calls and files), for a process outside the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<Box<ProcessObservation>>,
}

/// What holds a rank's socket call up, as the decision found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerFinding {
    /// The process at the other end is stopped (T/t).
    PeerStopped,
    /// The process at the other end is blocked in the kernel (D, or a filesystem wait).
    PeerBlocked,
    /// The peer's receive window is zero: it does not read what it is sent.
    WindowZero,
    /// Data sent is not acknowledged, and retransmissions time out: the network or that host.
    NoAcknowledgement,
    /// A connection's SYNs are not answered: the network or that host.
    NoAnswer,
    /// Nothing wrong seen with the connection: the rank waits for the peer to send or to accept.
    Waiting,
}

/// The process at the other end of a socket, as a verdict names it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PeerProcess {
    pub pid: i32,
    pub comm: Option<String>,
    /// Its state letter (`T`, `D`, `S`).
    pub state: Option<String>,
    pub in_job: bool,
    /// The call it waits in, and the file that call is on, when it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The rank it is, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// It holds the listener the connection waits on, not the connection.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub listener: bool,
}

/// A culprit's wait on a socket: the call, the connection and the process at the other end (`waits_on_peer` in
/// the verdict).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerWait {
    pub finding: PeerFinding,
    /// The waiting thread and its call.
    pub tid: i32,
    pub syscall: String,
    pub fd: i32,
    /// The address the rank talks to (`127.0.0.1:9000`, a Unix socket's path), when known.
    pub address: Option<String>,
    pub socket: SocketState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<PeerProcess>,
    /// How long nothing moved on the connection, in milliseconds, when the kernel says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_for_ms: Option<u64>,
    /// The finding in words: "sends to 127.0.0.1:9000 (pid 4242 python3, stopped (T)): 2.5 MB unsent, the peer's
    /// window zero for 40 s".
    pub words: String,
}

impl PeerWait {
    /// Whether the wait is what holds the rank up (a stuck peer, a closed window, an unanswered connection), not a
    /// rank waiting for a healthy peer to send.
    pub fn stuck(&self) -> bool {
        self.finding != PeerFinding::Waiting
    }
}
