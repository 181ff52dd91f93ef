//! The verdict: what `dump --json` and `run --json` print and what `verdict.json` in an evidence bundle holds.

use serde::{Deserialize, Serialize};

/// The version of the verdict document; bumped only on incompatible changes.
pub const VERDICT_VERSION: u32 = 1;

/// What kind of hang the roll call found (SPEC.md "The verdict").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// A rank waits inside a system call that does not come back (D state, or an S-state wait on an unresponsive
    /// filesystem such as FUSE or NFS).
    BlockedInKernel,
    /// A rank is stopped (T/t state).
    Stopped,
    /// A rank died while the others wait.
    Exited,
    /// A rank is somewhere else than its peers, not in the kernel (e.g. a data-loader deadlock).
    Diverged,
    /// A rank computes while its peers wait.
    Busy,
    /// All ranks wait in the same collective; no outlier.
    CollectiveHang,
    /// An agent stopped answering.
    NodeUnreachable,
    /// Nothing stands out.
    Unknown,
}

impl VerdictKind {
    /// Every kind.
    pub const ALL: [VerdictKind; 8] = [
        VerdictKind::BlockedInKernel,
        VerdictKind::Stopped,
        VerdictKind::Exited,
        VerdictKind::Diverged,
        VerdictKind::Busy,
        VerdictKind::CollectiveHang,
        VerdictKind::NodeUnreachable,
        VerdictKind::Unknown,
    ];

    /// The kind with this [`VerdictKind::as_str`] name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The kind in words for people: `blocked in kernel`.
    pub fn words(self) -> String {
        self.as_str().replace('_', " ")
    }

    /// The name used in JSON and in human output.
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictKind::BlockedInKernel => "blocked_in_kernel",
            VerdictKind::Stopped => "stopped",
            VerdictKind::Exited => "exited",
            VerdictKind::Diverged => "diverged",
            VerdictKind::Busy => "busy",
            VerdictKind::CollectiveHang => "collective_hang",
            VerdictKind::NodeUnreachable => "node_unreachable",
            VerdictKind::Unknown => "unknown",
        }
    }
}

/// What `--json` prints where a verdict would be when nothing hung: `{"version": 1, "hang": false}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoHang {
    pub version: u32,
    pub hang: bool,
}

impl NoHang {
    pub const DOCUMENT: NoHang = NoHang {
        version: 1,
        hang: false,
    };
}

/// The verdict document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub version: u32,
    pub kind: VerdictKind,
    /// One sentence a person can act on.
    pub summary: String,
    /// How long progress had stopped when the verdict was made; `null` for a dump taken without a detector.
    pub stalled_for_s: Option<f64>,
    pub culprits: Vec<Culprit>,
    pub groups: Vec<Group>,
    pub filesystems: Vec<FilesystemStatus>,
    pub actions: Vec<ActionRecord>,
    /// Seconds since the Unix epoch when the roll call was taken.
    #[serde(default)]
    pub observed_at_unix_s: Option<f64>,
    /// The node the verdict was made on (hostname), when made by one agent.
    #[serde(default)]
    pub node: Option<String>,
    /// What a person should do next, most important first.
    #[serde(default)]
    pub recommendations: Vec<String>,
    /// Reads that failed or timed out, tools attached to ranks, anything that limits what the verdict could see.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The full roll call: one entry per rank process, in rank order.
    #[serde(default)]
    pub ranks: Vec<RankReport>,
    /// Nodes of the job whose observations did not arrive: their ranks are not in this verdict.
    #[serde(default)]
    pub nodes_not_seen: Vec<String>,
    /// Nodes of the job that still reported progress but whose observations missed the roll call's deadline:
    /// loaded, not unreachable. Their ranks are not in this verdict; they are never `node_unreachable` for it.
    #[serde(default)]
    pub nodes_late: Vec<String>,
    /// This cause on this machine before, from the node's verdict history; `null` when not recorded (`dump`, or
    /// the history could not be written).
    #[serde(default)]
    pub recurrence: Option<crate::Recurrence>,
    /// The ranks still work although nothing reports progress (see `hangwatch_diagnosis::activity`): evidence
    /// that the job computes in silence (an evaluation, a preparation on rank 0), which holds the hard tier back
    /// until `--max-stall`. Absent when the roll call saw no such work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
    /// What the fault belongs to, and so what may be acted on (SPEC.md: a filesystem-scoped verdict excludes and
    /// drains no node whose ranks could be ended). `None`: the program (`job`), or not decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// Why the scope is what it is, in words, one fact a line ("/gpfs does not answer from n2, n3, where no
    /// rank is stuck"; "one node alone, no fleet history: cannot tell the node from the storage").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scope_evidence: Vec<String>,
    /// Whose pids `pid` fields are: the node's (the node service, a `run` outside the container) or a container's
    /// (a `run` inside one). Absent when not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<PidView>,
    /// Ranks of the roll call with no row in `ranks`: beyond `hangwatch_diagnosis::rollcall::FULL_TABLE_RANKS`
    /// the table lists each culprit and the first rank of each group (every rank is still in its group), and
    /// each node's evidence bundle keeps its own ranks' rows.
    #[serde(default, skip_serializing_if = "crate::is_zero")]
    pub ranks_not_listed: u32,
    /// What the ranks' Flight Recorders say of their collectives (who did not join which), when they were asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collectives: Option<crate::CollectiveAnalysis>,
    /// The container the ranks run in, when `run` started a container client (`docker run`, `podman run`): its
    /// id and image as the runtime recorded them, and how it was ended. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<crate::ContainerRef>,
}

