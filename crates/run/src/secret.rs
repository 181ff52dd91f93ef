//! Secrets read from files (the job's token, a webhook URL whose path is its password): refused when the file's
//! group or others may read or write it, since anyone who reads it can order the job's nodes or post as its alerts;
//! a job token also when it is too weak to keep the link closed. And fresh job tokens written to a private file
//! (`hangwatch token new`).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
/// A fresh token's text, for `hangwatch token new -` (the binary does not reach `hangwatch_rpc` itself).
pub use hangwatch_rpc::{new_token_text, NoRandomness};
use hangwatch_rpc::{JobSecret, JobToken};
use hangwatch_safefs::{SafeFsError, WriteMode};

use crate::usage;

/// The text of `path`, trimmed, or a usage error that says what is wrong and how to fix it. `what` names the
/// secret in the messages ("token file", "webhook file").
pub fn read_private_file(path: &Path, what: &str) -> anyhow::Result<String> {
    let unreadable =
        |e: std::io::Error| usage(format!("cannot read the {what} {}: {e}", path.display()));
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(usage(format!(
            "the {what} {} is accessible to its group or others (mode {mode:03o}): anyone who reads it holds the \
             secret; run `chmod 600 {}`",
            path.display(),
            path.display()
        )));
    }
    Ok(std::fs::read_to_string(path)
        .map_err(unreadable)?
        .trim()
        .to_string())
}

/// Reads the token, refusing a file that its group or others may read (or write) and a token too weak to use
/// (under 128 bits by `hangwatch_rpc::token_strength`'s rule, or repetitive: the error says why and to run
/// `hangwatch token new FILE`), and derives the job's link key from it and `job_id`.
pub fn read_job_secret(path: &Path, job_id: &str) -> anyhow::Result<JobSecret> {
    let text = read_private_file(path, "token file")?;
    let token =
        JobToken::new(&text).map_err(|e| usage(format!("token file {}: {e}", path.display())))?;
    JobSecret::new(token, job_id).context("cannot set up the link's key")
}

/// Why a fresh token could not be written. (Display and Error by hand: this crate does not take thiserror.)
#[derive(Debug)]
pub enum NewTokenError {
    Random(NoRandomness),
    /// The file exists and replacing it was not asked for.
    Exists {
        path: PathBuf,
    },
    Open {
        path: PathBuf,
        source: SafeFsError,
    },
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl std::fmt::Display for NewTokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NewTokenError::Random(e) => e.fmt(f),
            NewTokenError::Exists { path } => write!(
                f,
                "{} already exists: a job's token is made once and every node reads the same one; give another \
                 file, or --force to replace it (nodes still holding the old one can then no longer join)",
                path.display()
            ),
            NewTokenError::Open { path, .. } => {
                write!(f, "cannot create the token file {}", path.display())
            }
            NewTokenError::Write { path, .. } => {
                write!(f, "cannot write the token file {}", path.display())
            }
        }
    }
}

impl std::error::Error for NewTokenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NewTokenError::Random(_) | NewTokenError::Exists { .. } => None,
            NewTokenError::Open { source, .. } => Some(source),
            NewTokenError::Write { source, .. } => Some(source),
        }
    }
}

/// Writes a fresh job token (256 bits from the kernel's random source, as 64 hex digits and a newline) to `path`:
/// created mode 0600, never through a symlink (a planted one is refused, its target untouched), and an existing
/// file is refused unless `replace`, which then must be a regular file of ours. A missing directory is created
/// (0700, with its missing parents: `~/.hangwatch/JOB.token` works the first time); an existing one is taken as
/// it is.
pub fn write_new_token(path: &Path, replace: bool) -> Result<(), NewTokenError> {
    let token = hangwatch_rpc::new_token_text().map_err(NewTokenError::Random)?;
    let open_error = |source| NewTokenError::Open {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if std::fs::symlink_metadata(parent)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        {
            hangwatch_safefs::PrivateDir::open_or_create(parent).map_err(open_error)?;
        }
    }
    let how = if replace {
        WriteMode::Truncate
    } else {
        WriteMode::CreateNew
    };
    let mut file =
        hangwatch_safefs::open_file_in_dir(path, how).map_err(|source| match source {
            SafeFsError::Exists { path } => NewTokenError::Exists { path },
            source => NewTokenError::Open {
                path: path.to_path_buf(),
                source,
            },
        })?;
    file.write_all(format!("{token}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| NewTokenError::Write {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_file_others_can_read_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hook");
        std::fs::write(&file, "https://hooks.example.com/services/T/B/secret\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_private_file(&file, "webhook file")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mode 644") && err.contains("chmod 600"),
            "{err}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            read_private_file(&file, "webhook file").unwrap(),
            "https://hooks.example.com/services/T/B/secret"
        );
        let missing = read_private_file(&dir.path().join("nope"), "webhook file").unwrap_err();
        assert!(
            missing.to_string().contains("cannot read the webhook file"),
            "{missing}"
        );
    }

    fn private(dir: &Path, name: &str, text: &str) -> PathBuf {
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        file
    }

    #[test]
    fn a_weak_token_is_refused_as_a_usage_error_that_names_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        for weak in ["abc\n", &"a".repeat(200)] {
            let err = read_job_secret(&private(dir.path(), "token", weak), "job-1").unwrap_err();
            assert!(
                err.downcast_ref::<hangwatch_model::exit::UsageError>()
                    .is_some(),
                "{err:#}"
            );
            let text = err.to_string();
            assert!(
                text.contains("too weak") && text.contains("hangwatch token new FILE"),
                "{text}"
            );
        }
        let strong = private(dir.path(), "token", "3f9a0c7e5b21d84c6e0f1a9b7d3c2e58\n");
        assert!(read_job_secret(&strong, "job-1").is_ok());
    }

    #[test]
    fn a_new_token_is_private_strong_and_never_overwrites_or_follows_a_link_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(".hangwatch/tokens/job.token");
        write_new_token(&file, false).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(
            mode(&dir.path().join(".hangwatch")),
            0o700,
            "a missing directory is made private"
        );
        let first = std::fs::read_to_string(&file).unwrap();
        assert_eq!(first.trim().len(), 64);
        assert!(read_job_secret(&file, "job-1").is_ok());

        let err = write_new_token(&file, false).unwrap_err();
        assert!(matches!(err, NewTokenError::Exists { .. }), "{err:?}");
        assert!(err.to_string().contains("--force"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), first, "untouched");
        write_new_token(&file, true).unwrap();
        assert_ne!(std::fs::read_to_string(&file).unwrap(), first, "replaced");

        let target = private(dir.path(), "target", "theirs");
        let link = dir.path().join("link.token");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for replace in [false, true] {
            let err = write_new_token(&link, replace).unwrap_err();
            assert!(
                matches!(
                    err,
                    NewTokenError::Open {
                        source: SafeFsError::Symlink { .. },
                        ..
                    }
                ),
                "{replace}: {err:?}"
            );
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "theirs");
    }
}
