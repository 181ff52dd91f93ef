//! Observations of rank processes: what the inspector read from /proc, py-spy and probes, before any decision.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Everything read about one rank process during one roll call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessObservation {
    pub pid: i32,
    /// Global rank, when known (see `rank_source` for where it came from).
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    /// Where `rank` came from (`env:RANK`, `env:SLURM_PROCID`, `client`, `structure`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_source: Option<RankSource>,
    pub node: Option<String>,
    /// `comm` from /proc/PID/stat (15 characters at most).
    pub comm: Option<String>,
    /// The process no longer exists (or is a zombie) at the time of observation.
    pub exited: bool,
    /// Exit status when hangwatch is its parent and reaped it.
    pub exit_code: Option<i32>,
    /// When it exited (seconds since the epoch), when known: the first rank to fail is the one to blame.
    #[serde(default)]
    pub exited_at_unix_s: Option<f64>,
    pub threads: Vec<ThreadObservation>,
    /// Non-zero when a tracer (py-spy, strace, gdb) is attached.
    pub tracer_pid: Option<i32>,
    /// SIGSTOP pending on the process or any of its threads.
    pub sigstop_pending: bool,
    /// Python stacks, one per Python thread; `None` when not read (not Python, or the read failed).
    pub python: Option<Vec<PythonThread>>,
    /// Reads that failed or timed out while observing this process, in words ("python stack read timed out
    /// after 1s: the process's memory map is locked").
    pub read_issues: Vec<String>,
    /// Start time after boot in clock ticks (field 22 of /proc/PID/stat): with the pid, the process's identity.
    #[serde(default)]
    pub start_time: Option<u64>,
    /// Set when this process is not a rank but a descendant of one (a DataLoader, compile or `multiprocessing`
    /// worker): it belongs to that rank and is never a rank itself.
    #[serde(default)]
    pub worker_of: Option<WorkerOf>,
    /// How it died, when it exited and its supervisor gathered why (`run` with ranks it started).
    #[serde(default)]
    pub death: Option<crate::RankDeath>,
    /// Its pid in its own pid namespace (the last of `NSpid` in /proc/PID/status), when that differs from `pid`:
    /// what `ps` shows inside the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<i32>,
    /// How fast it read or wrote (files, pipes, sockets: `rchar + wchar`) between the roll call's two samples,
    /// in bytes per second: a rank that downloads works though it barely uses a CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_s_during_sample: Option<u64>,
    /// It lives in a mount namespace other than hangwatch's (a container): its paths and mounts are its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub other_mount_namespace: bool,
    /// The files this process has memory-mapped, read (in an abandonable child) only when one of its threads is
    /// blocked in a page fault: the file it faults on is one of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapped_files: Option<MappedFiles>,
    /// Threads left out of `threads` because each waited just like a thread that was kept (same state, wait
    /// channel, system call and kernel stack, no CPU time): a node's roll-call answer to the coordinator folds
    /// them (`hangwatch_diagnosis::answer`); the node's own evidence keeps every thread.
    #[serde(default, skip_serializing_if = "crate::is_zero")]
    pub threads_folded: u32,
    /// The file locks this process waits for (a thread in `flock()` or `fcntl()`), each with who holds it (from
    /// /proc/locks): the next hop when a rank waits for a lock.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lock_waits: Vec<LockWait>,
    /// Set when a thread of this process is blocked writing a pipe or FIFO: the processes that hold its read end,
    /// each observed as a rank is (its threads, calls and files), since the one that stopped reading is what the
    /// rank waits on (the next hop).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pipe_readers: Vec<PipeReader>,
    /// The sockets its threads wait on (a call on a socket, or `epoll_wait` over a few), each described from the
    /// process's network namespace with the process at the other end when this node has it (the next hop).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub socket_waits: Vec<crate::SocketWait>,
}

/// A process holding the read end of a pipe or FIFO that a rank is blocked writing.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PipeReader {
    /// The pipe as the writer names it (`pipe:[5678]`, or the FIFO's path).
    pub pipe: String,
    /// One of the job's processes, or someone else's (a log shipper).
    pub in_job: bool,
    /// The reader, observed (boxed: most processes have no reader to carry).
    pub observation: Box<ProcessObservation>,
}

