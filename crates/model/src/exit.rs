//! hangwatch's exit codes (SPEC.md, docs/run.md): the one place for every crate that ends a process with one or
//! reads how one ended.

/// Usage or configuration error.
pub const EXIT_USAGE: i32 = 2;
/// hangwatch's own failure.
pub const EXIT_FAILURE: i32 = 1;
/// hangwatch ended a hung job (EX_TEMPFAIL: retry it).
pub const EXIT_HUNG: i32 = 75;
/// `--action requeue` gave up: the job hung again without progress after its restart budget.
pub const EXIT_BUDGET_SPENT: i32 = 76;
/// An attempt gave up waiting for the storage that hung the one before (`--storage-wait`).
pub const EXIT_STORAGE_GAVE_UP: i32 = 77;

/// An error in what the user asked for (a flag, a file, a value): the process ends with [`EXIT_USAGE`] and the
/// message, which names what was wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);