/// Which pid namespace the pids of a verdict are numbered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PidView {
    /// The node's own (initial) pid namespace: what `ps` on the node shows.
    Host,
    /// A container's: hangwatch runs inside the container with its ranks.
    Container,
}

/// What a fault belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// A storage incident: a mount that does not answer from nodes with no stuck rank, or that blocks ranks on
    /// several nodes or jobs. Wait for the storage; burn no node.
    Filesystem,
    /// This node: stopped, unreachable, or a mount only it has that does not answer.
    Node,
    /// The program (a deadlock, a busy rank, a rank that died).
    Job,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Filesystem => "filesystem",
            Scope::Node => "node",
            Scope::Job => "job",
        }
    }
}

/// Work seen in a job that reports no progress: ranks (or their workers) whose CPU time advances, outside any wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activity {
    /// The ranks that compute, or whose workers compute.
    pub ranks: Vec<u32>,
    /// Their pids (a rank whose number is not known is still counted here).
    pub pids: Vec<i32>,
    /// Where most of them compute (the meaningful Python frame, else the kernel's word).
    #[serde(rename = "where")]
    pub where_: String,
    /// How many ranks were seen in all.
    pub of_ranks: usize,
    /// The ranks that wait meanwhile, and where most of them wait.
    pub waiting: usize,
    pub waiting_where: Option<String>,
    /// The activity in words: "all 4 ranks compute in evaluate (eval.py)".
    pub summary: String,
}

impl Verdict {
    /// The same verdict without its roll-call table (`ranks`), which is most of its size in a large job; the
    /// caller puts back the rows it needs.
    pub fn without_ranks(&self) -> Verdict {
        // Destructured in full: a new field must be decided on here, not silently dropped.
        let Verdict {
            version,
            kind,
            summary,
            stalled_for_s,
            culprits,
            groups,
            filesystems,
            actions,
            observed_at_unix_s,
            node,
            recommendations,
            warnings,
            ranks: _,
            nodes_not_seen,
            nodes_late,
            recurrence,
            activity,
            scope,
            scope_evidence,
            pids,
            ranks_not_listed,
            collectives,
            container,
        } = self;
        Verdict {
            version: *version,
            kind: *kind,
            summary: summary.clone(),
            stalled_for_s: *stalled_for_s,
            culprits: culprits.clone(),
            groups: groups.clone(),
            filesystems: filesystems.clone(),
            actions: actions.clone(),
            observed_at_unix_s: *observed_at_unix_s,
            node: node.clone(),
            recommendations: recommendations.clone(),
            warnings: warnings.clone(),
            ranks: Vec::new(),
            nodes_not_seen: nodes_not_seen.clone(),
            nodes_late: nodes_late.clone(),
            recurrence: recurrence.clone(),
            activity: activity.clone(),
            scope: *scope,
            scope_evidence: scope_evidence.clone(),
            pids: *pids,
            ranks_not_listed: *ranks_not_listed,
            collectives: collectives.clone(),
            container: container.clone(),
        }
    }

