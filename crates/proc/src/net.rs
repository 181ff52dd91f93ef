//! Parsers for what describes a socket: `/proc/PID/net/{tcp,tcp6,udp,udp6,unix}` (the fallback when netlink
//! `sock_diag` cannot be used), the kernel's `struct tcp_info` as `sock_diag` returns it, an epoll descriptor's
//! registered targets (`fdinfo`'s `tfd:` lines) and a descriptor's `socket:[INODE]` link.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hangwatch_model::{SocketProtocol, SocketSource, SocketState, TcpState};

/// One socket of a network namespace, from either source: its description and its own inode.
#[derive(Debug, Clone, PartialEq)]
pub struct NetSocket {
    pub inode: u64,
    pub local: Option<SocketAddr>,
    pub remote: Option<SocketAddr>,
    /// A Unix socket's path (`@name` for an abstract one).
    pub unix_path: Option<String>,
    /// A Unix listener's connections not yet accepted, by the connecting sockets' inodes (`sock_diag` only).
    pub pending: Vec<u64>,
    pub state: SocketState,
}

impl NetSocket {
    /// A connected TCP socket or listener whose local address serves `remote` (the same address and port, or the
    /// wildcard address on that port).
    pub fn listens_for(&self, remote: SocketAddr) -> bool {
        self.state.tcp_state == Some(TcpState::Listen)
            && self.local.is_some_and(|l| {
                l.port() == remote.port() && (l.ip() == remote.ip() || l.ip().is_unspecified())
            })
    }
}

/// `socket:[24751]` -> 24751.
pub fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The descriptors an epoll instance watches, from its `fdinfo` (`tfd:        5 events: ...`).
pub fn parse_epoll_targets(fdinfo: &str) -> Vec<i32> {
    fdinfo
        .lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("tfd:")?;
            rest.split_ascii_whitespace().next()?.parse().ok()
        })
        .collect()
}

/// `/proc/PID/net/tcp`, `tcp6`, `udp` or `udp6`: one socket per line after the header. Lines that do not parse
/// are skipped (the format has been stable since 2.6; a short line is a truncated read).
pub fn parse_proc_net_inet(text: &str, protocol: SocketProtocol) -> Vec<NetSocket> {
    text.lines()
        .skip(1)
        .filter_map(|l| inet_line(l, protocol))
        .collect()
}

fn inet_line(line: &str, protocol: SocketProtocol) -> Option<NetSocket> {
    let f: Vec<&str> = line.split_ascii_whitespace().collect();
    if f.len() < 10 {
        return None;
    }
    let local = hex_addr(f[1])?;
    let remote = hex_addr(f[2])?;
    let state = u8::from_str_radix(f[3], 16).ok()?;
    let (tx, rx) = f[4].split_once(':')?;
    let retransmits = u32::from_str_radix(f[6], 16).ok();
    let inode: u64 = f[9].parse().ok()?;
    let tcp = protocol == SocketProtocol::Tcp;
    let listening = tcp && state == 10;
    Some(NetSocket {
        inode,
        local: Some(local),
        remote: (!remote.ip().is_unspecified() || remote.port() != 0).then_some(remote),
        unix_path: None,
        pending: Vec::new(),
        state: SocketState {
            protocol,
            local: Some(addr_words(local)),
            remote: (!remote.ip().is_unspecified() || remote.port() != 0)
                .then(|| addr_words(remote)),
            tcp_state: tcp.then(|| TcpState::from_kernel(state)),
            // A listener's queues are its accept backlog, not bytes.
            send_queue_bytes: (!listening)
                .then(|| u64::from_str_radix(tx, 16).ok())
                .flatten(),
            recv_queue_bytes: (!listening)
                .then(|| u64::from_str_radix(rx, 16).ok())
                .flatten(),
            retransmits: retransmits.filter(|_| tcp),
            source: SocketSource::ProcNet,
            ..SocketState::default()
        },
    })
}

