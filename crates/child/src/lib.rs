//! Throwaway child processes with a deadline: the way hangwatch runs any call that may block in the kernel.
//!
//! A thread of ours stuck in D state would keep hangwatch from exiting (exit waits for every thread), so reads of a
//! rank's memory, probes of a watched filesystem and external programs run in a child process. The parent polls the
//! child's pipes under a deadline and, when the deadline passes, sends SIGKILL and *abandons* the child: it never
//! waits for it. A child in D state dies when its call returns; until then it is a harmless orphan, reaped later.

pub mod abandon;
pub mod deadline;
pub mod exe;

pub use abandon::{orphans_pending, reap_within, AbandonedChild};
pub use deadline::{
    input_from_bytes, run_with_deadline, run_with_deadline_and_input, ChildError, ChildOutcome,
};
pub use exe::{
    detach_from_binary_filesystem, external_command, judge_binary_filesystem_with, self_exe,
    start_external_programs_through_hangwatch,
};
