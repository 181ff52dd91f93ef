//! Which directories hangwatch uses on a node: the per-user report root and its `run-<UTC time>-<pid>`
//! directories (pruned to the newest N), and the state directory. The choices are pure functions of the
//! environment (passed in through [`Env`]) and of a node-local test, unit-tested below; the directories
//! themselves are opened through [`hangwatch_safefs`] (0700, ours, never a symlink).

use hangwatch_model::error_chain;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use hangwatch_safefs::{FoundKind, PrivateDir, SafeFsError};

/// Run directories kept under the per-user root by default (`--keep-runs`).
pub const DEFAULT_KEEP_RUNS: usize = 20;

/// The environment, read through a trait so that tests pass a map.
pub trait Env {
    fn var(&self, name: &str) -> Option<OsString>;
}

/// The real process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<OsString> {
        std::env::var_os(name)
    }
}

impl Env for std::collections::HashMap<&str, &str> {
    fn var(&self, name: &str) -> Option<OsString> {
        self.get(name).map(OsString::from)
    }
}

/// An absolute directory from `name`, when it is set, absolute and node-local.
fn env_dir(env: &dyn Env, name: &str, node_local: &dyn Fn(&Path) -> bool) -> Option<PathBuf> {
    let value = PathBuf::from(env.var(name)?);
    (value.is_absolute() && node_local(&value)).then_some(value)
}

/// Where the per-user report root may be, best first; the caller takes the first one it can open as a private
/// directory (another user may have squatted `/var/tmp/hangwatch-<uid>`).
///
/// `/var/tmp/hangwatch-<uid>` comes first when `/var/tmp` is node-local: it survives the job and a logout, so
/// the evidence is still there when someone looks. `$SLURM_TMPDIR` (usually removed when the job ends) and
/// `$XDG_RUNTIME_DIR` (memory, removed at logout) are per-user and cannot be squatted, so they are the fallbacks,
/// when set and node-local. `/var/tmp/hangwatch-<uid>` comes last again when `/var/tmp` is not node-local (a
/// diskless node) and nothing else is: `run` then warns that the evidence is on a shared filesystem.
pub fn report_root_candidates(
    env: &dyn Env,
    uid: u32,
    node_local: &dyn Fn(&Path) -> bool,
) -> Vec<PathBuf> {
    let var_tmp = default_root(uid);
    let var_tmp_local = node_local(Path::new("/var/tmp"));
    let mut out = Vec::new();
    if var_tmp_local {
        out.push(var_tmp.clone());
    }
    for name in ["SLURM_TMPDIR", "XDG_RUNTIME_DIR"] {
        if let Some(dir) = env_dir(env, name, node_local) {
            out.push(dir.join("hangwatch"));
        }
    }
    if !var_tmp_local {
        out.push(var_tmp);
    }
    out
}

/// The state directory, for what outlives a run on this node (the verdict history): `$HANGWATCH_STATE_DIR` when
/// set and absolute (a site's or a test's explicit choice, taken as it is), else `$XDG_STATE_HOME/hangwatch` when
/// that is set and node-local, else `/var/tmp/hangwatch-<uid>/state`. Not `~/.local/state`: home directories on
/// clusters are usually on a shared filesystem, and this state belongs to the node.
pub fn state_dir(env: &dyn Env, uid: u32, node_local: &dyn Fn(&Path) -> bool) -> PathBuf {
    if let Some(dir) = env_dir(env, STATE_DIR_ENV, &|_| true) {
        return dir;
    }
    match env_dir(env, "XDG_STATE_HOME", node_local) {
        Some(dir) => dir.join("hangwatch"),
        None => default_root(uid).join("state"),
    }
}

/// The environment variable that moves the state directory.
pub const STATE_DIR_ENV: &str = "HANGWATCH_STATE_DIR";

