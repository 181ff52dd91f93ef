//! The writer child (`hangwatch __log-writer --dest PATH`): the only code that touches the log destination.
//!
//! It reads records from stdin in batches, appends their payloads to the destination, and after every `write()`
//! that returns says on stdout which records are now completely written (`ack SEQ`). When the destination's
//! filesystem freezes, this process sits in D state inside `write()`; the sink keeps everything unacknowledged
//! and can abandon it. When the sink goes away, the child still writes what it has already read, then exits.
//! With a size cap it also rotates the destination (`rotate.rs`), between lines.

use std::io::{Read, Write};
use std::path::Path;

use hangwatch_model::error_chain;

use crate::protocol::{self, FrameError, WriterMessage};
use crate::rotate::{Destination, LogFile, Rotation};

/// Bytes read from stdin per batch (the sink's pipe holds about as much).
const READ_CHUNK: usize = 1 << 20;

/// Why the writer stopped.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    #[error("could not read log records from the sink")]
    Read {
        #[source]
        source: std::io::Error,
    },
    #[error("write to the log destination failed after line {written}")]
    Write {
        written: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("rotating the log failed after line {written}")]
    Rotate {
        written: u64,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("the sink closed the stream in the middle of a record")]
    Truncated,
}

/// Sends protocol messages to the sink. Once the sink is gone (a send fails), stays quiet and lets the writer
/// finish the lines it already holds.
#[derive(Debug)]
pub struct Messages<W: Write> {
    out: W,
    broken: bool,
}

impl<W: Write> Messages<W> {
    pub fn new(out: W) -> Self {
        Messages { out, broken: false }
    }

    pub fn send(&mut self, message: &WriterMessage) {
        if self.broken {
            return;
        }
        let line = message.to_line();
        if self
            .out
            .write_all(line.as_bytes())
            .and_then(|()| self.out.flush())
            .is_err()
        {
            self.broken = true;
        }
    }
}

/// What a writer did before its input ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterSummary {
    pub records: u64,
    pub bytes: u64,
    pub last_seq: u64,
}

