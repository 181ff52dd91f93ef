//! What `hangwatch doctor` reads about this host, and the lines `run` says at start from the same checks
//! (`hangwatch_doctor` holds the knowledge; this gathers the facts and says them).

use std::path::{Path, PathBuf};

use hangwatch_agent::human::say;
use hangwatch_doctor::{diagnose, startup_warnings, GatherOptions, HostFacts, PathRole};
use hangwatch_proc::MountTable;

use crate::dirs::{report_root_candidates, state_dir, ProcessEnv};

/// For `run`, before the job starts: one line per check that would leave hangwatch blind or a hang silent. Reads a
/// dozen small /proc files and the mount table; starts no process.
pub fn say_startup_warnings(report_dir: &Path, log_file: Option<&Path>) {
    let facts = gather(Some(report_dir), log_file);
    for finding in startup_warnings(&diagnose(&facts)) {
        say(format!(
            "hangwatch: doctor: {} (fix: {})",
            finding.what,
            finding.fix.as_deref().unwrap_or("see hangwatch doctor")
        ));
    }
}

/// The host's facts, with the report directory (`run`'s default when `None`), the state directory and the log
/// file's directory judged by the mount table.
pub fn gather(report_dir: Option<&Path>, log_file: Option<&Path>) -> HostFacts {
    let table = hangwatch_proc::ProcFs::new("/proc")
        .mountinfo(std::process::id() as i32)
        .ok();
    let local = |path: &Path| node_local(table.as_ref(), path);
    let uid = hangwatch_safefs::euid();
    let mut paths = Vec::new();
    let report = report_dir.map(Path::to_path_buf).or_else(|| {
        report_root_candidates(&ProcessEnv, uid, &local)
            .into_iter()
            .next()
    });
    if let Some(dir) = report {
        paths.push((PathRole::ReportDir, dir));
    }
    paths.push((PathRole::StateDir, state_dir(&ProcessEnv, uid, &local)));
    if let Some(file) = log_file {
        let dir = match file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        paths.push((PathRole::LogDir, dir));
    }
    HostFacts::gather(&GatherOptions::host(paths))
}

/// Node-local by the mount table alone (no stat of the path: it may be on a frozen mount). Unknown counts as local.
fn node_local(table: Option<&MountTable>, path: &Path) -> bool {
    table
        .and_then(|t| t.containing(&path.to_string_lossy()))
        .is_none_or(|m| !m.is_remote())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_proc::parse_mountinfo;

    #[test]
    fn node_local_is_decided_by_the_table() {
        let table = parse_mountinfo(
            "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:40 / /shared rw - nfs4 srv:/x rw\n",
        )
        .unwrap();
        assert!(node_local(Some(&table), Path::new("/var/tmp/x")));
        assert!(!node_local(
            Some(&table),
            Path::new("/shared/never/created")
        ));
        assert!(node_local(None, Path::new("/shared/x")));
    }
}