/// The verdict history database of this user on this node. When the state directory is the default one under a
/// squatted `/var/tmp/hangwatch-<uid>`, it moves to `state` in the private root that takes the evidence instead.
pub fn history_db_path() -> PathBuf {
    let uid = hangwatch_safefs::euid();
    let dir = state_dir(&ProcessEnv, uid, &node_local);
    let usual = default_root(uid);
    if dir.starts_with(&usual) && squatted(&usual, uid).is_some() {
        if let Ok(root) = fallback_root(uid) {
            return root
                .path()
                .join("state")
                .join(hangwatch_history::DB_FILE_NAME);
        }
    }
    dir.join(hangwatch_history::DB_FILE_NAME)
}

/// `/var/tmp/hangwatch-<uid>`: the usual per-user root.
pub fn default_root(uid: u32) -> PathBuf {
    PathBuf::from(format!("/var/tmp/hangwatch-{uid}"))
}

/// `run-20261129T214500Z-4242`: `kind`, the UTC time and the pid.
pub fn run_dir_name(kind: &str, unix_secs: u64, pid: u32) -> String {
    format!("{kind}-{}-{pid}", utc_stamp(unix_secs))
}

/// The (time stamp, pid) of a run directory's name; `None` for anything else.
fn parse_run_name(name: &str) -> Option<(&str, u32)> {
    let rest = name.strip_prefix("run-")?;
    let (stamp, pid) = rest.split_once('-')?;
    let b = stamp.as_bytes();
    let is_stamp = b.len() == 16
        && b[..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'T'
        && b[9..15].iter().all(u8::is_ascii_digit)
        && b[15] == b'Z';
    if !is_stamp || pid.is_empty() || !pid.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some((stamp, pid.parse().ok()?))
}

/// The run directories to remove so that `keep` remain (the current one counted): the oldest first-named by time
/// stamp, then pid. Never the current one, nor anything that is not a directory named like a run directory.
/// `keep == 0` keeps everything.
pub fn runs_to_prune(entries: &[(String, FoundKind)], current: &str, keep: usize) -> Vec<String> {
    if keep == 0 {
        return Vec::new();
    }
    let mut runs: Vec<(&str, u32, &str)> = entries
        .iter()
        .filter(|(name, kind)| *kind == FoundKind::Directory && name != current)
        .filter_map(|(name, _)| {
            let (stamp, pid) = parse_run_name(name)?;
            Some((stamp, pid, name.as_str()))
        })
        .collect();
    runs.sort_unstable_by(|a, b| (b.0, b.1).cmp(&(a.0, a.1)));
    let others_kept = keep.saturating_sub(usize::from(parse_run_name(current).is_some()));
    runs.into_iter()
        .skip(others_kept)
        .map(|(_, _, name)| name.to_owned())
        .collect()
}

/// Whether `path` (or its deepest existing ancestor) is on a node-local filesystem, from the mount table (which
/// never blocks on a frozen mount, unlike a `statfs`). Unknown counts as local.
pub fn node_local(path: &Path) -> bool {
    let Ok(table) = hangwatch_proc::ProcFs::new("/proc").mountinfo(std::process::id() as i32)
    else {
        return true;
    };
    let probe = path.ancestors().find(|a| a.exists()).unwrap_or(path);
    table.is_node_local(&probe.to_string_lossy())
}

/// How a report root that is already there is not ours: someone else took the name first (a squat, by mistake or
/// to catch our evidence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Squat {
    /// A symlink, wherever it points.
    Symlink,
    /// Something other than a directory.
    NotADirectory,
    /// A directory of another user.
    OwnedBy(u32),
}

impl std::fmt::Display for Squat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Squat::Symlink => write!(f, "is a symlink, which hangwatch never follows"),
            Squat::NotADirectory => write!(f, "is not a directory"),
            Squat::OwnedBy(uid) => write!(f, "belongs to uid {uid}, not to you"),
        }
    }
}

