//! How the node services of one job agree on a secret for its coordinator without a shared file: MUNGE, which
//! every Slurm node already runs with the cluster's key.
//!
//! A service on another node asks the service of the step's first node, sending a credential that only root on a
//! node of the cluster can make ([`KeyRequest`]); that service checks it with `unmunge` (uid 0, not replayed, not
//! expired) and answers with a credential that only root on a node of the cluster can read ([`KeyGrant`]: the
//! secret and the coordinator's port). Both then give their watcher the same secret as a token file, and the link
//! between watchers is the one `run --host-coordinator` uses (TLS keyed by the secret and the job id). Nothing is
//! sent in the clear that a stranger could use, and a credential cannot be replayed (munged remembers it).
//!
//! `munge` and `unmunge` are run as programs under a deadline (a stuck munged never holds the caller), rather than
//! linking libmunge: they are what every Slurm node has, and their output is stable text.

use crate::ids::{JobId, NodeName, StepId};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long `munge` or `unmunge` may take.
const MUNGE_DEADLINE: Duration = Duration::from_secs(5);
/// What every payload starts with: a credential made for something else is not taken for one of ours.
const TAG: &str = "hangwatch-node-key/1";
/// The secret's length in bytes.
pub const SECRET_BYTES: usize = 32;

/// Why a credential could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum MungeError {
    #[error("cannot run {program}: {reason}")]
    Run {
        program: &'static str,
        reason: String,
    },
    #[error(
        "{program} did not answer within {}",
        hangwatch_model::format_duration(MUNGE_DEADLINE)
    )]
    Timeout { program: &'static str },
    #[error("{program} refused: {message}")]
    Refused {
        program: &'static str,
        message: String,
    },
    #[error("the credential was made by uid {0}, not root: only another node's service may ask")]
    NotRoot(u32),
    #[error("not a hangwatch key message: {0}")]
    Payload(String),
}

/// munged on this node, at `socket` (None: munge's default, `/run/munge/munge.socket.2`).
#[derive(Debug, Clone, Default)]
pub struct Munge {
    pub socket: Option<PathBuf>,
}

/// What a credential said, once checked by munged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// Who made it, as munged vouches.
    pub uid: u32,
    pub payload: String,
}

impl Munge {
    pub fn at(socket: Option<&Path>) -> Self {
        Self {
            socket: socket.map(Path::to_path_buf),
        }
    }

    /// A credential carrying `payload` that only root may decode (on any node with the cluster's key).
    pub fn encode(&self, payload: &str) -> Result<String, MungeError> {
        let mut command = hangwatch_child::external_command("munge");
        // The payload goes in on stdin: on the command line any user of the node could read it.
        command.args(["--restrict-uid", "0"]);
        let out = self.run("munge", command, payload.as_bytes())?;
        let credential = String::from_utf8_lossy(&out).trim().to_string();
        if !credential.starts_with("MUNGE:") {
            return Err(MungeError::Refused {
                program: "munge",
                message: format!("printed no credential ({} bytes)", out.len()),
            });
        }
        Ok(credential)
    }

    /// The payload of `credential` and who made it; an expired, replayed or foreign credential is refused.
    pub fn decode(&self, credential: &str) -> Result<Decoded, MungeError> {
        let mut command = hangwatch_child::external_command("unmunge");
        command.args(["--numeric", "--keys", "STATUS,UID"]);
        let out = self.run("unmunge", command, credential.as_bytes())?;
        parse_unmunge(&String::from_utf8_lossy(&out))
    }

    fn run(
        &self,
        program: &'static str,
        mut command: std::process::Command,
        input: &[u8],
    ) -> Result<Vec<u8>, MungeError> {
        if let Some(socket) = &self.socket {
            command.arg("--socket").arg(socket);
        }
        let stdin = hangwatch_child::input_from_bytes(c"hangwatch-munge", input).map_err(|e| {
            MungeError::Run {
                program,
                reason: e.to_string(),
            }
        })?;
        match hangwatch_child::run_with_deadline_and_input(command, stdin, MUNGE_DEADLINE) {
            Ok(hangwatch_child::ChildOutcome::Finished {
                status,
                stdout,
                stderr,
                ..
            }) => {
                if status.success() {
                    Ok(stdout)
                } else {
                    let said = String::from_utf8_lossy(&stderr).trim().to_string();
                    Err(MungeError::Refused {
                        program,
                        message: if said.is_empty() {
                            format!("{status}")
                        } else {
                            said
                        },
                    })
                }
            }
            Ok(hangwatch_child::ChildOutcome::TimedOut { .. }) => {
                Err(MungeError::Timeout { program })
            }
            Err(e) => Err(MungeError::Run {
                program,
                reason: e.to_string(),
            }),
        }
    }
}

