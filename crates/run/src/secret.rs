//! Secrets read from files (the job's token, a webhook URL whose path is its password): refused when the file's
//! group or others may read or write it, since anyone who reads it can order the job's nodes or post as its alerts.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::Context;
use hangwatch_rpc::{JobSecret, JobToken};

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

/// Reads the token, refusing a file that its group or others may read (or write), and derives the job's link key
/// from it and `job_id`.
pub fn read_job_secret(path: &Path, job_id: &str) -> anyhow::Result<JobSecret> {
    let text = read_private_file(path, "token file")?;
    let token =
        JobToken::new(&text).map_err(|e| usage(format!("token file {}: {e}", path.display())))?;
    JobSecret::new(token, job_id).context("cannot set up the link's key")
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
}