    /// A verdict that says only that nothing could be seen (`kind: unknown`), with why.
    pub fn unknown(summary: impl Into<String>) -> Self {
        Self {
            version: 1,
            kind: VerdictKind::Unknown,
            summary: summary.into(),
            stalled_for_s: None,
            culprits: Vec::new(),
            groups: Vec::new(),
            filesystems: Vec::new(),
            actions: Vec::new(),
            observed_at_unix_s: None,
            node: None,
            recommendations: Vec::new(),
            warnings: Vec::new(),
            ranks: Vec::new(),
            nodes_not_seen: Vec::new(),
            nodes_late: Vec::new(),
            recurrence: None,
            activity: None,
            scope: None,
            scope_evidence: Vec::new(),
            pids: None,
            ranks_not_listed: 0,
            collectives: None,
            container: None,
        }
    }
}

/// A rank and where it is: the part that a culprit and a line of the roll call share (flattened into both, so
/// the JSON fields of SPEC.md "The verdict" stay where they were).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankPlace {
    pub rank: Option<u32>,
    /// Where `rank` came from (`env:RANK`, `env:SLURM_PROCID`, `client`, `structure`); absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_source: Option<crate::RankSource>,
    pub node: Option<String>,
    pub pid: i32,
    #[serde(default)]
    pub comm: Option<String>,
    /// Process state letter as `ps` shows it (R, S, D, T, t, Z, X, I).
    pub state: String,
    /// The meaningful frame (`barrier (torch/distributed/distributed_c10d.py)`), or the kernel wait when there is
    /// no Python stack.
    #[serde(rename = "where", default)]
    pub where_: String,
    pub wchan: Option<String>,
    /// The system call by name (`write`), or `null` when not in a system call.
    pub syscall: Option<String>,
    pub path: Option<String>,
    pub mount: Option<String>,
    pub fstype: Option<String>,
    /// Which filesystem `mount` is, and where the node has it when the rank runs in a container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<crate::FilesystemId>,
    /// The rank's pid in its own pid namespace, when that differs from `pid` (a container's `ps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<i32>,
    /// How long the telling thread had not run when observed (no context switch), in milliseconds.
    #[serde(default)]
    pub not_running_for_ms: Option<u64>,
    /// A tracer (py-spy, strace, gdb) attached to the rank.
    #[serde(default)]
    pub tracer_pid: Option<i32>,
    /// A SIGSTOP is pending: the rank will stop as soon as its system call returns.
    #[serde(default)]
    pub sigstop_pending: Option<bool>,
    pub python_stack: Option<Vec<String>>,
}

/// A rank that holds the others up: where it is, and why it was named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Culprit {
    #[serde(flatten)]
    pub at: RankPlace,
    /// The thread that is stuck (equal to `pid` for the main thread).
    #[serde(default)]
    pub tid: Option<i32>,
    /// Whether SIGKILL can end it now; `false` for an uninterruptible (D) wait.
    pub killable: Option<bool>,
    pub kernel_stack: Option<Vec<String>>,
    /// Why this rank was named, in words.
    #[serde(default)]
    pub reason: Option<String>,
    /// Set when the stuck process is one of the rank's workers rather than the rank itself: `pid`, `state`,
    /// `syscall`, `path`, `mount` and `fstype` are then the worker's, `rank` and `node` the rank's.
    #[serde(default)]
    pub worker: Option<WorkerRef>,
    /// How a rank that exited ended, as a shell reports it (128+N for signal N); `null` for a live rank.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// How a rank that died ended: signal, OOM kill, core dump, last lines; `null` for a live rank or when
    /// nothing was gathered.
    #[serde(default)]
    pub death: Option<crate::RankDeath>,
    /// The name of the stuck thread (`ckpt-writer`): its Python name, else its kernel name when it differs
    /// from the process's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_name: Option<String>,
    /// Set when the stuck thread is blocked in a page fault on a memory-mapped file (in no system call): which
    /// file, or which files it may be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_fault: Option<PageFault>,
    /// Set when the rank waits for a file lock: the lock and who holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_wait: Option<crate::LockWait>,
    /// Set when the rank waits in a socket call: the connection, what holds it up and the process at the other
    /// end when this node has it (docs/next-hops.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits_on_peer: Option<crate::PeerWait>,
    /// Every thread of the rank that is not idle in a known pool (a `ThreadPoolExecutor` worker waiting for work,
    /// a DataLoader's pin-memory thread, a `multiprocessing` pool's handlers, hangwatch's own), Python threads
    /// first, each with its name, state, kernel wait and innermost line of the job's own code; threads without a
    /// Python stack only where they are not asleep (in D, on a CPU, stopped). Empty for an exited rank, a worker,
    /// or a rank without Python stacks and nothing but sleeping threads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<ThreadPlace>,
    /// Set when every thread of the rank waits and two or more of them wait for a lock, a condition or another
    /// thread's end: a deadlock inside the rank is likely (`hangwatch_diagnosis::threads`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadlock: Option<InRankDeadlock>,
}