/// `0100007F:2328` (IPv4, little-endian words) or the 32-digit IPv6 form.
fn hex_addr(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(
            u32::from_str_radix(ip, 16).ok()?.swap_bytes(),
        )),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                let word = u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
                    .ok()?
                    .swap_bytes();
                chunk.copy_from_slice(&word.to_be_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// `127.0.0.1:9000`, `[::1]:9000`; an IPv4-mapped IPv6 address as its IPv4 form.
pub fn addr_words(addr: SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => format!("{v4}:{}", addr.port()),
            None => addr.to_string(),
        },
        IpAddr::V4(_) => addr.to_string(),
    }
}

/// `/proc/PID/net/unix`: path and state, no peer and no queues (those need `sock_diag`).
pub fn parse_proc_net_unix(text: &str) -> Vec<NetSocket> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_ascii_whitespace().collect();
            if f.len() < 7 {
                return None;
            }
            let kind = u16::from_str_radix(f[4], 16).ok()?;
            let st = u8::from_str_radix(f[5], 16).ok()?;
            let inode: u64 = f[6].parse().ok()?;
            let flags = u32::from_str_radix(f[3], 16).ok()?;
            let path = f.get(7).map(|p| p.to_string());
            Some(NetSocket {
                inode,
                local: None,
                remote: None,
                unix_path: path.clone(),
                pending: Vec::new(),
                state: SocketState {
                    protocol: unix_protocol(kind),
                    local: path,
                    tcp_state: Some(unix_state(st, flags & 0x10000 != 0)),
                    source: SocketSource::ProcNet,
                    ..SocketState::default()
                },
            })
        })
        .collect()
}

/// `SOCK_STREAM` 1, `SOCK_DGRAM` 2, `SOCK_SEQPACKET` 5.
pub fn unix_protocol(kind: u16) -> SocketProtocol {
    match kind {
        1 => SocketProtocol::UnixStream,
        2 => SocketProtocol::UnixDgram,
        5 => SocketProtocol::UnixSeqpacket,
        _ => SocketProtocol::Other,
    }
}

/// `/proc/net/unix`'s `SS_*` states (`SS_CONNECTING` 2, `SS_CONNECTED` 3), `__SO_ACCEPTCON` for a listener.
fn unix_state(st: u8, accepting: bool) -> TcpState {
    match (accepting, st) {
        (true, _) => TcpState::Listen,
        (_, 2) => TcpState::SynSent,
        (_, 3) => TcpState::Established,
        _ => TcpState::Close,
    }
}

/// The fields of the kernel's `struct tcp_info` (include/uapi/linux/tcp.h) that say whether a connection moves.
/// The struct only grows; a field past the end of an older kernel's copy is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpInfo {
    pub state: u8,
    pub retransmits: u8,
    pub probes: u8,
    pub backoff: u8,
    pub last_data_sent_ms: u32,
    pub last_data_recv_ms: u32,
    pub last_ack_recv_ms: u32,
    pub total_retrans: u32,
    pub notsent_bytes: Option<u32>,
    pub snd_wnd: Option<u32>,
}

/// Parses `INET_DIAG_INFO`'s payload; `None` when shorter than the fields every kernel since 2.6 has.
pub fn parse_tcp_info(bytes: &[u8]) -> Option<TcpInfo> {
    let u32_at = |at: usize| -> Option<u32> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    Some(TcpInfo {
        state: *bytes.first()?,
        retransmits: *bytes.get(2)?,
        probes: *bytes.get(3)?,
        backoff: *bytes.get(4)?,
        last_data_sent_ms: u32_at(44)?,
        last_data_recv_ms: u32_at(52)?,
        last_ack_recv_ms: u32_at(56)?,
        total_retrans: u32_at(100)?,
        notsent_bytes: u32_at(144),
        snd_wnd: u32_at(228),
    })
}

