//! Beats through shared memory: a 64-byte slot per local rank in a file that the agent creates in its private
//! runtime directory and each rank maps (`HANGWATCH_BEATS`). A beat is a store into the rank's own slot, no
//! system call (a datagram's `send` was 2.2 µs of a 3 µs beat); the agent reads the slots at its tick. Datagrams
//! stay for hello, phases and log records, and for beats when the file cannot be mapped (docs/wire-protocol.md).
//!
//! Slot `LOCAL_RANK` (else `RANK`, else 0), little-endian: `count: u64` (beats so far), `step: i64` (-1: none),
//! `pid: u64` and `rank + 1: u64` (0: unknown), written once by the process that takes the slot: the one holding
//! the lock on its bytes (python/src/hangwatch/_client.py), never a DataLoader worker of that rank.
//!
//! The agent reads the file with `pread` (a tmpfs page it shares with the ranks' mappings), never maps it:
//! hangwatch keeps no unsafe memory code for it, and a read of 64 KiB each tick costs microseconds.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Slots in the file: local ranks per node (LOCAL_RANK) stay far below.
pub const SLOTS: usize = 1024;
pub const SLOT_BYTES: usize = 64;

/// One slot's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub count: u64,
    pub step: Option<u64>,
    pub pid: i32,
    pub rank: Option<u32>,
}

/// A slot that moved since the last read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub slot: Slot,
    /// Beats since the last read (at least 1).
    pub beats: u64,
}

/// The agent's side of the file.
#[derive(Debug)]
pub struct BeatSlots {
    path: PathBuf,
    file: File,
    last: Vec<u64>,
    buf: Vec<u8>,
}

impl BeatSlots {
    /// Creates the file (0600, new) at `path`, sized for [`SLOTS`] slots of zeros.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        file.set_len((SLOTS * SLOT_BYTES) as u64)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            last: vec![0; SLOTS],
            buf: vec![0; SLOTS * SLOT_BYTES],
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The slots whose count moved since the last call.
    pub fn take(&mut self) -> Vec<Moved> {
        let n = match self.file.read_at(&mut self.buf, 0) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the beat slots");
                return Vec::new();
            }
        };
        let mut moved = Vec::new();
        for (i, raw) in self.buf[..n].chunks_exact(SLOT_BYTES).enumerate() {
            let slot = parse_slot(raw);
            if slot.count != self.last[i] && slot.pid > 0 {
                // A count that fell is a new owner's (an older client starts from zero), not 2^64 beats.
                let beats = slot.count.checked_sub(self.last[i]).unwrap_or(slot.count);
                moved.push(Moved {
                    slot,
                    beats: beats.max(1),
                });
                self.last[i] = slot.count;
            }
        }
        moved
    }
}

fn word(raw: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&raw[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Reads one slot as the client wrote it.
pub fn parse_slot(raw: &[u8]) -> Slot {
    let step = word(raw, 8) as i64;
    let rank = word(raw, 24);
    Slot {
        count: word(raw, 0),
        step: u64::try_from(step).ok(),
        pid: i32::try_from(word(raw, 16)).unwrap_or(0),
        rank: rank.checked_sub(1).and_then(|r| u32::try_from(r).ok()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_slot(file: &File, index: usize, count: u64, step: i64, pid: u64, rank: u64) {
        let mut raw = [0u8; 32];
        raw[0..8].copy_from_slice(&count.to_le_bytes());
        raw[8..16].copy_from_slice(&step.to_le_bytes());
        raw[16..24].copy_from_slice(&pid.to_le_bytes());
        raw[24..32].copy_from_slice(&rank.to_le_bytes());
        file.write_at(&raw, (index * SLOT_BYTES) as u64)
            .expect("written");
    }

    #[test]
    fn moved_slots_are_reported_once_with_their_step_rank_and_pid() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("beats");
        let mut slots = BeatSlots::create(&path).expect("created");
        assert!(slots.take().is_empty(), "all zero");
        let writer = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        write_slot(&writer, 0, 5, 40, 1234, 1);
        write_slot(&writer, 3, 1, -1, 1240, 4);
        let moved = slots.take();
        assert_eq!(moved.len(), 2);
        assert_eq!(
            moved[0],
            Moved {
                slot: Slot {
                    count: 5,
                    step: Some(40),
                    pid: 1234,
                    rank: Some(0)
                },
                beats: 5
            }
        );
        assert_eq!(moved[1].slot.step, None);
        assert_eq!(moved[1].slot.rank, Some(3));
        assert!(slots.take().is_empty(), "nothing moved since");
        write_slot(&writer, 0, 7, 42, 1234, 1);
        assert_eq!(slots.take()[0].beats, 2);
        write_slot(&writer, 0, 3, 1, 1300, 1);
        assert_eq!(
            slots.take()[0].beats,
            3,
            "a new owner that counts from zero"
        );
        assert!(
            BeatSlots::create(&path).is_err(),
            "never reuses (or follows) a file that is there"
        );
    }
}
