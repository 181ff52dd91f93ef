//! Private directories and files that refuse symlinks: every directory and file hangwatch writes on a node that
//! other users share (`/var/tmp`, a report directory given on the command line).
//!
//! A [`PrivateDir`] is an open directory fd, checked once: a directory (not a symlink to one), owned by our
//! effective uid, mode 0700. Everything below it is created and opened relative to that fd with `O_NOFOLLOW`, so
//! renaming or replacing a path component afterwards cannot redirect a write, and a symlink planted where a file
//! will go is refused with an error that names it (its target is never touched). Files are created mode 0600:
//! evidence holds kernel-log lines and the job's output.
//!
//! ```no_run
//! use hangwatch_safefs::PrivateDir;
//! # fn main() -> Result<(), hangwatch_safefs::SafeFsError> {
//! let root = PrivateDir::open_or_create("/var/tmp/hangwatch-1000".as_ref())?;
//! let run = root.subdir("run-20261129T214500Z-4242")?;
//! run.write("verdict.json", b"{}\n")?;
//! # Ok(())
//! # }
//! ```

use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, CWD};
use rustix::io::Errno;

mod handover;
pub use handover::UsersDir;

/// Directories hangwatch creates: only their owner may enter them.
pub const DIR_MODE: u32 = 0o700;
/// Files hangwatch creates: only their owner may read them.
pub const FILE_MODE: u32 = 0o600;

/// What was found where a directory or a regular file was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundKind {
    Symlink,
    Directory,
    RegularFile,
    /// A socket, fifo, device.
    Other,
}

impl std::fmt::Display for FoundKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FoundKind::Symlink => "a symlink",
            FoundKind::Directory => "a directory",
            FoundKind::RegularFile => "a regular file",
            FoundKind::Other => "a special file",
        })
    }
}

impl From<FileType> for FoundKind {
    fn from(t: FileType) -> Self {
        match t {
            FileType::Symlink => FoundKind::Symlink,
            FileType::Directory => FoundKind::Directory,
            FileType::RegularFile => FoundKind::RegularFile,
            _ => FoundKind::Other,
        }
    }
}

