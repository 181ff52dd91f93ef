//! The Flight Recorder dump files a job wrote itself (`<TORCH_FR_DUMP_TEMP_FILE><rank>`, pickled): which are
//! trusted, and how they are found, checked and decoded, in the reader child (`__inspect-child --serve`, asked
//! with `ServeRequest::OwnDumps` by `crate::own_dumps`) under a deadline: the prefix may be on the filesystem that
//! stopped, and the file is the job's (or whoever could write there), so its decoding, and a crash of it, stay out
//! of the watcher.
//!
//! Whose files are read. The watcher may be root (the node service's) and the default prefix,
//! `/tmp/nccl_trace_rank_`, is in a directory every user of the node can write: a file planted there by someone
//! else would forge the job's culprit, a link there would make root read what it points to. So, whoever runs the
//! watcher and whatever the prefix:
//!
//! - every directory on the way to the prefix is reached one component at a time from `/`, and must be owned by
//!   root or by the job's user and not writable by group or others unless it is sticky (`/tmp`): in a directory
//!   someone else controls, which file a name stands for is theirs to choose. A symbolic link on the way is
//!   followed only when root or the job's user owns it (its owner chose where it points, as the kernel's
//!   `protected_symlinks` rule says);
//! - the dump itself is opened `O_NOFOLLOW` (a link is never followed) and `O_NONBLOCK` (a FIFO never waits), and
//!   read only when it is a regular file owned by the job's user (the ranks' effective uid), not writable by every
//!   user, with no other hard link (another rank's dump linked in its place), written since the job started, at
//!   most [`MAX_FLIGHT_RECORDER_DUMP_BYTES`];
//! - its pickle is decoded only when its containers nest at most [`crate::pickle_shape::MAX_DEPTH`] deep
//!   (`pickle_shape`), and only plain values are decoded (a pickle naming a class or a function is refused).
//!
//! A watcher run by the job's own user therefore reads that user's dumps under the default prefix as before; the
//! node service's root watcher reads them there too when they are the job's user's files, and the TaskProlog
//! (`contrib/hangwatch-taskprolog.sh`) gives each step a private prefix in the first place.

use hangwatch_model::{CollectiveRecord, MAX_FLIGHT_RECORDER_DUMP_BYTES};
use rustix::fs::{FileType, Mode, OFlags};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Symbolic links followed on the way to the prefix's directory at most (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// Where torch writes the dumps when the job did not say.
pub const TORCH_DEFAULT_PREFIX: &str = "/tmp/nccl_trace_rank_";

/// What the reader child is asked: the ranks' dumps under their prefix written since `since_unix_s`, owned by
/// `owner_uid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnDumpsRequest {
    /// Ranks whose environment says the prefix (`TORCH_FR_DUMP_TEMP_FILE`, else torch's default), tried in
    /// order until one can be read: a watcher that did not start the job (the node service's, where the
    /// TaskProlog chose a private prefix) learns it there. Reading an environment takes the process's memory-map
    /// lock, so the caller puts ranks stuck in the kernel last.
    #[serde(default)]
    pub prefix_from: Vec<i32>,
    /// The prefix when none of `prefix_from` can be read.
    pub prefix: String,
    pub ranks: Vec<u32>,
    pub since_unix_s: u64,
    /// The job's user: the ranks' effective uid.
    pub owner_uid: u32,
    /// Collectives kept per process group.
    pub keep: usize,
}

/// One line of the child's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(crate) enum DumpLine {
    Record { record: Box<CollectiveRecord> },
    Problem { text: String },
    Done,
}

/// The child's side: looks for every rank's dump, checks and decodes it, and says what it found, one JSON line
/// each, then `done`.
pub fn answer(request: &OwnDumpsRequest, out: &mut impl Write) -> std::io::Result<()> {
    for line in look(request) {
        emit(out, &line)?;
    }
    emit(out, &DumpLine::Done)
}

fn emit(out: &mut impl Write, line: &DumpLine) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, line)?;
    out.write_all(b"\n")?;
    out.flush()
}