impl TcpInfo {
    /// Adds what `tcp_info` says to a socket's description.
    pub fn apply(&self, state: &mut SocketState) {
        state.tcp_state = Some(TcpState::from_kernel(self.state));
        state.retransmits = Some(u32::from(self.retransmits));
        state.probes = Some(u32::from(self.probes));
        state.total_retransmits = Some(self.total_retrans);
        state.unsent_bytes = self.notsent_bytes.map(u64::from);
        state.peer_window_bytes = self.snd_wnd.map(u64::from);
        state.since_data_sent_ms = Some(u64::from(self.last_data_sent_ms));
        state.since_data_received_ms = Some(u64::from(self.last_data_recv_ms));
        state.since_ack_received_ms = Some(u64::from(self.last_ack_recv_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// /proc/PID/net/tcp recorded here (Linux 6.18) while rank-like `up.py` PUT 32 MB to a `http.server` on port
    /// 19007 that was SIGSTOPped before accepting: the listener (one connection in its backlog), the client's
    /// connection (3.6 MB queued), the server's end not yet accepted (inode 0, 128 KB received) and an older
    /// connection in TIME-WAIT; the last line, a connect waiting for its SYN's answer, is written by hand.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   1: 0100007F:4A3F 00000000:0000 0A 00000000:00000001 00:00000000 00000000     0        0 1015501 2 0000000098c4319f 100 0 0 10 0
   3: 0100007F:9308 0100007F:4A3F 01 003A0C00:00000000 04:0000007D 00000000     0        0 1016650 2 000000002cf9e818 20 0 0 16 -1
   4: 0100007F:4A3F 0100007F:9308 01 00000000:0001F462 00:00000000 00000000     0        0 0 1 0000000066ea8e6f 20 8 0 10 -1
   5: 0100007F:4A3F 0100007F:9300 06 00000000:00000000 03:00001697 00000000     0        0 0 3 000000008235a1cb
   6: 0A00000A:C350 0B00000A:1F90 02 00000001:00000000 01:000005DC 00000003     0        0 953300 2 0000000000000000 1000 0 0 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:2328 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:A1B4 0000000000000000FFFF00000100007F:2328 01 00000010:00000000 00:00000000 00000000     0        0 4243 1 0000000000000000 100 0 0 10 0
";
    const UNIX: &str = "Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 960001 /tmp/store.sock
0000000000000000: 00000003 00000000 00000000 0001 03 960002
0000000000000000: 00000003 00000000 00000000 0001 03 960003 /tmp/store.sock
0000000000000000: 00000002 00000000 00000000 0002 01 960004 @abstract
";

    #[test]
    fn tcp_lines_name_addresses_state_and_queues() {
        let s = parse_proc_net_inet(TCP, SocketProtocol::Tcp);
        assert_eq!(s.len(), 5);
        assert_eq!(s[0].state.tcp_state, Some(TcpState::Listen));
        assert_eq!(s[0].state.local.as_deref(), Some("127.0.0.1:19007"));
        assert_eq!(
            s[0].state.recv_queue_bytes, None,
            "a listener's queue is its backlog"
        );
        assert!(s[0].listens_for("127.0.0.1:19007".parse().unwrap()));
        let client = &s[1];
        assert_eq!(client.inode, 1016650);
        assert_eq!(client.state.remote.as_deref(), Some("127.0.0.1:19007"));
        assert_eq!(client.state.tcp_state, Some(TcpState::Established));
        assert_eq!(client.state.send_queue_bytes, Some(3_804_160));
        assert_eq!(client.state.source, SocketSource::ProcNet);
        assert_eq!(s[2].inode, 0, "not accepted yet: no file, no inode");
        assert_eq!(s[2].state.recv_queue_bytes, Some(128_098));
        assert_eq!(s[3].state.tcp_state, Some(TcpState::TimeWait));
        let connecting = &s[4];
        assert_eq!(connecting.state.tcp_state, Some(TcpState::SynSent));
        assert_eq!(connecting.state.remote.as_deref(), Some("10.0.0.11:8080"));
        assert_eq!(connecting.state.retransmits, Some(3));
    }

    #[test]
    fn tcp6_lines_and_mapped_addresses() {
        let s = parse_proc_net_inet(TCP6, SocketProtocol::Tcp);
        assert_eq!(s[0].state.local.as_deref(), Some("[::1]:9000"));
        assert_eq!(s[0].state.remote, None);
        assert_eq!(s[1].state.local.as_deref(), Some("127.0.0.1:41396"));
        assert_eq!(s[1].state.remote.as_deref(), Some("127.0.0.1:9000"));
    }

    #[test]
    fn unix_lines_name_path_kind_and_listeners() {
        let s = parse_proc_net_unix(UNIX);
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].state.tcp_state, Some(TcpState::Listen));
        assert_eq!(s[0].unix_path.as_deref(), Some("/tmp/store.sock"));
        assert_eq!(s[1].state.tcp_state, Some(TcpState::Established));
        assert_eq!(s[1].state.protocol, SocketProtocol::UnixStream);
        assert_eq!(s[1].unix_path, None);
        assert_eq!(s[3].state.protocol, SocketProtocol::UnixDgram);
    }

    #[test]
    fn garbage_and_short_lines_are_skipped() {
        assert!(parse_proc_net_inet("header\n0: zz\n\n", SocketProtocol::Tcp).is_empty());
        assert!(parse_proc_net_unix("header\nshort line\n").is_empty());
    }

    #[test]
    fn epoll_targets_and_socket_links() {
        let fdinfo = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1057\n\
                      tfd:        5 events:       19 data:                5  pos:0 ino:40d sdev:e\n\
                      tfd:       12 events:       19 data:                c  pos:0 ino:e8a1 sdev:8\n";
        assert_eq!(parse_epoll_targets(fdinfo), vec![5, 12]);
        assert_eq!(socket_inode("socket:[24751]"), Some(24751));
        assert_eq!(socket_inode("pipe:[24751]"), None);
        assert_eq!(socket_inode("socket:[x]"), None);
    }

    /// A `tcp_info` of Linux 6.18's size (248 bytes) with the fields an uploading client of a stopped server shows:
    /// window zero, 3 probes, 2.5 MB not sent, nothing sent for 40 s (the rest zero).
    fn recorded_tcp_info() -> Vec<u8> {
        let mut b = vec![0u8; 248];
        b[0] = 1;
        b[3] = 3;
        b[4] = 3;
        b[44..48].copy_from_slice(&40_000u32.to_ne_bytes());
        b[52..56].copy_from_slice(&41_000u32.to_ne_bytes());
        b[56..60].copy_from_slice(&1_200u32.to_ne_bytes());
        b[144..148].copy_from_slice(&2_500_000u32.to_ne_bytes());
        b[228..232].copy_from_slice(&0u32.to_ne_bytes());
        b
    }

    #[test]
    fn tcp_info_fields_and_an_older_kernels_shorter_struct() {
        let info = parse_tcp_info(&recorded_tcp_info()).unwrap();
        assert_eq!(info.probes, 3);
        assert_eq!(info.last_data_sent_ms, 40_000);
        assert_eq!(info.notsent_bytes, Some(2_500_000));
        assert_eq!(info.snd_wnd, Some(0));
        let mut state = SocketState::default();
        info.apply(&mut state);
        assert!(state.peer_window_zero());
        assert_eq!(state.tcp_state, Some(TcpState::Established));
        let old = parse_tcp_info(&recorded_tcp_info()[..104]).unwrap();
        assert_eq!(old.snd_wnd, None);
        assert_eq!(old.notsent_bytes, None);
        assert_eq!(parse_tcp_info(&[1, 2, 3]), None);
    }
}