/// Whether a path that exists (`lstat`: symlink or not, directory or not, owner) is squatted for `euid`.
pub fn squat_of(is_symlink: bool, is_dir: bool, owner: u32, euid: u32) -> Option<Squat> {
    if is_symlink {
        Some(Squat::Symlink)
    } else if !is_dir {
        Some(Squat::NotADirectory)
    } else if owner != euid {
        Some(Squat::OwnedBy(owner))
    } else {
        None
    }
}

/// [`squat_of`] for `path` as it is now (`lstat`); `None` when it is ours or absent.
pub fn squatted(path: &Path, euid: u32) -> Option<Squat> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).ok()?;
    squat_of(
        meta.file_type().is_symlink(),
        meta.is_dir(),
        meta.uid(),
        euid,
    )
}

/// Where a fresh report root with a random name may go when the usual one is squatted: `/var/tmp`, then `/tmp`,
/// each when node-local, then `/dev/shm` (memory: always local).
pub fn fresh_root_parents(node_local: &dyn Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ["/var/tmp", "/tmp"]
        .into_iter()
        .map(PathBuf::from)
        .filter(|p| node_local(p))
        .collect();
    out.push(PathBuf::from("/dev/shm"));
    out
}

/// The prefix of a fresh report root's name: `hangwatch-<uid>-`, then random characters.
pub fn fresh_root_prefix(uid: u32) -> String {
    format!("hangwatch-{uid}-")
}

/// The report root to use instead of a squatted one: a `hangwatch-<uid>-<random>` directory of ours made by an
/// earlier run (so that runs are pruned together and the history stays in one place), else a new one under the
/// first of [`fresh_root_parents`] that takes one. A directory of that name that is not ours (another user's, a
/// symlink) is never used: `mkdir` fails on a name that exists, so no one can have planted the new one, and its
/// name is random so that no one can take it first either.
fn fallback_root(uid: u32) -> Result<PrivateDir, String> {
    use std::os::unix::fs::PermissionsExt;
    let parents = fresh_root_parents(&node_local);
    let prefix = fresh_root_prefix(uid);
    for parent in &parents {
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        let mut ours: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .filter(|p| squatted(p, uid).is_none())
            .collect();
        ours.sort();
        if let Some(dir) = ours.iter().find_map(|p| PrivateDir::open_or_create(p).ok()) {
            return Ok(dir);
        }
    }
    let mut refused = Vec::new();
    for parent in parents {
        let made = tempfile::Builder::new()
            .prefix(&fresh_root_prefix(uid))
            .rand_bytes(10)
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(&parent);
        match made {
            Ok(dir) => {
                let path = dir.keep();
                return PrivateDir::open_or_create(&path)
                    .map_err(|e| format!("{}: {}", path.display(), error_chain(&e)));
            }
            Err(e) => refused.push(format!("{}: {e}", parent.display())),
        }
    }
    Err(refused.join("; "))
}

fn run_dir_in(root: &PrivateDir, kind: &str) -> Result<PrivateDir, SafeFsError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    root.subdir(&run_dir_name(kind, secs, std::process::id()))
}