/// A file lock a process waits for, and the processes that hold it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LockWait {
    /// `FLOCK`, `POSIX` or `OFDLCK`.
    pub class: String,
    /// The locked file as the kernel names it (`MAJ:MIN:INODE`); its path is the waiting call's file.
    pub file: String,
    pub holders: Vec<LockHolder>,
}

/// A process holding a lock that a rank waits for.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LockHolder {
    pub pid: i32,
    /// Its `comm`.
    pub comm: Option<String>,
    /// One of the job's processes (a rank or a worker of one), or someone else's.
    pub in_job: bool,
}

/// The file-backed mappings of a process (`/proc/PID/maps`), each placed on its mount.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MappedFiles {
    /// One entry per file (its mappings merged), in address order of the first.
    pub files: Vec<MappedFile>,
    /// Why the map could not be read (it takes the process's mmap lock, which a fault may hold); `files` is then
    /// empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// One memory-mapped file of a process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MappedFile {
    /// The file, its mount and filesystem (from the mapping's device and the process's mount table).
    pub file: FileRef,
    /// The address ranges it is mapped at, `[start, end)`.
    pub ranges: Vec<(u64, u64)>,
    /// Mapped executable: code (the program or a shared library), not data.
    pub code: bool,
}

impl MappedFile {
    /// Whether `addr` lies in one of its mappings.
    pub fn holds(&self, addr: u64) -> bool {
        self.ranges
            .iter()
            .any(|&(start, end)| start <= addr && addr < end)
    }
}

/// Where a process's rank number came from, as the evidence says it. The order in which sources are tried is
/// `hangwatch_diagnosis::ranks` (docs/run.md, "Who is a rank").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RankSource {
    /// The rank's own Python client, once `torch.distributed` was initialized (or Lightning's `global_rank`).
    #[serde(rename = "client")]
    Client,
    /// `RANK` in the process's starting environment (torchrun, accelerate, `--nproc`).
    #[serde(rename = "env:RANK")]
    EnvRank,
    /// `OMPI_COMM_WORLD_RANK` (Open MPI's `mpirun`).
    #[serde(rename = "env:OMPI_COMM_WORLD_RANK")]
    EnvOmpi,
    /// `PMIX_RANK` (PMIx launchers, `srun --mpi=pmix`).
    #[serde(rename = "env:PMIX_RANK")]
    EnvPmix,
    /// `PMI_RANK` (MPICH's and Intel MPI's hydra).
    #[serde(rename = "env:PMI_RANK")]
    EnvPmi,
    /// `SLURM_PROCID` (an `srun` task).
    #[serde(rename = "env:SLURM_PROCID")]
    EnvSlurm,
    /// Guessed from the process tree: the order in which `torch.multiprocessing.spawn` or Lightning started the
    /// processes. A guess until the client reports.
    #[serde(rename = "structure")]
    Structure,
}

impl RankSource {
    /// The name the evidence uses (`env:RANK`, `client`, `structure`).
    pub fn as_str(self) -> &'static str {
        match self {
            RankSource::Client => "client",
            RankSource::EnvRank => "env:RANK",
            RankSource::EnvOmpi => "env:OMPI_COMM_WORLD_RANK",
            RankSource::EnvPmix => "env:PMIX_RANK",
            RankSource::EnvPmi => "env:PMI_RANK",
            RankSource::EnvSlurm => "env:SLURM_PROCID",
            RankSource::Structure => "structure",
        }
    }
}

impl std::fmt::Display for RankSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A process known by its pid and its start time, so that a reused pid is never taken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProcId {
    pub pid: i32,
    /// Start time after boot, in clock ticks (field 22 of /proc/PID/stat).
    pub start_time: u64,
}

/// The rank a worker process belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerOf {
    /// The rank process (the outermost process carrying `RANK` above the worker).
    pub rank_pid: i32,
    /// That rank's number, when known.
    pub rank: Option<u32>,
    /// Where that number came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_source: Option<RankSource>,
    /// The worker's parent: the rank itself for a direct child.
    pub parent_pid: i32,
}

