//! Line prefixes of the kernel-log formats people paste (`dmesg -T`, `dmesg`, syslog/journalctl, ISO, raw
//! `/dev/kmsg` records): which one a line has, its timestamp, and the kernel message behind it.

use std::borrow::Cow;

use hangwatch_model::kernel_log::{LineFormat, Timestamp};
use hangwatch_model::{parse_iso, WallTime};

/// One kernel message line with its prefix removed.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<'a> {
    pub time: Timestamp,
    /// The message; raw `/dev/kmsg` records are unescaped, so this may hold several lines.
    pub text: Cow<'a, str>,
    pub format: LineFormat,
}

/// Splits a line into timestamp and kernel message. `None` for lines that carry no kernel message: the
/// `KEY=VALUE` continuation lines of `/dev/kmsg` records, and syslog lines written by other programs.
pub fn split_prefix(line: &str) -> Option<Entry<'_>> {
    let line = line.trim_end_matches(['\n', '\r']);
    if let Some(entry) = kmsg_record(line) {
        return entry;
    }
    if is_kmsg_dict_line(line) {
        return None;
    }
    let mut rest = strip_priority(line);
    rest = strip_dmesg_level(rest);
    if rest.starts_with('[') {
        if let Some((time, format, after)) = bracketed(rest) {
            let after = strip_kernel_ident(after).unwrap_or(after);
            return Some(Entry {
                time,
                text: Cow::Borrowed(after),
                format,
            });
        }
    }
    if let Some((wall, after)) = parse_iso(rest) {
        let after = after.strip_prefix(' ').unwrap_or(after);
        let after = match strip_kernel_ident(after) {
            Some(message) => message,
            None if looks_like_other_program(after) => return None,
            None => after,
        };
        return Some(with_monotonic(
            Timestamp {
                wall: Some(wall),
                monotonic_s: None,
            },
            LineFormat::Iso,
            after,
        ));
    }
    if let Some((wall, after)) = syslog_time(rest) {
        let message = strip_kernel_ident(after)?;
        return Some(with_monotonic(
            Timestamp {
                wall: Some(wall),
                monotonic_s: None,
            },
            LineFormat::Syslog,
            message,
        ));
    }
    Some(Entry {
        time: Timestamp::default(),
        text: Cow::Borrowed(rest),
        format: LineFormat::Bare,
    })
}

/// A syslog-style message may still carry the kernel's own `[ 123.456] ` stamp.
fn with_monotonic(mut time: Timestamp, format: LineFormat, message: &str) -> Entry<'_> {
    let mut text = message;
    if let Some((secs, after)) = monotonic_bracket(message) {
        time.monotonic_s = Some(secs);
        text = after;
    }
    Entry {
        time,
        text: Cow::Borrowed(text),
        format,
    }
}

/// `prio,seq,usec,flags[,...];message`. Records of facilities other than the kernel (0) are written by
/// programs through `/dev/kmsg` and are not kernel messages: `Some(None)`.
fn kmsg_record(line: &str) -> Option<Option<Entry<'_>>> {
    let (header, message) = line.split_once(';')?;
    let mut fields = header.split(',');
    let prio: u32 = fields.next()?.parse().ok()?;
    let _seq: u64 = fields.next()?.parse().ok()?;
    let usec: u64 = fields.next()?.parse().ok()?;
    fields.next()?;
    if prio >> 3 != 0 {
        return Some(None);
    }
    let time = Timestamp {
        wall: None,
        monotonic_s: Some(usec as f64 / 1e6),
    };
    Some(Some(Entry {
        time,
        text: unescape_kmsg(message),
        format: LineFormat::Kmsg,
    }))
}