/// Copies records from `input` to `dest` until `input` ends, acknowledging through `messages` after every
/// `write()` the highest record written completely. When `dest` has a size cap, it is rotated before a record
/// that would take it over the cap (never in the middle of one; an empty file takes any record).
pub fn copy_records<R: Read, D: Destination, M: Write>(
    mut input: R,
    mut dest: D,
    messages: &mut Messages<M>,
) -> Result<WriterSummary, WriterError> {
    let mut summary = WriterSummary::default();
    let mut inbuf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut out: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut ends: Vec<(usize, u64)> = Vec::new();
    loop {
        let start = inbuf.len();
        inbuf.resize(start + READ_CHUNK, 0);
        let n = loop {
            match input.read(&mut inbuf[start..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(WriterError::Read { source }),
            }
        };
        inbuf.truncate(start + n);
        if n == 0 {
            return if inbuf.is_empty() {
                Ok(summary)
            } else {
                Err(WriterError::Truncated)
            };
        }

        out.clear();
        ends.clear();
        let mut pos = 0;
        while let Some(rec) = protocol::decode(&inbuf[pos..])? {
            out.extend_from_slice(rec.payload);
            ends.push((out.len(), rec.seq));
            pos += rec.len;
        }
        inbuf.drain(..pos);
        if ends.is_empty() {
            continue;
        }

        let mut written = 0usize;
        let mut next = 0usize;
        // Right after a rotation the next record goes into the new file whatever its size (someone else may have
        // created PATH meanwhile): never rotate twice in a row.
        let mut rotated = false;
        loop {
            let before = next;
            while next < ends.len() && ends[next].0 <= written {
                next += 1;
            }
            if next > before {
                let seq = ends[next - 1].1;
                summary.records += (next - before) as u64;
                summary.last_seq = seq;
                messages.send(&WriterMessage::Ack(seq));
            }
            if written == out.len() {
                break;
            }
            let start = record_start(&ends, next);
            let end = match segment_end(&dest, &ends[next..], written, start, !rotated) {
                Segment::Rotate => {
                    rotated = true;
                    dest.rotate().map_err(|source| WriterError::Rotate {
                        written: summary.last_seq,
                        source,
                    })?;
                    continue;
                }
                Segment::Until(end) => {
                    rotated = false;
                    end
                }
            };
            match dest.write(&out[written..end]) {
                Ok(0) => {
                    return Err(WriterError::Write {
                        written: summary.last_seq,
                        source: std::io::ErrorKind::WriteZero.into(),
                    })
                }
                Ok(n) => {
                    written += n;
                    summary.bytes += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(WriterError::Write {
                        written: summary.last_seq,
                        source,
                    })
                }
            }
        }
    }
}

fn record_start(ends: &[(usize, u64)], index: usize) -> usize {
    if index == 0 {
        0
    } else {
        ends[index - 1].0
    }
}

enum Segment {
    /// Rotate first: the next record would take the current file over its cap.
    Rotate,
    /// Write up to this offset of the batch.
    Until(usize),
}

/// How far the next `write()` may go. `ends` are the end offsets of the records not yet completely written, the
/// first of which starts at `start`; `written` is at or after `start` (after a short write, inside it).
fn segment_end<D: Destination>(
    dest: &D,
    ends: &[(usize, u64)],
    written: usize,
    start: usize,
    may_rotate: bool,
) -> Segment {
    let last = ends.last().map_or(written, |e| e.0);
    let Some((size, max)) = dest.cap() else {
        return Segment::Until(last);
    };
    let Some(&(first_end, _)) = ends.first() else {
        return Segment::Until(last);
    };
    if may_rotate && written == start && size > 0 && size + (first_end - start) as u64 > max {
        return Segment::Rotate;
    }
    // The record begun (or about to begin) is finished in this file; then whole records while they fit.
    let mut end = first_end;
    for &(e, _) in &ends[1..] {
        if size + (e - written) as u64 > max {
            break;
        }
        end = e;
    }
    Segment::Until(end)
}

/// The whole child: opens `dest` for appending (creating it), says `ready`, copies stdin to it, rotating it by
/// size when `rotation` is set. Returns the process exit code; failures are also reported to the sink as
/// `err MESSAGE`.
///
/// `private`: `dest` is in one of hangwatch's private directories; it is created 0600 and a symlink there is
/// refused. A log file the user named is opened as they named it (it may be a link to where they want it).
pub fn writer_main(dest: &Path, private: bool, rotation: Option<Rotation>) -> u8 {
    crate::yield_to_the_job(None);
    let mut messages = Messages::new(std::io::stdout().lock());
    let file = match LogFile::open(dest, rotation, private).map_err(|e| e.to_string()) {
        Ok(file) => file,
        Err(message) => {
            messages.send(&WriterMessage::Error(message));
            return 1;
        }
    };
    messages.send(&WriterMessage::Ready);
    match copy_records(std::io::stdin().lock(), file, &mut messages) {
        Ok(_) => 0,
        Err(e) => {
            messages.send(&WriterMessage::Error(error_chain(&e)));
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(range: std::ops::RangeInclusive<u64>) -> Vec<u8> {
        let mut buf = Vec::new();
        for seq in range {
            protocol::encode(seq, format!("line {seq}\n").as_bytes(), &mut buf);
        }
        buf
    }

    fn acks(messages: &[u8]) -> Vec<u64> {
        std::str::from_utf8(messages)
            .unwrap()
            .lines()
            .filter_map(|l| match WriterMessage::parse(l) {
                Some(WriterMessage::Ack(seq)) => Some(seq),
                _ => None,
            })
            .collect()
    }

    /// A destination whose `write()` takes at most `max` bytes and fails after `fail_after` bytes.
    struct Dest {
        data: Vec<u8>,
        max: usize,
        fail_after: usize,
    }

    impl Destination for Dest {}

    impl Write for Dest {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.data.len() >= self.fail_after {
                return Err(std::io::Error::from_raw_os_error(28));
            }
            let n = buf
                .len()
                .min(self.max)
                .min(self.fail_after - self.data.len());
            self.data.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn copies_payloads_and_acks_each_completed_record() {
        let input = records(1..=3);
        let mut dest = Dest {
            data: Vec::new(),
            max: 10,
            fail_after: usize::MAX,
        };
        let mut out = Vec::new();
        let summary = copy_records(&input[..], &mut dest, &mut Messages::new(&mut out)).unwrap();
        assert_eq!(dest.data, b"line 1\nline 2\nline 3\n");
        assert_eq!(acks(&out), vec![1, 2, 3]);
        assert_eq!(summary.records, 3);
        assert_eq!(summary.last_seq, 3);
    }

    #[test]
    fn short_writes_never_ack_a_record_that_is_only_partly_written() {
        let input = records(1..=4);
        let mut dest = Dest {
            data: Vec::new(),
            max: 3,
            fail_after: usize::MAX,
        };
        let mut out = Vec::new();
        copy_records(&input[..], &mut dest, &mut Messages::new(&mut out)).unwrap();
        let acks = acks(&out);
        assert_eq!(acks, vec![1, 2, 3, 4]);
    }

    #[test]
    fn failed_write_reports_the_last_complete_line_and_acks_only_that() {
        let input = records(1..=4);
        let mut dest = Dest {
            data: Vec::new(),
            max: 100,
            fail_after: 17,
        };
        let mut out = Vec::new();
        let err = copy_records(&input[..], &mut dest, &mut Messages::new(&mut out)).unwrap_err();
        assert!(
            matches!(err, WriterError::Write { written: 2, .. }),
            "{err:?}"
        );
        assert_eq!(acks(&out), vec![2]);
    }

    #[test]
    fn input_cut_inside_a_record_is_an_error() {
        let input = records(1..=2);
        let cut = &input[..input.len() - 2];
        let mut out = Vec::new();
        let err = copy_records(cut, Vec::new(), &mut Messages::new(&mut out)).unwrap_err();
        assert!(matches!(err, WriterError::Truncated));
        assert_eq!(acks(&out), vec![1]);
    }

    /// Files as a rotating destination sees them: the current one last.
    #[derive(Default)]
    struct Files {
        files: Vec<Vec<u8>>,
        max: u64,
        short: usize,
    }

    impl Write for Files {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.files.is_empty() {
                self.files.push(Vec::new());
            }
            let n = buf.len().min(self.short.max(1));
            self.files.last_mut().unwrap().extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Destination for Files {
        fn cap(&self) -> Option<(u64, u64)> {
            Some((self.files.last().map_or(0, |f| f.len() as u64), self.max))
        }
        fn rotate(&mut self) -> std::io::Result<()> {
            self.files.push(Vec::new());
            Ok(())
        }
    }

    #[test]
    fn rotation_happens_between_lines_and_keeps_every_line_in_order() {
        // "line N\n" is 7 bytes (9 from line 10 on); a cap of 20 holds two short lines per file.
        let input = records(1..=12);
        for short in [1, 3, usize::MAX] {
            let mut dest = Files {
                max: 20,
                short,
                ..Files::default()
            };
            let mut out = Vec::new();
            copy_records(&input[..], &mut dest, &mut Messages::new(&mut out)).unwrap();
            let joined: Vec<u8> = dest.files.concat();
            let want: Vec<u8> = (1..=12)
                .flat_map(|i| format!("line {i}\n").into_bytes())
                .collect();
            assert_eq!(joined, want, "short writes of {short}");
            for f in &dest.files {
                assert!(
                    f.len() <= 20,
                    "a file over its cap: {:?}",
                    String::from_utf8_lossy(f)
                );
                assert!(
                    f.ends_with(b"\n") && f.starts_with(b"line "),
                    "a line cut in two: {f:?}"
                );
            }
            assert_eq!(acks(&out).last(), Some(&12));
        }
    }

    #[test]
    fn a_line_longer_than_the_cap_gets_a_file_of_its_own() {
        let mut input = Vec::new();
        protocol::encode(1, b"ab\n", &mut input);
        protocol::encode(2, &[b'x'; 50], &mut input);
        protocol::encode(3, b"cd\n", &mut input);
        let mut dest = Files {
            max: 10,
            short: usize::MAX,
            ..Files::default()
        };
        let mut out = Vec::new();
        copy_records(&input[..], &mut dest, &mut Messages::new(&mut out)).unwrap();
        assert_eq!(dest.files.len(), 3);
        assert_eq!(dest.files[0], b"ab\n");
        assert_eq!(dest.files[1].len(), 50);
        assert_eq!(dest.files[2], b"cd\n");
    }

    #[test]
    fn a_gone_sink_does_not_stop_the_writing() {
        struct Gone;
        impl Write for Gone {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let input = records(1..=3);
        let mut dest = Vec::new();
        copy_records(&input[..], &mut dest, &mut Messages::new(Gone)).unwrap();
        assert_eq!(dest, b"line 1\nline 2\nline 3\n");
    }
}
