//! The heartbeat wire protocol (`docs/wire-protocol.md`): parsing one datagram from the Python client.

/// One message from a rank's Python client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientMessage {
    Hello {
        header: Header,
        local_rank: Option<u32>,
        version: String,
    },
    Beat {
        header: Header,
        step: Option<u64>,
    },
    Phase {
        header: Header,
        begin: bool,
        name: String,
    },
    Log {
        header: Header,
        level: u32,
        text: String,
    },
    /// "I am rank R of W, local rank L": what the process's own `torch.distributed` (or Lightning) says, once it
    /// is initialized. An agent that predates it ignores it (an unknown type).
    Rank {
        header: Header,
        rank: u32,
        local_rank: Option<u32>,
        world_size: Option<u32>,
        /// Who told the client (`torch`, `lightning`); free text for the evidence.
        via: String,
    },
    /// "I answer requests for `what` at the address this came from" (`collectives`: the rank's thread that
    /// answers for its Flight Recorder is running; said again from each new socket).
    Listen {
        header: Header,
        what: String,
    },
    /// The answer to the agent's `hw1 dump-collectives <request>`: the rank's Flight Recorder, trimmed (JSON in the
    /// recorder's own format).
    Collectives {
        header: Header,
        request: u64,
        json: String,
    },
}

/// The fields every message has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub rank: Option<u32>,
    pub pid: i32,
    pub seq: u64,
}

impl ClientMessage {
    pub fn header(&self) -> Header {
        match self {
            ClientMessage::Hello { header, .. }
            | ClientMessage::Beat { header, .. }
            | ClientMessage::Phase { header, .. }
            | ClientMessage::Log { header, .. }
            | ClientMessage::Rank { header, .. }
            | ClientMessage::Listen { header, .. }
            | ClientMessage::Collectives { header, .. } => *header,
        }
    }
}

/// Why a datagram was not understood (counted, never fatal).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("not a hw1 message")]
    NotHw1,
    #[error("unknown message type `{0}`")]
    UnknownType(String),
    #[error("missing or malformed field `{0}`")]
    Field(&'static str),
}

fn opt_number<T: std::str::FromStr>(
    field: Option<&str>,
    name: &'static str,
) -> Result<Option<T>, WireError> {
    match field {
        Some("-") => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| WireError::Field(name)),
        None => Err(WireError::Field(name)),
    }
}

fn number<T: std::str::FromStr>(field: Option<&str>, name: &'static str) -> Result<T, WireError> {
    field
        .and_then(|v| v.parse().ok())
        .ok_or(WireError::Field(name))
}

/// Parses one datagram.
pub fn parse_datagram(bytes: &[u8]) -> Result<ClientMessage, WireError> {
    let text = String::from_utf8_lossy(bytes);
    let (first, body) = match text.split_once('\n') {
        Some((first, body)) => (first, Some(body)),
        None => (text.as_ref(), None),
    };
    let mut fields = first.splitn(6, ' ');
    if fields.next() != Some("hw1") {
        return Err(WireError::NotHw1);
    }
    let kind = fields.next().ok_or(WireError::Field("type"))?;
    let header = Header {
        rank: opt_number(fields.next(), "rank")?,
        pid: number(fields.next(), "pid")?,
        seq: number(fields.next(), "seq")?,
    };
    let rest = fields.next();
    match kind {
        "hello" => {
            let mut parts = rest.unwrap_or("").splitn(2, ' ');
            let local_rank = opt_number(parts.next(), "local_rank")?;
            Ok(ClientMessage::Hello {
                header,
                local_rank,
                version: parts.next().unwrap_or("").to_string(),
            })
        }
        "beat" => Ok(ClientMessage::Beat {
            header,
            step: opt_number(rest.or(Some("-")), "step")?,
        }),
        "phase" => {
            let (what, name) = rest
                .and_then(|r| r.split_once(' '))
                .ok_or(WireError::Field("phase"))?;
            let begin = match what {
                "begin" => true,
                "end" => false,
                _ => return Err(WireError::Field("phase")),
            };
            Ok(ClientMessage::Phase {
                header,
                begin,
                name: name.to_string(),
            })
        }
        "log" => Ok(ClientMessage::Log {
            header,
            level: number(rest.map(str::trim), "level")?,
            text: body.unwrap_or("").to_string(),
        }),
        "rank" => {
            let mut parts = rest.unwrap_or("").split(' ');
            Ok(ClientMessage::Rank {
                header,
                rank: number(parts.next(), "rank")?,
                local_rank: opt_number(parts.next(), "local_rank")?,
                world_size: opt_number(parts.next(), "world_size")?,
                via: parts.next().unwrap_or("").to_string(),
            })
        }
        "listen" => Ok(ClientMessage::Listen {
            header,
            what: rest.unwrap_or("").trim().to_string(),
        }),
        "collectives" => Ok(ClientMessage::Collectives {
            header,
            request: number(rest.map(str::trim), "request")?,
            json: body.unwrap_or("").to_string(),
        }),
        other => Err(WireError::UnknownType(other.to_string())),
    }
}

