//! The history database: one SQLite file per user and node, its schema and migrations, recording a verdict and
//! answering "seen before?", listing past verdicts.
//!
//! Journal mode: the default rollback journal, not WAL. Writes are rare (one row per hang) and short, readers
//! (`hangwatch history`) brief, so WAL's readers-during-a-write buys nothing here, while it adds two files that
//! live as long as a connection (`-wal`, `-shm`) and a shared-memory map. Concurrent writers (several `run`s on one
//! node) are serialized by SQLite's file lock; each waits up to [`BUSY_TIMEOUT`], and a recording takes the write
//! lock up front (`BEGIN IMMEDIATE`) so that its "seen before" count and its insert are one step.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hangwatch_model::{Verdict, VerdictKind};
use hangwatch_safefs::{PrivateDir, SafeFsError};
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};
use serde::Serialize;

use crate::fingerprint::{is_placeless_key, record_key, Fingerprint};
use hangwatch_model::{utc_time, Recurrence};

/// How long a recording or a listing waits for another process's write to finish.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema, one entry per version: entry N takes a database from `user_version` N to N+1. Append only.
const MIGRATIONS: &[&str] = &[
    // 1: verdicts and the nodes their culprits were on.
    "CREATE TABLE verdicts (
        id INTEGER PRIMARY KEY,
        at_unix_s REAL NOT NULL,
        fingerprint TEXT NOT NULL,
        kind TEXT NOT NULL,
        syscall TEXT,
        fstype TEXT,
        mount TEXT,
        kernel_wait TEXT,
        python_frame TEXT,
        summary TEXT NOT NULL,
        node TEXT NOT NULL,
        job_id TEXT,
        bundle TEXT,
        stalled_for_s REAL
    );
    CREATE INDEX verdicts_by_fingerprint ON verdicts (fingerprint, at_unix_s);
    CREATE INDEX verdicts_by_time ON verdicts (at_unix_s);
    CREATE TABLE culprit_nodes (
        verdict_id INTEGER NOT NULL REFERENCES verdicts (id) ON DELETE CASCADE,
        pos INTEGER NOT NULL,
        node TEXT NOT NULL,
        PRIMARY KEY (verdict_id, pos)
    );
    CREATE INDEX culprit_nodes_by_node ON culprit_nodes (node);",
    // 2: the fleet database (crates/fleet): the culprit's mount as it was (an incident is one filesystem, not a
    // normalized cause), and whether the row reached the fleet database. Rows from before wait to be shipped
    // too: a fleet database set later learns the node's past.
    "ALTER TABLE verdicts ADD COLUMN mount_point TEXT;
    ALTER TABLE verdicts ADD COLUMN mount_source TEXT;
    ALTER TABLE verdicts ADD COLUMN shipped INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX verdicts_unshipped ON verdicts (id) WHERE shipped = 0;",
    // 3: the culprit's filesystem identity (`FilesystemId::key`): two containers that bind one filesystem at
    // different paths are one incident.
    "ALTER TABLE verdicts ADD COLUMN filesystem TEXT;",
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// What went wrong with the history database; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("cannot use {dir} for the history database")]
    Dir {
        dir: PathBuf,
        #[source]
        source: SafeFsError,
    },
    #[error("cannot create the history database {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: SafeFsError,
    },
    #[error("{path} is not a path to a database file")]
    BadPath { path: PathBuf },
    #[error("cannot open the history database {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{path} is not a hangwatch history database (move it away: a new one is created at the next verdict)")]
    NotADatabase {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the history database {path} has schema version {found}, newer than this hangwatch knows ({known}): use the newer hangwatch that wrote it, or set HANGWATCH_STATE_DIR to another directory")]
    NewerSchema {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("cannot update the schema of the history database {path} to version {version}")]
    Migrate {
        path: PathBuf,
        version: i64,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot {what} the history database {path}")]
    Query {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: rusqlite::Error,
    },
}

/// One verdict to record.
pub struct NewEntry<'a> {
    pub verdict: &'a Verdict,
    pub fingerprint: Fingerprint,
    /// The node that records it (its hostname); the culprits' nodes come from the verdict.
    pub node: String,
    pub job_id: Option<String>,
    /// The evidence bundle's directory.
    pub bundle: Option<PathBuf>,
    pub at_unix_s: f64,
}