/// `unmunge --numeric --keys STATUS,UID` output: `KEY: value` lines, a blank line, the payload.
fn parse_unmunge(text: &str) -> Result<Decoded, MungeError> {
    let (head, payload) = text.split_once("\n\n").unwrap_or((text, ""));
    let field = |key: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    };
    let status = field("STATUS").unwrap_or_default();
    if status != "0" {
        return Err(MungeError::Refused {
            program: "unmunge",
            message: format!("status {status}"),
        });
    }
    let uid = field("UID")
        .and_then(|u| u.parse().ok())
        .ok_or_else(|| MungeError::Payload("unmunge gave no numeric UID".into()))?;
    Ok(Decoded {
        uid,
        payload: payload.to_string(),
    })
}

/// A service asks the step's first node for the key of step `job.step`, for node `node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRequest {
    pub job: String,
    pub step: String,
    pub node: String,
}

/// The first node's answer: the secret of step `job.step` and the port of its coordinator.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyGrant {
    pub job: String,
    pub step: String,
    pub port: u16,
    pub secret: [u8; SECRET_BYTES],
}

// The secret never goes into a log line.
impl std::fmt::Debug for KeyGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyGrant")
            .field("job", &self.job)
            .field("step", &self.step)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// `key=value` words after the tag, each key once, in this order.
fn fields<'a>(payload: &'a str, kind: &str, keys: &[&str]) -> Result<Vec<&'a str>, MungeError> {
    let mut words = payload.trim().split(' ');
    if words.next() != Some(TAG) || words.next() != Some(kind) {
        return Err(MungeError::Payload(format!("expected `{TAG} {kind} ...`")));
    }
    let values: Vec<&str> = keys
        .iter()
        .zip(words.by_ref())
        .map(|(key, word)| {
            word.strip_prefix(key)
                .and_then(|w| w.strip_prefix('='))
                .ok_or_else(|| MungeError::Payload(format!("expected {key}=..., got {word:?}")))
        })
        .collect::<Result<_, _>>()?;
    if values.len() != keys.len() || words.next().is_some() {
        return Err(MungeError::Payload(format!(
            "expected exactly {}",
            keys.join(", ")
        )));
    }
    Ok(values)
}

impl KeyRequest {
    pub fn payload(&self) -> String {
        format!(
            "{TAG} want job={} step={} node={}",
            self.job, self.step, self.node
        )
    }

    pub fn parse(payload: &str) -> Result<Self, MungeError> {
        let v = fields(payload, "want", &["job", "step", "node"])?;
        let names_ok = JobId::parse(v[0]).is_ok()
            && StepId::parse(v[1]).is_ok()
            && NodeName::parse(v[2]).is_ok();
        if !names_ok {
            return Err(MungeError::Payload(format!("odd names in {payload:?}")));
        }
        Ok(Self {
            job: v[0].into(),
            step: v[1].into(),
            node: v[2].into(),
        })
    }
}

impl KeyGrant {
    pub fn payload(&self) -> String {
        format!(
            "{TAG} key job={} step={} port={} secret={}",
            self.job,
            self.step,
            self.port,
            self.secret_hex()
        )
    }

    fn secret_hex(&self) -> String {
        self.secret.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn parse(payload: &str) -> Result<Self, MungeError> {
        let v = fields(payload, "key", &["job", "step", "port", "secret"])?;
        let bad = |what: &str| MungeError::Payload(format!("bad {what} in a key grant"));
        if JobId::parse(v[0]).is_err() || StepId::parse(v[1]).is_err() {
            return Err(bad("names"));
        }
        let port = v[2]
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad("port"))?;
        let hex = v[3].as_bytes();
        if hex.len() != SECRET_BYTES * 2 {
            return Err(bad("secret"));
        }
        let mut secret = [0u8; SECRET_BYTES];
        for (byte, pair) in secret.iter_mut().zip(hex.chunks(2)) {
            let text = std::str::from_utf8(pair).map_err(|_| bad("secret"))?;
            *byte = u8::from_str_radix(text, 16).map_err(|_| bad("secret"))?;
        }
        Ok(Self {
            job: v[0].into(),
            step: v[1].into(),
            port,
            secret,
        })
    }

    /// The secret as a token file holds it (hex, one line): what `run --token-file` reads.
    pub fn token(&self) -> String {
        format!("{}\n", self.secret_hex())
    }

    /// Whether this grant answers `request`.
    pub fn answers(&self, request: &KeyRequest) -> bool {
        self.job == request.job && self.step == request.step
    }
}

/// At most this many bytes in a credential line (a MUNGE credential with our payloads is about 300).
const MAX_LINE: u64 = 4096;
/// How long one exchange may take on the wire, each way.
const WIRE_DEADLINE: Duration = Duration::from_secs(5);

/// Reads one line of at most [`MAX_LINE`] bytes.
fn read_line(stream: &std::net::TcpStream) -> std::io::Result<String> {
    use std::io::{BufRead, Read};
    let mut line = String::new();
    std::io::BufReader::new(stream.take(MAX_LINE)).read_line(&mut line)?;
    Ok(line.trim().to_string())
}

