//! Whom a rank waiting on a socket waits for: the process at the other end (stopped, blocked in the kernel), or
//! the connection itself (a closed window, data not acknowledged, SYNs not answered), decided from the roll call's
//! [`SocketWait`]s and put in words. Pure: observations in, a [`PeerWait`] out.

use hangwatch_model::{
    PeerFinding, PeerProcess, PeerWait, ProcessObservation, SocketProtocol, SocketWait, TcpState,
};

use crate::death::human_bytes;
use crate::position::{classify, Condition};

/// The wait that says most about what holds `process` up, among its threads' socket waits: a stuck peer first,
/// then an unanswered connection, unacknowledged data, a closed window; else the telling thread's own wait
/// (`tid`), described though nothing is wrong with it. `job` finds a peer that is one of the job's processes (its
/// observation is the roll call's own).
pub fn peer_wait<'a>(
    process: &ProcessObservation,
    tid: Option<i32>,
    window_ms: u64,
    job: impl Fn(i32) -> Option<&'a ProcessObservation>,
) -> Option<PeerWait> {
    let mut best: Option<PeerWait> = None;
    for wait in process.socket_waits.iter().filter(|w| w.socket.is_some()) {
        let peer_obs = wait.peer.as_ref().and_then(|p| {
            p.observation
                .as_deref()
                .or_else(|| p.in_job.then(|| job(p.pid)).flatten())
        });
        let candidate = judge(wait, peer_obs, window_ms);
        let better = match &best {
            None => candidate.stuck() || Some(wait.tid) == tid,
            Some(b) => rank(candidate.finding) < rank(b.finding),
        };
        if better {
            best = Some(candidate);
        }
    }
    best
}

/// Lower is more telling.
fn rank(finding: PeerFinding) -> u8 {
    match finding {
        PeerFinding::PeerStopped => 0,
        PeerFinding::PeerBlocked => 1,
        PeerFinding::NoAnswer => 2,
        PeerFinding::NoAcknowledgement => 3,
        PeerFinding::WindowZero => 4,
        PeerFinding::Waiting => 5,
    }
}

/// One socket wait judged: what holds it up, with the peer's process (observed) when there is one.
pub fn judge(wait: &SocketWait, peer_obs: Option<&ProcessObservation>, window_ms: u64) -> PeerWait {
    let socket = wait.socket.clone().unwrap_or_default();
    let peer = wait.peer.as_ref().map(|p| {
        let position = peer_obs.map(|o| classify(o, window_ms));
        PeerProcess {
            pid: p.pid,
            comm: p
                .comm
                .clone()
                .or_else(|| peer_obs.and_then(|o| o.comm.clone())),
            state: position.as_ref().map(|pos| pos.state.to_string()),
            in_job: p.in_job,
            syscall: position.as_ref().and_then(|pos| pos.syscall_name.clone()),
            path: position
                .as_ref()
                .and_then(|pos| pos.file.as_ref().map(|f| f.path.clone())),
            rank: peer_obs
                .filter(|o| o.worker_of.is_none())
                .and_then(|o| o.rank),
            listener: p.listener,
        }
    });
    let peer_position = peer_obs.map(|o| classify(o, window_ms));
    let retransmits = socket.retransmits.unwrap_or(0);
    let queued = socket.send_queue_bytes.unwrap_or(0);
    let finding = match &peer_position {
        Some(p) if p.condition == Condition::Stopped => PeerFinding::PeerStopped,
        Some(p) if p.state == 'D' || p.filesystem_wait => PeerFinding::PeerBlocked,
        _ if socket.tcp_state == Some(TcpState::SynSent) && retransmits > 0 => {
            PeerFinding::NoAnswer
        }
        _ if socket.protocol == SocketProtocol::Tcp
            && socket.tcp_state == Some(TcpState::Established)
            && queued > 0
            && retransmits > 0 =>
        {
            PeerFinding::NoAcknowledgement
        }
        _ if socket.peer_window_zero() => PeerFinding::WindowZero,
        _ => PeerFinding::Waiting,
    };
    let quiet_for_ms = match finding {
        PeerFinding::NoAcknowledgement => socket.since_ack_received_ms,
        _ => match (socket.since_data_sent_ms, socket.since_data_received_ms) {
            (Some(s), Some(r)) => Some(s.min(r)),
            (s, r) => s.or(r),
        },
    }
    // Before any data moved the kernel counts from boot: not a time worth saying.
    .filter(|&ms| ms < 24 * 3600 * 1000);
    let address = socket.remote.clone().or_else(|| socket.local.clone());
    let mut out = PeerWait {
        finding,
        tid: wait.tid,
        syscall: wait.call.clone(),
        fd: wait.fd,
        address,
        socket,
        peer,
        quiet_for_ms,
        words: String::new(),
    };
    out.words = words(&out);
    out
}