/// The agent's request for a rank's Flight Recorder (answered by [`ClientMessage::Collectives`]).
pub fn collectives_request(request: u64) -> Vec<u8> {
    format!("hw1 dump-collectives {request}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(rank: Option<u32>, pid: i32, seq: u64) -> Header {
        Header { rank, pid, seq }
    }

    #[test]
    fn parses_a_rank_report() {
        assert_eq!(
            parse_datagram(b"hw1 rank - 4242 3 2 0 4 torch"),
            Ok(ClientMessage::Rank {
                header: h(None, 4242, 3),
                rank: 2,
                local_rank: Some(0),
                world_size: Some(4),
                via: "torch".into()
            })
        );
        assert_eq!(
            parse_datagram(b"hw1 rank 1 7 1 1 - -"),
            Ok(ClientMessage::Rank {
                header: h(Some(1), 7, 1),
                rank: 1,
                local_rank: None,
                world_size: None,
                via: String::new()
            })
        );
        assert_eq!(
            parse_datagram(b"hw1 rank - 7 1 - - -"),
            Err(WireError::Field("rank"))
        );
    }

    #[test]
    fn parses_every_message_type() {
        assert_eq!(
            parse_datagram(b"hw1 beat 3 4242 17 120"),
            Ok(ClientMessage::Beat {
                header: h(Some(3), 4242, 17),
                step: Some(120)
            })
        );
        assert_eq!(
            parse_datagram(b"hw1 beat - 4242 1 -"),
            Ok(ClientMessage::Beat {
                header: h(None, 4242, 1),
                step: None
            })
        );
        assert_eq!(
            parse_datagram(b"hw1 phase 0 10 2 begin save checkpoint"),
            Ok(ClientMessage::Phase {
                header: h(Some(0), 10, 2),
                begin: true,
                name: "save checkpoint".into()
            })
        );
        assert_eq!(
            parse_datagram(b"hw1 log 1 10 5 30\nline one\nline two"),
            Ok(ClientMessage::Log {
                header: h(Some(1), 10, 5),
                level: 30,
                text: "line one\nline two".into()
            })
        );
        assert_eq!(
            parse_datagram(b"hw1 hello 2 99 1 0 0.1.0"),
            Ok(ClientMessage::Hello {
                header: h(Some(2), 99, 1),
                local_rank: Some(0),
                version: "0.1.0".into()
            })
        );
    }

    #[test]
    fn rejects_what_it_does_not_understand() {
        assert_eq!(parse_datagram(b"hello"), Err(WireError::NotHw1));
        assert_eq!(
            parse_datagram(b"hw1 dance 0 1 1"),
            Err(WireError::UnknownType("dance".into()))
        );
        assert_eq!(
            parse_datagram(b"hw1 beat x 1 1 1"),
            Err(WireError::Field("rank"))
        );
        assert_eq!(
            parse_datagram(b"hw1 phase 0 1 1 sideways x"),
            Err(WireError::Field("phase"))
        );
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_datagram(&bytes);
        }

        #[test]
        fn never_panics_on_near_misses(s in "hw1 (beat|phase|log|hello) [-0-9a-z ]{0,40}") {
            let _ = parse_datagram(s.as_bytes());
        }
    }

    #[test]
    fn a_rank_answers_a_request_for_its_collectives_with_the_recorders_json() {
        let m = parse_datagram(b"hw1 collectives 3 4242 9 17\n{\"pg_status\":{}}").unwrap();
        assert_eq!(
            m,
            ClientMessage::Collectives {
                header: h(Some(3), 4242, 9),
                request: 17,
                json: "{\"pg_status\":{}}".into(),
            }
        );
        assert_eq!(
            parse_datagram(b"hw1 collectives 3 4242 9 x\n{}"),
            Err(WireError::Field("request"))
        );
        assert_eq!(collectives_request(17), b"hw1 dump-collectives 17");
        assert_eq!(
            parse_datagram(b"hw1 listen 3 4242 8 collectives").unwrap(),
            ClientMessage::Listen {
                header: h(Some(3), 4242, 8),
                what: "collectives".into(),
            }
        );
    }
}
