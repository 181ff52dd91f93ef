//! The fleet database: every node's verdicts in PostgreSQL, so that a hang can be recognized when it happened
//! before on *other* nodes, and so that jobs blocked on one mount at about the same time read as one storage
//! incident. The node-local SQLite history (`hangwatch_history`) stays the first place every verdict is written,
//! and the buffer while the fleet database does not answer.
//!
//! See docs/history.md, "The fleet database".

pub mod credentials;
pub mod db;
pub mod incident;
pub mod record;
pub mod table;
pub mod target;
pub mod tls;

use std::time::Duration;

pub use credentials::{client_config, describe, Environment, ProcessEnv};
pub use db::{
    ship_key, ConnectError, FleetCause, FleetDb, FleetEntry, FleetMount, FleetQuery, QueryError,
    ShipError, SCHEMA_VERSION,
};
pub use hangwatch_history::FleetTarget;
pub use record::{record_child_main, ship_backlog, ship_child_main, ShipReport};
pub use target::{
    check_password_file, resolve, TargetError, TlsPolicy, UrlSources, DEFAULT_DEADLINE_S,
    DEFAULT_INCIDENT_WINDOW_S, URL_ENV,
};

/// Runs `f` on its own thread and waits for it at most `deadline`: `None` when it did not finish. A network
/// call to a database that accepts and never answers cannot be cancelled from outside; its thread is left
/// behind, which is harmless in the short-lived processes that use this (the recording child, `history`).
pub fn within<T: Send + 'static>(
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("hw-fleet".into())
        .spawn(move || {
            let _ = tx.send(f());
        });
    match spawned {
        Ok(_) => rx.recv_timeout(deadline).ok(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start a thread for the fleet database");
            None
        }
    }
}