/// A recorded verdict as the fleet database takes it (`hangwatch_fleet`): every column of its row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingVerdict {
    /// The row's id in this node's database.
    pub id: i64,
    pub at_unix_s: f64,
    pub fingerprint: String,
    pub fields: Fingerprint,
    /// The first culprit's mount point as it was (not normalized); for a rank in a container, the node's mount
    /// of that filesystem when the node has one.
    pub mount_point: Option<String>,
    /// Its source (device, server:/export), when recorded.
    pub mount_source: Option<String>,
    /// Its filesystem identity (`FilesystemId::key`), when recorded: what incidents are matched by.
    #[serde(default)]
    pub filesystem: Option<String>,
    pub summary: String,
    pub node: String,
    pub culprit_nodes: Vec<String>,
    pub job_id: Option<String>,
    pub bundle: Option<PathBuf>,
    pub stalled_for_s: Option<f64>,
}

/// What [`HistoryDb::record_entry`] stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// The new row's id.
    pub id: i64,
    /// How often its cause was recorded before, on this node.
    pub recurrence: Recurrence,
}

/// Which verdicts to list.
#[derive(Debug, Clone, Copy, Default)]
pub struct Query {
    /// Only verdicts recorded at or after this time.
    pub since_unix_s: Option<f64>,
    /// At most this many rows (newest first); `None` for all.
    pub limit: Option<usize>,
}

/// One recorded verdict, with how often its cause was recorded in all.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryEntry {
    pub id: i64,
    pub at_unix_s: f64,
    /// `at_unix_s` for people (UTC).
    pub at: String,
    pub kind: VerdictKind,
    pub summary: String,
    /// The fingerprint's key, and the cause in words.
    pub fingerprint: String,
    pub cause: String,
    pub fields: Fingerprint,
    /// The node that recorded it.
    pub node: String,
    pub culprit_nodes: Vec<String>,
    pub job_id: Option<String>,
    pub bundle: Option<PathBuf>,
    pub stalled_for_s: Option<f64>,
    /// Verdicts with this fingerprint in the whole history (this one included).
    pub count: u64,
}

/// One cause and its verdicts (`history --by-cause`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CauseSummary {
    pub fingerprint: String,
    pub cause: String,
    pub fields: Fingerprint,
    pub count: u64,
    /// Every node a culprit of this cause was on, sorted.
    pub nodes: Vec<String>,
    pub first_at_unix_s: f64,
    pub last_at_unix_s: f64,
}

/// The open history database.
pub struct HistoryDb {
    conn: Connection,
    path: PathBuf,
}