fn look(request: &OwnDumpsRequest) -> Vec<DumpLine> {
    let prefix = &prefix_of(request);
    let (dir, name_prefix) = match split_prefix(prefix) {
        Ok(split) => split,
        Err(why) => {
            return vec![DumpLine::Problem {
                text: format!("the dump prefix {prefix} {why}: not read"),
            }]
        }
    };
    let dir_fd = match open_trusted_dir(&dir, request.owner_uid) {
        Ok(Some(fd)) => fd,
        Ok(None) => return Vec::new(),
        Err(why) => {
            return vec![DumpLine::Problem {
                text: format!("the dumps under {prefix} are not read: {why}"),
            }]
        }
    };
    let mut lines = Vec::new();
    for &rank in &request.ranks {
        let name = format!("{name_prefix}{rank}");
        let path = format!("{prefix}{rank}");
        match read_dump(&dir_fd, &name, request) {
            Ok(None) => {}
            Ok(Some(bytes)) => match decode(rank, &bytes, request.keep) {
                Ok(record) => lines.push(DumpLine::Record {
                    record: Box::new(record),
                }),
                Err(why) => lines.push(DumpLine::Problem {
                    text: format!("rank {rank}'s own Flight Recorder dump ({path}): {why}"),
                }),
            },
            Err(why) => lines.push(DumpLine::Problem {
                text: format!("{path}: {why}"),
            }),
        }
    }
    lines
}

/// The prefix the ranks write under: the first readable environment of `prefix_from` says it.
fn prefix_of(request: &OwnDumpsRequest) -> String {
    for pid in &request.prefix_from {
        if let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) {
            return prefix_in_environment(&environ);
        }
    }
    request.prefix.clone()
}

/// `TORCH_FR_DUMP_TEMP_FILE` (`TORCH_NCCL_DEBUG_INFO_TEMP_FILE` before torch 2.5) in a NUL-separated environment,
/// else torch's default.
pub fn prefix_in_environment(environ: &[u8]) -> String {
    let value = |key: &str| {
        environ.split(|&b| b == 0).find_map(|entry| {
            let value = entry.strip_prefix(key.as_bytes())?.strip_prefix(b"=")?;
            let value = String::from_utf8_lossy(value).into_owned();
            (!value.trim().is_empty()).then_some(value)
        })
    };
    value("TORCH_FR_DUMP_TEMP_FILE")
        .or_else(|| value("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"))
        .unwrap_or_else(|| TORCH_DEFAULT_PREFIX.to_string())
}

/// Decodes one dump once its shape passed.
pub fn decode(rank: u32, pickle: &[u8], keep: usize) -> Result<CollectiveRecord, String> {
    crate::pickle_shape::check(pickle).map_err(|e| e.to_string())?;
    CollectiveRecord::from_flight_recorder_pickle(rank, pickle, keep).map_err(|e| e.to_string())
}

/// `/tmp/nccl_trace_rank_` -> (`/tmp`, `nccl_trace_rank_`); `/scratch/fr/` -> (`/scratch/fr`, ``).
fn split_prefix(prefix: &str) -> Result<(PathBuf, String), &'static str> {
    if !prefix.starts_with('/') {
        return Err("is not an absolute path");
    }
    let (dir, name) = prefix.rsplit_once('/').unwrap_or(("", prefix));
    if name.contains('\0') || dir.contains('\0') {
        return Err("holds a NUL");
    }
    let dir = if dir.is_empty() { "/" } else { dir };
    Ok((PathBuf::from(dir), name.to_string()))
}