/// Why a private directory or file could not be opened or written. Every message names the path and what to do.
#[derive(Debug, thiserror::Error)]
pub enum SafeFsError {
    #[error(
        "a symlink is planted at {path}; hangwatch never follows one there (its target is left untouched): \
         remove it, or choose another directory"
    )]
    Symlink { path: PathBuf },
    #[error(
        "{path} belongs to uid {owner}, not to you (uid {euid}); hangwatch only writes into its own files and \
         directories: remove it (as its owner), or choose another directory"
    )]
    NotOurs {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    #[error(
        "{path} is {found}, where {expected} was expected: remove it, or choose another directory"
    )]
    WrongKind {
        path: PathBuf,
        found: FoundKind,
        expected: FoundKind,
    },
    #[error("{path} already exists; hangwatch creates it fresh and never reuses one it did not create: remove it")]
    Exists { path: PathBuf },
    #[error("cannot make {path} private (mode {mode:o} lets other users in): run `chmod go= {path}` yourself")]
    MakePrivate {
        path: PathBuf,
        mode: u32,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} belongs to uid {owner}, not to uid {uid} whose evidence goes there: root hands nothing over into a \
         directory someone else took; remove it (as its owner)"
    )]
    NotTheirs { path: PathBuf, owner: u32, uid: u32 },
    #[error("cannot move {path} into {to}; it stays where it is")]
    Move {
        path: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{name}` is not a plain file name (no `/`, `.` or `..`)")]
    BadName { name: String },
    #[error("cannot create the directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot remove {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// How an existing file is opened for writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// It must not exist yet (`O_EXCL`).
    CreateNew,
    /// Created, or emptied when it is already a regular file of ours.
    Truncate,
    /// Created, or appended to when it is already a regular file of ours.
    Append,
}

/// Our effective uid: what "ours" means for every check.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A directory that only we can enter, held open: see the module documentation.
#[derive(Debug)]
pub struct PrivateDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl PrivateDir {
    /// Opens `path` as a private directory, creating it (mode 0700) and each missing parent (0700 too) when
    /// needed.
    ///
    /// Parents that already exist are taken as they are (a `/scratch -> /local/scratch` link is the admin's
    /// choice); the directory itself must not be a symlink and must be ours. An existing directory of ours that
    /// lets other users in is made private (0700), with a warning: what hangwatch puts there is the job's output.
    pub fn open_or_create(path: &Path) -> Result<PrivateDir, SafeFsError> {
        let Some(name) = path.file_name() else {
            return Err(SafeFsError::BadName {
                name: path.display().to_string(),
            });
        };
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let parent_fd = open_parent(parent)?;
        PrivateDir::child_of(parent_fd.as_fd(), name, path.to_path_buf())
    }

    /// A private subdirectory `name`, created when missing.
    pub fn subdir(&self, name: &str) -> Result<PrivateDir, SafeFsError> {
        check_name(name)?;
        PrivateDir::child_of(self.fd.as_fd(), OsStr::new(name), self.path.join(name))
    }

    fn child_of(
        parent: BorrowedFd<'_>,
        name: &OsStr,
        path: PathBuf,
    ) -> Result<PrivateDir, SafeFsError> {
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(DIR_MODE)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => {
                return Err(SafeFsError::CreateDir {
                    path,
                    source: e.into(),
                })
            }
        }
        let fd = match rustix::fs::openat(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) => return Err(explain(parent, name, path, FoundKind::Directory, e)),
        };
        let dir = PrivateDir { fd, path };
        dir.check_private()?;
        Ok(dir)
    }

    /// Ours, and 0700 (made so when it is ours).
    fn check_private(&self) -> Result<(), SafeFsError> {
        let st = rustix::fs::fstat(&self.fd).map_err(|e| SafeFsError::Open {
            path: self.path.clone(),
            source: e.into(),
        })?;
        check_owner(&self.path, st.st_uid)?;
        let mode = st.st_mode & 0o7777;
        if mode != DIR_MODE {
            rustix::fs::fchmod(&self.fd, Mode::from_raw_mode(DIR_MODE)).map_err(|e| {
                SafeFsError::MakePrivate {
                    path: self.path.clone(),
                    mode,
                    source: e.into(),
                }
            })?;
            if mode & 0o077 != 0 {
                tracing::warn!(
                    path = %self.path.display(),
                    was = format!("{mode:o}"),
                    "made the directory private (mode 700): hangwatch keeps the job's output there"
                );
            }
        }
        Ok(())
    }

    /// The path this directory was opened as (for messages; every operation goes through the fd).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens file `name` for writing (mode 0600 when created); never follows a symlink, and refuses an existing
    /// file that is not a regular file of ours.
    pub fn open_file(&self, name: &str, how: WriteMode) -> Result<File, SafeFsError> {
        check_name(name)?;
        open_file_at(self.fd.as_fd(), OsStr::new(name), self.path.join(name), how)
    }

    /// A new file `name` (it must not exist).
    pub fn create_file(&self, name: &str) -> Result<File, SafeFsError> {
        self.open_file(name, WriteMode::CreateNew)
    }

    /// `name` created or emptied.
    pub fn create_or_truncate(&self, name: &str) -> Result<File, SafeFsError> {
        self.open_file(name, WriteMode::Truncate)
    }

    /// `name` created or appended to.
    pub fn append(&self, name: &str) -> Result<File, SafeFsError> {
        self.open_file(name, WriteMode::Append)
    }

    /// Writes `bytes` as the whole content of `name` (created or replaced in place).
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, SafeFsError> {
        let path = self.path.join(name);
        let mut file = self.create_or_truncate(name)?;
        file.write_all(bytes).map_err(|source| SafeFsError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }

    /// An unnamed file (`O_TMPFILE`, 0600) in this directory: it disappears with its last fd.
    pub fn unnamed_file(&self) -> Result<File, SafeFsError> {
        rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDWR | OFlags::TMPFILE | OFlags::CLOEXEC,
            Mode::from_raw_mode(FILE_MODE),
        )
        .map(File::from)
        .map_err(|e| SafeFsError::Open {
            path: self.path.clone(),
            source: e.into(),
        })
    }

    /// The entries of this directory: name and kind (as stored in the directory, symlinks not followed).
    pub fn entries(&self) -> Result<Vec<(String, FoundKind)>, SafeFsError> {
        PrivateDir::entries_of(self.fd.as_fd(), &self.path)
    }

    /// The entries of the directory open as `fd` (`path` for messages).
    fn entries_of(
        fd: BorrowedFd<'_>,
        path: &Path,
    ) -> Result<Vec<(String, FoundKind)>, SafeFsError> {
        let open_err = |e: Errno| SafeFsError::Open {
            path: path.to_path_buf(),
            source: e.into(),
        };
        let mut dir = rustix::fs::Dir::read_from(fd).map_err(open_err)?;
        let mut out = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(open_err)?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let Ok(name) = std::str::from_utf8(name) else {
                continue;
            };
            let kind = match entry.file_type() {
                FileType::Unknown => rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| FileType::from_raw_mode(st.st_mode).into())
                    .unwrap_or(FoundKind::Other),
                t => t.into(),
            };
            out.push((name.to_owned(), kind));
        }
        Ok(out)
    }

    /// Holds a shared lock on this directory for as long as this value lives: [`PrivateDir::remove_dir_all`]
    /// never removes a directory locked so (a run still going on).
    pub fn lock_in_use(&self) -> Result<(), SafeFsError> {
        rustix::fs::flock(&self.fd, FlockOperation::NonBlockingLockShared).map_err(|e| {
            SafeFsError::Open {
                path: self.path.clone(),
                source: e.into(),
            }
        })
    }

    /// Removes subdirectory `name` and everything in it, refusing to follow symlinks and skipping nothing
    /// silently: entries not ours stop the removal with [`SafeFsError::NotOurs`]. Returns `Ok(false)` without
    /// removing anything when the directory is in use (see [`PrivateDir::lock_in_use`]), and `Ok(true)` when it
    /// is already gone (another run pruning the same root removed it first).
    pub fn remove_dir_all(&self, name: &str) -> Result<bool, SafeFsError> {
        check_name(name)?;
        let path = self.path.join(name);
        let opened = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        );
        if matches!(opened, Err(rustix::io::Errno::NOENT)) {
            return Ok(true);
        }
        let fd = opened.map_err(|e| {
            explain(
                self.fd.as_fd(),
                OsStr::new(name),
                path.clone(),
                FoundKind::Directory,
                e,
            )
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| SafeFsError::Open {
            path: path.clone(),
            source: e.into(),
        })?;
        check_owner(&path, st.st_uid)?;
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => return Ok(false),
            Err(e) => {
                return Err(SafeFsError::Open {
                    path,
                    source: e.into(),
                })
            }
        }
        let sub = PrivateDir { fd, path };
        sub.empty()?;
        // Gone already: another run pruning the same root removed it first.
        rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)
            .or_else(ignore_gone)
            .map_err(|e| SafeFsError::Remove {
                path: sub.path.clone(),
                source: e.into(),
            })?;
        Ok(true)
    }

    /// Removes everything in this directory (depth first, by fd, never through a symlink).
    fn empty(&self) -> Result<(), SafeFsError> {
        for (name, kind) in self.entries()? {
            let path = self.path.join(&name);
            if kind == FoundKind::Directory {
                let fd = rustix::fs::openat(
                    &self.fd,
                    name.as_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| {
                    explain(
                        self.fd.as_fd(),
                        OsStr::new(&name),
                        path.clone(),
                        FoundKind::Directory,
                        e,
                    )
                })?;
                let st = rustix::fs::fstat(&fd).map_err(|e| SafeFsError::Open {
                    path: path.clone(),
                    source: e.into(),
                })?;
                check_owner(&path, st.st_uid)?;
                PrivateDir {
                    fd,
                    path: path.clone(),
                }
                .empty()?;
                rustix::fs::unlinkat(&self.fd, name.as_str(), AtFlags::REMOVEDIR)
            } else {
                rustix::fs::unlinkat(&self.fd, name.as_str(), AtFlags::empty())
            }
            .or_else(ignore_gone)
            .map_err(|e| SafeFsError::Remove {
                path,
                source: e.into(),
            })?;
        }
        Ok(())
    }
}

/// An entry that is already gone was removed by someone else (a concurrent prune): the removal is done.
fn ignore_gone(e: rustix::io::Errno) -> rustix::io::Result<()> {
    if e == rustix::io::Errno::NOENT {
        Ok(())
    } else {
        Err(e)
    }
}

impl AsFd for PrivateDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Opens `path` for writing where its directory is not one of ours (an undelivered-lines file whose directory the
/// caller chose): the directory is taken as it is, but the file itself is never a symlink, is created 0600, and
/// an existing one must be a regular file of ours.
pub fn open_file_in_dir(path: &Path, how: WriteMode) -> Result<File, SafeFsError> {
    let Some(name) = path.file_name() else {
        return Err(SafeFsError::BadName {
            name: path.display().to_string(),
        });
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = open_admins_dir(parent)?;
    open_file_at(dir.as_fd(), name, path.to_path_buf(), how)
}

/// A directory that is the caller's or the admin's choice, opened by its path as it is (symlinks in it followed).
fn open_admins_dir(path: &Path) -> Result<OwnedFd, SafeFsError> {
    rustix::fs::openat(
        CWD,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| SafeFsError::Open {
        path: path.to_path_buf(),
        source: e.into(),
    })
}

fn open_file_at(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: PathBuf,
    how: WriteMode,
) -> Result<File, SafeFsError> {
    let mut flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match how {
        WriteMode::CreateNew => flags |= OFlags::EXCL,
        WriteMode::Append => flags |= OFlags::APPEND,
        WriteMode::Truncate => {}
    }
    let fd = match rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(FILE_MODE)) {
        Ok(fd) => fd,
        Err(Errno::EXIST) if how == WriteMode::CreateNew => {
            return Err(match found_kind(dir, name) {
                Some(FoundKind::Symlink) => SafeFsError::Symlink { path },
                _ => SafeFsError::Exists { path },
            })
        }
        Err(e) => return Err(explain(dir, name, path, FoundKind::RegularFile, e)),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| SafeFsError::Open {
        path: path.clone(),
        source: e.into(),
    })?;
    let found = FoundKind::from(FileType::from_raw_mode(st.st_mode));
    if found != FoundKind::RegularFile {
        return Err(SafeFsError::WrongKind {
            path,
            found,
            expected: FoundKind::RegularFile,
        });
    }
    check_owner(&path, st.st_uid)?;
    if st.st_mode & 0o7777 != FILE_MODE {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(FILE_MODE)).map_err(|e| {
            SafeFsError::MakePrivate {
                path: path.clone(),
                mode: st.st_mode & 0o7777,
                source: e.into(),
            }
        })?;
    }
    // Emptied only now, after the checks: a file that is not ours is refused untouched.
    if how == WriteMode::Truncate {
        rustix::fs::ftruncate(&fd, 0).map_err(|e| SafeFsError::Write {
            path,
            source: e.into(),
        })?;
    }
    Ok(File::from(fd))
}

/// Opens an existing parent directory, following symlinks (it is the caller's or the admin's), creating missing
/// ones 0700 from the deepest existing ancestor down, each relative to its parent's fd.
fn open_parent(parent: &Path) -> Result<OwnedFd, SafeFsError> {
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::openat(CWD, parent, dir_flags, Mode::empty()) {
        Ok(fd) => return Ok(fd),
        Err(Errno::NOENT) => {}
        Err(e) => {
            return Err(SafeFsError::Open {
                path: parent.to_path_buf(),
                source: e.into(),
            })
        }
    }
    let mut existing = parent;
    let mut missing = Vec::new();
    let mut fd = loop {
        missing.push(existing.file_name().ok_or_else(|| SafeFsError::BadName {
            name: existing.display().to_string(),
        })?);
        existing = match existing.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        match rustix::fs::openat(CWD, existing, dir_flags, Mode::empty()) {
            Ok(fd) => break fd,
            Err(Errno::NOENT) => continue,
            Err(e) => {
                return Err(SafeFsError::Open {
                    path: existing.to_path_buf(),
                    source: e.into(),
                })
            }
        }
    };
    let mut path = existing.to_path_buf();
    for name in missing.into_iter().rev() {
        path.push(name);
        match rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(DIR_MODE)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => {
                return Err(SafeFsError::CreateDir {
                    path,
                    source: e.into(),
                })
            }
        }
        fd = rustix::fs::openat(&fd, name, dir_flags | OFlags::NOFOLLOW, Mode::empty())
            .map_err(|e| explain(fd.as_fd(), name, path.clone(), FoundKind::Directory, e))?;
    }
    Ok(fd)
}

fn check_name(name: &str) -> Result<(), SafeFsError> {
    let mut components = Path::new(name).components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(n)), None) if n.as_bytes() == name.as_bytes() => Ok(()),
        _ => Err(SafeFsError::BadName { name: name.into() }),
    }
}

fn check_owner(path: &Path, owner: u32) -> Result<(), SafeFsError> {
    let euid = euid();
    if owner == euid {
        Ok(())
    } else {
        Err(SafeFsError::NotOurs {
            path: path.to_path_buf(),
            owner,
            euid,
        })
    }
}

fn found_kind(dir: BorrowedFd<'_>, name: &OsStr) -> Option<FoundKind> {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .ok()
        .map(|st| FileType::from_raw_mode(st.st_mode).into())
}

/// Turns an `openat` failure into the error a person can act on: `O_NOFOLLOW` reports a symlink as `ELOOP`, and
/// `O_DIRECTORY` a file as `ENOTDIR`.
fn explain(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: PathBuf,
    expected: FoundKind,
    e: Errno,
) -> SafeFsError {
    match (e, found_kind(dir, name)) {
        (Errno::LOOP | Errno::NOTDIR | Errno::ISDIR | Errno::NXIO, Some(FoundKind::Symlink)) => {
            SafeFsError::Symlink { path }
        }
        (Errno::NOTDIR | Errno::ISDIR | Errno::NXIO, Some(found)) if found != expected => {
            SafeFsError::WrongKind {
                path,
                found,
                expected,
            }
        }
        _ => SafeFsError::Open {
            path,
            source: e.into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn creates_missing_directories_private() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a/b/c");
        let dir = PrivateDir::open_or_create(&path).unwrap();
        assert_eq!(dir.path(), path);
        for p in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&tmp.path().join(p)), 0o700, "{p}");
        }
        let run = dir.subdir("run-1").unwrap();
        assert_eq!(mode(&path.join("run-1")), 0o700);
        let written = run.write("verdict.json", b"{}").unwrap();
        assert_eq!(mode(&written), 0o600);
        assert_eq!(std::fs::read(&written).unwrap(), b"{}");
    }

    #[test]
    fn an_existing_open_directory_of_ours_is_made_private() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("open");
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        PrivateDir::open_or_create(&path).unwrap();
        assert_eq!(mode(&path), 0o700);
    }

    #[test]
    fn a_symlinked_directory_is_refused_and_its_target_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = tmp.path().join("hangwatch-1000");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = PrivateDir::open_or_create(&link).unwrap_err();
        assert!(matches!(err, SafeFsError::Symlink { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&link.display().to_string()),
            "{err}"
        );
        assert!(err.to_string().contains("remove it"), "{err}");
        assert_eq!(mode(&target), 0o755);
    }

    #[test]
    fn a_symlink_where_a_file_goes_is_refused_in_every_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("precious");
        std::fs::write(&target, b"keep me").unwrap();
        let dir = PrivateDir::open_or_create(&tmp.path().join("report")).unwrap();
        std::os::unix::fs::symlink(&target, tmp.path().join("report/verdict.json")).unwrap();
        for how in [WriteMode::CreateNew, WriteMode::Truncate, WriteMode::Append] {
            let err = dir.open_file("verdict.json", how).unwrap_err();
            assert!(
                matches!(err, SafeFsError::Symlink { .. }),
                "{how:?}: {err:?}"
            );
            assert!(err.to_string().contains("report/verdict.json"), "{err}");
        }
        assert!(dir.write("verdict.json", b"x").is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
        let err = open_file_in_dir(&tmp.path().join("report/verdict.json"), WriteMode::Truncate)
            .unwrap_err();
        assert!(matches!(err, SafeFsError::Symlink { .. }), "{err:?}");
    }

    #[test]
    fn a_dangling_symlink_is_refused_and_nothing_is_created() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PrivateDir::open_or_create(&tmp.path().join("report")).unwrap();
        let target = tmp.path().join("would-be-created");
        std::os::unix::fs::symlink(&target, tmp.path().join("report/out.txt")).unwrap();
        for how in [WriteMode::CreateNew, WriteMode::Truncate, WriteMode::Append] {
            assert!(dir.open_file("out.txt", how).is_err(), "{how:?}");
        }
        assert!(!target.exists());
    }

    #[test]
    fn create_new_refuses_an_existing_file_and_truncate_replaces_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PrivateDir::open_or_create(&tmp.path().join("d")).unwrap();
        dir.write("f", b"first, longer").unwrap();
        assert!(matches!(
            dir.create_file("f"),
            Err(SafeFsError::Exists { .. })
        ));
        dir.write("f", b"second").unwrap();
        let mut appended = dir.append("f").unwrap();
        appended.write_all(b"+").unwrap();
        let mut text = String::new();
        File::open(tmp.path().join("d/f"))
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "second+");
    }

    #[test]
    fn an_existing_file_open_to_others_is_made_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PrivateDir::open_or_create(&tmp.path().join("d")).unwrap();
        let path = tmp.path().join("d/f");
        std::fs::write(&path, b"x").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        dir.append("f").unwrap();
        assert_eq!(mode(&path), 0o600);
    }

    #[test]
    fn a_directory_where_a_file_goes_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PrivateDir::open_or_create(&tmp.path().join("d")).unwrap();
        dir.subdir("output").unwrap();
        let err = dir.create_or_truncate("output").unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
    }

    #[test]
    fn names_with_slashes_or_dots_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PrivateDir::open_or_create(&tmp.path().join("d")).unwrap();
        for name in ["../x", "a/b", ".", "..", "", "/etc/passwd"] {
            assert!(
                matches!(dir.create_file(name), Err(SafeFsError::BadName { .. })),
                "{name}"
            );
        }
    }

    #[test]
    fn remove_dir_all_removes_files_and_subdirectories_but_not_symlink_targets() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"k").unwrap();
        let root = PrivateDir::open_or_create(&tmp.path().join("root")).unwrap();
        let run = root.subdir("run-1").unwrap();
        run.subdir("output")
            .unwrap()
            .write("rank-0.txt", b"x")
            .unwrap();
        run.write("verdict.json", b"{}").unwrap();
        std::os::unix::fs::symlink(&outside, tmp.path().join("root/run-1/link")).unwrap();
        drop(run);
        assert!(root.remove_dir_all("run-1").unwrap());
        assert!(!tmp.path().join("root/run-1").exists());
        assert!(outside.join("keep").exists());
    }

    #[test]
    fn a_directory_in_use_is_not_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = PrivateDir::open_or_create(&tmp.path().join("root")).unwrap();
        let run = root.subdir("run-1").unwrap();
        run.lock_in_use().unwrap();
        assert!(!root.remove_dir_all("run-1").unwrap());
        assert!(tmp.path().join("root/run-1").exists());
        drop(run);
        assert!(root.remove_dir_all("run-1").unwrap());
    }

    #[test]
    fn a_symlink_in_place_of_a_run_directory_is_not_followed_when_removing() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"k").unwrap();
        let root = PrivateDir::open_or_create(&tmp.path().join("root")).unwrap();
        std::os::unix::fs::symlink(&outside, tmp.path().join("root/run-2")).unwrap();
        assert!(matches!(
            root.remove_dir_all("run-2"),
            Err(SafeFsError::Symlink { .. })
        ));
        assert!(outside.join("keep").exists());
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        if euid() != 0 {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("hangwatch-1000");
        std::fs::create_dir(&path).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        let err = PrivateDir::open_or_create(&path).unwrap_err();
        assert!(
            matches!(err, SafeFsError::NotOurs { owner: 65534, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("belongs to uid 65534"), "{err}");
        let file = tmp.path().join("f");
        std::fs::write(&file, b"theirs").unwrap();
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        assert!(open_file_in_dir(&file, WriteMode::Truncate).is_err());
        assert_eq!(std::fs::read(&file).unwrap(), b"theirs");
    }

    #[test]
    fn entries_report_kinds_without_following_links() {
        let tmp = tempfile::tempdir().unwrap();
        let root = PrivateDir::open_or_create(&tmp.path().join("root")).unwrap();
        root.subdir("run-1").unwrap();
        root.write("note", b"").unwrap();
        std::os::unix::fs::symlink("/", tmp.path().join("root/link")).unwrap();
        let mut entries = root.entries().unwrap();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            entries,
            vec![
                ("link".to_owned(), FoundKind::Symlink),
                ("note".to_owned(), FoundKind::RegularFile),
                ("run-1".to_owned(), FoundKind::Directory),
            ]
        );
    }

    #[test]
    fn unnamed_files_are_private_and_leave_nothing_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PrivateDir::open_or_create(&tmp.path().join("d")).unwrap();
        let mut f = dir.unnamed_file().unwrap();
        f.write_all(b"spill").unwrap();
        assert_eq!(f.metadata().unwrap().mode() & 0o777, 0o600);
        assert!(dir.entries().unwrap().is_empty());
    }
}
