//! Evidence root makes for another user, handed over without a path that user controls: root writes in a
//! directory of its own ([`PrivateDir`], no user can enter it), gives each entry to the user by descriptor
//! (`fchownat` with `AT_SYMLINK_NOFOLLOW` relative to held directory descriptors), and only then moves the whole
//! directory into the user's directory, held open too ([`UsersDir`]), with `renameat2(RENAME_NOREPLACE)`.
//!
//! The order is what makes it safe: while root changes owners the tree sits where only root can reach it, so no
//! user can swap an entry for a symlink under root's hands (the attack on walking a user's directory by path:
//! rename `step-…` away, put a symlink to `/etc` in its place, and root `lchown`s `/etc/shadow`); once moved, it
//! is the user's and root touches it no more.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use crate::{check_name, explain, open_admins_dir, FoundKind, PrivateDir, SafeFsError, DIR_MODE};

/// A directory of another user's (their `/var/tmp/hangwatch-<uid>`), or a site's report root, held open: where
/// [`PrivateDir::hand_over`] moves what it gives.
#[derive(Debug)]
pub struct UsersDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl UsersDir {
    /// `parent/name` as a directory of `uid`'s: created (0700, then given to `uid`) when missing; an existing one
    /// must be a directory (not a symlink) that `uid` owns, or it is refused (someone else took the name).
    /// `parent` is the admin's (`/var/tmp`) and taken as it is.
    pub fn open_or_create(parent: &Path, name: &str, uid: u32) -> Result<UsersDir, SafeFsError> {
        check_name(name)?;
        let path = parent.join(name);
        let parent_fd = open_admins_dir(parent)?;
        let made = match rustix::fs::mkdirat(&parent_fd, name, Mode::from_raw_mode(DIR_MODE)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(e) => {
                return Err(SafeFsError::CreateDir {
                    path,
                    source: e.into(),
                })
            }
        };
        let fd = open_dir_at(parent_fd.as_fd(), OsStr::new(name), &path)?;
        let st = stat(&fd, &path)?;
        // Made just now, it is root's: in a sticky /var/tmp nobody else can rename or replace it meanwhile.
        if made && st.st_uid == crate::euid() {
            rustix::fs::fchown(&fd, Some(uid_of(uid)), None).map_err(|e| SafeFsError::Write {
                path: path.clone(),
                source: e.into(),
            })?;
        } else if st.st_uid != uid {
            return Err(SafeFsError::NotTheirs {
                path,
                owner: st.st_uid,
                uid,
            });
        }
        Ok(UsersDir { fd, path })
    }