/// Opens `dir` one component at a time from `/` as the module doc says. `Ok(None)`: a component does not exist
/// (no dump was written).
fn open_trusted_dir(dir: &Path, owner: u32) -> Result<Option<OwnedFd>, String> {
    let root = || {
        rustix::fs::open(
            "/",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("cannot open /: {e}"))
    };
    let mut current = root()?;
    let mut walked = PathBuf::from("/");
    let mut pending: Vec<std::ffi::OsString> = Vec::new();
    push_components(&mut pending, dir)?;
    let mut links = 0;
    while let Some(name) = pending.pop() {
        let next = match rustix::fs::openat(
            &current,
            name.as_os_str(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(format!("cannot open {}: {e}", walked.join(&name).display())),
        };
        let here = walked.join(&name);
        let st =
            rustix::fs::fstat(&next).map_err(|e| format!("cannot stat {}: {e}", here.display()))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                if st.st_uid != 0 && st.st_uid != owner {
                    return Err(format!(
                        "{} is a symbolic link owned by uid {}, neither root nor the job's user (uid {owner})",
                        here.display(),
                        st.st_uid
                    ));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(format!("more than {MAX_LINKS} symbolic links on the way"));
                }
                let target = rustix::fs::readlinkat(&current, name.as_os_str(), Vec::new())
                    .map_err(|e| format!("cannot read the link {}: {e}", here.display()))?;
                let target = PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()));
                if target.is_absolute() {
                    current = root()?;
                    walked = PathBuf::from("/");
                }
                push_components(&mut pending, &target)?;
            }
            FileType::Directory => {
                trusted_directory(&here, st.st_uid, st.st_mode, owner)?;
                current = next;
                walked = here;
            }
            _ => return Err(format!("{} is not a directory", here.display())),
        }
    }
    Ok(Some(current))
}

