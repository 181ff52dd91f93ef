//! The memory-mapped files of a rank blocked in a page fault: `/proc/PID/maps` read in a child the parent
//! abandons at a deadline, then placed on mounts with the process's own mount table (a safe read).
//!
//! Reading `maps` takes the process's mmap lock; a thread faulting on a stopped filesystem can hold it, or a
//! writer (munmap, mmap) can queue behind the fault, and then the read blocks in D until the filesystem answers
//! (docs/inspecting-a-stuck-process.md). So it never runs in hangwatch itself.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::reexec::{read_json_lines, text_or_error};

/// What the child says about one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapsRead {
    pub pid: i32,
    pub text: Option<String>,
    pub error: Option<String>,
}

/// Reads `PROC/PID/maps` of every pid in one child (`program __read-maps`), giving up at `deadline`. A pid the
/// child did not get to is `Err` with why; a read that blocked is named as such.
pub fn read_maps(
    program: &Path,
    proc_root: &Path,
    pids: &[i32],
    deadline: Duration,
) -> HashMap<i32, Result<String, String>> {
    let mut out = HashMap::new();
    if pids.is_empty() {
        return out;
    }
    let mut cmd = Command::new(program);
    cmd.arg("__read-maps").arg("--proc-root").arg(proc_root);
    for pid in pids {
        cmd.arg("--pid").arg(pid.to_string());
    }
    let (read, why_missing) = read_json_lines::<MapsRead>(
        cmd,
        deadline,
        "the map reader",
        (
            "reading /proc/PID/maps",
            "its memory map is locked by the fault",
        ),
    );
    for r in read {
        out.insert(r.pid, text_or_error(r.text, r.error));
    }
    for pid in pids {
        out.entry(*pid).or_insert_with(|| Err(why_missing.clone()));
    }
    out
}

/// The child's side: reads each process's map under `proc_root` and prints one JSON line per process as soon as
/// it has it (a read that blocks costs only the processes after it).
pub fn child_main(proc_root: &Path, pids: &[i32], out: &mut impl Write) -> std::io::Result<()> {
    for &pid in pids {
        let (text, error) =
            match std::fs::read_to_string(proc_root.join(pid.to_string()).join("maps")) {
                Ok(t) => (Some(t), None),
                Err(e) => (None, Some(format!("cannot read /proc/{pid}/maps: {e}"))),
            };
        serde_json::to_writer(&mut *out, &MapsRead { pid, text, error })?;
        out.write_all(b"\n")?;
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_reads_a_live_map_and_says_why_it_cannot() {
        let me = std::process::id() as i32;
        let mut out = Vec::new();
        child_main(Path::new("/proc"), &[me, -5], &mut out).expect("written");
        let lines: Vec<MapsRead> = String::from_utf8(out)
            .expect("utf-8")
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect();
        let maps = hangwatch_proc::parse_maps(lines[0].text.as_deref().unwrap_or_default());
        assert!(
            maps.iter().any(|m| m.is_file() && m.executable()),
            "our own code is mapped"
        );
        assert!(lines[1]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("/proc/-5/maps")));
    }
}