/// The per-user report root (the first candidate that opens as a private directory) and a new directory
/// `<kind>-<UTC time>-<pid>` in it. When the usual root is squatted (another user's directory, a symlink) and no
/// other candidate serves, a fresh private root with a random name takes the run, and one line says so. Errors
/// list every candidate tried and why it was refused.
pub fn create_run_dir(kind: &str) -> Result<(PrivateDir, PrivateDir), String> {
    let euid = hangwatch_safefs::euid();
    let candidates = report_root_candidates(&ProcessEnv, euid, &node_local);
    let mut refused = Vec::new();
    let mut squat: Option<(PathBuf, Squat)> = None;
    let say_squat = |squat: &Option<(PathBuf, Squat)>, run: &PrivateDir| {
        if let Some((usual, why)) = squat {
            hangwatch_agent::human::say(format!(
                "hangwatch: warning: {} {why}: someone else took that name; evidence goes to {} instead",
                usual.display(),
                run.path().display()
            ));
        }
    };
    for root_path in candidates {
        match PrivateDir::open_or_create(&root_path)
            .and_then(|root| Ok((run_dir_in(&root, kind)?, root)))
        {
            Ok((run, root)) => {
                say_squat(&squat, &run);
                return Ok((root, run));
            }
            Err(e) => {
                refused.push(format!("  {}: {}", root_path.display(), error_chain(&e)));
                match squatted(&root_path, euid) {
                    // Said in one line once a root is found.
                    Some(why) if squat.is_none() => squat = Some((root_path.clone(), why)),
                    _ => {
                        tracing::warn!(root = %root_path.display(), error = %error_chain(&e), "cannot use this report root")
                    }
                }
            }
        }
    }
    if squat.is_some() {
        let fresh = fallback_root(euid).and_then(|root| {
            let run = run_dir_in(&root, kind)
                .map_err(|e| format!("{}: {}", root.path().display(), error_chain(&e)))?;
            Ok((root, run))
        });
        match fresh {
            Ok((root, run)) => {
                say_squat(&squat, &run);
                return Ok((root, run));
            }
            Err(e) => refused.push(format!("  a private directory instead: {e}")),
        }
    }
    Err(format!(
        "no usable report directory:\n{}\nfix one of them, or give --report-dir DIR (node-local)",
        refused.join("\n")
    ))
}

/// The report directory of a command that keeps evidence: `given` made private, or a new `<kind>-<time>-<pid>`
/// under the per-user root; locked as in use while it is held (a run pruning the same root leaves it alone). The
/// error says what was refused and why.
pub fn open_report_dir(given: Option<&Path>, kind: &str) -> Result<PrivateDir, String> {
    let refused = |e: SafeFsError| format!("cannot use the report directory: {}", error_chain(&e));
    let dir = match given {
        Some(dir) => PrivateDir::open_or_create(dir).map_err(refused)?,
        None => create_run_dir(kind).map(|(_, run)| run)?,
    };
    dir.lock_in_use().map_err(refused)?;
    Ok(dir)
}

/// Removes the oldest run directories under `root` so that `keep` remain; a run still going on (its directory
/// locked by its hangwatch) and anything not ours are left. Returns the names removed.
pub fn prune_runs(root: &PrivateDir, current: &str, keep: usize) -> Vec<String> {
    let entries = match root.entries() {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(error = %error_chain(&e), "cannot list old run directories to prune");
            return Vec::new();
        }
    };
    let mut removed = Vec::new();
    for name in runs_to_prune(&entries, current, keep) {
        match root.remove_dir_all(&name) {
            Ok(true) => removed.push(name),
            Ok(false) => tracing::debug!(%name, "run directory in use: kept"),
            Err(e) => {
                tracing::warn!(%name, error = %error_chain(&e), "cannot prune an old run directory")
            }
        }
    }
    if !removed.is_empty() {
        tracing::info!(count = removed.len(), root = %root.path().display(), keep, "pruned old run directories");
    }
    removed
}

/// Refuses a report directory where a file hangwatch will write is already a symlink (or not a regular file, or
/// not ours): said now, before the job starts, rather than when the evidence is written. The files themselves are
/// opened `O_NOFOLLOW` as well, so a link planted later is refused then.
pub fn refuse_planted(dir: &PrivateDir, names: &[&str]) -> Result<(), SafeFsError> {
    for (name, kind) in dir.entries()? {
        if !names.contains(&name.as_str()) {
            continue;
        }
        let path = dir.path().join(&name);
        match kind {
            FoundKind::Symlink => return Err(SafeFsError::Symlink { path }),
            FoundKind::Directory if name == "output" => {
                dir.subdir(&name)?;
            }
            FoundKind::RegularFile => {
                dir.append(&name)?;
            }
            found if name != "hb.sock" => {
                return Err(SafeFsError::WrongKind {
                    path,
                    found,
                    expected: FoundKind::RegularFile,
                })
            }
            _ => {}
        }
    }
    Ok(())
}

