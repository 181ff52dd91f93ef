//! How a rank that died ended: its exit status or signal, the kernel's OOM kill and its memory cgroup, a core
//! dump, the last lines it printed. Carried on the observation of an exited rank and on its culprit entry.

use serde::{Deserialize, Serialize};

/// Why a rank is gone, as far as it is known; every field that is not known is `null`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankDeath {
    /// The code it passed to `exit()`; `null` when a signal ended it.
    pub exit_code: Option<i32>,
    /// The signal that ended it (`9`), and its name (`SIGKILL`).
    pub signal: Option<i32>,
    pub signal_name: Option<String>,
    /// The kernel wrote a core dump (the wait status says so).
    pub core_dumped: Option<bool>,
    /// Where the core went: a file (`/var/crash/core.4242`) or `piped to systemd-coredump`; `null` when none was
    /// written or it could not be found.
    pub core_dump: Option<String>,
    /// Killed by the kernel's OOM killer: the kernel log names its pid, or its memory cgroup counted an OOM kill
    /// and SIGKILL ended it. `false` when it was not (another cause, or nothing says so where it would);
    /// `null` when nothing could tell.
    pub oom_killed: Option<bool>,
    /// What says so, in words ("kernel log: Memory cgroup out of memory: Killed process 4242 (python)").
    #[serde(default)]
    pub oom_evidence: Vec<String>,
    /// The rank's memory cgroup (`/hw-test`), its controller version (1 or 2), its limit and its OOM-kill counter.
    pub memory_cgroup: Option<String>,
    pub cgroup_version: Option<u8>,
    /// `null` when unlimited or unreadable.
    pub memory_limit_bytes: Option<u64>,
    /// The limit for people: `256 MiB`.
    pub memory_limit: Option<String>,
    pub cgroup_oom_kills: Option<u64>,
    /// The last lines it printed (stdout and stderr, interleaved as read), oldest first.
    pub output_tail: Option<Vec<String>>,
    /// The exception its last Python traceback ended with (`RuntimeError: boom`).
    pub exception: Option<String>,
    /// How it died, in words, without the rank: `was killed by the kernel's OOM killer (memory cgroup /hw-test,
    /// limit 256 MiB)`, `died of SIGSEGV`, `exited with code 1: RuntimeError: boom`.
    pub cause: String,
}
