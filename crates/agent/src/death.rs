//! Gathering why a rank died (the I/O half of `hangwatch_diagnosis::death`): its wait status, the kernel log's
//! OOM kill of its pid, its memory cgroup's limit and OOM counter, where its core went, its last lines. Runs in
//! the worker that builds a verdict, never in the supervision loop: it may wait (at most [`SETTLE`] after the
//! death) for the kernel log line and the rank's last output, which arrive a little after the exit is reaped.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hangwatch_diagnosis::death::{
    core_location, explain, CgroupFacts, CoreContext, CoreLocation, DeathFacts, KernelOom,
};
use hangwatch_model::RankDeath;
use hangwatch_proc::{CgroupFs, MemoryCgroup, ProcFs};

use crate::kernel_log::KernelLog;
use crate::output::Tails;

/// How long after a death its kernel-log line and last output lines are waited for.
pub const SETTLE: Duration = Duration::from_secs(1);

/// What is known of a rank while it lives, for explaining its death: a dead process's /proc entry is gone (a
/// zombie's cgroup is already the root's), so this is read while it runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankIdentity {
    pub cgroup: Option<MemoryCgroup>,
    pub comm: Option<String>,
    pub exe: Option<String>,
    pub cwd: Option<String>,
}

impl RankIdentity {
    /// Reads it from /proc: `cgroup`, `stat` and two links, none of which touches a filesystem the rank uses.
    pub fn read(procfs: &ProcFs, pid: i32) -> Self {
        Self {
            cgroup: procfs.memory_cgroup(pid).ok().flatten(),
            comm: procfs.stat(pid).ok().map(|s| s.comm),
            exe: procfs.exe(pid).ok(),
            cwd: procfs.cwd(pid).ok(),
        }
    }
}

/// A rank hangwatch started and reaped.
#[derive(Debug, Clone)]
pub struct DeadRank {
    pub pid: i32,
    pub rank: Option<u32>,
    pub status: ExitStatus,
    pub exited_at: Instant,
    pub identity: RankIdentity,
}

/// Where the facts come from; the roots are parameters so that tests can point them elsewhere.
#[derive(Clone)]
pub struct Witnesses {
    pub kernel_log: KernelLog,
    pub tails: Arc<Tails>,
    pub cgroups: CgroupFs,
    /// `/proc/sys/kernel`, for `core_pattern` and `core_uses_pid`.
    pub sysctl_kernel: PathBuf,
    pub hostname: Option<String>,
}

impl Witnesses {
    /// This machine's: the live kernel log, the cgroup hierarchies hangwatch's own mount table shows.
    pub fn of_this_node(kernel_log: KernelLog, tails: Arc<Tails>) -> Self {
        let cgroups = ProcFs::new("/proc")
            .mountinfo(std::process::id() as i32)
            .map(|m| CgroupFs::from_mounts(&m))
            .unwrap_or_default();
        Self {
            kernel_log,
            tails,
            cgroups,
            sysctl_kernel: PathBuf::from("/proc/sys/kernel"),
            hostname: nix::unistd::gethostname()
                .ok()
                .map(|h| h.to_string_lossy().into_owned()),
        }
    }

    /// Why `dead` died. Waits until its kernel-log line (for a SIGKILL) and its last output are in, at most
    /// until [`SETTLE`] after its death.
    pub fn explain(&self, dead: &DeadRank) -> RankDeath {
        let signal = dead.status.signal();
        let label = Tails::label(dead.rank);
        let until = dead.exited_at + SETTLE;
        let mut kernel_oom = self.kernel_oom(dead.pid);
        loop {
            let waiting_for_kmsg = signal == Some(libc::SIGKILL)
                && kernel_oom.is_none()
                && self.kernel_log.unavailable.is_none();
            if !(waiting_for_kmsg || self.tails.streams_open(&label)) || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            if waiting_for_kmsg {
                kernel_oom = self.kernel_oom(dead.pid);
            }
        }
        // The cgroup named in the kernel's OOM report is the one whose limit was hit; else the one it lived in.
        let cgroup = kernel_oom
            .as_ref()
            .and_then(|k| k.memcg.clone())
            .and_then(|path| {
                Some(MemoryCgroup {
                    version: self.cgroups.memory_version()?,
                    path,
                })
            })
            .or_else(|| dead.identity.cgroup.clone());
        let memory_cgroup = cgroup.map(|cg| {
            let state = self.cgroups.memory_state(&cg).unwrap_or_default();
            CgroupFacts {
                version: cg.version.number(),
                path: cg.path,
                limit_bytes: state.limit_bytes,
                oom_kills: state.oom_kills,
            }
        });
        let core_dumped = signal.map(|_| dead.status.core_dumped());
        let core_dump = core_dumped
            .filter(|dumped| *dumped)
            .and_then(|_| self.core_dump(dead));
        explain(&DeathFacts {
            exit_code: dead.status.code(),
            signal,
            core_dumped,
            core_dump,
            kernel_log_readable: self.kernel_log.unavailable.is_none(),
            kernel_oom,
            memory_cgroup,
            output: self.tails.lines_of(&label),
        })
    }

    fn kernel_oom(&self, pid: i32) -> Option<KernelOom> {
        let pid = u32::try_from(pid).ok()?;
        let (line, memcg) = self.kernel_log.oom_kill_of(pid)?;
        Some(KernelOom { line, memcg })
    }

    /// Where the core of `dead` went: a pipe's program, or a file that is there. A file on a network or FUSE
    /// filesystem is not looked for (that look could hang): it is named as not checked.
    fn core_dump(&self, dead: &DeadRank) -> Option<String> {
        let read = |name: &str| {
            std::fs::read_to_string(self.sysctl_kernel.join(name))
                .ok()
                .map(|t| t.trim_end().to_string())
        };
        let pattern = read("core_pattern")?;
        let ctx = CoreContext {
            pid: dead.pid,
            signal: dead.status.signal(),
            hostname: self.hostname.clone(),
            comm: dead.identity.comm.clone(),
            exe: dead.identity.exe.clone(),
            cwd: dead.identity.cwd.clone(),
            uses_pid: read("core_uses_pid").is_some_and(|v| v == "1"),
            ..Default::default()
        };
        match core_location(&pattern, &ctx) {
            CoreLocation::Piped(program) => Some(format!("piped to {program}")),
            CoreLocation::File(path) => {
                let mount = ProcFs::new("/proc")
                    .mountinfo(std::process::id() as i32)
                    .ok()
                    .and_then(|m| m.containing(&path).cloned());
                match mount {
                    Some(m) if m.is_remote() => Some(format!(
                        "{path} (on {} {}: not checked)",
                        m.fstype, m.mount_point
                    )),
                    // Node-local: a stat of a local disk answers.
                    Some(_) => std::fs::symlink_metadata(&path).ok().map(|_| path),
                    None => None,
                }
            }
            CoreLocation::Unknown => None,
        }
    }
}