/// Whether the wait makes the waiting rank the one to name: something outside the job's ranks holds it (a
/// process that is not a rank, the connection, the network). A rank waiting on another rank that is stopped or
/// blocked is not: that rank is named itself.
pub fn blames_waiter(wait: &PeerWait) -> bool {
    match wait.finding {
        PeerFinding::Waiting => false,
        PeerFinding::PeerStopped | PeerFinding::PeerBlocked => !wait
            .peer
            .as_ref()
            .is_some_and(|p| p.in_job && p.rank.is_some()),
        _ => true,
    }
}

/// "sends to 127.0.0.1:9000 (pid 4242 python3, stopped (T)): 2.5 MiB unsent, the peer's window zero for 40 s";
/// "connects to 10.0.0.11:8080: no answer for 7 s (3 SYNs retransmitted): the network or that host".
pub fn words(w: &PeerWait) -> String {
    let s = &w.socket;
    let address = w.address.as_deref().unwrap_or("an unknown address");
    let verb = match w.syscall.as_str() {
        "connect" => "connects to",
        "accept" | "accept4" => "waits for a connection on",
        c if c.starts_with("send") || c.starts_with("write") || c == "splice" => "sends to",
        c if c.starts_with("recv") || c.starts_with("read") => "waits for data from",
        _ => "waits on",
    };
    let protocol = if s.protocol.is_unix() {
        format!("{} socket ", s.protocol.words())
    } else {
        String::new()
    };
    let peer = w.peer.as_ref().map_or_else(String::new, |p| {
        let mut parts = vec![match &p.comm {
            Some(c) => format!("pid {} {c}", p.pid),
            None => format!("pid {}", p.pid),
        }];
        if let Some(rank) = p.rank {
            parts.push(format!("rank {rank}"));
        } else if p.in_job {
            parts.push("a process of the job".into());
        }
        let state = p.state.as_deref().and_then(|s| s.chars().next());
        if let Some(state) = state {
            parts.push(crate::position::state_words(state).to_string());
        }
        // A stopped process's call is where the stop found it, not what it waits for.
        let stopped = matches!(state, Some('T' | 't'));
        if let Some(call) = p.syscall.as_ref().filter(|_| !stopped) {
            match &p.path {
                Some(path) => parts.push(format!("in {call}() on {path}")),
                None => parts.push(format!("in {call}()")),
            }
        }
        if p.listener {
            parts.push("its listener, which has not accepted the connection".into());
        }
        format!(" ({})", parts.join(", "))
    });
    let quiet = w.quiet_for_ms.map(seconds);
    let mut details: Vec<String> = Vec::new();
    let unsent = s.unsent_bytes.filter(|&b| b > 0);
    match (unsent, s.send_queue_bytes.filter(|&b| b > 0)) {
        (Some(b), _) => details.push(format!("{} unsent", human_bytes(b))),
        (None, Some(b)) if s.protocol.is_unix() => {
            details.push(format!("{} not read by the peer", human_bytes(b)))
        }
        (None, Some(b)) => details.push(format!("{} not acknowledged", human_bytes(b))),
        _ => {}
    }
    if let Some(b) = s.recv_queue_bytes.filter(|&b| b > 0) {
        details.push(format!("{} received and not read", human_bytes(b)));
    }
    let head = format!("{verb} {protocol}{address}{peer}");
    match w.finding {
        PeerFinding::NoAnswer => {
            let n = s.retransmits.unwrap_or(0);
            let syns = if n == 1 { "SYN" } else { "SYNs" };
            let for_ = quiet.map(|q| format!(" for {q}")).unwrap_or_default();
            format!("{head}: no answer from {address}{for_} ({n} {syns} retransmitted): the network or that host")
        }
        PeerFinding::NoAcknowledgement => {
            let n = s.retransmits.unwrap_or(0);
            let for_ = quiet.map(|q| format!(" for {q}")).unwrap_or_default();
            let what = if details.is_empty() {
                String::new()
            } else {
                format!(", {}", details.join(", "))
            };
            format!(
                "{head}: no acknowledgement from {address}{for_} ({n} retransmission timeouts in a row{what}): the \
                 network or that host"
            )
        }
        PeerFinding::WindowZero
        | PeerFinding::PeerStopped
        | PeerFinding::PeerBlocked
        | PeerFinding::Waiting => {
            if s.peer_window_zero() {
                details.push(match &quiet {
                    Some(q) => format!("the peer's window zero for {q}"),
                    None => "the peer's window zero".to_string(),
                });
            } else if let Some(q) = &quiet {
                if w.finding != PeerFinding::Waiting || !details.is_empty() {
                    details.push(format!("nothing moved for {q}"));
                }
            }
            if details.is_empty() {
                head
            } else {
                format!("{head}: {}", details.join(", "))
            }
        }
    }
}

