//! The node_exporter textfile: `NAME.prom` in the collector's directory, replaced whole (written as
//! `NAME.prom.PID` then renamed) so that node_exporter, which reads only `*.prom`, never sees half a file.
//!
//! These are plain blocking file operations: the caller runs them where a directory that does not answer cannot
//! hold it (hangwatch runs them in a short-lived child, `__write-textfile`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Errors writing or cleaning the textfile directory.
#[derive(Debug, thiserror::Error)]
pub enum TextfileError {
    #[error("{name:?} is not a textfile name: use letters, digits, '_', '-' and '.' only, without '.prom'")]
    BadName { name: String },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot rename {from} to {to}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot list {dir}")]
    List {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The file name (without `.prom`) of one job's metrics on one node: `hangwatch_<job id>_<node>`, every
/// character outside `[A-Za-z0-9_-]` replaced by `_` (a job id or node name is free text).
pub fn textfile_name(job_id: &str, node: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!("hangwatch_{}_{}", clean(job_id), clean(node))
}

/// Writes `text` as `dir/name.prom`, atomically: `dir/name.prom.<pid>` first (not a `*.prom` name, so
/// node_exporter skips it), synced, then renamed over the old file. A failed write removes its temporary file.
pub fn write_textfile(dir: &Path, name: &str, text: &str) -> Result<PathBuf, TextfileError> {
    let valid = !name.is_empty()
        && !name.ends_with(".prom")
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !valid {
        return Err(TextfileError::BadName { name: name.into() });
    }
    let target = dir.join(format!("{name}.prom"));
    let temporary = dir.join(format!("{name}.prom.{}", std::process::id()));
    // The directory is shared (node_exporter's), and hangwatch often runs as root: a name planted there (a
    // symlink to /etc/shadow) must never be written through. A leftover is removed (unlinking a symlink removes
    // the link), then the file is created new and not followed, and its mode set on the open file.
    let _ = std::fs::remove_file(&temporary);
    let written = (|| {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary)?;
        // node_exporter runs as another user: readable by it whatever the umask.
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        file.write_all(text.as_bytes())?;
        file.sync_all()
    })();
    if let Err(source) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(TextfileError::Write {
            path: temporary,
            source,
        });
    }
    std::fs::rename(&temporary, &target).map_err(|source| {
        let _ = std::fs::remove_file(&temporary);
        TextfileError::Rename {
            from: temporary.clone(),
            to: target.clone(),
            source,
        }
    })?;
    Ok(target)
}

/// Removes hangwatch's textfiles (`hangwatch_*.prom`, and temporary files a killed writer left) not written for
/// `older_than`: those of jobs that ended (their last state was kept for a while) or whose agent was killed. A
/// running job rewrites its file every few seconds. Returns what was removed.
pub fn prune_textfiles(
    dir: &Path,
    older_than: Duration,
    now: SystemTime,
) -> Result<Vec<PathBuf>, TextfileError> {
    let entries = std::fs::read_dir(dir).map_err(|source| TextfileError::List {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("hangwatch_") || !name.contains(".prom") {
            continue;
        }
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default();
        if meta.is_file() && age > older_than && std::fs::remove_file(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_symlink_planted_in_the_directory_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        // Where this process's temporary file will be, and the target itself.
        let planted = dir
            .path()
            .join(format!("hangwatch_1_n.prom.{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let written = write_textfile(dir.path(), "hangwatch_1_n", "a 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "a 1\n");
        assert!(!std::fs::symlink_metadata(&written)
            .unwrap()
            .file_type()
            .is_symlink());
        // A symlink at the final name is replaced, not followed.
        std::fs::remove_file(&written).unwrap();
        std::os::unix::fs::symlink(&victim, &written).unwrap();
        write_textfile(dir.path(), "hangwatch_1_n", "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "a 2\n");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&written).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "readable by node_exporter");
    }

    use super::*;

    #[test]
    fn the_file_is_replaced_whole_and_no_temporary_file_stays() {
        let dir = tempfile::tempdir().unwrap();
        let first = write_textfile(dir.path(), "hangwatch_1_n", "a 1\n").unwrap();
        assert_eq!(first, dir.path().join("hangwatch_1_n.prom"));
        write_textfile(dir.path(), "hangwatch_1_n", "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&first).unwrap(), "a 2\n");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["hangwatch_1_n.prom"]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&first).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_says_where() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = write_textfile(&missing, "x", "a 1\n").unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
        assert!(matches!(
            write_textfile(dir.path(), "../x", ""),
            Err(TextfileError::BadName { .. })
        ));
        assert!(matches!(
            write_textfile(dir.path(), "x.prom", ""),
            Err(TextfileError::BadName { .. })
        ));
    }

    #[test]
    fn names_are_safe_for_any_job_id_and_node() {
        assert_eq!(
            textfile_name("123_4", "gpu-01.cluster"),
            "hangwatch_123_4_gpu-01_cluster"
        );
        assert_eq!(textfile_name("../../x", "n y"), "hangwatch_______x_n_y");
    }

    #[test]
    fn pruning_removes_only_old_hangwatch_files() {
        let dir = tempfile::tempdir().unwrap();
        write_textfile(dir.path(), "hangwatch_old_n", "a 1\n").unwrap();
        std::fs::write(dir.path().join("other.prom"), "b 1\n").unwrap();
        let later = SystemTime::now() + Duration::from_secs(7200);
        let removed = prune_textfiles(dir.path(), Duration::from_secs(3600), later).unwrap();
        assert_eq!(removed, [dir.path().join("hangwatch_old_n.prom")]);
        assert!(dir.path().join("other.prom").exists());
        write_textfile(dir.path(), "hangwatch_new_n", "a 1\n").unwrap();
        let removed =
            prune_textfiles(dir.path(), Duration::from_secs(3600), SystemTime::now()).unwrap();
        assert!(removed.is_empty());
    }
}
