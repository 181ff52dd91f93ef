//! The running hangwatch binary as a child's program: re-executed from memory or `/proc/self/exe`, never through
//! `PATH`, and external programs started through it (`hangwatch __exec`) so that finding them cannot hold us.

use std::process::Command;

/// Set once by the hangwatch binary, which implements `hangwatch __exec`: see [`external_command`].
static EXEC_THROUGH_HANGWATCH: std::sync::OnceLock<()> = std::sync::OnceLock::new();

/// Starts every [`external_command`] through `hangwatch __exec` from now on. Called by the hangwatch binary only
/// (a library test's binary has no `__exec`).
pub fn start_external_programs_through_hangwatch() {
    let _ = EXEC_THROUGH_HANGWATCH.set(());
}

/// A command for an external program (`scontrol`, `sbatch`, `sh` for an alert command) that cannot hold
/// hangwatch: `Command::spawn` returns only once the child has exec'd, and finding the program through a `PATH`
/// whose first directory is on a stopped filesystem (the job's venv), or reading it from one (Slurm on NFS), never
/// returns. So the child is hangwatch itself (`hangwatch __exec -- PROGRAM`, started from memory or
/// `/proc/self/exe`, never through `PATH`), which then execs the program; a child stuck in that exec is abandoned at
/// the caller's deadline like any other ([`crate::run_with_deadline`]). Arguments, environment and standard streams set on
/// the returned command reach the program unchanged.
pub fn external_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    if EXEC_THROUGH_HANGWATCH.get().is_some() {
        if let Ok(exe) = self_exe() {
            let mut command = Command::new(exe);
            command.arg("__exec").arg("--").arg(program);
            return command;
        }
    }
    Command::new(program)
}

/// The running hangwatch binary, for re-executing it as a child (`__probe-child`, `__inspect-child`).
///
/// Not the binary's path: a job runs for days, and a hangwatch upgraded (or rebuilt) in the meantime replaces the
/// file there; `/proc/self/exe` keeps pointing at the binary that runs. And when that binary lives on a network or
/// FUSE filesystem (a shared venv on GPFS), starting a child would read it from the filesystem that may be the one
/// frozen, and `spawn` waits for the child's exec: the first call copies the binary into memory (a memfd) while
/// things are healthy, and children are executed from there.
pub fn self_exe() -> std::io::Result<std::path::PathBuf> {
    static SELF_EXE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    let chosen = SELF_EXE.get_or_init(|| {
        // lstat, not stat: following the link would touch the binary's filesystem.
        let link = std::path::Path::new("/proc/self/exe");
        std::fs::symlink_metadata(link).ok()?;
        Some(match in_memory_copy() {
            Ok(Some(path)) => path,
            Ok(None) => link.to_path_buf(),
            Err(e) => {
                tracing::warn!(error = %e, "hangwatch's binary is on a remote filesystem and could not be copied to memory");
                link.to_path_buf()
            }
        })
    });
    match chosen {
        Some(path) => Ok(path.clone()),
        None => std::env::current_exe(),
    }
}

/// How [`self_exe`] and [`detach_from_binary_filesystem`] learn whether the running binary lives on a network or
/// FUSE filesystem; unset, it counts as local.
static BINARY_IS_REMOTE: std::sync::OnceLock<fn() -> std::io::Result<bool>> =
    std::sync::OnceLock::new();

/// Tells this crate how to judge the running binary's filesystem (reading the mount table is not its business:
/// the hangwatch binary passes `hangwatch_inspect::reexec::binary_is_remote`). Call at start, before the first
/// [`self_exe`]; a second call changes nothing.
pub fn judge_binary_filesystem_with(is_remote: fn() -> std::io::Result<bool>) {
    let _ = BINARY_IS_REMOTE.set(is_remote);
}

/// Whether the running binary lives on a network or FUSE filesystem, by the judge given at start.
fn binary_is_remote() -> std::io::Result<bool> {
    BINARY_IS_REMOTE.get().map_or(Ok(false), |judge| judge())
}

/// Keeps a long-running hangwatch independent of the filesystem its binary lives on: when that is a network or
/// FUSE filesystem, every page mapped now (the binary's code included) is locked in memory, so that running code
/// for the first time (the roll call, hours into a job) never page-faults on a filesystem that stopped answering;
/// and the copy that children are started from is made. Call once at start, while things are healthy. Returns
/// what it did, for a log line.
pub fn detach_from_binary_filesystem() -> Option<String> {
    if !binary_is_remote().unwrap_or(false) {
        return None;
    }
    let locked = nix::sys::mman::mlockall(nix::sys::mman::MlockAllFlags::MCL_CURRENT);
    let copied = self_exe();
    Some(format!(
        "hangwatch's binary is on a remote filesystem: code {}, children run from {}",
        match locked {
            Ok(()) => "locked in memory".to_string(),
            Err(e) => format!("NOT locked in memory ({e}: raise `ulimit -l`)"),
        },
        copied
            .map(|p| p.display().to_string())
            .unwrap_or_else(|e| format!("nowhere ({e})"))
    ))
}

/// Copies the running binary into a memfd when it lives on a remote filesystem; `None` when it does not.
fn in_memory_copy() -> std::io::Result<Option<std::path::PathBuf>> {
    if !binary_is_remote()? {
        return Ok(None);
    }
    let fd =
        nix::sys::memfd::memfd_create(c"hangwatch", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)?;
    let mut copy = std::fs::File::from(fd);
    std::io::copy(&mut std::fs::File::open("/proc/self/exe")?, &mut copy)?;
    // Children exec it through our fd table (their own copy of the fd closes at exec): kept open for the life of
    // the process on purpose.
    let path = std::path::PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        std::os::fd::AsRawFd::as_raw_fd(&copy)
    ));
    std::mem::forget(copy);
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadline::{run_with_deadline, ChildOutcome};
    use std::time::Duration;

    #[test]
    fn self_exe_runs_this_binary_even_if_its_file_is_replaced() {
        let exe = self_exe().unwrap();
        assert_eq!(exe, std::path::PathBuf::from("/proc/self/exe"));
        let mut cmd = Command::new(&exe);
        cmd.arg("--list");
        match run_with_deadline(cmd, Duration::from_secs(20)).unwrap() {
            ChildOutcome::Finished { status, stdout, .. } => {
                assert!(status.success());
                assert!(String::from_utf8_lossy(&stdout).contains("self_exe_runs_this_binary"));
            }
            other => panic!("expected Finished, got {other:?}"),
        }
    }
}