/// `/dev/kmsg` escapes non-printable bytes as `\xNN`.
fn unescape_kmsg(message: &str) -> Cow<'_, str> {
    if !message.contains("\\x") {
        return Cow::Borrowed(message);
    }
    let bytes = message.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && bytes.get(i + 1) == Some(&b'x') {
            if let Some(v) = bytes
                .get(i + 2..i + 4)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// ` SUBSYSTEM=pci`, ` DEVICE=+pci:0000:3b:00.0`: dictionary lines following a `/dev/kmsg` record.
fn is_kmsg_dict_line(line: &str) -> bool {
    let Some(rest) = line.strip_prefix(' ') else {
        return false;
    };
    let Some((key, _)) = rest.split_once('=') else {
        return false;
    };
    !key.is_empty()
        && key.bytes().next().is_some_and(|c| c.is_ascii_uppercase())
        && key
            .bytes()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
}

/// `<6>` (`dmesg -r`, syslog priority).
fn strip_priority(line: &str) -> &str {
    if let Some(rest) = line.strip_prefix('<') {
        if let Some((num, after)) = rest.split_once('>') {
            if !num.is_empty() && num.len() <= 3 && num.bytes().all(|c| c.is_ascii_digit()) {
                return after;
            }
        }
    }
    line
}

/// `kern  :info  : ` (`dmesg -x`).
fn strip_dmesg_level(line: &str) -> &str {
    const FACILITIES: [&str; 12] = [
        "kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron",
        "authpriv", "ftp",
    ];
    let Some((facility, rest)) = line.split_once(':') else {
        return line;
    };
    if !FACILITIES.contains(&facility.trim_end()) {
        return line;
    }
    let Some((level, after)) = rest.split_once(':') else {
        return line;
    };
    const LEVELS: [&str; 8] = [
        "emerg", "alert", "crit", "err", "warn", "notice", "info", "debug",
    ];
    if LEVELS.contains(&level.trim_end()) {
        after.strip_prefix(' ').unwrap_or(after)
    } else {
        line
    }
}

/// `[...] ` prefixes: ctime, monotonic, or another stamp-like bracket (`[  +0.000123]` of `dmesg -d/-e`).
fn bracketed(line: &str) -> Option<(Timestamp, LineFormat, &str)> {
    let close = line.find(']')?;
    let inner = &line[1..close];
    let after = &line[close + 1..];
    let after = after.strip_prefix(' ').unwrap_or(after);
    if let Some(wall) = ctime(inner) {
        return Some((
            Timestamp {
                wall: Some(wall),
                monotonic_s: None,
            },
            LineFormat::DmesgCtime,
            after,
        ));
    }
    if let Some(secs) = monotonic_inner(inner) {
        return Some((
            Timestamp {
                wall: None,
                monotonic_s: Some(secs),
            },
            LineFormat::Monotonic,
            after,
        ));
    }
    let stamp_like = close <= 40
        && inner.bytes().any(|c| c.is_ascii_digit())
        && inner
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b' ' | b'+' | b'.' | b':' | b','))
        && inner.contains(['.', ':']);
    stamp_like.then_some((Timestamp::default(), LineFormat::Bare, after))
}

/// `Sat Mar  4 04:10:52 2023`
fn ctime(inner: &str) -> Option<WallTime> {
    let mut parts = inner.split_ascii_whitespace();
    let weekday = parts.next()?;
    if weekday.len() != 3 || !weekday.bytes().all(|c| c.is_ascii_alphabetic()) {
        return None;
    }
    let month = month_from_abbrev(parts.next()?)?;
    let day: u8 = parts.next()?.parse().ok()?;
    let (hour, minute, second) = clock(parts.next()?)?;
    let year: i32 = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    WallTime::new(Some(year), month, day, hour, minute, second)
}

/// `HH:MM:SS`
fn clock(text: &str) -> Option<(u8, u8, u8)> {
    let mut it = text.split(':');
    let h = it.next()?.parse().ok()?;
    let m = it.next()?.parse().ok()?;
    let s = it.next()?.parse().ok()?;
    it.next().is_none().then_some((h, m, s))
}

/// `  967.723456`
fn monotonic_inner(inner: &str) -> Option<f64> {
    let t = inner.trim_start();
    let (whole, frac) = t.split_once('.')?;
    if whole.is_empty()
        || frac.is_empty()
        || !whole
            .bytes()
            .chain(frac.bytes())
            .all(|c| c.is_ascii_digit())
    {
        return None;
    }
    t.parse().ok()
}

fn monotonic_bracket(text: &str) -> Option<(f64, &str)> {
    let rest = text.strip_prefix('[')?;
    let (inner, after) = rest.split_once(']')?;
    let secs = monotonic_inner(inner)?;
    Some((secs, after.strip_prefix(' ').unwrap_or(after)))
}

/// `Jun 26 12:23:15 ` (classic syslog; no year).
fn syslog_time(line: &str) -> Option<(WallTime, &str)> {
    let month = month_from_abbrev(line.get(0..3)?)?;
    let rest = line.get(3..)?.strip_prefix(' ')?;
    let rest = rest.trim_start_matches(' ');
    let (day, rest) = rest.split_once(' ')?;
    let day: u8 = day.parse().ok()?;
    let (time, rest) = rest.split_once(' ')?;
    let (hour, minute, second) = clock(time)?;
    Some((WallTime::new(None, month, day, hour, minute, second)?, rest))
}

/// `host kernel: message` -> `message`.
fn strip_kernel_ident(text: &str) -> Option<&str> {
    let (host, rest) = text.split_once(' ')?;
    if host.is_empty() || host.ends_with(':') {
        return None;
    }
    rest.strip_prefix("kernel: ")
        .or_else(|| (rest == "kernel:").then_some(""))
}

/// `host prog[123]: ...`: a syslog line of another program.
fn looks_like_other_program(text: &str) -> bool {
    let Some((host, rest)) = text.split_once(' ') else {
        return false;
    };
    if host.is_empty() || host.ends_with(':') {
        return false;
    }
    let Some((ident, _)) = rest.split_once(": ") else {
        return false;
    };
    !ident.contains(' ') && ident.ends_with(']') && ident.contains('[')
}

