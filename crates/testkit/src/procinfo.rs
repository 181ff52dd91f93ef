//! What tests check about processes and mounts: a task's state letter and wchan, whether a path is a mount point.
//! Only /proc entries that never block on a stuck filesystem are read (`stat`, `wchan`, `mountinfo`).

use std::path::Path;

/// One thread of a process as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskState {
    pub tid: i32,
    /// State letter: R, S, D, T, t, Z, ...
    pub state: char,
    /// Kernel function the thread sleeps in (`percpu_rwsem_wait`, `request_wait_answer`), or empty / `0`.
    pub wchan: String,
}

/// State letter of a process (its main thread), `None` when it no longer exists.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    state_from_stat(&stat)
}

/// The kernel function a process's main thread waits in, `None` when it no longer exists.
pub fn wchan(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).ok()
}

/// Every thread of a process (empty when it no longer exists).
pub fn task_states(pid: u32) -> Vec<TaskState> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut tasks: Vec<TaskState> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let tid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let wchan = std::fs::read_to_string(e.path().join("wchan")).unwrap_or_default();
            Some(TaskState {
                tid,
                state: state_from_stat(&stat)?,
                wchan,
            })
        })
        .collect();
    tasks.sort_by_key(|t| t.tid);
    tasks
}

/// True when the process is gone or a zombie (dead, waiting to be reaped).
pub fn is_dead(pid: u32) -> bool {
    matches!(process_state(pid), None | Some('Z') | Some('X'))
}

/// The state letter from the text of /proc/PID/stat (the field after the last `)`, since `comm` may hold one).
pub fn state_from_stat(stat: &str) -> Option<char> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// Whether `mount_point` is a mount point in this process's mount namespace (/proc/self/mountinfo).
pub fn is_mount_point(mount_point: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = mount_point.to_string_lossy();
    text.lines()
        .any(|line| mount_point_of(line).as_deref() == Some(&*wanted))
}

/// The mount point field (5th) of a mountinfo line, with the kernel's octal escapes (`\040`) decoded.
fn mount_point_of(line: &str) -> Option<String> {
    let field = line.split(' ').nth(4)?;
    Some(unescape_octal(field))
}

fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let code =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_is_read_after_the_last_parenthesis() {
        assert_eq!(state_from_stat("42 (a) b) D 1 2 3"), Some('D'));
        assert_eq!(state_from_stat("garbage"), None);
    }

    #[test]
    fn mount_point_escapes_are_decoded() {
        let line = r"42 27 7:0 / /tmp/a\040b rw,relatime - ext4 /dev/loop0 rw";
        assert_eq!(mount_point_of(line).as_deref(), Some("/tmp/a b"));
    }

    #[test]
    fn root_is_a_mount_point_and_a_plain_directory_is_not() {
        assert!(is_mount_point(Path::new("/")));
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(dir.path()));
    }

    #[test]
    fn own_process_is_running_or_sleeping() {
        let state = process_state(std::process::id()).unwrap();
        assert!(matches!(state, 'R' | 'S'), "{state}");
        assert!(!task_states(std::process::id()).is_empty());
    }
}
