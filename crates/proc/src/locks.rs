//! Parser of `/proc/locks`: the file locks the kernel holds (flock, POSIX, open file description locks) and the
//! processes waiting for them, so that a rank waiting for a lock is named with the process that holds it.
//!
//! A line is `ID: [-> ]CLASS TYPE ACCESS PID MAJ:MIN:INODE START END`; a waiter (`->`) carries the id of the lock
//! it waits for. Reading the file walks the kernel's lock lists: it never touches the locked file's filesystem.

use serde::{Deserialize, Serialize};

/// One line of `/proc/locks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLock {
    /// The lock's number (a waiter has the number of the lock it waits for).
    pub id: u64,
    /// A process waiting for the lock `id`, not holding it.
    pub waiting: bool,
    /// `FLOCK`, `POSIX`, `OFDLCK`, `LEASE`, ...
    pub class: String,
    /// `READ` or `WRITE`.
    pub access: String,
    /// The holder (or waiter), in the reader's pid namespace; -1 for an open file description lock.
    pub pid: i32,
    /// `MAJ:MIN:INODE` of the locked file.
    pub file: String,
}

/// Every well-formed line of `text` (others are skipped: a kernel that writes more is still read).
pub fn parse_locks(text: &str) -> Vec<FileLock> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<FileLock> {
    let (id, rest) = line.split_once(':')?;
    let id = id.trim().parse().ok()?;
    let mut fields = rest.split_whitespace().peekable();
    let waiting = fields.peek() == Some(&"->");
    if waiting {
        fields.next();
    }
    let class = fields.next()?.to_string();
    let _advisory = fields.next()?;
    let access = fields.next()?.to_string();
    let pid = fields.next()?.parse().ok()?;
    let file = fields.next()?.to_string();
    Some(FileLock {
        id,
        waiting,
        class,
        access,
        pid,
        file,
    })
}

/// The locks `pid` waits for, each with the processes that hold it: (the waited lock, its holders).
pub fn holders_of_waits(locks: &[FileLock], pid: i32) -> Vec<(FileLock, Vec<FileLock>)> {
    locks
        .iter()
        .filter(|l| l.waiting && l.pid == pid)
        .map(|wait| {
            let holders = locks
                .iter()
                .filter(|l| !l.waiting && l.id == wait.id && l.file == wait.file)
                .cloned()
                .collect();
            (wait.clone(), holders)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded on this machine: a shell holding an flock, a rank waiting for it, and an unrelated POSIX lock.
    const LOCKS: &str = "\
1: FLOCK  ADVISORY  WRITE 4242 08:01:131090 0 EOF
1: -> FLOCK  ADVISORY  WRITE 5151 08:01:131090 0 EOF
2: POSIX  ADVISORY  WRITE 777 00:2b:12 0 EOF
3: OFDLCK ADVISORY  READ  -1 00:05:99 0 EOF
";

    #[test]
    fn a_waiter_is_matched_to_the_holder_of_the_lock_it_waits_for() {
        let locks = parse_locks(LOCKS);
        assert_eq!(locks.len(), 4);
        let waits = holders_of_waits(&locks, 5151);
        assert_eq!(waits.len(), 1);
        let (wait, holders) = &waits[0];
        assert_eq!(
            (wait.class.as_str(), wait.file.as_str()),
            ("FLOCK", "08:01:131090")
        );
        assert_eq!(
            holders.iter().map(|h| h.pid).collect::<Vec<_>>(),
            vec![4242]
        );
        assert!(
            holders_of_waits(&locks, 4242).is_empty(),
            "the holder waits for nothing"
        );
        assert_eq!(locks[3].pid, -1);
    }

    #[test]
    fn lines_of_another_shape_are_skipped() {
        assert!(parse_locks("garbage\n1: FLOCK\n\n").is_empty());
    }
}