/// Month number of an English three-letter abbreviation.
fn month_from_abbrev(s: &str) -> Option<u8> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    MONTHS.iter().position(|m| *m == s).map(|p| p as u8 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(line: &str) -> (Option<String>, Option<f64>, String, LineFormat) {
        let e = split_prefix(line).expect("a kernel line");
        (
            e.time.wall.map(|w| w.to_string()),
            e.time.monotonic_s,
            e.text.into_owned(),
            e.format,
        )
    }

    #[test]
    fn dmesg_ctime_prefix_keeps_the_message_indent() {
        let (wall, mono, text, format) = split("[Sat Mar  4 04:10:52 2023]  schedule+0x35/0xa0");
        assert_eq!(wall.as_deref(), Some("2023-03-04T04:10:52"));
        assert_eq!(mono, None);
        assert_eq!(text, " schedule+0x35/0xa0");
        assert_eq!(format, LineFormat::DmesgCtime);
    }

    #[test]
    fn monotonic_prefix() {
        let (wall, mono, text, format) =
            split("[  967.723456] INFO: task python:1 blocked for more than 120 seconds.");
        assert_eq!((wall, mono), (None, Some(967.723456)));
        assert_eq!(
            text,
            "INFO: task python:1 blocked for more than 120 seconds."
        );
        assert_eq!(format, LineFormat::Monotonic);
    }

    #[test]
    fn syslog_prefix_with_and_without_kernel_stamp() {
        let (wall, mono, text, format) =
            split("Jun 26 12:23:15 node7 kernel: nfs: server fs1 not responding, still trying");
        assert_eq!(wall.as_deref(), Some("--06-26T12:23:15"));
        assert_eq!(mono, None);
        assert_eq!(text, "nfs: server fs1 not responding, still trying");
        assert_eq!(format, LineFormat::Syslog);
        let (wall, mono, text, _) =
            split("Jun  6 02:03:04 node7 kernel: [ 123.4] task:python state:D");
        assert_eq!(wall.as_deref(), Some("--06-06T02:03:04"));
        assert_eq!(mono, Some(123.4));
        assert_eq!(text, "task:python state:D");
    }

    #[test]
    fn syslog_lines_of_other_programs_are_not_kernel_messages() {
        assert_eq!(
            split_prefix("Jun 26 12:23:15 node7 sshd[123]: Accepted publickey"),
            None
        );
        assert_eq!(
            split_prefix("2023-03-04T04:10:52+0100 node7 sshd[123]: Accepted publickey"),
            None
        );
    }

    #[test]
    fn iso_prefixes_of_dmesg_and_journalctl() {
        let (wall, _, text, format) = split("2023-03-04T04:10:52,123456+01:00 nfs: server fs1 OK");
        assert_eq!(wall.as_deref(), Some("2023-03-04T04:10:52.123456+01:00"));
        assert_eq!(text, "nfs: server fs1 OK");
        assert_eq!(format, LineFormat::Iso);
        let (wall, _, text, _) = split("2023-03-04T04:10:52+0100 node7 kernel: nfs: server fs1 OK");
        assert_eq!(wall.as_deref(), Some("2023-03-04T04:10:52+01:00"));
        assert_eq!(text, "nfs: server fs1 OK");
    }

    #[test]
    fn raw_kmsg_records_and_their_dictionary_lines() {
        let (wall, mono, text, format) =
            split("6,1234,5678901,-;INFO: task python:7 blocked for more than 120 seconds.");
        assert_eq!((wall, mono), (None, Some(5.678901)));
        assert_eq!(
            text,
            "INFO: task python:7 blocked for more than 120 seconds."
        );
        assert_eq!(format, LineFormat::Kmsg);
        assert_eq!(
            split("4,99,1000000,c; __schedule+0x2d1/0x860").2,
            " __schedule+0x2d1/0x860"
        );
        assert_eq!(split_prefix(" SUBSYSTEM=pci"), None);
        assert_eq!(split_prefix(" DEVICE=+pci:0000:3b:00.0"), None);
        assert_eq!(split("6,1,2,-;a\\x5cb\\x0ac").2, "a\\b\nc");
    }

    #[test]
    fn kmsg_records_written_by_programs_are_skipped() {
        assert_eq!(
            split_prefix("30,1234,5678901,-;systemd[1]: Started foo."),
            None
        );
    }

    #[test]
    fn bare_lines_and_other_prefixes() {
        assert_eq!(
            split(" __schedule+0x2d1/0x860").2,
            " __schedule+0x2d1/0x860"
        );
        assert_eq!(
            split(" [<ffffffff8168b579>] schedule+0x29/0x70").2,
            " [<ffffffff8168b579>] schedule+0x29/0x70"
        );
        assert_eq!(split("[drm] Initialized").2, "[drm] Initialized");
        assert_eq!(
            split("[  +0.000123] nfs: server a OK").2,
            "nfs: server a OK"
        );
        assert_eq!(split("<4>[  1.5] hello").1, Some(1.5));
        assert_eq!(split("kern  :warn  : [  1.5] hello").2, "hello");
        assert_eq!(split("[  967.723456] node7 kernel: hello").2, "hello");
    }
}