/// One thread of a culprit rank: where it is, in the kernel and in Python.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadPlace {
    /// Kernel thread id; `null` for a Python thread whose interpreter does not say it (Python < 3.11, not the main
    /// thread) or whose kernel thread was folded into `threads_folded`.
    pub tid: Option<i32>,
    /// Its Python name (`metrics-flusher`, `MainThread`), else its kernel name.
    pub name: Option<String>,
    /// State letter (`S`, `D`, `R`, `T`); `?` when its kernel thread was not seen.
    pub state: String,
    pub wchan: Option<String>,
    /// The system call it is in, by name (`futex`), or `null`.
    pub syscall: Option<String>,
    /// The innermost frame of the job's own code (neither the standard library nor an installed package):
    /// function, file (short, as in `where`) and line; `null` without a Python stack or own code on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<CodeLine>,
    /// What it waits for, when that is a lock, a condition or another thread (from its innermost Python frame and
    /// its futex wait); `null` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits_for: Option<ThreadWait>,
    /// For a thread waiting to acquire a lock: the thread that holds it, where it can be told.
    ///
    /// Found by elimination only: the one other thread of the rank that is listed here and not idle. Reading
    /// the owner itself is not done: CPython (3.9-3.13) keeps an `RLock`'s owner (`rlock_owner`, the owning
    /// thread's ident) in the lock object, but nothing outside the process knows that object's address. A
    /// thread blocked in `with lock:` or `lock.acquire()` holds the lock only on its interpreter's value stack
    /// (or as an attribute of `self`, or a module global) while it waits in C; py-spy, which reads the stacks
    /// without stopping the rank, reads frames' code, line and named locals, never the value stack, so the
    /// object is found only when it happens to be a named local, and even then reading `rlock_owner` means
    /// following a layout private to each CPython minor version. A plain `Lock` has no owner at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<ThreadRef>,
}

/// A line of Python code: `flush (train.py:54)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeLine {
    pub function: String,
    /// Short: the part after `site-packages/`, else the file name.
    pub file: String,
    pub line: i32,
}

impl std::fmt::Display for CodeLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// What a thread waits for, read from outside: its innermost Python frame and its kernel wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadWait {
    /// To acquire a `Lock` or `RLock` (`with lock:`, `lock.acquire()`): a futex wait in a C call made straight
    /// from the job's own code (a `Lock` cannot be told from an `RLock` from outside).
    Lock,
    /// In `Condition.wait` (and what is built on it: `Event.wait`, `Queue.get`/`put`, `Semaphore`, `Barrier`).
    Condition,
    /// In `Thread.join`: for another thread to end.
    Join,
}

impl ThreadWait {
    /// In words: "waits for a lock".
    pub fn words(self) -> &'static str {
        match self {
            ThreadWait::Lock => "waits for a lock",
            ThreadWait::Condition => "waits on a condition",
            ThreadWait::Join => "waits for a thread to end",
        }
    }
}

/// A thread named by another: its id and its name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadRef {
    pub tid: Option<i32>,
    pub name: Option<String>,
}

