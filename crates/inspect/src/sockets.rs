//! The next hop of a rank waiting on a socket: the socket found from the waiting call's descriptor (or the few
//! sockets an `epoll_wait` watches), described from the rank's own network namespace (netlink `sock_diag`, one
//! dump per namespace, in a thread that enters it and is abandoned past a deadline; `/proc/PID/net/*` when
//! netlink cannot be used), and the process at the other end when this node has it, observed as a rank is.
//!
//! Nothing here touches a filesystem a rank uses: /proc links and fdinfo, netlink and the kernel's socket tables.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::mpsc;
use std::time::Duration;

use hangwatch_model::{
    ProcessObservation, SocketPeer, SocketProtocol, SocketSource, SocketWait, SyscallObservation,
};
use hangwatch_proc::{parse_proc_net_inet, parse_proc_net_unix, socket_inode, NetSocket, ProcFs};

/// Calls that wait on the socket their first argument names.
const SOCKET_CALLS: &[&str] = &[
    "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "connect", "accept",
    "accept4", "read", "write", "readv", "writev", "sendfile", "splice",
];
/// Calls that wait on an epoll instance, whose watched sockets are read from its fdinfo.
const EPOLL_CALLS: &[&str] = &["epoll_wait", "epoll_pwait", "epoll_pwait2"];
/// An epoll over more sockets than this is an event loop over many peers (gloo's), not a wait on one: left out.
pub const MAX_EPOLL_SOCKETS: usize = 4;
/// At most this many socket waits per process are described.
pub const MAX_WAITS_PER_PROCESS: usize = 8;
/// At most this many peers' owners are looked for, and this many outside the job observed.
pub const MAX_PEERS: usize = 64;
pub const MAX_PEERS_OBSERVED: usize = 4;
/// The window a peer outside the job is observed over: none (two samples back to back). Its state and call are
/// what matter (stopped, in D, in which call on which file), and the roll call must not wait a window for them.
pub const PEER_WINDOW: Duration = Duration::ZERO;
/// How long the scan of descriptors for the peers' processes may take: a bound for a node with many processes
/// (found at once in the usual case: the peer is one of the job's waits, or a process started with the job).
pub const SCAN_BUDGET: Duration = Duration::from_millis(100);
/// How long one namespace's netlink dump may take before its thread is abandoned and /proc/PID/net read instead.
pub const DUMP_DEADLINE: Duration = Duration::from_millis(500);

/// The sockets the threads of `o` wait on (descriptor and inode only), at most [`MAX_WAITS_PER_PROCESS`].
pub fn socket_waits_of(procfs: &ProcFs, o: &ProcessObservation) -> Vec<SocketWait> {
    let mut out: Vec<SocketWait> = Vec::new();
    for t in &o.threads {
        let Some(SyscallObservation::InSyscall {
            name: Some(name),
            fd: Some(fd),
            file,
            ..
        }) = &t.syscall
        else {
            continue;
        };
        if SOCKET_CALLS.contains(&name.as_str()) {
            let inode = file.as_ref().and_then(|f| socket_inode(&f.path));
            if let Some(inode) = inode {
                out.push(SocketWait {
                    tid: t.tid,
                    call: name.clone(),
                    fd: *fd,
                    inode,
                    ..SocketWait::default()
                });
            }
        } else if EPOLL_CALLS.contains(&name.as_str()) {
            let targets = procfs.epoll_targets(o.pid, *fd).unwrap_or_default();
            let sockets: Vec<(i32, u64)> = targets
                .into_iter()
                .filter_map(|tfd| {
                    let link = procfs.fd_link(o.pid, tfd).ok()?;
                    Some((tfd, socket_inode(&link)?))
                })
                .take(MAX_EPOLL_SOCKETS + 1)
                .collect();
            if sockets.len() <= MAX_EPOLL_SOCKETS {
                out.extend(sockets.into_iter().map(|(tfd, inode)| SocketWait {
                    tid: t.tid,
                    call: name.clone(),
                    fd: tfd,
                    inode,
                    via_epoll: Some(*fd),
                    ..SocketWait::default()
                }));
            }
        }
    }
    let mut seen = HashSet::new();
    out.retain(|w| seen.insert((w.tid, w.inode)));
    out.truncate(MAX_WAITS_PER_PROCESS);
    out
}