/// Puts `path`'s components on `pending` (a stack: the first component last). `..` is refused: where it leads
/// depends on links already followed.
fn push_components(pending: &mut Vec<std::ffi::OsString>, path: &Path) -> Result<(), String> {
    let mut names = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => names.push(name.to_os_string()),
            Component::ParentDir => {
                return Err(format!("{} goes up with `..`", path.display()));
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    pending.extend(names.into_iter().rev());
    Ok(())
}

/// A directory whose entries nobody but root and the job's user can swap.
fn trusted_directory(path: &Path, uid: u32, mode: u32, owner: u32) -> Result<(), String> {
    if uid != 0 && uid != owner {
        return Err(format!(
            "{} is owned by uid {uid}, neither root nor the job's user (uid {owner})",
            path.display()
        ));
    }
    let sticky = mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !sticky {
        return Err(format!(
            "{} is writable by others (mode {:o}) and not sticky",
            path.display(),
            mode & 0o7777
        ));
    }
    Ok(())
}

/// Rank's dump `name` in `dir`, when it passes the checks: `Ok(None)` when there is none written since the job
/// started.
fn read_dump(
    dir: &OwnedFd,
    name: &str,
    request: &OwnDumpsRequest,
) -> Result<Option<Vec<u8>>, String> {
    let fd = match rustix::fs::openat(
        dir.as_fd(),
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(rustix::io::Errno::LOOP) => {
            return Err("a symbolic link, not followed: not read".to_string())
        }
        Err(e) => return Err(format!("cannot open: {e}")),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| format!("cannot stat: {e}"))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err("not a regular file: not read".to_string());
    }
    if st.st_uid != request.owner_uid {
        return Err(format!(
            "owned by uid {}, not by the job's user (uid {}): not read",
            st.st_uid, request.owner_uid
        ));
    }
    if st.st_mode & 0o002 != 0 {
        return Err("writable by every user: not read".to_string());
    }
    // torch writes a new file; a second name is someone's link to a file of the job's user (another rank's
    // dump, an older one), where `protected_hardlinks` is off.
    if st.st_nlink != 1 {
        return Err(format!(
            "has {} hard links, a dump has one: not read",
            st.st_nlink
        ));
    }
    if st.st_mtime < i64::try_from(request.since_unix_s).unwrap_or(i64::MAX) {
        return Ok(None);
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size > MAX_FLIGHT_RECORDER_DUMP_BYTES as u64 {
        return Err(format!(
            "{size} bytes, more than the {MAX_FLIGHT_RECORDER_DUMP_BYTES} read"
        ));
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_FLIGHT_RECORDER_DUMP_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, PermissionsExt};

    use hangwatch_testkit::{require, TestkitError};

    use super::*;

    /// The job's user in these tests, and a stranger on the same node (numeric: no account is needed to own a
    /// file).
    const JOB: u32 = 4101;
    const STRANGER: u32 = 4102;

    fn need_root() -> hangwatch_testkit::Result<()> {
        hangwatch_testkit::require_root().map_err(|_| TestkitError::NotRoot {
            what: "files owned by other users",
            uid: rustix::process::geteuid().as_raw(),
        })
    }

    fn real_pickle() -> Vec<u8> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../diagnosis/tests/fixtures/flight_recorder/pickled/rank2.pickle"
        );
        std::fs::read(path).expect("recorded pickle")
    }

    /// A shared directory like /tmp (root's, 1777) under a private test directory, and the request for
    /// `prefix` (`<shared>/nccl_trace_rank_` unless the test says).
    fn shared_tmp() -> (tempfile::TempDir, PathBuf) {
        let top = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let shared = top.path().join("tmp");
        std::fs::create_dir(&shared).expect("mkdir");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        (top, shared)
    }

    fn request(prefix: &Path) -> OwnDumpsRequest {
        OwnDumpsRequest {
            prefix_from: Vec::new(),
            prefix: prefix.display().to_string(),
            ranks: vec![2],
            since_unix_s: hangwatch_model::unix_now() as u64 - 60,
            owner_uid: JOB,
            keep: 8,
        }
    }

    fn write_owned(path: &Path, bytes: &[u8], uid: u32) {
        std::fs::write(path, bytes).expect("write");
        std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
    }

    fn records(lines: &[DumpLine]) -> Vec<u32> {
        lines
            .iter()
            .filter_map(|l| match l {
                DumpLine::Record { record } => Some(record.rank),
                _ => None,
            })
            .collect()
    }

    fn problems(lines: &[DumpLine]) -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| match l {
                DumpLine::Problem { text } => Some(text.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_jobs_own_dump_under_the_shared_default_is_read() {
        require!(need_root());
        let (_top, shared) = shared_tmp();
        write_owned(&shared.join("nccl_trace_rank_2"), &real_pickle(), JOB);
        let lines = look(&request(&shared.join("nccl_trace_rank_")));
        assert_eq!(records(&lines), vec![2], "{:?}", problems(&lines));
    }

    #[test]
    fn a_dump_planted_by_another_user_in_the_shared_default_is_not_read() {
        require!(need_root());
        let (_top, shared) = shared_tmp();
        write_owned(&shared.join("nccl_trace_rank_2"), &real_pickle(), STRANGER);
        let lines = look(&request(&shared.join("nccl_trace_rank_")));
        assert_eq!(records(&lines), Vec::<u32>::new());
        let said = problems(&lines).join("; ");
        assert!(
            said.contains(&format!("owned by uid {STRANGER}, not by the job's user")),
            "{said}"
        );
    }

    #[test]
    fn a_symbolic_or_hard_link_at_the_dump_path_is_not_read() {
        require!(need_root());
        let (top, shared) = shared_tmp();
        // The target is a genuine dump of the job's user: the link, whoever made it, is still not followed.
        let target = top.path().join("elsewhere");
        write_owned(&target, &real_pickle(), JOB);
        symlink(&target, shared.join("nccl_trace_rank_2")).expect("symlink");
        std::os::unix::fs::lchown(shared.join("nccl_trace_rank_2"), Some(JOB), Some(JOB))
            .expect("lchown");
        let lines = look(&request(&shared.join("nccl_trace_rank_")));
        assert_eq!(records(&lines), Vec::<u32>::new());
        let said = problems(&lines).join("; ");
        assert!(said.contains("a symbolic link, not followed"), "{said}");
        // Nor a hard link to the job's own file (rank 3's dump in rank 2's place).
        std::fs::remove_file(shared.join("nccl_trace_rank_2")).expect("rm");
        std::fs::hard_link(&target, shared.join("nccl_trace_rank_2")).expect("link");
        let lines = look(&request(&shared.join("nccl_trace_rank_")));
        assert_eq!(records(&lines), Vec::<u32>::new());
        let said = problems(&lines).join("; ");
        assert!(said.contains("has 2 hard links"), "{said}");
    }

    #[test]
    fn directories_someone_else_controls_are_not_read_from() {
        require!(need_root());
        let (top, shared) = shared_tmp();
        // Another user's directory, and a group-writable one that is not sticky.
        for (name, uid, mode, why) in [
            ("theirs", STRANGER, 0o755, "is owned by uid"),
            ("group", JOB, 0o775, "is writable by others"),
        ] {
            let dir = shared.join(name);
            std::fs::create_dir(&dir).expect("mkdir");
            std::os::unix::fs::chown(&dir, Some(uid), Some(uid)).expect("chown");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).expect("chmod");
            write_owned(&dir.join("fr_2"), &real_pickle(), JOB);
            let lines = look(&request(&dir.join("fr_")));
            assert_eq!(records(&lines), Vec::<u32>::new(), "{name}");
            let said = problems(&lines).join("; ");
            assert!(said.contains(why), "{name}: {said}");
        }
        // A directory link made by a stranger is not followed; one made by the job's user is.
        let private = top.path().join("private");
        std::fs::create_dir(&private).expect("mkdir");
        std::os::unix::fs::chown(&private, Some(JOB), Some(JOB)).expect("chown");
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        write_owned(&private.join("fr_2"), &real_pickle(), JOB);
        for (uid, read) in [(STRANGER, false), (JOB, true)] {
            let link = shared.join(format!("link-{uid}"));
            symlink(&private, &link).expect("symlink");
            std::os::unix::fs::lchown(&link, Some(uid), Some(uid)).expect("lchown");
            let lines = look(&request(&link.join("fr_")));
            assert_eq!(
                records(&lines).len(),
                usize::from(read),
                "{:?}",
                problems(&lines)
            );
        }
    }

    #[test]
    fn a_fifo_is_not_waited_for_and_old_or_absent_dumps_are_not_read() {
        require!(need_root());
        let (_top, shared) = shared_tmp();
        let fifo = shared.join("fr_2");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        std::os::unix::fs::chown(&fifo, Some(JOB), Some(JOB)).expect("chown");
        let lines = look(&request(&shared.join("fr_")));
        assert!(problems(&lines).join("; ").contains("not a regular file"));
        std::fs::remove_file(&fifo).expect("rm");
        write_owned(&fifo, &real_pickle(), JOB);
        let mut later = request(&shared.join("fr_"));
        later.since_unix_s += 3600;
        assert!(look(&later).is_empty(), "written before the job started");
        assert!(look(&request(&shared.join("nothing-here/fr_"))).is_empty());
        assert!(look(&request(&shared.join("none_"))).is_empty());
    }

    #[test]
    fn the_prefix_is_the_ranks_own() {
        let env =
            b"PATH=/bin\0TORCH_FR_DUMP_TEMP_FILE=/var/tmp/hangwatch-7/fr-41.0/nccl_trace_rank_\0";
        assert_eq!(
            prefix_in_environment(env),
            "/var/tmp/hangwatch-7/fr-41.0/nccl_trace_rank_"
        );
        assert_eq!(
            prefix_in_environment(b"TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/old/nccl_\0"),
            "/old/nccl_"
        );
        assert_eq!(
            prefix_in_environment(b"XTORCH_FR_DUMP_TEMP_FILE=/x\0TORCH_FR_DUMP_TEMP_FILE=\0"),
            TORCH_DEFAULT_PREFIX
        );
        // This test process's own environment, read as the child reads a rank's.
        let mine = OwnDumpsRequest {
            prefix_from: vec![999_999_999, std::process::id() as i32],
            prefix: "/never/".into(),
            ranks: vec![],
            since_unix_s: 0,
            owner_uid: 0,
            keep: 8,
        };
        let expected = std::env::var("TORCH_FR_DUMP_TEMP_FILE")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| TORCH_DEFAULT_PREFIX.to_string());
        assert_eq!(prefix_of(&mine), expected);
    }

    #[test]
    fn a_relative_prefix_is_refused() {
        let lines = look(&OwnDumpsRequest {
            prefix_from: Vec::new(),
            prefix: "nccl_trace_rank_".into(),
            ranks: vec![0],
            since_unix_s: 0,
            owner_uid: 0,
            keep: 8,
        });
        assert!(problems(&lines)[0].contains("not an absolute path"));
    }
}