impl HistoryDb {
    /// Opens the database at `path`, creating its directory (0700) and the file (0600) when missing, and brings
    /// its schema up to [`SCHEMA_VERSION`]. A file written by a newer hangwatch is refused, never rewritten.
    pub fn open(path: &Path) -> Result<HistoryDb, HistoryError> {
        let bad_path = || HistoryError::BadPath {
            path: path.to_path_buf(),
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(bad_path)?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = PrivateDir::open_or_create(parent).map_err(|source| HistoryError::Dir {
            dir: parent.to_path_buf(),
            source,
        })?;
        // Created here, 0600 and never through a planted symlink; SQLite then opens what is there.
        dir.append(name).map_err(|source| HistoryError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        HistoryDb::open_existing(path)
    }

    /// Opens the database file at `path`, which must exist (`hangwatch history` reads it: nothing is created, no
    /// directory's mode is changed), and brings its schema up to [`SCHEMA_VERSION`].
    pub fn open_existing(path: &Path) -> Result<HistoryDb, HistoryError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_NOFOLLOW;
        let conn =
            Connection::open_with_flags(path, flags).map_err(|source| HistoryError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|source| HistoryError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        let mut db = HistoryDb {
            conn,
            path: path.to_path_buf(),
        };
        db.migrate()?;
        Ok(db)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version of the file (after [`HistoryDb::open`]: [`SCHEMA_VERSION`]).
    pub fn schema_version(&self) -> Result<i64, HistoryError> {
        user_version(&self.conn).map_err(|e| self.classify(e, "read"))
    }

    fn migrate(&mut self) -> Result<(), HistoryError> {
        let found = self.schema_version()?;
        self.check_not_newer(found)?;
        if found == SCHEMA_VERSION {
            return Ok(());
        }
        let path = self.path.clone();
        let migrate_err = |version| {
            let path = path.clone();
            move |source| HistoryError::Migrate {
                path,
                version,
                source,
            }
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(migrate_err(found + 1))?;
        // Another process may have migrated while this one waited for the lock.
        let found = user_version(&tx).map_err(migrate_err(found + 1))?;
        if found > SCHEMA_VERSION {
            return Err(HistoryError::NewerSchema {
                path: path.clone(),
                found,
                known: SCHEMA_VERSION,
            });
        }
        for (from, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
            let version = from as i64 + 1;
            tx.execute_batch(sql).map_err(migrate_err(version))?;
            tx.pragma_update(None, "user_version", version)
                .map_err(migrate_err(version))?;
        }
        tx.commit().map_err(migrate_err(SCHEMA_VERSION))?;
        tracing::info!(path = %path.display(), from = found, to = SCHEMA_VERSION, "history database schema updated");
        Ok(())
    }

    fn check_not_newer(&self, found: i64) -> Result<(), HistoryError> {
        if found > SCHEMA_VERSION {
            return Err(HistoryError::NewerSchema {
                path: self.path.clone(),
                found,
                known: SCHEMA_VERSION,
            });
        }
        Ok(())
    }

    /// A file that is not SQLite shows as such at the first statement: said so, with what to do.
    fn classify(&self, source: rusqlite::Error, what: &'static str) -> HistoryError {
        let path = self.path.clone();
        match source.sqlite_error_code() {
            Some(ErrorCode::NotADatabase) => HistoryError::NotADatabase { path, source },
            _ => HistoryError::Query { path, what, source },
        }
    }

    /// Stores one verdict and says how often its cause was recorded before it.
    pub fn record(&mut self, entry: &NewEntry<'_>) -> Result<Recurrence, HistoryError> {
        self.record_entry(entry).map(|r| r.recurrence)
    }

    /// [`HistoryDb::record`], with the new row's id. The row waits to be shipped to the fleet database
    /// ([`HistoryDb::pending`]).
    pub fn record_entry(&mut self, entry: &NewEntry<'_>) -> Result<Recorded, HistoryError> {
        let key = record_key(
            entry.verdict,
            &entry.node,
            entry.job_id.as_deref(),
            entry.bundle.as_deref(),
            entry.at_unix_s,
        );
        let placeless = is_placeless_key(&key);
        let culprit_nodes = culprit_nodes(entry);
        let path = self.path.clone();
        let err = |source| HistoryError::Query {
            path: path.clone(),
            what: "record a verdict in",
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let (seen_before, first, last_id): (i64, Option<f64>, Option<i64>) = tx
            .query_row(
                "SELECT COUNT(*), MIN(at_unix_s),
                    (SELECT id FROM verdicts WHERE fingerprint = ?1 ORDER BY at_unix_s DESC, id DESC LIMIT 1)
                 FROM verdicts WHERE fingerprint = ?1",
                [&key],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .map_err(err)?;
        let (last_at_unix_s, last_nodes) = match last_id {
            Some(id) => {
                let at: Option<f64> = tx
                    .query_row("SELECT at_unix_s FROM verdicts WHERE id = ?1", [id], |r| {
                        r.get(0)
                    })
                    .optional()
                    .map_err(err)?;
                (at, nodes_of(&tx, id).map_err(err)?)
            }
            None => (None, Vec::new()),
        };
        let fp = &entry.fingerprint;
        let culprit = entry.verdict.culprits.first();
        tx.execute(
            "INSERT INTO verdicts (at_unix_s, fingerprint, kind, syscall, fstype, mount, kernel_wait, python_frame,
                summary, node, job_id, bundle, stalled_for_s, mount_point, mount_source, filesystem)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            params![
                entry.at_unix_s,
                key,
                fp.kind.as_str(),
                fp.syscall,
                fp.fstype,
                fp.mount,
                fp.kernel_wait,
                fp.python_frame,
                entry.verdict.summary,
                entry.node,
                entry.job_id,
                entry.bundle.as_ref().map(|b| b.to_string_lossy().into_owned()),
                entry.verdict.stalled_for_s,
                culprit.and_then(|c| c.node_mount()),
                culprit
                    .and_then(|c| c.filesystem.as_ref())
                    .map(|f| f.source.as_str()),
                culprit
                    .and_then(|c| c.filesystem.as_ref())
                    .map(|f| f.key.as_str()),
            ],
        )
        .map_err(err)?;
        let id = tx.last_insert_rowid();
        for (pos, node) in culprit_nodes.iter().enumerate() {
            tx.execute(
                "INSERT INTO culprit_nodes (verdict_id, pos, node) VALUES (?1, ?2, ?3)",
                params![id, pos as i64, node],
            )
            .map_err(err)?;
        }
        tx.commit().map_err(err)?;
        let recurrence = Recurrence {
            fingerprint: key,
            seen_before: seen_before.max(0) as u64,
            last_nodes,
            last_at_unix_s,
            first_at_unix_s: first,
            node: Some(entry.node.clone()),
            at_unix_s: Some(entry.at_unix_s),
            mount: entry.fingerprint.mount.clone(),
            placeless,
            ..Recurrence::default()
        };
        Ok(Recorded { id, recurrence })
    }

    /// Verdicts not yet in the fleet database, oldest first, at most `limit`.
    pub fn pending(&self, limit: usize) -> Result<Vec<PendingVerdict>, HistoryError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.for_shipping("shipped = 0 ORDER BY id LIMIT ?1", limit)
    }

    /// The row `id` as the fleet database takes it, shipped or not.
    pub fn for_shipping_by_id(&self, id: i64) -> Result<Option<PendingVerdict>, HistoryError> {
        self.for_shipping("id = ?1", id)
            .map(|rows| rows.into_iter().next())
    }

    fn for_shipping(
        &self,
        condition: &str,
        param: i64,
    ) -> Result<Vec<PendingVerdict>, HistoryError> {
        let run = || -> rusqlite::Result<Vec<PendingVerdict>> {
            let mut stmt = self.conn.prepare(&format!(
                "SELECT id, at_unix_s, fingerprint, kind, syscall, fstype, mount, kernel_wait, python_frame,
                    mount_point, mount_source, summary, node, job_id, bundle, stalled_for_s, filesystem
                 FROM verdicts WHERE {condition}"
            ))?;
            let rows = stmt.query_map([param], |row| {
                let fields = Fingerprint {
                    kind: kind_from(row.get::<_, String>(3)?),
                    syscall: row.get(4)?,
                    fstype: row.get(5)?,
                    mount: row.get(6)?,
                    kernel_wait: row.get(7)?,
                    python_frame: row.get(8)?,
                    collective: None,
                };
                Ok(PendingVerdict {
                    id: row.get(0)?,
                    at_unix_s: row.get(1)?,
                    fingerprint: row.get(2)?,
                    fields,
                    mount_point: row.get(9)?,
                    mount_source: row.get(10)?,
                    summary: row.get(11)?,
                    node: row.get(12)?,
                    culprit_nodes: Vec::new(),
                    job_id: row.get(13)?,
                    bundle: row.get::<_, Option<String>>(14)?.map(PathBuf::from),
                    stalled_for_s: row.get(15)?,
                    filesystem: row.get(16)?,
                })
            })?;
            let mut pending = rows.collect::<rusqlite::Result<Vec<_>>>()?;
            for verdict in &mut pending {
                verdict.culprit_nodes = nodes_of(&self.conn, verdict.id)?;
            }
            Ok(pending)
        };
        run().map_err(|e| self.classify(e, "read"))
    }

    /// How many verdicts wait to be shipped to the fleet database.
    pub fn pending_count(&self) -> Result<u64, HistoryError> {
        self.conn
            .query_row("SELECT COUNT(*) FROM verdicts WHERE shipped = 0", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n.max(0) as u64)
            .map_err(|e| self.classify(e, "read"))
    }

    /// Marks these rows as in the fleet database.
    pub fn mark_shipped(&mut self, ids: &[i64]) -> Result<(), HistoryError> {
        let path = self.path.clone();
        let err = |source| HistoryError::Query {
            path: path.clone(),
            what: "mark shipped verdicts in",
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        {
            let mut stmt = tx
                .prepare_cached("UPDATE verdicts SET shipped = 1 WHERE id = ?1")
                .map_err(err)?;
            for id in ids {
                stmt.execute([id]).map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    /// Recorded verdicts, newest first, each with the count of its fingerprint.
    pub fn list(&self, query: &Query) -> Result<Vec<HistoryEntry>, HistoryError> {
        let run = || -> rusqlite::Result<Vec<HistoryEntry>> {
            let mut stmt = self.conn.prepare(
                "SELECT v.id, v.at_unix_s, v.kind, v.summary, v.fingerprint, v.syscall, v.fstype, v.mount,
                    v.kernel_wait, v.python_frame, v.node, v.job_id, v.bundle, v.stalled_for_s,
                    (SELECT COUNT(*) FROM verdicts w WHERE w.fingerprint = v.fingerprint)
                 FROM verdicts v
                 WHERE ?1 IS NULL OR v.at_unix_s >= ?1
                 ORDER BY v.at_unix_s DESC, v.id DESC
                 LIMIT ?2",
            )?;
            let rows = stmt.query_map(params![query.since_unix_s, sql_limit(query)], |row| {
                let fields = Fingerprint {
                    kind: kind_from(row.get::<_, String>(2)?),
                    syscall: row.get(5)?,
                    fstype: row.get(6)?,
                    mount: row.get(7)?,
                    kernel_wait: row.get(8)?,
                    python_frame: row.get(9)?,
                    collective: None,
                };
                let at_unix_s: f64 = row.get(1)?;
                Ok(HistoryEntry {
                    id: row.get(0)?,
                    at_unix_s,
                    at: utc_time(at_unix_s),
                    kind: fields.kind,
                    summary: row.get(3)?,
                    fingerprint: row.get(4)?,
                    cause: fields.describe(),
                    fields,
                    node: row.get(10)?,
                    culprit_nodes: Vec::new(),
                    job_id: row.get(11)?,
                    bundle: row.get::<_, Option<String>>(12)?.map(PathBuf::from),
                    stalled_for_s: row.get(13)?,
                    count: row.get::<_, i64>(14)?.max(0) as u64,
                })
            })?;
            let mut entries = rows.collect::<rusqlite::Result<Vec<_>>>()?;
            for entry in &mut entries {
                entry.culprit_nodes = nodes_of(&self.conn, entry.id)?;
            }
            Ok(entries)
        };
        run().map_err(|e| self.classify(e, "read"))
    }

    /// One row per cause, the most recently seen first.
    pub fn by_fingerprint(&self, query: &Query) -> Result<Vec<CauseSummary>, HistoryError> {
        let run = || -> rusqlite::Result<Vec<CauseSummary>> {
            let mut stmt = self.conn.prepare(
                "SELECT fingerprint, kind, syscall, fstype, mount, kernel_wait, python_frame,
                    COUNT(*), MIN(at_unix_s), MAX(at_unix_s)
                 FROM verdicts
                 WHERE ?1 IS NULL OR at_unix_s >= ?1
                 GROUP BY fingerprint
                 ORDER BY MAX(at_unix_s) DESC
                 LIMIT ?2",
            )?;
            let rows = stmt.query_map(params![query.since_unix_s, sql_limit(query)], |row| {
                let fields = Fingerprint {
                    kind: kind_from(row.get::<_, String>(1)?),
                    syscall: row.get(2)?,
                    fstype: row.get(3)?,
                    mount: row.get(4)?,
                    kernel_wait: row.get(5)?,
                    python_frame: row.get(6)?,
                    collective: None,
                };
                Ok(CauseSummary {
                    fingerprint: row.get(0)?,
                    cause: fields.describe(),
                    fields,
                    count: row.get::<_, i64>(7)?.max(0) as u64,
                    nodes: Vec::new(),
                    first_at_unix_s: row.get(8)?,
                    last_at_unix_s: row.get(9)?,
                })
            })?;
            let mut causes = rows.collect::<rusqlite::Result<Vec<_>>>()?;
            let mut nodes = self.conn.prepare(
                "SELECT DISTINCT c.node FROM culprit_nodes c JOIN verdicts v ON v.id = c.verdict_id
                 WHERE v.fingerprint = ?1 AND (?2 IS NULL OR v.at_unix_s >= ?2)
                 ORDER BY c.node",
            )?;
            for cause in &mut causes {
                cause.nodes = nodes
                    .query_map(params![cause.fingerprint, query.since_unix_s], |r| r.get(0))?
                    .collect::<rusqlite::Result<Vec<String>>>()?;
            }
            Ok(causes)
        };
        run().map_err(|e| self.classify(e, "read"))
    }
}

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

/// SQLite reads a negative LIMIT as "no limit".
fn sql_limit(query: &Query) -> i64 {
    query
        .limit
        .map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX))
}

fn kind_from(name: String) -> VerdictKind {
    VerdictKind::from_name(&name).unwrap_or_else(|| {
        tracing::warn!(kind = %name, "unknown verdict kind in the history database: shown as unknown");
        VerdictKind::Unknown
    })
}

fn nodes_of(conn: &Connection, id: i64) -> rusqlite::Result<Vec<String>> {
    let mut stmt =
        conn.prepare_cached("SELECT node FROM culprit_nodes WHERE verdict_id = ?1 ORDER BY pos")?;
    let nodes = stmt
        .query_map([id], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>();
    nodes
}

/// The culprits' nodes in the verdict's order, each once; without any, the verdict's own node, else the node
/// that records it (a single-node run names no node on its culprits).
fn culprit_nodes(entry: &NewEntry<'_>) -> Vec<String> {
    let mut nodes: Vec<String> = Vec::new();
    for node in entry
        .verdict
        .culprits
        .iter()
        .filter_map(|c| c.node.as_ref())
    {
        if !nodes.contains(node) {
            nodes.push(node.clone());
        }
    }
    if nodes.is_empty() && !entry.verdict.culprits.is_empty() {
        nodes.push(
            entry
                .verdict
                .node
                .clone()
                .unwrap_or_else(|| entry.node.clone()),
        );
    }
    nodes
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn fixture(name: &str) -> Verdict {
        let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("a verdict")
    }

    fn entry<'a>(verdict: &'a Verdict, node: &str, at: f64) -> NewEntry<'a> {
        NewEntry {
            verdict,
            fingerprint: Fingerprint::of(verdict),
            node: node.to_string(),
            job_id: Some("4242".into()),
            bundle: Some(PathBuf::from("/var/tmp/hangwatch-0/run-x")),
            at_unix_s: at,
        }
    }

    /// 2026-11-30 08:10:00 UTC
    const T0: f64 = 1_796_026_200.0;

    #[test]
    fn the_second_verdict_with_the_same_cause_is_a_recurrence() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = HistoryDb::open(&dir.path().join("state/history.sqlite")).unwrap();
        let (a, b) = (
            fixture("blocked-write-n1.json"),
            fixture("blocked-write-n2.json"),
        );
        let first = db.record(&entry(&a, "n1", T0)).unwrap();
        assert_eq!(first.seen_before, 0);
        assert_eq!(
            first.sentence(),
            "first time this cause is seen on this machine"
        );
        let second = db.record(&entry(&b, "n2", T0 + 3600.0)).unwrap();
        assert_eq!(second.seen_before, 1);
        assert_eq!(second.last_nodes, ["n1"]);
        assert_eq!(second.fingerprint, first.fingerprint);
        assert_eq!(
            second.sentence(),
            "seen 1 time before, on node n1 on 2026-11-30 08:10:00 UTC"
        );
        let third = db.record(&entry(&a, "n1", T0 + 7200.0)).unwrap();
        assert_eq!(
            third.sentence(),
            "seen 2 times before (first 2026-11-30 08:10:00 UTC), last on node n2 on 2026-11-30 09:10:00 UTC"
        );
        let other = db
            .record(&entry(
                &fixture("diverged-load-batch.json"),
                "n1",
                T0 + 7300.0,
            ))
            .unwrap();
        assert_eq!(other.seen_before, 0);
    }

    #[test]
    fn unrelated_futex_only_hangs_are_not_a_recurrence() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = HistoryDb::open(&dir.path().join("h.sqlite")).unwrap();
        let (podman, trainer) = (
            fixture("podman-client-futex.json"),
            fixture("native-trainer-futex.json"),
        );
        let first = db.record(&entry(&trainer, "n1", T0)).unwrap();
        let second = db.record(&entry(&podman, "n1", T0 + 60.0)).unwrap();
        let again = db.record(&entry(&podman, "n1", T0 + 120.0)).unwrap();
        for r in [&first, &second, &again] {
            assert_eq!(r.seen_before, 0, "{r:?}");
            assert!(r.placeless, "{r:?}");
            assert_eq!(r.news(), None);
            assert!(r.sentence().starts_with("not compared"), "{}", r.sentence());
        }
        assert_ne!(second.fingerprint, again.fingerprint);
        let listed = db.list(&Query::default()).unwrap();
        assert_eq!(
            listed.iter().map(|e| e.count).collect::<Vec<_>>(),
            [1, 1, 1]
        );
        assert_eq!(listed[0].cause, "futex(), waiting in futex_do_wait");
        assert_eq!(db.by_fingerprint(&Query::default()).unwrap().len(), 3);
        // A hang with a place is still compared, and not with these.
        let frozen = db
            .record(&entry(&fixture("blocked-write-n1.json"), "n1", T0 + 180.0))
            .unwrap();
        assert_eq!(frozen.seen_before, 0);
        assert!(!frozen.placeless);
    }

    #[test]
    fn old_rows_keep_their_keys_a_placed_cause_still_matches_a_placeless_one_never_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let mut db = HistoryDb::open(&path).unwrap();
        // Rows as an earlier hangwatch wrote them: every verdict under the key of its fields.
        let (frozen, podman) = (
            fixture("blocked-write-n1.json"),
            fixture("podman-client-futex.json"),
        );
        for (verdict, at) in [(&frozen, T0), (&podman, T0 + 1.0)] {
            db.conn
                .execute(
                    "INSERT INTO verdicts (at_unix_s, fingerprint, kind, syscall, summary, node)
                     VALUES (?1, ?2, ?3, ?4, ?5, 'n1')",
                    params![
                        at,
                        Fingerprint::of(verdict).key(),
                        verdict.kind.as_str(),
                        Fingerprint::of(verdict).syscall,
                        verdict.summary
                    ],
                )
                .unwrap();
        }
        assert_eq!(
            db.record(&entry(&frozen, "n2", T0 + 10.0))
                .unwrap()
                .seen_before,
            1
        );
        assert_eq!(
            db.record(&entry(&podman, "n2", T0 + 20.0))
                .unwrap()
                .seen_before,
            0
        );
    }

    #[test]
    fn a_multi_node_verdict_keeps_every_culprit_node() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = HistoryDb::open(&dir.path().join("h.sqlite")).unwrap();
        let mut v = fixture("blocked-write-n1.json");
        let mut second = v.culprits[0].clone();
        second.at.node = Some("n3".into());
        v.culprits.push(second.clone());
        v.culprits.push(second);
        db.record(&entry(&v, "n1", T0)).unwrap();
        let again = db.record(&entry(&v, "n1", T0 + 1.0)).unwrap();
        assert_eq!(again.last_nodes, ["n1", "n3"]);
        assert!(
            again.sentence().contains("on node n1 on")
                || again.sentence().contains("on nodes n1, n3 on")
        );
        let listed = db.list(&Query::default()).unwrap();
        assert_eq!(listed[0].culprit_nodes, ["n1", "n3"]);
    }

    #[test]
    fn the_sentence_names_several_nodes() {
        let r = Recurrence {
            fingerprint: "k".into(),
            seen_before: 2,
            last_nodes: vec!["n1".into(), "n3".into()],
            last_at_unix_s: Some(T0 + 86_400.0 + 6.0 * 3600.0),
            first_at_unix_s: Some(T0),
            ..Recurrence::default()
        };
        assert_eq!(
            r.sentence(),
            "seen 2 times before (first 2026-11-30 08:10:00 UTC), last on nodes n1, n3 on 2026-12-01 14:10:00 UTC"
        );
    }

    #[test]
    fn list_is_newest_first_with_counts_and_honours_since_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = HistoryDb::open(&dir.path().join("h.sqlite")).unwrap();
        let (a, d) = (
            fixture("blocked-write-n1.json"),
            fixture("diverged-load-batch.json"),
        );
        db.record(&entry(&a, "n1", T0)).unwrap();
        db.record(&entry(&d, "n1", T0 + 10.0)).unwrap();
        db.record(&entry(&a, "n2", T0 + 20.0)).unwrap();

        let all = db.list(&Query::default()).unwrap();
        let seen: Vec<(f64, u64)> = all.iter().map(|e| (e.at_unix_s, e.count)).collect();
        assert_eq!(seen, [(T0 + 20.0, 2), (T0 + 10.0, 1), (T0, 2)]);
        assert_eq!(all[0].kind, VerdictKind::BlockedInKernel);
        assert_eq!(all[0].job_id.as_deref(), Some("4242"));
        assert!(
            all[0].cause.starts_with("write() on /tmp/*/mnt (ext4)"),
            "{}",
            all[0].cause
        );

        let recent = db
            .list(&Query {
                since_unix_s: Some(T0 + 10.0),
                limit: None,
            })
            .unwrap();
        assert_eq!(recent.len(), 2);
        // The count is of the whole history, not of the window.
        assert_eq!(recent[0].count, 2);
        let one = db
            .list(&Query {
                since_unix_s: None,
                limit: Some(1),
            })
            .unwrap();
        assert_eq!(one.len(), 1);

        let causes = db.by_fingerprint(&Query::default()).unwrap();
        assert_eq!(causes.len(), 2);
        assert_eq!(causes[0].count, 2);
        assert_eq!(causes[0].nodes, ["n1"]);
        assert_eq!(
            (causes[0].first_at_unix_s, causes[0].last_at_unix_s),
            (T0, T0 + 20.0)
        );
        let windowed = db
            .by_fingerprint(&Query {
                since_unix_s: Some(T0 + 15.0),
                limit: None,
            })
            .unwrap();
        assert_eq!(windowed.len(), 1);
        assert_eq!(windowed[0].count, 1);
    }