/// One thread of a rank process, sampled twice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadObservation {
    pub tid: i32,
    /// Thread name (`comm` of the task).
    pub name: Option<String>,
    /// State letter from the second sample (R, S, D, T, t, Z, X, I, P, W, K).
    pub state: char,
    pub wchan: Option<String>,
    pub syscall: Option<SyscallObservation>,
    /// Kernel stack frames (`/proc/PID/task/TID/stack`, root only), without addresses.
    pub kernel_stack: Option<Vec<String>>,
    pub voluntary_ctxt_switches: Option<u64>,
    pub nonvoluntary_ctxt_switches: Option<u64>,
    /// No context switch and no CPU time between the two samples: the thread did not run for at least this long.
    pub not_running_for_ms: Option<u64>,
    /// CPU time (user + system) spent between the two samples.
    pub cpu_ms_during_sample: Option<u64>,
    /// Total CPU time (user + system) at the second sample.
    pub cpu_ms_total: Option<u64>,
    /// SIGKILL pending on this thread (an earlier kill did not take effect yet).
    pub sigkill_pending: bool,
    /// A third look at the thread, later in the same roll call, where the second sample's state was one instant's
    /// (in D, or on a CPU with no CPU time to back it): whether that state lasted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub second_look: Option<SecondLook>,
}

/// What a thread was doing a moment after the roll call's second sample: a thread caught in D for a page fault on
/// a healthy disk, or runnable for an instant between two waits, has moved on by then; one stuck has not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecondLook {
    /// Milliseconds after the second sample.
    pub after_ms: u64,
    /// The state letter then; `X` when the thread had exited.
    pub state: char,
    /// CPU time (user + system) used since the second sample, when both were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// Whether it was switched off or onto a CPU since (its context-switch counters moved), when both were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switched: Option<bool>,
}

impl SecondLook {
    /// The thread left the state of the second sample, or ran, in between: what it was seen in was a moment.
    pub fn moved_on(&self, state: char) -> bool {
        self.state != state || self.switched == Some(true) || self.cpu_ms.is_some_and(|ms| ms > 0)
    }
}

/// What `/proc/PID/task/TID/syscall` said, decoded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SyscallObservation {
    /// The thread is running on a CPU.
    Running,
    /// Blocked, but not in a system call (`-1 sp pc`: e.g. a page fault on a frozen mount).
    NotInSyscall {
        /// The user instruction pointer: for a fault on code (the executable, a shared library) it lies in the
        /// page being read, and so names the file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pc: Option<u64>,
    },
    /// Blocked in a system call.
    InSyscall {
        nr: i64,
        /// Name for the machine's architecture (`write`), when known.
        name: Option<String>,
        args: Vec<u64>,
        /// The file descriptor argument, for calls whose first argument is one.
        fd: Option<i32>,
        /// What that fd points at, or the file the path argument names (once read and resolved).
        file: Option<FileRef>,
        /// The path argument of a call that takes one (mkdir, openat, rename, stat, ...).
        /// Boxed: most calls take no path, and the variant stays small.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<Box<PathArg>>,
    },
}

/// The path argument of a blocked call: where it is in the rank's memory, the directory it is relative to, and
/// the string itself once read (without stopping the rank, in a child that is abandoned if the read blocks).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PathArg {
    /// Address of the string in the process's memory.
    pub addr: u64,
    /// The directory a relative path is relative to: the dirfd's target or the working directory (readlink of
    /// /proc, which never touches the filesystem).
    pub base: Option<String>,
    /// The string as the call got it.
    pub text: Option<String>,
    /// Why the string could not be read; the verdict then names no file and no mount for this call.
    pub unreadable: Option<String>,
}

/// A file a thread is using, resolved without touching its filesystem.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FileRef {
    /// `readlink` of /proc/PID/fd/N (`/shared/log.txt`, `socket:[1234]`, `pipe:[5678]`), as the process sees it
    /// (in its own mount namespace).
    pub path: String,
    /// Mount point containing it (from fdinfo mnt_id and the process's own mountinfo).
    pub mount: Option<String>,
    pub fstype: Option<String>,
    /// Mount source (device, server:/export), when known.
    pub source: Option<String>,
    /// Which filesystem that is, the same whatever path a container binds it at (boxed: a thread's syscall
    /// observation stays small).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<Box<FilesystemId>>,
}

impl FileRef {
    /// What names its filesystem when filesystems are compared (across ranks, nodes, jobs): the identity's key,
    /// else the mount point (observations from before identities were kept).
    pub fn filesystem_key(&self) -> Option<&str> {
        filesystem_key(self.filesystem.as_deref(), self.mount.as_deref())
    }
}