/// The sockets of one network namespace, by inode.
#[derive(Debug, Default)]
pub struct Namespace {
    pub sockets: HashMap<u64, NetSocket>,
    pub source: Option<SocketSource>,
    /// Why netlink was not used, when it was not.
    pub fallback_why: Option<String>,
}

impl Namespace {
    /// Reads the namespace `pid` lives in: netlink in a thread that enters it (when it is not hangwatch's own),
    /// else `/proc/PID/net/*`.
    pub fn read(procfs: &ProcFs, pid: i32, own: bool) -> Namespace {
        let path = procfs.root().join(pid.to_string()).join("ns").join("net");
        match dump_in(&path, own, DUMP_DEADLINE) {
            Ok(list) => Namespace {
                sockets: list.into_iter().map(|s| (s.inode, s)).collect(),
                source: Some(SocketSource::SockDiag),
                fallback_why: None,
            },
            Err(why) => {
                tracing::debug!(pid, why = %why, "netlink sock_diag not used; reading /proc/PID/net");
                let mut sockets = HashMap::new();
                for (file, protocol) in [
                    ("tcp", SocketProtocol::Tcp),
                    ("tcp6", SocketProtocol::Tcp),
                    ("udp", SocketProtocol::Udp),
                    ("udp6", SocketProtocol::Udp),
                ] {
                    if let Ok(text) = procfs.net_table(pid, file) {
                        sockets.extend(
                            parse_proc_net_inet(&text, protocol)
                                .into_iter()
                                .map(|s| (s.inode, s)),
                        );
                    }
                }
                if let Ok(text) = procfs.net_table(pid, "unix") {
                    sockets.extend(parse_proc_net_unix(&text).into_iter().map(|s| (s.inode, s)));
                }
                Namespace {
                    source: (!sockets.is_empty()).then_some(SocketSource::ProcNet),
                    sockets,
                    fallback_why: Some(why),
                }
            }
        }
    }

    /// The socket at the other end of `socket`, and whether it is the listener the connection waits on: a Unix
    /// socket's peer, or the TCP connection (else listener) whose local address is its remote one.
    pub fn peer_of(&self, socket: &NetSocket) -> Option<(u64, bool)> {
        if let Some(peer) = socket.state.peer_inode.filter(|&i| i != 0) {
            return Some((peer, false));
        }
        if socket.state.protocol.is_unix() {
            // Connected but not yet accepted: its listener lists it among its pending connections.
            return self
                .sockets
                .values()
                .find(|s| s.pending.contains(&socket.inode))
                .map(|s| (s.inode, true));
        }
        let (Some(local), Some(remote)) = (socket.local, socket.remote) else {
            return None;
        };
        let connection = self.sockets.values().find(|s| {
            s.inode != 0
                && s.inode != socket.inode
                && s.local == Some(remote)
                && s.remote == Some(local)
        });
        if let Some(c) = connection {
            return Some((c.inode, false));
        }
        self.sockets
            .values()
            .find(|s| s.inode != 0 && s.listens_for(remote))
            .map(|s| (s.inode, true))
    }
}

