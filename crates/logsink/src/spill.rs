//! The node-local spill file: lines that do not fit in memory while the destination is stuck, in the writer's
//! record format, appended at the end and read back from the front.
//!
//! The file is created on first use in the spill directory and is already unlinked (it disappears with the sink
//! or with the process, whatever happens); it is truncated to nothing each time it has been read back entirely.
//! It never fills its filesystem: an append that would leave less than the [`SpillReserve`] free is refused.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::ledger::{Line, SpillStore};
use crate::protocol::{self, HEADER_LEN};

/// Free space the spill leaves on its filesystem for the rest of the node: the smaller of `percent` of the
/// filesystem's size and `max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillReserve {
    pub percent: u8,
    pub max_bytes: u64,
}

impl Default for SpillReserve {
    /// 5 % of the filesystem, at most 1 GiB.
    fn default() -> Self {
        SpillReserve {
            percent: 5,
            max_bytes: 1 << 30,
        }
    }
}

impl SpillReserve {
    /// No reserve: spill until the disk is full (tests of a full disk).
    pub const NONE: SpillReserve = SpillReserve {
        percent: 0,
        max_bytes: 0,
    };

    /// Bytes to leave free on a filesystem of `total` bytes.
    pub fn bytes(&self, total: u64) -> u64 {
        (total / 100 * u64::from(self.percent)).min(self.max_bytes)
    }
}

/// A [`SpillStore`] in an unnamed file under `dir` (which must be on node-local disk).
#[derive(Debug)]
pub struct FileSpill {
    reserve: SpillReserve,
    dir: PathBuf,
    file: Option<File>,
    read_at: u64,
    write_at: u64,
    buf: Vec<u8>,
}

impl FileSpill {
    pub fn new(dir: impl Into<PathBuf>, reserve: SpillReserve) -> Self {
        FileSpill {
            reserve,
            dir: dir.into(),
            file: None,
            read_at: 0,
            write_at: 0,
            buf: Vec::new(),
        }
    }

    fn file(&mut self) -> std::io::Result<&File> {
        if self.file.is_none() {
            // Safe in any directory, even a shared one: an unnamed `O_TMPFILE` (mode 0600), or where the
            // filesystem lacks it a random name created `O_EXCL` (never through a symlink) and unlinked at once.
            let file = tempfile::tempfile_in(&self.dir).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "could not create a spill file in {}: {e}",
                        self.dir.display()
                    ),
                )
            })?;
            self.file = Some(file);
        }
        self.file
            .as_ref()
            .ok_or_else(|| std::io::Error::other("spill file vanished"))
    }
}

/// Refuses an append of `len` bytes that would leave less than the reserve free on the spill's filesystem.
fn check_room(file: &File, dir: &Path, reserve: SpillReserve, len: u64) -> std::io::Result<()> {
    if reserve == SpillReserve::NONE {
        return Ok(());
    }
    // fstatvfs on the spill file itself: node-local, never the destination's filesystem.
    let st = nix::sys::statvfs::fstatvfs(file)?;
    let fragment = st.fragment_size();
    let free = st.blocks_available().saturating_mul(fragment);
    let keep = reserve.bytes(st.blocks().saturating_mul(fragment));
    if free < keep.saturating_add(len) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            format!(
                "the spill directory {} has only {} free (hangwatch leaves {} free for the node)",
                dir.display(),
                crate::human_bytes(free),
                crate::human_bytes(keep)
            ),
        ));
    }
    Ok(())
}

impl SpillStore for FileSpill {
    fn append(&mut self, lines: &[Line]) -> std::io::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        for line in lines {
            protocol::encode(line.seq, &line.bytes, &mut buf);
        }
        let at = self.write_at;
        let reserve = self.reserve;
        let dir = self.dir.clone();
        let result = self.file().and_then(|f| {
            check_room(f, &dir, reserve, buf.len() as u64)?;
            f.write_all_at(&buf, at).map_err(|e| {
                let _ = f.set_len(at);
                std::io::Error::new(
                    e.kind(),
                    format!("writing to the spill file in {} failed: {e}", dir.display()),
                )
            })
        });
        if result.is_ok() {
            self.write_at += buf.len() as u64;
        }
        self.buf = buf;
        result
    }

    fn take_front(&mut self, max_bytes: usize) -> std::io::Result<Vec<Line>> {
        let available = self.write_at - self.read_at;
        if available == 0 {
            return Ok(Vec::new());
        }
        let want = (max_bytes.max(HEADER_LEN) as u64).min(available) as usize;
        let mut chunk = vec![0u8; want];
        let at = self.read_at;
        let file = self.file()?;
        file.read_exact_at(&mut chunk, at)?;
        if protocol::decode(&chunk)
            .map_err(std::io::Error::other)?
            .is_none()
        {
            let mut header = [0u8; HEADER_LEN];
            file.read_exact_at(&mut header, at)?;
            let mut len = [0u8; 4];
            len.copy_from_slice(&header[9..13]);
            let total = protocol::encoded_len(u32::from_le_bytes(len) as usize);
            chunk.resize(total, 0);
            file.read_exact_at(&mut chunk, at)?;
        }
        let mut lines = Vec::new();
        let mut pos = 0;
        while let Some(rec) = protocol::decode(&chunk[pos..]).map_err(std::io::Error::other)? {
            lines.push(Line {
                seq: rec.seq,
                bytes: rec.payload.to_vec(),
            });
            pos += rec.len;
        }
        self.read_at += pos as u64;
        if self.read_at == self.write_at {
            self.read_at = 0;
            self.write_at = 0;
            if let Some(f) = &self.file {
                f.set_len(0)?;
            }
        }
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(range: std::ops::Range<u64>, len: usize) -> Vec<Line> {
        range
            .map(|seq| Line {
                seq,
                bytes: vec![b'a' + (seq % 26) as u8; len],
            })
            .collect()
    }

    #[test]
    fn lines_come_back_in_order_across_appends_and_partial_reads() {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = FileSpill::new(dir.path(), SpillReserve::default());
        spill.append(&lines(1..50, 10)).unwrap();
        let mut got = spill.take_front(100).unwrap();
        assert!(!got.is_empty() && got.len() < 49);
        spill.append(&lines(50..60, 3)).unwrap();
        while got.len() < 59 {
            let batch = spill.take_front(37).unwrap();
            assert!(!batch.is_empty());
            got.extend(batch);
        }
        assert_eq!(got, [lines(1..50, 10), lines(50..60, 3)].concat());
        assert!(spill.take_front(100).unwrap().is_empty());
    }

    #[test]
    fn a_record_larger_than_the_read_size_still_comes_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = FileSpill::new(dir.path(), SpillReserve::default());
        spill.append(&lines(1..3, 5000)).unwrap();
        let first = spill.take_front(10).unwrap();
        assert_eq!(first, lines(1..2, 5000));
    }

    #[test]
    fn emptied_spill_gives_its_disk_space_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = FileSpill::new(dir.path(), SpillReserve::default());
        spill.append(&lines(1..100, 100)).unwrap();
        while !spill.take_front(1000).unwrap().is_empty() {}
        let len = spill.file.as_ref().unwrap().metadata().unwrap().len();
        assert_eq!(len, 0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn missing_spill_directory_is_an_error_naming_it() {
        let mut spill = FileSpill::new("/nonexistent/hangwatch-spill", SpillReserve::default());
        let err = spill.append(&lines(1..2, 1)).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/hangwatch-spill"));
    }
}