/// The key a filesystem is compared by: its identity's when known, else the mount point.
pub fn filesystem_key<'a>(id: Option<&'a FilesystemId>, mount: Option<&'a str>) -> Option<&'a str> {
    id.map(|id| id.key.as_str()).or(mount)
}

/// What identifies a mounted filesystem across mount namespaces: a rank in a container sees the shared
/// filesystem at a path of the container's choosing (`/data`), the node at another (`/gpfs/project`). Built from
/// mountinfo only (`hangwatch_proc::filesystem_id`), never by touching the filesystem.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesystemId {
    /// What filesystems are compared by: `fstype source` for a network filesystem (`nfs4 srv:/export`,
    /// `gpfs gpfs1`: the same on every node); else the mount point in hangwatch's own namespace of the
    /// filesystem (`/srv/shared`); else the device numbers (`fuse dev 0:52`, a filesystem only a container
    /// mounts).
    pub key: String,
    /// `major:minor` of the filesystem (st_dev): the same in every mount namespace of one node.
    pub device: String,
    pub fstype: String,
    /// `/dev/vda1`, `server:/export`, the GPFS or Lustre filesystem's name.
    pub source: String,
    /// The directory of the filesystem that the mount shows (`/` unless it binds a part of it).
    pub root: String,
    /// The mount point in hangwatch's own mount namespace (the node's, for the node service or a `run` outside
    /// the container) where that filesystem is mounted, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_mount: Option<String>,
    /// Where the mount's directory is in hangwatch's namespace (`/srv/shared/run7` for a container's `/data`
    /// bound from there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// The mount was seen in a mount namespace other than hangwatch's (a container's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub other_namespace: bool,
}

impl FilesystemId {
    /// How a person is told where a container's mount is: "= /srv/shared on the host" (empty when the mount is
    /// in hangwatch's own namespace, or the node does not mount that filesystem).
    pub fn host_words(&self) -> Option<String> {
        if !self.other_namespace {
            return None;
        }
        Some(match &self.host_path {
            Some(path) => format!("{path} on the host"),
            None => format!("{} {} (not mounted on the host)", self.fstype, self.source),
        })
    }
}

/// One thread's Python stack, innermost frame first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PythonThread {
    /// Kernel thread id, when the interpreter exposes it (Python 3.11+ for non-main threads).
    pub os_tid: Option<i32>,
    pub thread_id: u64,
    pub name: Option<String>,
    pub frames: Vec<PythonFrame>,
}

/// One Python frame.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PythonFrame {
    /// Shared with equal texts (`crate::interned`): every rank runs the same code.
    #[serde(deserialize_with = "crate::interned::deserialize")]
    pub function: Arc<str>,
    #[serde(deserialize_with = "crate::interned::deserialize")]
    pub filename: Arc<str>,
    pub line: i32,
}

impl PythonFrame {
    /// `function (file:line)`, as shown in verdicts.
    pub fn display(&self) -> String {
        format!("{} ({}:{})", self.function, self.filename, self.line)
    }
}

/// Result of probing one filesystem.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    /// The path that was asked about.
    pub path: String,
    pub mount: Option<String>,
    pub fstype: Option<String>,
    pub source: Option<String>,
    /// `true`: every probe step returned in time; `false`: one did not (or failed in a way that means the
    /// filesystem is broken); `None`: could not be determined.
    pub responsive: Option<bool>,
    /// Milliseconds the probe took, or waited before giving up.
    pub elapsed_ms: u64,
    /// Human explanation ("write probe did not return within 2s", "still stuck from a probe started 14s ago").
    pub detail: String,
    /// The probe steps that ran, each with its outcome.
    pub steps: Vec<ProbeStep>,
    /// Which filesystem was probed (the mount as the ranks see it: a container's is probed in its own
    /// namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemId>,
}

impl ProbeResult {
    /// See [`FileRef::filesystem_key`].
    pub fn filesystem_key(&self) -> Option<&str> {
        filesystem_key(self.filesystem.as_ref(), self.mount.as_deref())
    }
}

/// One step of a filesystem probe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeStep {
    /// `stat`, `statfs`, `write`.
    pub step: String,
    /// `ok`, `timeout`, `error: ...`, `skipped: ...`.
    pub outcome: String,
    pub elapsed_ms: u64,
}