    /// A directory the site chose (`--report-root`), opened as it is: its parents and itself are the admin's.
    pub fn open_site_root(path: &Path) -> Result<UsersDir, SafeFsError> {
        let fd = open_admins_dir(path)?;
        Ok(UsersDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl PrivateDir {
    /// Gives subdirectory `name` and everything in it to `uid`, except the entries named in `keep` (left root's:
    /// a file only root may read), and moves it into `to`, under `name` or, when that is taken there,
    /// `name-2`..`name-9`. Returns where it now is. A directory on another filesystem than `to` cannot be moved
    /// (`EXDEV`): it is left here, given, and the error says so.
    pub fn hand_over(
        &self,
        name: &str,
        uid: u32,
        keep: &[&str],
        to: &UsersDir,
    ) -> Result<PathBuf, SafeFsError> {
        check_name(name)?;
        let path = self.path.join(name);
        let dir = open_dir_at(self.fd.as_fd(), OsStr::new(name), &path)?;
        give_tree(dir.as_fd(), &path, uid, keep)?;
        rustix::fs::fchown(&dir, Some(uid_of(uid)), None).map_err(|e| SafeFsError::Write {
            path: path.clone(),
            source: e.into(),
        })?;
        let mut last = Errno::EXIST;
        for n in 1..10 {
            let target = if n == 1 {
                name.to_string()
            } else {
                format!("{name}-{n}")
            };
            match rustix::fs::renameat_with(
                &self.fd,
                name,
                &to.fd,
                target.as_str(),
                RenameFlags::NOREPLACE,
            ) {
                Ok(()) => return Ok(to.path.join(target)),
                Err(Errno::EXIST) => last = Errno::EXIST,
                Err(e) => {
                    last = e;
                    break;
                }
            }
        }
        Err(SafeFsError::Move {
            path,
            to: to.path.clone(),
            source: last.into(),
        })
    }
}

/// Every entry below `dir` given to `uid` by descriptor, never following a symlink; directories are opened with
/// `O_NOFOLLOW` relative to their parent's descriptor.
fn give_tree(dir: BorrowedFd<'_>, path: &Path, uid: u32, keep: &[&str]) -> Result<(), SafeFsError> {
    let entries = PrivateDir::entries_of(dir, path)?;
    for (name, kind) in entries {
        if keep.contains(&name.as_str()) {
            continue;
        }
        let child = path.join(&name);
        if kind == FoundKind::Directory {
            let sub = open_dir_at(dir, OsStr::new(&name), &child)?;
            give_tree(sub.as_fd(), &child, uid, keep)?;
        }
        rustix::fs::chownat(
            dir,
            name.as_str(),
            Some(uid_of(uid)),
            None,
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| SafeFsError::Write {
            path: child,
            source: e.into(),
        })?;
    }
    Ok(())
}

fn open_dir_at(dir: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<OwnedFd, SafeFsError> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| explain(dir, name, path.to_path_buf(), FoundKind::Directory, e))
}

fn stat(fd: &OwnedFd, path: &Path) -> Result<rustix::fs::Stat, SafeFsError> {
    rustix::fs::fstat(fd).map_err(|e| SafeFsError::Open {
        path: path.to_path_buf(),
        source: e.into(),
    })
}

fn uid_of(uid: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// Changing owners needs root; the test suite runs as root (strict mode fails instead of skipping).
    fn root_or_skip() -> bool {
        if crate::euid() == 0 {
            return true;
        }
        assert!(
            std::env::var_os("HANGWATCH_TESTKIT_STRICT").is_none(),
            "needs root to change owners"
        );
        false
    }

    const USER: u32 = 4_242_001;

    fn owner(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).expect("exists").uid()
    }

    /// Root's staging directory with a step's evidence: a file, a subdirectory with a file, a root-only file.
    fn staged(tmp: &Path) -> PrivateDir {
        let staging = PrivateDir::open_or_create(&tmp.join("staging")).expect("staging");
        let step = staging.subdir("step-7.0-n1").expect("step");
        step.write("verdict.json", b"{}").expect("verdict");
        step.write("kernel-log.root.txt", b"all of it")
            .expect("root's");
        step.subdir("probes")
            .and_then(|p| p.write("probe.json", b"{}"))
            .expect("probe");
        staging
    }

    #[test]
    fn a_step_is_given_by_descriptor_and_moved_into_the_users_directory() {
        if !root_or_skip() {
            return;
        }
        let tmp = tempfile::tempdir().expect("tmp");
        let staging = staged(tmp.path());
        let users = UsersDir::open_or_create(tmp.path(), "hangwatch-user", USER).expect("user dir");
        assert_eq!(owner(&tmp.path().join("hangwatch-user")), USER);
        let mode = std::fs::metadata(tmp.path().join("hangwatch-user"))
            .expect("user dir")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let moved = staging
            .hand_over("step-7.0-n1", USER, &["kernel-log.root.txt"], &users)
            .expect("handed over");
        assert_eq!(moved, tmp.path().join("hangwatch-user/step-7.0-n1"));
        for given in ["", "verdict.json", "probes", "probes/probe.json"] {
            assert_eq!(owner(&moved.join(given)), USER, "{given}");
        }
        assert_eq!(owner(&moved.join("kernel-log.root.txt")), 0, "kept root's");
        assert!(!tmp.path().join("staging/step-7.0-n1").exists());
    }

    #[test]
    fn a_symlink_planted_at_the_steps_name_is_left_alone_and_its_target_keeps_its_owner() {
        if !root_or_skip() {
            return;
        }
        let tmp = tempfile::tempdir().expect("tmp");
        let victim = tmp.path().join("etc");
        std::fs::create_dir(&victim).expect("victim dir");
        std::fs::write(victim.join("shadow"), "root's").expect("victim file");
        let staging = staged(tmp.path());
        let users = UsersDir::open_or_create(tmp.path(), "hangwatch-user", USER).expect("user dir");
        // The user plants the step's name before the step ends.
        std::os::unix::fs::symlink(&victim, users.path().join("step-7.0-n1")).expect("plant");
        let moved = staging
            .hand_over("step-7.0-n1", USER, &[], &users)
            .expect("handed over beside it");
        assert_eq!(moved, users.path().join("step-7.0-n1-2"));
        assert_eq!(owner(&victim), 0);
        assert_eq!(owner(&victim.join("shadow")), 0);
        assert_eq!(owner(&moved.join("verdict.json")), USER);
    }

    #[test]
    fn a_users_directory_taken_by_someone_else_or_a_symlink_is_refused() {
        if !root_or_skip() {
            return;
        }
        let tmp = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(tmp.path().join("hangwatch-user")).expect("squat");
        std::os::unix::fs::chown(tmp.path().join("hangwatch-user"), Some(USER + 1), None)
            .expect("chown");
        let err =
            UsersDir::open_or_create(tmp.path(), "hangwatch-user", USER).expect_err("squatted");
        assert!(
            matches!(err, SafeFsError::NotTheirs { owner, .. } if owner == USER + 1),
            "{err}"
        );
        std::os::unix::fs::symlink("/etc", tmp.path().join("hangwatch-link")).expect("link");
        let err =
            UsersDir::open_or_create(tmp.path(), "hangwatch-link", USER).expect_err("symlink");
        assert!(matches!(err, SafeFsError::Symlink { .. }), "{err}");
        assert_eq!(owner(Path::new("/etc")), 0);
    }
}