/// Answers one service's request on `stream`: its credential is checked (root, not replayed, a well-formed
/// request), `grant` says what to answer (None: nothing for that step), and the answer goes back as a credential
/// only root can read. Blocks at most a few seconds on the wire, plus munge's deadlines.
pub fn answer(
    stream: std::net::TcpStream,
    munge: &Munge,
    grant: impl FnOnce(&KeyRequest) -> Option<KeyGrant>,
) -> Result<KeyRequest, MungeError> {
    use std::io::Write;
    let wire = |e: std::io::Error| MungeError::Run {
        program: "the key exchange",
        reason: e.to_string(),
    };
    stream.set_read_timeout(Some(WIRE_DEADLINE)).map_err(wire)?;
    stream
        .set_write_timeout(Some(WIRE_DEADLINE))
        .map_err(wire)?;
    let credential = read_line(&stream).map_err(wire)?;
    let decoded = munge.decode(&credential)?;
    if decoded.uid != 0 {
        return Err(MungeError::NotRoot(decoded.uid));
    }
    let request = KeyRequest::parse(&decoded.payload)?;
    let Some(grant) = grant(&request).filter(|g| g.answers(&request)) else {
        return Err(MungeError::Payload(format!(
            "no key for step {}.{} here",
            request.job, request.step
        )));
    };
    let reply = munge.encode(&grant.payload())?;
    (&stream)
        .write_all(format!("{reply}\n").as_bytes())
        .map_err(wire)?;
    Ok(request)
}

/// Asks the service at `addr` for the key of `request`'s step: the answer, checked (made by root, for that step).
pub fn ask(
    addr: std::net::SocketAddr,
    munge: &Munge,
    request: &KeyRequest,
) -> Result<KeyGrant, MungeError> {
    use std::io::Write;
    let wire = |e: std::io::Error| MungeError::Run {
        program: "the key exchange",
        reason: format!("{addr}: {e}"),
    };
    let credential = munge.encode(&request.payload())?;
    let stream = std::net::TcpStream::connect_timeout(&addr, WIRE_DEADLINE).map_err(wire)?;
    stream.set_read_timeout(Some(WIRE_DEADLINE)).map_err(wire)?;
    stream
        .set_write_timeout(Some(WIRE_DEADLINE))
        .map_err(wire)?;
    (&stream)
        .write_all(format!("{credential}\n").as_bytes())
        .map_err(wire)?;
    let reply = read_line(&stream).map_err(wire)?;
    if reply.is_empty() {
        return Err(MungeError::Refused {
            program: "the first node's service",
            message: format!("{addr} closed without a key (see that node's service log)"),
        });
    }
    let decoded = munge.decode(&reply)?;
    if decoded.uid != 0 {
        return Err(MungeError::NotRoot(decoded.uid));
    }
    let grant = KeyGrant::parse(&decoded.payload)?;
    if !grant.answers(request) {
        return Err(MungeError::Payload("a key for another step".into()));
    }
    Ok(grant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_grants_survive_their_payloads_and_nothing_else_parses() {
        let request = KeyRequest {
            job: "41".into(),
            step: "0".into(),
            node: "gpu-07".into(),
        };
        assert_eq!(
            KeyRequest::parse(&request.payload()).expect("request"),
            request
        );
        let grant = KeyGrant {
            job: "41".into(),
            step: "0".into(),
            port: 40123,
            secret: [0xab; SECRET_BYTES],
        };
        let back = KeyGrant::parse(&grant.payload()).expect("grant");
        assert!(back == grant && back.answers(&request));
        assert_eq!(grant.token().trim().len(), 64);
        assert!(!format!("{grant:?}").contains("abab"), "no secret in Debug");
        for bad in [
            "",
            "hello",
            "hangwatch-node-key/1 want job=41 step=0",
            "hangwatch-node-key/1 want job=41 step=0 node=n1 extra=1",
            "hangwatch-node-key/1 want job=4 1 step=0 node=n1",
            "hangwatch-node-key/1 want step=0 job=41 node=n1",
            "hangwatch-node-key/1 want job=41;rm step=0 node=n1",
            "hangwatch-node-key/1 key job=41 step=0 port=0 secret=00",
        ] {
            assert!(KeyRequest::parse(bad).is_err(), "{bad:?}");
            assert!(KeyGrant::parse(bad).is_err(), "{bad:?}");
        }
        let short = grant.payload().replace("abab", "");
        assert!(KeyGrant::parse(&short).is_err());
    }

    #[test]
    fn unmunge_output_gives_the_maker_and_the_payload_and_a_bad_status_is_refused() {
        let ok = "STATUS:          0\nUID:             0\n\nhangwatch-node-key/1 want job=5 step=0 node=n2";
        assert_eq!(
            parse_unmunge(ok).expect("decoded"),
            Decoded {
                uid: 0,
                payload: "hangwatch-node-key/1 want job=5 step=0 node=n2".into()
            }
        );
        let replayed = "STATUS:          17\nUID:             0\n\nx";
        assert!(matches!(
            parse_unmunge(replayed),
            Err(MungeError::Refused { .. })
        ));
    }
}
