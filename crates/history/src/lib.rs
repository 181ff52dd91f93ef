//! The verdict history of a node: every verdict recorded with its fingerprint in an embedded SQLite database, and
//! how often each cause recurred, where and when (`hangwatch history`, and "seen N times before" in a verdict).
//!
//! See docs/history.md.

pub mod db;
pub mod fingerprint;
pub mod request;
pub mod table;

pub use db::{
    CauseSummary, HistoryDb, HistoryEntry, HistoryError, NewEntry, PendingVerdict, Query, Recorded,
    BUSY_TIMEOUT, SCHEMA_VERSION,
};
pub use fingerprint::{
    is_bare_wait, is_placeless_key, normalize_mount, record_key, Fingerprint, PLACELESS_KEY_PREFIX,
};
pub use hangwatch_model::{utc_time, Recurrence, RecurrenceSource};
pub use request::{record_child_main, FleetTarget, HistoryRequest};

/// The database's file name in the state directory.
pub const DB_FILE_NAME: &str = "history.sqlite";
