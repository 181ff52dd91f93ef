//! The path argument of a blocked system call (mkdir, openat, rename, stat, ...), read from the rank's memory
//! without stopping it, in a child the parent abandons at a deadline; then resolved against the directory it is
//! relative to and placed on a mount by prefix, never by touching the path.
//!
//! `process_vm_readv` takes the target's memory-map lock, which a rank holds across a page fault on a frozen
//! mount (docs/inspecting-a-stuck-process.md): the read can block in D, so it never runs in hangwatch itself.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::reexec::{read_json_lines, text_or_error};

/// The longest path read (`PATH_MAX`).
pub const MAX_PATH: usize = 4096;

/// One string to read: `addr` in process `pid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StringAt {
    pub pid: i32,
    pub addr: u64,
}

/// What the child says about one string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StringRead {
    pub pid: i32,
    pub addr: u64,
    /// The bytes up to the first NUL, lossily as UTF-8 (paths are bytes; names in verdicts are for people).
    pub text: Option<String>,
    pub error: Option<String>,
}

/// Reads every string in `wanted` in one child (`program __read-strings`), giving up at `deadline`. Strings the
/// child did not get to are `Err` with why; a read that blocked is named as such.
pub fn read_strings(
    program: &Path,
    wanted: &[StringAt],
    deadline: Duration,
) -> HashMap<StringAt, Result<String, String>> {
    let mut out = HashMap::new();
    if wanted.is_empty() {
        return out;
    }
    let mut cmd = Command::new(program);
    cmd.arg("__read-strings");
    for w in wanted {
        cmd.arg("--at").arg(format!("{}:{:#x}", w.pid, w.addr));
    }
    let (read, why_missing) = read_json_lines::<StringRead>(
        cmd,
        deadline,
        "the memory reader",
        (
            "reading the rank's memory",
            "its memory map is locked, e.g. by a page fault on a frozen mount",
        ),
    );
    for r in read {
        out.insert(
            StringAt {
                pid: r.pid,
                addr: r.addr,
            },
            text_or_error(r.text, r.error),
        );
    }
    for w in wanted {
        out.entry(*w).or_insert_with(|| Err(why_missing.clone()));
    }
    out
}

/// The child's side: reads each string and prints one JSON line per string as soon as it has it (so that a read
/// that blocks costs only the strings after it).
pub fn child_main(wanted: &[StringAt], out: &mut impl Write) -> std::io::Result<()> {
    for w in wanted {
        let (text, error) = match read_c_string(w.pid, w.addr) {
            Ok(t) => (Some(t), None),
            Err(e) => (None, Some(e)),
        };
        let line = StringRead {
            pid: w.pid,
            addr: w.addr,
            text,
            error,
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
        out.flush()?;
    }
    Ok(())
}

/// Reads a NUL-terminated string at `addr` in `pid` with `process_vm_readv`, a page at a time (a string near the
/// end of a mapping must not fail for the unmapped page after it).
fn read_c_string(pid: i32, addr: u64) -> Result<String, String> {
    use nix::sys::uio::{process_vm_readv, RemoteIoVec};
    use std::io::IoSliceMut;
    const PAGE: u64 = 4096;
    let mut bytes: Vec<u8> = Vec::new();
    let mut at = addr;
    while bytes.len() < MAX_PATH {
        let to_page_end = PAGE - (at % PAGE);
        let want = usize::try_from(to_page_end)
            .unwrap_or(4096)
            .min(MAX_PATH - bytes.len());
        let mut buf = vec![0u8; want];
        let remote = [RemoteIoVec {
            base: usize::try_from(at).map_err(|_| format!("address {at:#x} out of range"))?,
            len: want,
        }];
        let n = process_vm_readv(
            nix::unistd::Pid::from_raw(pid),
            &mut [IoSliceMut::new(&mut buf)],
            &remote,
        )
        .map_err(|e| format!("process_vm_readv at {at:#x}: {e}"))?;
        if n == 0 {
            break;
        }
        if let Some(end) = buf[..n].iter().position(|&b| b == 0) {
            bytes.extend_from_slice(&buf[..end]);
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        bytes.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    Err(format!(
        "no end of string within {MAX_PATH} bytes at {addr:#x}"
    ))
}

/// Parses `PID:ADDR` (ADDR in hex with `0x`, or decimal), as the parent passes it.
pub fn parse_string_at(s: &str) -> Result<StringAt, String> {
    let (pid, addr) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not PID:ADDR"))?;
    let pid = pid
        .parse::<i32>()
        .map_err(|e| format!("pid in {s:?}: {e}"))?;
    let addr = match addr.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => addr.parse::<u64>(),
    }
    .map_err(|e| format!("address in {s:?}: {e}"))?;
    Ok(StringAt { pid, addr })
}

/// The absolute path a call's path argument names: `text` as is when absolute, else relative to `base` (the
/// dirfd's target or the working directory). `.` and `..` are folded lexically: the path is never touched.
/// An empty `text` (`AT_EMPTY_PATH`) is `base` itself.
pub fn absolute(text: &str, base: Option<&str>) -> Option<String> {
    let joined = if text.starts_with('/') {
        text.to_string()
    } else {
        let base = base.filter(|b| b.starts_with('/'))?;
        if text.is_empty() {
            base.to_string()
        } else {
            format!("{}/{text}", base.trim_end_matches('/'))
        }
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_resolved_lexically_against_their_directory() {
        assert_eq!(
            absolute("ckpt/step-100", Some("/gpfs/run")).as_deref(),
            Some("/gpfs/run/ckpt/step-100")
        );
        assert_eq!(
            absolute("/abs/./x/../y", Some("/ignored")).as_deref(),
            Some("/abs/y")
        );
        assert_eq!(
            absolute("", Some("/gpfs/run/")).as_deref(),
            Some("/gpfs/run")
        );
        assert_eq!(absolute("../../..", Some("/a/b")).as_deref(), Some("/"));
        assert_eq!(
            absolute("x", None),
            None,
            "a relative path without its base is unknown"
        );
        assert_eq!(
            absolute("x", Some("socket:[12]")),
            None,
            "a base that is not a directory path"
        );
    }

    #[test]
    fn the_child_reads_a_string_from_a_live_process_and_says_why_it_cannot() {
        // Our own memory: a C string at a known address.
        let text = std::ffi::CString::new("/gpfs/run/ckpt-7").expect("no NUL");
        let at = StringAt {
            pid: std::process::id() as i32,
            addr: text.as_ptr() as u64,
        };
        let mut out = Vec::new();
        child_main(
            &[
                at,
                StringAt {
                    pid: at.pid,
                    addr: 8,
                },
            ],
            &mut out,
        )
        .expect("written");
        let lines: Vec<StringRead> = String::from_utf8(out)
            .expect("utf-8")
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect();
        assert_eq!(lines[0].text.as_deref(), Some("/gpfs/run/ckpt-7"));
        assert!(lines[1].text.is_none());
        assert!(
            lines[1]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("process_vm_readv")),
            "{:?}",
            lines[1]
        );
        assert_eq!(
            parse_string_at("42:0x1f"),
            Ok(StringAt { pid: 42, addr: 31 })
        );
        assert!(parse_string_at("42").is_err());
    }
}