/// A deadlock inside one rank, likely: every thread of it waits, and two or more wait for a lock, a condition or
/// another thread's end, so nothing in the process is left to release them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InRankDeadlock {
    /// The threads that wait so (a subset of the culprit's `threads`), with their names and lines.
    pub threads: Vec<ThreadPlace>,
    /// In words: "two threads of rank 0 each wait for a lock: MainThread at train.py:71, metrics-flusher at
    /// train.py:54".
    pub words: String,
}

/// A thread blocked in a page fault on a memory-mapped file. `path`, `mount` and `fstype` of the culprit name the
/// file when it is known; with several candidates `path` is null and they are listed here (`mount` is named when
/// they share it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PageFault {
    /// Reading the mapping, or writing to it (a store into a shared file mapping).
    pub access: FaultAccess,
    /// How the file was found.
    pub found_by: FaultFound,
    /// The mapped files it may be faulting on (one when `found_by` names it).
    #[serde(default)]
    pub candidates: Vec<crate::FileRef>,
    /// The file is code: the program or a shared library (a fault loading it, not reading data).
    #[serde(default)]
    pub code: bool,
    /// Why the process's mappings could not be read, when they could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// Which way a page fault touches its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultAccess {
    Read,
    Write,
}

/// How the file of a page fault was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultFound {
    /// The faulting instruction lies in the file: a fault on code.
    InstructionPointer,
    /// The only file the process maps on the filesystem that the kernel stack names or that does not answer.
    OnlyMapping,
    /// Several files it maps there: `candidates`, one of which it is.
    Candidates,
    /// No file it maps is on such a filesystem, or its mappings could not be read.
    NotFound,
}

impl Culprit {
    /// A culprit at `at`, with nothing else known yet (fill the rest with struct update syntax).
    pub fn at(at: RankPlace) -> Self {
        Self {
            at,
            tid: None,
            killable: None,
            kernel_stack: None,
            reason: None,
            worker: None,
            exit_code: None,
            death: None,
            thread_name: None,
            page_fault: None,
            lock_wait: None,
            waits_on_peer: None,
            threads: Vec::new(),
            deadlock: None,
        }
    }
}

impl RankPlace {
    /// The mount as the node calls it: the node's own mount of the filesystem for a rank in a container (two
    /// containers binding it at `/data` and `/scratch` are both `/srv/shared`), else the rank's mount. What
    /// fingerprints and the fleet's "by mount" use.
    pub fn node_mount(&self) -> Option<&str> {
        self.filesystem
            .as_ref()
            .filter(|f| f.other_namespace)
            .and_then(|f| f.host_mount.as_deref())
            .or(self.mount.as_deref())
            .filter(|m| !m.trim().is_empty())
    }

    /// See [`crate::FileRef::filesystem_key`].
    pub fn filesystem_key(&self) -> Option<&str> {
        crate::filesystem_key(self.filesystem.as_ref(), self.mount.as_deref())
    }
}

// Reads of a culprit's place (`culprit.rank`, `culprit.state`) go straight to the shared part.
impl std::ops::Deref for Culprit {
    type Target = RankPlace;
    fn deref(&self) -> &RankPlace {
        &self.at
    }
}

/// Which worker of a rank a culprit entry is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRef {
    pub pid: i32,
    pub parent_pid: i32,
    /// The rank process it belongs to.
    pub rank_pid: i32,
    /// In words: "child of rank 3", "DataLoader worker, child of rank 3", "descendant of rank 3 (parent pid N)".
    pub role: String,
    pub comm: Option<String>,
}

/// One worker of a rank (a descendant process), as the roll call saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerReport {
    pub pid: i32,
    pub parent_pid: i32,
    pub comm: Option<String>,
    /// State letter, `X` when it exited during the roll call.
    pub state: String,
    #[serde(rename = "where")]
    pub where_: String,
    pub wchan: Option<String>,
    pub syscall: Option<String>,
    pub path: Option<String>,
    pub mount: Option<String>,
    pub fstype: Option<String>,
}

