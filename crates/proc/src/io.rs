//! Parser of `/proc/PID/io`: I/O counters, which tell a process that still writes from one that stopped.

use serde::{Deserialize, Serialize};

use crate::error::ParseError;

const FILE: &str = "io";

/// I/O counters of a process, in bytes (`syscr`/`syscw` in calls); `None` for lines the kernel did not print.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoCounters {
    pub rchar: Option<u64>,
    pub wchar: Option<u64>,
    pub syscr: Option<u64>,
    pub syscw: Option<u64>,
    pub read_bytes: Option<u64>,
    pub write_bytes: Option<u64>,
    pub cancelled_write_bytes: Option<u64>,
}

pub fn parse_io(text: &str) -> Result<IoCounters, ParseError> {
    if text.trim().is_empty() {
        return Err(ParseError::Empty { file: FILE });
    }
    let mut io = IoCounters::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let slot = match key {
            "rchar" => &mut io.rchar,
            "wchar" => &mut io.wchar,
            "syscr" => &mut io.syscr,
            "syscw" => &mut io.syscw,
            "read_bytes" => &mut io.read_bytes,
            "write_bytes" => &mut io.write_bytes,
            "cancelled_write_bytes" => &mut io.cancelled_write_bytes,
            _ => continue,
        };
        let value = value.trim();
        *slot = Some(value.parse().map_err(|_| ParseError::Invalid {
            file: FILE,
            field: "counter",
            value: format!("{key}: {value}"),
        })?);
    }
    Ok(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_counters() {
        let io = parse_io(
            "rchar: 4096\nwchar: 2490\nsyscr: 12\nsyscw: 3\nread_bytes: 0\nwrite_bytes: 8192\n\
             cancelled_write_bytes: 0\n",
        )
        .unwrap();
        assert_eq!(io.rchar, Some(4096));
        assert_eq!(io.wchar, Some(2490));
        assert_eq!(io.syscw, Some(3));
        assert_eq!(io.write_bytes, Some(8192));
        assert_eq!(io.cancelled_write_bytes, Some(0));
    }

    #[test]
    fn errors() {
        assert!(parse_io("").is_err());
        assert!(parse_io("wchar: lots\n").is_err());
        assert_eq!(parse_io("other: 1\n").unwrap(), IoCounters::default());
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = parse_io(&text);
        }
    }
}
