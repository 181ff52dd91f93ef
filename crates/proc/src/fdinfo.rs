//! Parser of `/proc/PID/fdinfo/N`: the mount an open file lives on, learned without touching that mount.

use serde::{Deserialize, Serialize};

use crate::error::ParseError;

const FILE: &str = "fdinfo";

/// The fields of `fdinfo` that hangwatch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdInfo {
    /// File offset.
    pub pos: u64,
    /// Open flags (`O_WRONLY`, `O_APPEND`, ...), printed in octal by the kernel.
    pub flags: u32,
    /// Id of the mount in `/proc/PID/mountinfo` (kernel 3.15+).
    pub mnt_id: Option<u32>,
    pub ino: Option<u64>,
}

/// Parses an `fdinfo` file; lines after the common ones (epoll, inotify, eventfd details) are ignored.
pub fn parse_fdinfo(text: &str) -> Result<FdInfo, ParseError> {
    if text.trim().is_empty() {
        return Err(ParseError::Empty { file: FILE });
    }
    let (mut pos, mut flags, mut mnt_id, mut ino) = (None, None, None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "pos" => pos = Some(value.parse().map_err(|_| invalid("pos", value))?),
            "flags" => {
                flags = Some(u32::from_str_radix(value, 8).map_err(|_| invalid("flags", value))?)
            }
            "mnt_id" => mnt_id = Some(value.parse().map_err(|_| invalid("mnt_id", value))?),
            "ino" => ino = Some(value.parse().map_err(|_| invalid("ino", value))?),
            _ => {}
        }
    }
    Ok(FdInfo {
        pos: pos.ok_or(ParseError::Missing {
            file: FILE,
            field: "pos",
        })?,
        flags: flags.ok_or(ParseError::Missing {
            file: FILE,
            field: "flags",
        })?,
        mnt_id,
        ino,
    })
}

fn invalid(field: &'static str, value: &str) -> ParseError {
    ParseError::invalid(FILE, field, value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// fd 1 of a shell on this machine: a file on the root ext4 (mount 27), opened `O_WRONLY|O_LARGEFILE`.
    const LOG_FILE: &str = "pos:\t2490\nflags:\t0100001\nmnt_id:\t27\nino:\t10010878\n";
    /// An eventpoll fd: extra lines after the common ones.
    const EPOLL: &str = "pos:\t0\nflags:\t02\nmnt_id:\t16\nino:\t1057\n\
                         tfd:        5 events:       19 data:                5  pos:0 ino:40d sdev:e\n";

    #[test]
    fn regular_file() {
        let info = parse_fdinfo(LOG_FILE).unwrap();
        assert_eq!(info.pos, 2490);
        assert_eq!(info.flags, 0o100001);
        assert_eq!(info.flags & 0o3, 1, "O_WRONLY");
        assert_eq!(info.mnt_id, Some(27));
        assert_eq!(info.ino, Some(10010878));
    }

    #[test]
    fn epoll_extra_lines_are_ignored() {
        let info = parse_fdinfo(EPOLL).unwrap();
        assert_eq!(info.mnt_id, Some(16));
        assert_eq!(info.flags, 2);
    }

    #[test]
    fn old_kernel_without_mnt_id() {
        let info = parse_fdinfo("pos:\t0\nflags:\t02\n").unwrap();
        assert_eq!(info.mnt_id, None);
        assert_eq!(info.ino, None);
    }

    #[test]
    fn errors() {
        assert!(matches!(
            parse_fdinfo("").unwrap_err(),
            ParseError::Empty { .. }
        ));
        assert!(matches!(
            parse_fdinfo("flags:\t02\n").unwrap_err(),
            ParseError::Missing { field: "pos", .. }
        ));
        assert!(matches!(
            parse_fdinfo("pos:\t0\nflags:\t09\n").unwrap_err(),
            ParseError::Invalid { field: "flags", .. }
        ));
        assert!(matches!(
            parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t-1\n").unwrap_err(),
            ParseError::Invalid {
                field: "mnt_id",
                ..
            }
        ));
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = parse_fdinfo(&text);
        }

        #[test]
        fn never_panics_on_known_keys(lines in prop::collection::vec("(pos|flags|mnt_id|ino|tfd):[ \t]?[0-9a-z-]{0,22}", 0..6)) {
            let _ = parse_fdinfo(&lines.join("\n"));
        }
    }
}