use hangwatch_model::utc_stamp;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn all_local(_: &Path) -> bool {
        true
    }

    #[test]
    fn var_tmp_per_user_comes_first_when_local() {
        let env = HashMap::from([
            ("SLURM_TMPDIR", "/local/job42"),
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
        ]);
        assert_eq!(
            report_root_candidates(&env, 1000, &all_local),
            [
                PathBuf::from("/var/tmp/hangwatch-1000"),
                PathBuf::from("/local/job42/hangwatch"),
                PathBuf::from("/run/user/1000/hangwatch"),
            ]
        );
        assert_eq!(
            report_root_candidates(&HashMap::new(), 0, &all_local),
            [PathBuf::from("/var/tmp/hangwatch-0")]
        );
    }

    #[test]
    fn a_shared_var_tmp_goes_last_and_shared_or_relative_env_dirs_are_skipped() {
        let env = HashMap::from([
            ("SLURM_TMPDIR", "/gpfs/tmp/job42"),
            ("XDG_RUNTIME_DIR", "relative/dir"),
        ]);
        let local = |p: &Path| !p.starts_with("/var/tmp") && !p.starts_with("/gpfs");
        assert_eq!(
            report_root_candidates(&env, 7, &local),
            [PathBuf::from("/var/tmp/hangwatch-7")]
        );
        let env = HashMap::from([("XDG_RUNTIME_DIR", "/run/user/7")]);
        assert_eq!(
            report_root_candidates(&env, 7, &local),
            [
                PathBuf::from("/run/user/7/hangwatch"),
                PathBuf::from("/var/tmp/hangwatch-7"),
            ]
        );
    }

    #[test]
    fn state_dir_is_xdg_state_home_when_local_else_under_var_tmp() {
        let env = HashMap::from([("XDG_STATE_HOME", "/local/state")]);
        assert_eq!(
            state_dir(&env, 5, &all_local),
            PathBuf::from("/local/state/hangwatch")
        );
        let shared = |p: &Path| !p.starts_with("/local");
        assert_eq!(
            state_dir(&env, 5, &shared),
            PathBuf::from("/var/tmp/hangwatch-5/state")
        );
        assert_eq!(
            state_dir(&HashMap::new(), 5, &all_local),
            PathBuf::from("/var/tmp/hangwatch-5/state")
        );
        let env = HashMap::from([
            ("HANGWATCH_STATE_DIR", "/gpfs/site/hangwatch"),
            ("XDG_STATE_HOME", "/local/state"),
        ]);
        assert_eq!(
            state_dir(&env, 5, &shared),
            PathBuf::from("/gpfs/site/hangwatch")
        );
        let env = HashMap::from([("HANGWATCH_STATE_DIR", "relative")]);
        assert_eq!(
            state_dir(&env, 5, &all_local),
            PathBuf::from("/var/tmp/hangwatch-5/state")
        );
    }

    #[test]
    fn a_root_is_squatted_when_it_is_a_symlink_a_file_or_another_users() {
        assert_eq!(squat_of(false, true, 1000, 1000), None);
        assert_eq!(squat_of(true, false, 1000, 1000), Some(Squat::Symlink));
        assert_eq!(
            squat_of(false, false, 1000, 1000),
            Some(Squat::NotADirectory)
        );
        assert_eq!(
            squat_of(false, true, 1001, 1000),
            Some(Squat::OwnedBy(1001))
        );
        assert_eq!(squat_of(false, true, 1001, 0), Some(Squat::OwnedBy(1001)));
        assert_eq!(
            Squat::OwnedBy(1001).to_string(),
            "belongs to uid 1001, not to you"
        );
    }

    #[test]
    fn a_fresh_root_goes_to_node_local_temporary_directories_only() {
        assert_eq!(
            fresh_root_parents(&all_local),
            [
                PathBuf::from("/var/tmp"),
                PathBuf::from("/tmp"),
                PathBuf::from("/dev/shm")
            ]
        );
        let shared = |p: &Path| !p.starts_with("/var/tmp") && !p.starts_with("/tmp");
        assert_eq!(fresh_root_parents(&shared), [PathBuf::from("/dev/shm")]);
        assert_eq!(fresh_root_prefix(7), "hangwatch-7-");
    }

    #[test]
    fn run_names_round_trip() {
        let name = run_dir_name("run", 1_795_988_366, 4242);
        assert_eq!(name, "run-20261129T213926Z-4242");
        assert_eq!(parse_run_name(&name), Some(("20261129T213926Z", 4242)));
        for other in [
            "state",
            "run-",
            "run-20261129T213926Z",
            "run-20261129T213926Z-",
            "run-20261129X213926Z-1",
            "run-2026112T213926Z-1",
            "run-20261129T213926Z-1x",
            "demo-20261129T213926Z-1",
        ] {
            assert_eq!(parse_run_name(other), None, "{other}");
        }
    }

    fn dirs(names: &[&str]) -> Vec<(String, FoundKind)> {
        names
            .iter()
            .map(|n| (n.to_string(), FoundKind::Directory))
            .collect()
    }

    #[test]
    fn prune_keeps_the_newest_counting_the_current_one() {
        let entries = dirs(&[
            "run-20260101T000000Z-5",
            "run-20260103T000000Z-1",
            "run-20260102T000000Z-9",
            "run-20260102T000000Z-10",
            "run-20260104T000000Z-2",
        ]);
        let mut removed = runs_to_prune(&entries, "run-20260104T000000Z-2", 3);
        removed.sort();
        assert_eq!(
            removed,
            ["run-20260101T000000Z-5", "run-20260102T000000Z-9"]
        );
    }

    #[test]
    fn prune_never_removes_the_current_one_even_when_it_looks_oldest() {
        let entries = dirs(&[
            "run-20250101T000000Z-1",
            "run-20260101T000000Z-2",
            "run-20260102T000000Z-3",
        ]);
        let removed = runs_to_prune(&entries, "run-20250101T000000Z-1", 1);
        assert!(!removed.contains(&"run-20250101T000000Z-1".to_string()));
        assert_eq!(removed.len(), 2);
    }

    #[test]
    fn prune_leaves_what_is_not_a_run_directory() {
        let mut entries = dirs(&["state", "demo-20260101T000000Z-1", "run-x"]);
        entries.push(("run-20200101T000000Z-1".into(), FoundKind::RegularFile));
        entries.push(("run-20200101T000000Z-2".into(), FoundKind::Symlink));
        entries.extend(dirs(&["run-20200101T000000Z-3"]));
        assert_eq!(
            runs_to_prune(&entries, "run-20260101T000000Z-9", 1),
            ["run-20200101T000000Z-3"]
        );
    }

    #[test]
    fn keep_zero_keeps_everything() {
        let entries = dirs(&["run-20200101T000000Z-3", "run-20200101T000000Z-4"]);
        assert!(runs_to_prune(&entries, "run-20260101T000000Z-9", 0).is_empty());
    }

    #[test]
    fn a_planted_symlink_is_refused_before_the_job_starts() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PrivateDir::open_or_create(&tmp.path().join("report")).unwrap();
        std::fs::write(tmp.path().join("target"), b"keep").unwrap();
        std::os::unix::fs::symlink(
            tmp.path().join("target"),
            tmp.path().join("report/verdict.json"),
        )
        .unwrap();
        std::fs::write(tmp.path().join("report/unrelated"), b"").unwrap();
        let err = refuse_planted(&dir, &["verdict.json"]).unwrap_err();
        assert!(err.to_string().contains("a symlink is planted at"), "{err}");
        assert!(refuse_planted(&dir, &["other.json"]).is_ok());
        assert_eq!(std::fs::read(tmp.path().join("target")).unwrap(), b"keep");
    }
}
