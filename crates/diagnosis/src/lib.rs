//! Pure decisions of hangwatch: observations in, decisions out, no clock and no I/O.
//!
//! - [`position`]: where each rank is (its most telling thread, the meaningful Python frame, its condition).
//! - [`rollcall`]: from the observations of every node, grouping ranks by position, naming the outliers, and the
//!   one verdict.
//! - [`death`]: why a rank died (signal, OOM kill, core dump, exception), from the facts gathered at its death.
//! - [`acting`]: when a verdict is strong enough to act on.
//! - [`answer`]: what a node's roll-call answer to the coordinator carries (idle threads folded).
//! - [`activity`](mod@activity): whether a job without progress still works, and how long that holds the hard tier back.
//! - [`collectives`]: who did not join which collective, from every rank's Flight Recorder record.
//! - [`faults`]: a rank blocked in a page fault: the memory-mapped file it reads, or the candidates.
//! - [`fs_stall`]: the fast path for a rank stuck on a filesystem (or stopped) while the job stalls.
//! - [`ranks`]: who is a rank in a launcher's tree, and which processes are its workers.
//! - [`threads`]: a culprit rank's threads (name, state, kernel wait, own line) and a deadlock inside it.
//! - [`sockets`]: whom a rank waiting on a socket waits for: the process at the other end, or the connection.
//! - [`scope`]: what a fault belongs to (the filesystem, the node, the program), and why.
//! - [`requeue`]: after a hung attempt under `--action requeue`: nodes to keep out, the restart budget.
//! - [`work`]: whose CPU time is the job's work (a waiting rank's background threads are not).

pub mod acting;
pub mod activity;
pub mod answer;
pub mod collectives;
pub mod death;
pub mod detector;
pub mod faults;
pub mod fs_stall;
pub mod position;
pub mod ranks;
pub mod requeue;
pub mod rollcall;
pub mod scope;
pub mod sockets;
pub mod threads;
pub mod work;

pub use acting::{
    acts_on, is_conclusive, is_conclusive_for_job, is_confirmed_stuck, Ladder, OnHang, Rung,
};
pub use activity::{
    activity, ActivityHold, ActivityRule, AfterLook, HoldCheck, HoldDecision, HoldNotice, Look,
};
pub use detector::{
    Detector, DetectorConfig, ProgressBatch, ProgressSource, StallState, Threshold,
};
pub use faults::{in_page_fault, wants_mappings, Fault};
pub use fs_stall::{fast_path_due, thread_blocked, Blocked, FsStallTracker, RankSample, Stuck};
pub use position::{classify, waits_on_frozen_superblock, Condition, FrozenMount, Position};
pub use ranks::{
    find_ranks, find_ranks_on_node, EnvFact, ProcFacts, RankClaim, RankMap, RankSource, TreeNode,
};
pub use rollcall::{
    decide, mounts_to_probe, mounts_to_probe_as_seen, roll_call, superblock_waiter, DecideOptions,
    MountToProbe, RollCallInput,
};
pub use scope::{apply_scope, scope_of};
pub use work::{CpuWork, ThreadCpu, Work};