/// Fills `socket_waits` of every process with a thread waiting on a socket: the socket described, its peer's
/// process found and, outside the job, observed (`window` apart). One namespace dump for all processes in it.
pub fn fill_socket_waits(
    procfs: &ProcFs,
    observations: &mut [ProcessObservation],
    window: Duration,
    clk_tck: u64,
) {
    let mut any = false;
    for o in observations.iter_mut() {
        if o.exited {
            continue;
        }
        o.socket_waits = socket_waits_of(procfs, o);
        any |= !o.socket_waits.is_empty();
    }
    if !any {
        return;
    }
    let own_ns = std::fs::read_link(procfs.root().join("self/ns/net"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let mut by_ns: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, o) in observations.iter_mut().enumerate() {
        if o.socket_waits.is_empty() {
            continue;
        }
        match procfs.net_namespace(o.pid) {
            Ok(ns) => by_ns.entry(ns).or_default().push(i),
            Err(e) => {
                for w in &mut o.socket_waits {
                    w.unreadable = Some(format!("its network namespace could not be read: {e}"));
                }
            }
        }
    }
    let mut wanted: Vec<u64> = Vec::new();
    for (ns, members) in &by_ns {
        let own = own_ns.as_deref() == Some(ns.as_str());
        let table = Namespace::read(procfs, observations[members[0]].pid, own);
        for &i in members {
            for w in &mut observations[i].socket_waits {
                let Some(socket) = table.sockets.get(&w.inode) else {
                    w.unreadable = Some(match &table.fallback_why {
                        Some(why) => format!("not found in /proc/PID/net (netlink: {why})"),
                        None => "not found in its network namespace's socket table".to_string(),
                    });
                    continue;
                };
                let mut state = socket.state.clone();
                let peer = table.peer_of(socket);
                state.peer_inode = peer.map(|(inode, _)| inode);
                // A Unix client has no name of its own: it talks to the path its peer is bound to.
                if state.remote.is_none() {
                    state.remote = peer
                        .and_then(|(inode, _)| table.sockets.get(&inode))
                        .and_then(|p| p.unix_path.clone());
                }
                w.socket = Some(state);
                if let Some((inode, listener)) = peer {
                    if wanted.len() < MAX_PEERS && !wanted.contains(&inode) {
                        wanted.push(inode);
                    }
                    w.peer = Some(SocketPeer {
                        inode,
                        listener,
                        ..SocketPeer::default()
                    });
                }
            }
        }
    }
    if wanted.is_empty() {
        return;
    }
    let job: Vec<i32> = observations.iter().map(|o| o.pid).collect();
    let known: HashMap<u64, i32> = observations
        .iter()
        .flat_map(|o| o.socket_waits.iter().map(move |w| (w.inode, o.pid)))
        .collect();
    let owners = owners_of(procfs, &wanted, &known, &job, SCAN_BUDGET);
    let outside: Vec<i32> = {
        let mut v: Vec<i32> = owners
            .values()
            .copied()
            .filter(|p| !job.contains(p))
            .collect();
        v.sort_unstable();
        v.dedup();
        v.truncate(MAX_PEERS_OBSERVED);
        v
    };
    let observed: HashMap<i32, ProcessObservation> = std::thread::scope(|s| {
        let handles: Vec<_> = outside
            .iter()
            .map(|&pid| {
                s.spawn(move || {
                    (
                        pid,
                        procfs
                            .observe_process(pid, PEER_WINDOW.min(window), clk_tck)
                            .ok(),
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().ok())
            .filter_map(|(pid, o)| Some((pid, o?)))
            .collect()
    });
    for o in observations.iter_mut() {
        for w in &mut o.socket_waits {
            let Some(peer) = w.peer.as_mut() else {
                continue;
            };
            match owners.get(&peer.inode) {
                Some(&pid) => {
                    peer.pid = pid;
                    peer.in_job = job.contains(&pid);
                    peer.comm = procfs.stat(pid).ok().map(|s| s.comm);
                    peer.observation = observed.get(&pid).cloned().map(Box::new);
                }
                None => {
                    let inode = peer.inode;
                    w.peer = None;
                    w.unreadable = Some(format!(
                        "the process holding the other end (socket {inode}) was not found within {} ms of \
                         descriptor scan",
                        SCAN_BUDGET.as_millis()
                    ));
                }
            }
        }
    }
}

/// Which process holds each socket inode: those the job's own waits name are known; the rest by a scan of
/// descriptors (`readlink`), everyone outside the job newest first (a store or sidecar the job talks to was most
/// likely started with it, after the node's daemons), then the job's processes, stopping once all are found or
/// after `budget`.
fn owners_of(
    procfs: &ProcFs,
    inodes: &[u64],
    known: &HashMap<u64, i32>,
    job: &[i32],
    budget: Duration,
) -> HashMap<u64, i32> {
    let mut found: HashMap<u64, i32> = inodes
        .iter()
        .filter_map(|i| Some((*i, *known.get(i)?)))
        .collect();
    let started = std::time::Instant::now();
    let own = std::process::id();
    let mut pids = procfs.pids();
    pids.sort_unstable_by(|a, b| b.cmp(a));
    let others = pids
        .into_iter()
        .filter(|p| !job.contains(p) && u32::try_from(*p).ok() != Some(own));
    for pid in others.chain(job.iter().copied()) {
        if found.len() == inodes.len() || started.elapsed() > budget {
            break;
        }
        for fd in procfs.open_fds(pid).unwrap_or_default() {
            let Some(inode) = procfs.fd_link(pid, fd).ok().and_then(|l| socket_inode(&l)) else {
                continue;
            };
            if inodes.contains(&inode) {
                found.entry(inode).or_insert(pid);
            }
        }
    }
    found
}

/// Dumps the sockets of the namespace at `ns_path` through netlink: here when it is hangwatch's own (`own`), else
/// in a thread that enters it, waited for at most `deadline` (a thread that does not answer by then is left to
/// finish alone; it is never reused, being in another namespace).
fn dump_in(
    ns_path: &std::path::Path,
    own: bool,
    deadline: Duration,
) -> Result<Vec<NetSocket>, String> {
    if own {
        // No namespace to enter: the dump runs here, each receive bounded by the socket's timeout.
        return diag::dump(deadline);
    }
    let ns = std::fs::File::open(ns_path)
        .map_err(|e| format!("cannot open {}: {e}", ns_path.display()))?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("hw-sock-diag".into())
        .spawn(move || {
            let result = nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("cannot enter its network namespace: {e}"))
                .and_then(|()| diag::dump(deadline));
            let _ = tx.send(result);
        })
        .map_err(|e| format!("cannot start the netlink thread: {e}"))?;
    rx.recv_timeout(deadline)
        .map_err(|_| format!("netlink did not answer within {} ms", deadline.as_millis()))?
}

/// The netlink `sock_diag` requests and their answers.
mod diag {
    use std::time::Duration;

    use hangwatch_model::{SocketProtocol, SocketSource, SocketState, TcpState};
    use hangwatch_proc::{addr_words, parse_tcp_info, unix_protocol, NetSocket};
    use netlink_packet_core::{
        NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
    };
    use netlink_packet_sock_diag::inet::{
        nlas::Nla as InetNla, ExtensionFlags, InetRequest, SocketId, StateFlags,
    };
    use netlink_packet_sock_diag::unix::{
        nlas::Nla as UnixNla, ShowFlags, StateFlags as UnixStates, UnixRequest,
    };
    use netlink_packet_sock_diag::{SockDiagMessage, AF_INET, AF_INET6, IPPROTO_TCP};
    use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};

    pub(super) fn dump(deadline: Duration) -> Result<Vec<NetSocket>, String> {
        let mut socket =
            Socket::new(NETLINK_SOCK_DIAG).map_err(|e| format!("netlink socket: {e}"))?;
        socket
            .bind_auto()
            .map_err(|e| format!("netlink bind: {e}"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| format!("netlink connect: {e}"))?;
        let timeout = nix::sys::time::TimeVal::new(
            i64::try_from(deadline.as_secs()).unwrap_or(1),
            i64::from(deadline.subsec_micros()),
        );
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| format!("netlink timeout: {e}"))?;
        let mut out = Vec::new();
        for (family, socket_id) in [
            (AF_INET, SocketId::new_v4()),
            (AF_INET6, SocketId::new_v6()),
        ] {
            let request = SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::INFO,
                states: StateFlags::all(),
                socket_id,
            });
            exchange(&socket, request, &mut out)?;
        }
        let request = SockDiagMessage::UnixRequest(UnixRequest {
            state_flags: UnixStates::from_bits_retain(u32::MAX),
            inode: 0,
            show_flags: ShowFlags::NAME | ShowFlags::PEER | ShowFlags::RQLEN | ShowFlags::ICONS,
            cookie: [0xff; 8],
        });
        exchange(&socket, request, &mut out)?;
        Ok(out)
    }

    fn exchange(
        socket: &Socket,
        request: SockDiagMessage,
        out: &mut Vec<NetSocket>,
    ) -> Result<(), String> {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut packet = NetlinkMessage::new(header, request.into());
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf[..]);
        socket
            .send(&buf[..], 0)
            .map_err(|e| format!("netlink send: {e}"))?;
        let mut receive: Vec<u8> = Vec::with_capacity(1 << 16);
        loop {
            receive.clear();
            let size = socket
                .recv(&mut receive, 0)
                .map_err(|e| format!("netlink receive: {e}"))?;
            let size = size.min(receive.len());
            let mut offset = 0;
            while offset < size {
                let message =
                    <NetlinkMessage<SockDiagMessage>>::deserialize(&receive[offset..size])
                        .map_err(|e| format!("netlink message: {e}"))?;
                let length = message.header.length as usize;
                match message.payload {
                    NetlinkPayload::Done(_) => return Ok(()),
                    NetlinkPayload::Error(e) => return Err(format!("netlink error: {e}")),
                    NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                        out.push(inet(&r))
                    }
                    NetlinkPayload::InnerMessage(SockDiagMessage::UnixResponse(r)) => {
                        out.push(unix(&r))
                    }
                    _ => {}
                }
                if length == 0 {
                    break;
                }
                offset += length;
            }
        }
    }

    fn inet(r: &netlink_packet_sock_diag::inet::InetResponse) -> NetSocket {
        let id = &r.header.socket_id;
        let local = std::net::SocketAddr::new(id.source_address, id.source_port);
        let remote = std::net::SocketAddr::new(id.destination_address, id.destination_port);
        let connected = !remote.ip().is_unspecified() || remote.port() != 0;
        let listening = r.header.state == 10;
        let mut state = SocketState {
            protocol: SocketProtocol::Tcp,
            local: Some(addr_words(local)),
            remote: connected.then(|| addr_words(remote)),
            tcp_state: Some(TcpState::from_kernel(r.header.state)),
            send_queue_bytes: (!listening).then_some(u64::from(r.header.send_queue)),
            recv_queue_bytes: (!listening).then_some(u64::from(r.header.recv_queue)),
            source: SocketSource::SockDiag,
            ..SocketState::default()
        };
        for nla in &r.nlas {
            if let InetNla::TcpInfo(bytes) = nla {
                if let Some(info) = parse_tcp_info(bytes) {
                    info.apply(&mut state);
                }
            }
        }
        NetSocket {
            inode: u64::from(r.header.inode),
            local: Some(local),
            remote: connected.then_some(remote),
            unix_path: None,
            pending: Vec::new(),
            state,
        }
    }

    fn unix(r: &netlink_packet_sock_diag::unix::UnixResponse) -> NetSocket {
        let mut path = None;
        let mut queues = None;
        let pending: Vec<u64> = r
            .pending_connections()
            .map(|p| p.iter().map(|&i| u64::from(i)).collect())
            .unwrap_or_default();
        for nla in &r.nlas {
            match nla {
                UnixNla::Name(name) => {
                    path = Some(match name {
                        netlink_packet_sock_diag::unix::nlas::UnixDiagName::Pathname(p) => {
                            p.to_string_lossy().into_owned()
                        }
                        netlink_packet_sock_diag::unix::nlas::UnixDiagName::Abstract(a) => {
                            format!("@{}", String::from_utf8_lossy(a))
                        }
                    })
                }
                UnixNla::ReceiveQueueLength(rq, wq) => queues = Some((*rq, *wq)),
                _ => {}
            }
        }
        let listening = r.header.state == 10;
        NetSocket {
            inode: u64::from(r.header.inode),
            local: None,
            remote: None,
            unix_path: path.clone(),
            pending,
            state: SocketState {
                protocol: unix_protocol(u16::from(r.header.kind)),
                local: path,
                tcp_state: Some(TcpState::from_kernel(r.header.state)),
                recv_queue_bytes: queues.filter(|_| !listening).map(|(rq, _)| u64::from(rq)),
                send_queue_bytes: queues.filter(|_| !listening).map(|(_, wq)| u64::from(wq)),
                peer_inode: r.peer().map(u64::from),
                source: SocketSource::SockDiag,
                ..SocketState::default()
            },
        }
    }
}