/// Ranks that are in the same place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// The meaningful frame, e.g. `barrier (torch/distributed/distributed_c10d.py)`, or the kernel wait when there
    /// is no Python stack.
    #[serde(rename = "where")]
    pub where_: String,
    pub state: String,
    pub ranks: Vec<u32>,
    /// The processes of the group (also those without a known rank). Empty in a verdict past the full table
    /// (`ranks_not_listed`) when every member has a rank number: pids repeat from node to node.
    #[serde(default)]
    pub pids: Vec<i32>,
    /// The nodes the group's ranks run on, sorted (a group may span nodes; each line of `ranks` in the verdict
    /// names its node).
    #[serde(default)]
    pub nodes: Vec<String>,
}

impl Group {
    /// How many processes the group holds (a large job's group of numbered ranks lists no pids).
    pub fn size(&self) -> usize {
        self.pids.len().max(self.ranks.len())
    }
}

/// Whether a filesystem a rank is blocked on answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FilesystemStatus {
    /// The mount point as the ranks see it (in a container: the container's path).
    pub mount: String,
    /// The node whose probe this is: the same mount can answer on one node and not on another.
    #[serde(default)]
    pub node: Option<String>,
    pub fstype: Option<String>,
    /// `null` when it was not probed.
    pub responsive: Option<bool>,
    /// What the probe saw, e.g. "write probe did not return within 1s".
    #[serde(default)]
    pub detail: Option<String>,
    /// Which filesystem it is, whatever path the ranks' container binds it at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<crate::FilesystemId>,
}

impl FilesystemStatus {
    /// See [`crate::FileRef::filesystem_key`].
    pub fn filesystem_key(&self) -> &str {
        crate::filesystem_key(self.filesystem.as_ref(), Some(&self.mount)).unwrap_or(&self.mount)
    }

    /// The mount in words: "/data (ext4)", or "/data in the container = /srv/shared on the host (ext4)".
    pub fn words(&self) -> String {
        let fstype = self.fstype.as_deref().unwrap_or("unknown type");
        match self
            .filesystem
            .as_ref()
            .and_then(crate::FilesystemId::host_words)
        {
            Some(host) => format!("{} in the container = {host} ({fstype})", self.mount),
            None => format!("{} ({fstype})", self.mount),
        }
    }
}

/// Something hangwatch did about the hang.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionRecord {
    pub action: String,
    pub ranks: Vec<u32>,
    pub ok: bool,
    #[serde(default)]
    pub detail: Option<String>,
    /// For a termination: what became of each process, one entry per process signalled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outcomes: Vec<ProcessOutcome>,
}

/// What a termination did to one process of the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessOutcome {
    pub pid: i32,
    /// Its rank, when it is one (a launcher is not).
    #[serde(default)]
    pub rank: Option<u32>,
    pub ended: Ended,
    /// For one that could not be killed: its state letter after SIGKILL (`D`; `Z` when its main thread exited
    /// and another thread is stuck).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<char>,
    /// For one that could not be killed: the thread that holds it (its id, name and state), when it is not the
    /// main thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stuck_thread: Option<StuckThread>,
}

/// How a process of the job ended when it was terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ended {
    BySigterm,
    BySigkill,
    /// Still there after SIGKILL and the wait: blocked in the kernel.
    Unkillable,
}

/// A thread that keeps a process from ending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StuckThread {
    pub tid: i32,
    #[serde(default)]
    pub name: Option<String>,
    pub state: char,
}

/// One line of the roll call: a rank process and where its most telling thread is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankReport {
    #[serde(flatten)]
    pub at: RankPlace,
    pub cpu_ms_during_sample: Option<u64>,
    /// Every thread, as observed (less `threads_folded`).
    #[serde(default)]
    pub threads: Vec<crate::ThreadObservation>,
    /// Threads not listed in `threads` because each waited just like a listed one (a coordinator's verdict: the
    /// node's answer folded them; the node's own bundle lists them all).
    #[serde(default, skip_serializing_if = "crate::is_zero")]
    pub threads_folded: u32,
    /// The rank's worker processes (its descendants), by the cheap /proc reads only.
    #[serde(default)]
    pub workers: Vec<WorkerReport>,
}

// Reads of a line's place (`report.rank`, `report.where_`) go straight to the shared part.
impl std::ops::Deref for RankReport {
    type Target = RankPlace;
    fn deref(&self) -> &RankPlace {
        &self.at
    }
}