/// `40 s`, `1.5 s`, `250 ms`.
fn seconds(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms} ms"),
        1000..10_000 => format!("{:.1} s", ms as f64 / 1000.0),
        _ => format!("{} s", ms / 1000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::{
        SocketPeer, SocketSource, SocketState, SyscallObservation, ThreadObservation,
    };

    fn thread(tid: i32, state: char, call: &str) -> ThreadObservation {
        ThreadObservation {
            tid,
            state,
            syscall: Some(SyscallObservation::InSyscall {
                nr: 0,
                name: Some(call.into()),
                args: vec![],
                fd: Some(3),
                file: None,
                path: None,
            }),
            not_running_for_ms: Some(5000),
            ..ThreadObservation::default()
        }
    }

    fn server(state: char) -> ProcessObservation {
        ProcessObservation {
            pid: 4242,
            comm: Some("python3".into()),
            threads: vec![thread(4242, state, "accept4")],
            ..ProcessObservation::default()
        }
    }

    /// Rank 0 PUTting 32 MB to a stopped local HTTP server, shaped on what `hangwatch dump` read here (sock_diag,
    /// Linux 6.18), with rounder numbers.
    fn upload(peer: Option<ProcessObservation>) -> ProcessObservation {
        ProcessObservation {
            pid: 100,
            rank: Some(0),
            threads: vec![thread(100, 'S', "sendto")],
            socket_waits: vec![SocketWait {
                tid: 100,
                call: "sendto".into(),
                fd: 3,
                inode: 24751,
                socket: Some(SocketState {
                    protocol: SocketProtocol::Tcp,
                    local: Some("127.0.0.1:41396".into()),
                    remote: Some("127.0.0.1:9000".into()),
                    tcp_state: Some(TcpState::Established),
                    send_queue_bytes: Some(2_621_440),
                    unsent_bytes: Some(2_621_440),
                    recv_queue_bytes: Some(0),
                    retransmits: Some(0),
                    probes: Some(3),
                    peer_window_bytes: Some(0),
                    since_data_sent_ms: Some(40_120),
                    since_data_received_ms: Some(41_000),
                    since_ack_received_ms: Some(800),
                    peer_inode: Some(24760),
                    source: SocketSource::SockDiag,
                    ..SocketState::default()
                }),
                peer: peer.map(|o| SocketPeer {
                    pid: o.pid,
                    inode: 24760,
                    comm: o.comm.clone(),
                    in_job: false,
                    observation: Some(Box::new(o)),
                    ..SocketPeer::default()
                }),
                ..SocketWait::default()
            }],
            ..ProcessObservation::default()
        }
    }

    #[test]
    fn a_stopped_local_server_is_named_with_its_pid_state_and_the_bytes_unsent() {
        let w = peer_wait(&upload(Some(server('T'))), Some(100), 100, |_| None).unwrap();
        assert_eq!(w.finding, PeerFinding::PeerStopped);
        assert!(blames_waiter(&w));
        assert_eq!(
            w.words,
            "sends to 127.0.0.1:9000 (pid 4242 python3, stopped (T)): 2.5 MiB unsent, the peer's window zero for 40 s"
        );
        let peer = w.peer.unwrap();
        assert_eq!((peer.pid, peer.state.as_deref()), (4242, Some("T")));
    }

    #[test]
    fn a_zero_window_without_a_known_peer_is_still_the_finding() {
        let w = peer_wait(&upload(None), Some(100), 100, |_| None).unwrap();
        assert_eq!(w.finding, PeerFinding::WindowZero);
        assert!(
            w.words
                .ends_with("2.5 MiB unsent, the peer's window zero for 40 s"),
            "{}",
            w.words
        );
    }

    #[test]
    fn unacknowledged_data_with_retransmissions_is_the_network_or_that_host() {
        let mut p = upload(None);
        let s = p.socket_waits[0].socket.as_mut().unwrap();
        s.remote = Some("10.1.2.3:443".into());
        s.peer_window_bytes = Some(65_536);
        s.probes = Some(0);
        s.unsent_bytes = Some(0);
        s.retransmits = Some(6);
        s.since_ack_received_ms = Some(40_500);
        let w = peer_wait(&p, Some(100), 100, |_| None).unwrap();
        assert_eq!(w.finding, PeerFinding::NoAcknowledgement);
        assert_eq!(
            w.words,
            "sends to 10.1.2.3:443: no acknowledgement from 10.1.2.3:443 for 40 s (6 retransmission timeouts in a \
             row, 2.5 MiB not acknowledged): the network or that host"
        );
    }

    #[test]
    fn a_connect_whose_syns_go_unanswered_says_no_answer() {
        let p = ProcessObservation {
            pid: 100,
            threads: vec![thread(100, 'S', "connect")],
            socket_waits: vec![SocketWait {
                tid: 100,
                call: "connect".into(),
                fd: 3,
                inode: 9,
                socket: Some(SocketState {
                    protocol: SocketProtocol::Tcp,
                    local: Some("10.9.8.1:50000".into()),
                    remote: Some("10.9.8.2:8080".into()),
                    tcp_state: Some(TcpState::SynSent),
                    retransmits: Some(3),
                    source: SocketSource::ProcNet,
                    ..SocketState::default()
                }),
                ..SocketWait::default()
            }],
            ..ProcessObservation::default()
        };
        let w = peer_wait(&p, Some(100), 100, |_| None).unwrap();
        assert_eq!(w.finding, PeerFinding::NoAnswer);
        assert_eq!(
            w.words,
            "connects to 10.9.8.2:8080: no answer from 10.9.8.2:8080 (3 SYNs retransmitted): the network or that host"
        );
    }

    #[test]
    fn a_rank_waiting_on_a_healthy_peer_rank_is_described_but_not_blamed() {
        let mut p = upload(None);
        let s = p.socket_waits[0].socket.as_mut().unwrap();
        *s = SocketState {
            protocol: SocketProtocol::Tcp,
            local: Some("127.0.0.1:50000".into()),
            remote: Some("127.0.0.1:29500".into()),
            tcp_state: Some(TcpState::Established),
            send_queue_bytes: Some(0),
            recv_queue_bytes: Some(0),
            ..SocketState::default()
        };
        p.threads[0] = thread(100, 'S', "recvfrom");
        p.socket_waits[0].call = "recvfrom".into();
        let peer_rank = ProcessObservation {
            pid: 200,
            rank: Some(1),
            comm: Some("python3".into()),
            threads: vec![thread(200, 'S', "recvfrom")],
            ..ProcessObservation::default()
        };
        p.socket_waits[0].peer = Some(SocketPeer {
            pid: 200,
            inode: 5,
            in_job: true,
            ..SocketPeer::default()
        });
        let w = peer_wait(&p, Some(100), 100, |pid| (pid == 200).then_some(&peer_rank)).unwrap();
        assert_eq!(w.finding, PeerFinding::Waiting);
        assert!(!blames_waiter(&w));
        assert_eq!(
            w.words,
            "waits for data from 127.0.0.1:29500 (pid 200 python3, rank 1, sleep (S), in recvfrom())"
        );
        // The same rank stopped is named itself, not the one waiting for it.
        let stopped = ProcessObservation {
            threads: vec![thread(200, 'T', "recvfrom")],
            ..peer_rank.clone()
        };
        let w = peer_wait(&p, Some(100), 100, |pid| (pid == 200).then_some(&stopped)).unwrap();
        assert_eq!(w.finding, PeerFinding::PeerStopped);
        assert!(!blames_waiter(&w));
        // Another thread's healthy wait is not described.
        assert_eq!(
            peer_wait(&p, Some(101), 100, |pid| (pid == 200).then_some(&peer_rank)),
            None
        );
    }

    #[test]
    fn a_unix_stream_to_a_stopped_server_says_what_the_peer_did_not_read() {
        let mut p = upload(Some(server('T')));
        let s = p.socket_waits[0].socket.as_mut().unwrap();
        *s = SocketState {
            protocol: SocketProtocol::UnixStream,
            remote: Some("/run/store.sock".into()),
            tcp_state: Some(TcpState::Established),
            send_queue_bytes: Some(212_992),
            recv_queue_bytes: Some(0),
            peer_inode: Some(7),
            source: SocketSource::SockDiag,
            ..SocketState::default()
        };
        let w = peer_wait(&p, Some(100), 100, |_| None).unwrap();
        assert_eq!(
            w.words,
            "sends to Unix stream socket /run/store.sock (pid 4242 python3, stopped (T)): 208 KiB not read by the peer"
        );
    }
}