    #[test]
    fn a_new_database_is_private_and_at_the_current_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/deeper/history.sqlite");
        let db = HistoryDb::open(&path).unwrap();
        assert_eq!(db.schema_version().unwrap(), SCHEMA_VERSION);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        drop(db);
        // Reopened: nothing migrated twice, nothing lost.
        let mut db = HistoryDb::open(&path).unwrap();
        let v = fixture("blocked-write-n1.json");
        db.record(&entry(&v, "n1", T0)).unwrap();
        drop(db);
        let db = HistoryDb::open(&path).unwrap();
        assert_eq!(db.list(&Query::default()).unwrap().len(), 1);
    }

    #[test]
    fn an_empty_sqlite_file_is_migrated_and_a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        Connection::open(&path)
            .unwrap()
            .execute_batch("PRAGMA user_version = 0")
            .unwrap();
        assert_eq!(
            HistoryDb::open(&path).unwrap().schema_version().unwrap(),
            SCHEMA_VERSION
        );

        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", SCHEMA_VERSION + 6)
            .unwrap();
        let err = HistoryDb::open(&path).err().expect("refused");
        assert!(
            matches!(err, HistoryError::NewerSchema { found, .. } if found == SCHEMA_VERSION + 6)
        );
        let text = err.to_string();
        assert!(text.contains("newer than this hangwatch knows"), "{text}");
        assert!(text.contains("h.sqlite"), "{text}");
    }

    #[test]
    fn reading_an_existing_database_creates_nothing_and_changes_no_mode() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("h.sqlite");
        assert!(matches!(
            HistoryDb::open_existing(&path),
            Err(HistoryError::Open { .. })
        ));
        assert!(!path.exists());
        Connection::open(&path).unwrap();
        assert_eq!(
            HistoryDb::open_existing(&path)
                .unwrap()
                .schema_version()
                .unwrap(),
            SCHEMA_VERSION
        );
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755);
    }

    #[test]
    fn recorded_verdicts_wait_to_be_shipped_until_marked() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = HistoryDb::open(&dir.path().join("h.sqlite")).unwrap();
        let v = fixture("blocked-write-n1.json");
        let first = db.record_entry(&entry(&v, "n1", T0)).unwrap();
        db.record(&entry(&v, "n1", T0 + 1.0)).unwrap();
        let pending = db.pending(10).unwrap();
        assert_eq!(pending.len(), 2);
        assert_eq!(pending[0].id, first.id);
        assert_eq!(pending[0].fingerprint, first.recurrence.fingerprint);
        assert_eq!(pending[0].mount_point, v.culprits[0].mount);
        assert_eq!(pending[0].culprit_nodes, ["n1"]);
        assert_eq!(db.pending(1).unwrap().len(), 1);
        db.mark_shipped(&[first.id]).unwrap();
        assert_eq!(db.pending_count().unwrap(), 1);
        assert_eq!(db.pending(10).unwrap()[0].at_unix_s, T0 + 1.0);
    }

    #[test]
    fn a_version_1_database_keeps_its_rows_and_they_wait_to_be_shipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.execute_batch(
            "INSERT INTO verdicts (at_unix_s, fingerprint, kind, summary, node) VALUES (1.0, 'k', 'stopped', 's', 'n1');
             PRAGMA user_version = 1;",
        )
        .unwrap();
        drop(conn);
        let db = HistoryDb::open(&path).unwrap();
        assert_eq!(db.schema_version().unwrap(), SCHEMA_VERSION);
        let pending = db.pending(10).unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].mount_point, None);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_named_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.sqlite");
        std::fs::write(&path, vec![b'x'; 4096]).unwrap();
        let err = HistoryDb::open(&path).err().expect("refused");
        assert!(matches!(err, HistoryError::NotADatabase { .. }), "{err:?}");
        assert!(err.to_string().contains("move it away"), "{err}");
    }

    #[test]
    fn concurrent_writers_each_see_a_distinct_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        HistoryDb::open(&path).unwrap();
        let verdict = fixture("blocked-write-n1.json");
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (path, verdict) = (path.clone(), verdict.clone());
                std::thread::spawn(move || {
                    let mut db = HistoryDb::open(&path).unwrap();
                    (0..25)
                        .map(|i| {
                            let at = T0 + f64::from(w * 100 + i);
                            db.record(&entry(&verdict, &format!("n{w}"), at))
                                .unwrap()
                                .seen_before
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut seen: Vec<u64> = writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<u64>>());
    }
}
