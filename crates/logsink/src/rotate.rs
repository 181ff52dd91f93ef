//! The log file's size cap: when PATH would grow past `max_size`, the writer child renames PATH to PATH.1 (PATH.1
//! to PATH.2, ... keeping `keep` old files) and starts a new PATH. Only between lines, so every line is whole in
//! one file and reading PATH.keep .. PATH.1, PATH gives every kept line in order.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// How big the log may grow and how many rotated files are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Bytes one file may hold; a line longer than this gets a file of its own. Never 0.
    pub max_size: u64,
    /// Rotated files kept (PATH.1 is the newest). Never 0.
    pub keep: u32,
}

/// A size cap that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RotationError {
    #[error(
        "keeping 0 rotated files would delete the log each time it reaches its size cap: keep at least 1, or set \
         the size cap to 0 (no cap)"
    )]
    KeepZero,
}

impl Rotation {
    /// `run`'s default: 1 GiB per file, 3 old files (at most 4 GiB of log).
    pub const DEFAULT: Rotation = Rotation {
        max_size: 1 << 30,
        keep: 3,
    };

    /// The cap from the command line: `max_size` 0 means no cap (`None`).
    pub fn new(max_size: u64, keep: u32) -> Result<Option<Rotation>, RotationError> {
        if max_size == 0 {
            return Ok(None);
        }
        if keep == 0 {
            return Err(RotationError::KeepZero);
        }
        Ok(Some(Rotation { max_size, keep }))
    }
}

/// `PATH.n`.
pub fn rotated_path(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// Shifts PATH.(keep-1) .. PATH.1 up by one (the oldest is replaced) and renames PATH to PATH.1. Missing files are
/// gaps, not errors.
pub fn shift_files(path: &Path, keep: u32) -> std::io::Result<()> {
    let rename = |from: &Path, to: &Path| match std::fs::rename(from, to) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(std::io::Error::new(
            e.kind(),
            format!("cannot rename {} to {}: {e}", from.display(), to.display()),
        )),
        _ => Ok(()),
    };
    for n in (1..keep).rev() {
        rename(&rotated_path(path, n), &rotated_path(path, n + 1))?;
    }
    rename(path, &rotated_path(path, 1))
}

/// Where the writer child writes: the file, what is in it, and when it must be rotated.
pub trait Destination: Write {
    /// `(bytes in the current file, its cap)` when it has a cap.
    fn cap(&self) -> Option<(u64, u64)> {
        None
    }

    /// Starts a new, empty current file.
    fn rotate(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Destination for Vec<u8> {}

impl<D: Destination + ?Sized> Destination for &mut D {
    fn cap(&self) -> Option<(u64, u64)> {
        (**self).cap()
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        (**self).rotate()
    }
}

/// The log file, opened for appending, rotated by size when it has a [`Rotation`].
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    file: File,
    size: u64,
    rotation: Option<Rotation>,
    /// Opened through safefs (hangwatch's own output.log), rotations too.
    private: bool,
}

/// Opens `path` for appending, creating it. `private`: in one of hangwatch's private directories (0600, a symlink
/// there refused); otherwise as the user named it.
fn open_append(path: &Path, private: bool) -> std::io::Result<File> {
    if private {
        return hangwatch_safefs::open_file_in_dir(path, hangwatch_safefs::WriteMode::Append)
            .map_err(|e| std::io::Error::other(hangwatch_model::error_chain(&e)));
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
}

impl LogFile {
    /// Opens `path` for appending (creating it); the size already there counts toward the cap.
    pub fn open(
        path: &Path,
        rotation: Option<Rotation>,
        private: bool,
    ) -> std::io::Result<LogFile> {
        let file = open_append(path, private)?;
        let size = file.metadata()?.len();
        Ok(LogFile {
            path: path.to_owned(),
            file,
            size,
            rotation,
            private,
        })
    }
}

impl Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl Destination for LogFile {
    fn cap(&self) -> Option<(u64, u64)> {
        self.rotation.map(|r| (self.size, r.max_size))
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let Some(rotation) = self.rotation else {
            return Ok(());
        };
        shift_files(&self.path, rotation.keep)?;
        let file = open_append(&self.path, self.private).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot create {} after rotating it: {e}",
                    self.path.display()
                ),
            )
        })?;
        self.size = file.metadata()?.len();
        self.file = file;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_size_means_no_cap_and_zero_keep_is_refused() {
        assert_eq!(Rotation::new(0, 0), Ok(None));
        assert_eq!(
            Rotation::new(10, 2),
            Ok(Some(Rotation {
                max_size: 10,
                keep: 2
            }))
        );
        let err = Rotation::new(10, 0).unwrap_err();
        assert!(err.to_string().contains("keep at least 1"), "{err}");
    }

    #[test]
    fn shifting_keeps_the_newest_files_and_replaces_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        let write = |p: PathBuf, text: &str| std::fs::write(p, text).unwrap();
        write(path.clone(), "current");
        write(rotated_path(&path, 1), "one");
        write(rotated_path(&path, 2), "two");
        shift_files(&path, 2).unwrap();
        let read = |n| std::fs::read_to_string(rotated_path(&path, n)).unwrap();
        assert!(!path.exists());
        assert_eq!(read(1), "current");
        assert_eq!(read(2), "one");
        assert!(!rotated_path(&path, 3).exists());
    }

    #[test]
    fn missing_rotated_files_are_gaps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        std::fs::write(&path, "current").unwrap();
        shift_files(&path, 3).unwrap();
        assert_eq!(
            std::fs::read_to_string(rotated_path(&path, 1)).unwrap(),
            "current"
        );
    }

    #[test]
    fn log_file_counts_what_is_already_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        std::fs::write(&path, "12345").unwrap();
        let mut f = LogFile::open(&path, Rotation::new(8, 1).unwrap(), false).unwrap();
        assert_eq!(f.cap(), Some((5, 8)));
        f.write_all(b"67").unwrap();
        assert_eq!(f.cap(), Some((7, 8)));
        f.rotate().unwrap();
        assert_eq!(f.cap(), Some((0, 8)));
        f.write_all(b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        assert_eq!(
            std::fs::read_to_string(rotated_path(&path, 1)).unwrap(),
            "1234567"
        );
    }
}
