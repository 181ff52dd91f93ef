//! The two small formats between the sink and its writer child: binary records on the child's stdin (also the
//! spill file's format), and text messages (`ready`, `ack SEQ`, `err MESSAGE`) on its stdout.
//!
//! A record carries its sequence number so that the child can say exactly which lines it has written, and so that
//! a restarted child or a replay from the spill file needs no other bookkeeping.

/// First byte of every record; anything else means the stream lost its framing (a bug, reported as such).
pub const TAG: u8 = b'L';
/// Tag, sequence number (u64, little endian), payload length (u32, little endian).
pub const HEADER_LEN: usize = 1 + 8 + 4;
/// The longest payload of one record. Longer lines are split into several records by the sink.
pub const MAX_RECORD: usize = 16 << 20;

/// Appends one record to `out`.
pub fn encode(seq: u64, payload: &[u8], out: &mut Vec<u8>) {
    debug_assert!(payload.len() <= MAX_RECORD);
    out.reserve(HEADER_LEN + payload.len());
    out.push(TAG);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The encoded size of a record with `payload_len` bytes.
pub fn encoded_len(payload_len: usize) -> usize {
    HEADER_LEN + payload_len
}

/// One record found at the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub seq: u64,
    pub payload: &'a [u8],
    /// Bytes of the buffer the record occupies (header included).
    pub len: usize,
}

/// The stream does not start with a record header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error(
        "log record stream lost its framing: expected tag {expected:#04x}, found {found:#04x}"
    )]
    BadTag { expected: u8, found: u8 },
    #[error("log record {seq} claims {len} bytes, more than the limit of {MAX_RECORD}")]
    TooLong { seq: u64, len: usize },
}

/// Decodes the record at the start of `buf`; `Ok(None)` when `buf` holds only part of one.
pub fn decode(buf: &[u8]) -> Result<Option<Record<'_>>, FrameError> {
    let Some(&tag) = buf.first() else {
        return Ok(None);
    };
    if tag != TAG {
        return Err(FrameError::BadTag {
            expected: TAG,
            found: tag,
        });
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&buf[1..9]);
    let seq = u64::from_le_bytes(seq);
    let mut len = [0u8; 4];
    len.copy_from_slice(&buf[9..13]);
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_RECORD {
        return Err(FrameError::TooLong { seq, len });
    }
    let total = HEADER_LEN + len;
    if buf.len() < total {
        return Ok(None);
    }
    Ok(Some(Record {
        seq,
        payload: &buf[HEADER_LEN..total],
        len: total,
    }))
}

/// A message from the writer child, one per line on its stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriterMessage {
    /// The destination is open; writes may start.
    Ready,
    /// Every record up to and including this sequence number has been written (a `write()` returned for it).
    Ack(u64),
    /// The child cannot go on (open or write failed); it exits after this.
    Error(String),
}

impl WriterMessage {
    /// Parses one line (without its newline); `None` for anything not in the protocol.
    pub fn parse(line: &str) -> Option<WriterMessage> {
        let line = line.trim_end_matches(['\r', '\n']);
        if line == "ready" {
            return Some(WriterMessage::Ready);
        }
        if let Some(seq) = line.strip_prefix("ack ") {
            return seq.parse().ok().map(WriterMessage::Ack);
        }
        line.strip_prefix("err ")
            .map(|m| WriterMessage::Error(m.to_owned()))
    }

    /// The line that carries this message, newline included.
    pub fn to_line(&self) -> String {
        match self {
            WriterMessage::Ready => "ready\n".to_owned(),
            WriterMessage::Ack(seq) => format!("ack {seq}\n"),
            WriterMessage::Error(m) => format!("err {}\n", m.replace('\n', " ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_reports_its_length() {
        let mut buf = Vec::new();
        encode(7, b"hello\n", &mut buf);
        encode(8, b"", &mut buf);
        let first = decode(&buf).unwrap().unwrap();
        assert_eq!((first.seq, first.payload), (7, &b"hello\n"[..]));
        assert_eq!(first.len, encoded_len(6));
        let second = decode(&buf[first.len..]).unwrap().unwrap();
        assert_eq!((second.seq, second.payload), (8, &b""[..]));
        assert_eq!(first.len + second.len, buf.len());
    }

    #[test]
    fn partial_record_is_not_decoded() {
        let mut buf = Vec::new();
        encode(1, b"abcdef", &mut buf);
        for cut in 0..buf.len() {
            assert_eq!(decode(&buf[..cut]).unwrap(), None, "cut at {cut}");
        }
    }

    #[test]
    fn lost_framing_is_an_error_not_garbage() {
        assert_eq!(
            decode(b"xyz"),
            Err(FrameError::BadTag {
                expected: TAG,
                found: b'x'
            })
        );
        let mut buf = vec![TAG];
        buf.extend_from_slice(&3u64.to_le_bytes());
        buf.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode(&buf),
            Err(FrameError::TooLong { seq: 3, .. })
        ));
    }

    #[test]
    fn messages_round_trip() {
        for m in [
            WriterMessage::Ready,
            WriterMessage::Ack(42),
            WriterMessage::Error("no space left on device".into()),
        ] {
            assert_eq!(WriterMessage::parse(&m.to_line()), Some(m));
        }
        assert_eq!(WriterMessage::parse("ack x"), None);
        assert_eq!(WriterMessage::parse("hello"), None);
        assert_eq!(WriterMessage::Error("a\nb".into()).to_line(), "err a b\n");
    }
}
