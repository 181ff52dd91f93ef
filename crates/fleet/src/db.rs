//! The fleet database: its schema and migrations (a version table; a database from a newer hangwatch is refused,
//! never rewritten), shipping verdicts into it (idempotent: a row shipped twice is stored once), and the lookups:
//! how often a cause was seen across the fleet, which other jobs were blocked on the same mount just now, and the
//! listings of `hangwatch history --fleet`.

use std::time::Duration;

use hangwatch_history::{Fingerprint, FleetTarget, PendingVerdict};
use hangwatch_model::{utc_time, Recurrence, RecurrenceSource, VerdictKind};
use postgres::config::SslMode as PgSslMode;
use postgres::{Client, NoTls};
use serde::Serialize;

use crate::credentials::{
    client_config, client_config_without_password, describe, CredentialsError, Environment,
};
use crate::incident::{incident_from, sightings_from, EarlierRow, NearbyRow};
use crate::tls::{Link, SslMode};

/// The schema, one entry per version: entry N takes the database from version N to N+1. Append only.
const MIGRATIONS: &[&str] = &[
    // 1: every node's verdicts. The identity column needs no grant on a sequence, so a role with INSERT and
    // SELECT on the table can ship. ship_key makes shipping idempotent (a child abandoned after the commit
    // ships the row again later). The indexes are those of the lookups: a cause's latest verdicts, a mount's
    // recent blocked verdicts, a time window.
    "CREATE TABLE fleet_verdicts (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ship_key TEXT NOT NULL UNIQUE,
        at_unix_s DOUBLE PRECISION NOT NULL,
        fingerprint TEXT NOT NULL,
        kind TEXT NOT NULL,
        syscall TEXT,
        fstype TEXT,
        mount TEXT,
        kernel_wait TEXT,
        python_frame TEXT,
        mount_point TEXT,
        mount_source TEXT,
        summary TEXT NOT NULL,
        node TEXT NOT NULL,
        culprit_nodes TEXT[] NOT NULL,
        job_id TEXT,
        bundle TEXT,
        stalled_for_s DOUBLE PRECISION,
        shipped_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    CREATE INDEX fleet_verdicts_by_fingerprint ON fleet_verdicts (fingerprint, at_unix_s DESC);
    CREATE INDEX fleet_verdicts_by_mount ON fleet_verdicts (mount_point, at_unix_s)
        WHERE kind = 'blocked_in_kernel';
    CREATE INDEX fleet_verdicts_by_time ON fleet_verdicts (at_unix_s);",
    // 2: the culprit's filesystem identity (`FilesystemId::key`): containers that bind one filesystem at
    // different paths are one incident.
    "ALTER TABLE fleet_verdicts ADD COLUMN filesystem TEXT;
    CREATE INDEX fleet_verdicts_by_filesystem ON fleet_verdicts (filesystem, at_unix_s)
        WHERE kind = 'blocked_in_kernel';",
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// Serializes migrations of concurrent nodes (`pg_advisory_xact_lock`): "hangwatch" in ASCII.
const MIGRATION_LOCK: i64 = 0x68_616e_6777_6174;

/// The earlier verdicts of a cause read for its sightings (deduplicated by job, newest first).
const SIGHTING_ROWS: i64 = 50;
/// The sightings a recurrence names.
pub const MAX_SIGHTINGS: usize = 5;
/// The nearby verdicts read for an incident.
const INCIDENT_ROWS: i64 = 200;

/// Why the fleet database could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Settings(#[from] CredentialsError),
    #[error("cannot connect to the fleet database {database}")]
    Connect {
        database: String,
        #[source]
        source: postgres::Error,
    },
    #[error("the fleet database {database} does not offer TLS, and hangwatch sends no verdict and no password unencrypted: give the server a certificate (ssl = on, ssl_cert_file and ssl_key_file in postgresql.conf) and name the CA that signed it with history_ca in the site configuration (or --history-ca FILE); or, only on a network you trust, set insecure_history = true in the site configuration")]
    ServerWithoutTls {
        database: String,
        #[source]
        source: postgres::Error,
    },
    #[error("the fleet database {database} presented a certificate that {trusted} does not vouch for, or not for the host name in the URL: name the CA that signed the server's certificate with history_ca in the site configuration (or --history-ca FILE), and connect by a name the certificate lists")]
    Certificate {
        database: String,
        /// The CA file, or the default roots, in words.
        trusted: String,
        #[source]
        source: postgres::Error,
    },
    #[error("the fleet database {database} asks for a password over an unencrypted link, and hangwatch never sends one there: give the server a certificate and name its CA with history_ca (then the password goes encrypted), or let the nodes in without a password (pg_hba.conf)")]
    PasswordWithheld {
        database: String,
        #[source]
        source: postgres::Error,
    },
    #[error("the fleet database {database} did not answer within {after:?}")]
    TimedOut { database: String, after: Duration },
    #[error("the fleet database {database} has schema version {found}, newer than this hangwatch knows ({known}): use the newer hangwatch that wrote it (nothing was changed)")]
    NewerSchema {
        database: String,
        found: i32,
        known: i32,
    },
    #[error("cannot bring the schema of the fleet database {database} to version {version} (a role with only INSERT and SELECT cannot: run `hangwatch history --fleet` once as the database's owner)")]
    Migrate {
        database: String,
        version: i32,
        #[source]
        source: postgres::Error,
    },
}

/// Why verdicts could not be shipped.
#[derive(Debug, thiserror::Error)]
#[error("cannot ship verdicts to the fleet database {database}")]
pub struct ShipError {
    pub database: String,
    #[source]
    pub source: postgres::Error,
}

/// Why a lookup or a listing failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} the fleet database {database}")]
pub struct QueryError {
    pub database: String,
    pub what: &'static str,
    #[source]
    pub source: postgres::Error,
}

/// Which verdicts to list: the same question as of the node's own history.
pub type FleetQuery = hangwatch_history::Query;

/// One verdict in the fleet database (`history --fleet`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetEntry {
    pub at_unix_s: f64,
    pub at: String,
    pub kind: VerdictKind,
    pub summary: String,
    pub fingerprint: String,
    pub cause: String,
    pub fields: Fingerprint,
    pub mount_point: Option<String>,
    /// The node that recorded it.
    pub node: String,
    pub culprit_nodes: Vec<String>,
    pub job_id: Option<String>,
    pub bundle: Option<String>,
    /// Verdicts with this fingerprint in the whole fleet database.
    pub count: u64,
}

/// One cause across the fleet (`history --fleet --by-cause`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetCause {
    pub fingerprint: String,
    pub cause: String,
    pub fields: Fingerprint,
    pub count: u64,
    pub jobs: u64,
    pub nodes: Vec<String>,
    pub first_at_unix_s: f64,
    pub last_at_unix_s: f64,
}

/// One mount across the fleet (`history --fleet --by-mount`): the verdicts blocked on it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetMount {
    pub mount_point: String,
    pub fstype: Option<String>,
    pub count: u64,
    pub jobs: u64,
    pub nodes: Vec<String>,
    pub first_at_unix_s: f64,
    pub last_at_unix_s: f64,
}

/// An open connection to the fleet database, its schema checked.
pub struct FleetDb {
    client: Client,
    database: String,
}

impl FleetDb {
    /// Connects to `target` (credentials from `env` as libpq would take them) and brings the schema up to
    /// [`SCHEMA_VERSION`]. Blocks as long as the server takes: callers that must not wait run it under a deadline
    /// ([`crate::within`]); `connect_timeout` bounds the TCP connect only.
    ///
    /// The link is the URL's `sslmode` ([`crate::tls`]; `verify-full` when it names none): TLS with the server's
    /// certificate checked against the URL's `sslrootcert` (else webpki-roots) and its name against the host;
    /// an unencrypted link only where the URL asks for one, which [`crate::resolve`] allows only when the site
    /// does, and then without a password.
    pub fn connect(
        target: &FleetTarget,
        env: &dyn Environment,
        connect_timeout: Duration,
    ) -> Result<FleetDb, ConnectError> {
        let mut config = client_config(target, env, connect_timeout)?;
        let database = describe(&config);
        let params = crate::tls::split(&target.url).1;
        let mode = params
            .mode(SslMode::VerifyFull)
            .map_err(CredentialsError::from)?;
        let ca = params.sslrootcert.as_deref();
        let verified = |config: &mut postgres::Config| -> Result<Client, ConnectError> {
            let tls = crate::tls::connector(ca).map_err(CredentialsError::from)?;
            config
                .ssl_mode(PgSslMode::Require)
                .connect(tls)
                .map_err(|source| tls_error(&database, ca, source))
        };
        let plain = || -> Result<Client, ConnectError> {
            let mut bare = client_config_without_password(target, env, connect_timeout)?;
            let withheld = config.get_password().is_some();
            bare.ssl_mode(PgSslMode::Disable)
                .connect(NoTls)
                .map_err(|source| {
                    if withheld && chain_says(&source, "password missing") {
                        ConnectError::PasswordWithheld {
                            database: database.clone(),
                            source,
                        }
                    } else {
                        ConnectError::Connect {
                            database: database.clone(),
                            source,
                        }
                    }
                })
        };
        let client = match Link::of(mode, config.get_hosts()) {
            Link::Local => {
                config
                    .ssl_mode(PgSslMode::Disable)
                    .connect(NoTls)
                    .map_err(|source| ConnectError::Connect {
                        database: database.clone(),
                        source,
                    })?
            }
            Link::Verified => verified(&mut config)?,
            Link::Plain => plain()?,
            Link::Opportunistic => match verified(&mut config.clone()) {
                Err(ConnectError::ServerWithoutTls { .. }) => {
                    tracing::warn!(database = %database, "the fleet database offers no TLS: verdicts go unencrypted, as the site allows (insecure_history)");
                    plain()?
                }
                other => other?,
            },
        };
        let mut db = FleetDb { client, database };
        db.migrate()?;
        Ok(db)
    }

    /// `postgresql://user@host:port/db`, without a password.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The schema version of the database.
    pub fn schema_version(&mut self) -> Result<i32, QueryError> {
        let row = self
            .client
            .query_one(
                "SELECT COALESCE(MAX(version), 0) FROM hangwatch_schema",
                &[],
            )
            .map_err(|source| self.query_error("read", source))?;
        Ok(row.get(0))
    }

    fn migrate(&mut self) -> Result<(), ConnectError> {
        // Read first without a transaction or DDL: a role with only SELECT and INSERT gets this far.
        let found = self
            .read_version()
            .map_err(|source| ConnectError::Migrate {
                database: self.database.clone(),
                version: 1,
                source,
            })?;
        self.check_not_newer(found)?;
        if found == SCHEMA_VERSION {
            return Ok(());
        }
        let database = self.database.clone();
        let migrate_err = |version| {
            let database = database.clone();
            move |source| ConnectError::Migrate {
                database,
                version,
                source,
            }
        };
        let mut tx = self.client.transaction().map_err(migrate_err(found + 1))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .map_err(migrate_err(found + 1))?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS hangwatch_schema (version INTEGER NOT NULL)")
            .map_err(migrate_err(found + 1))?;
        // Another node may have migrated while this one waited for the lock.
        let found: i32 = tx
            .query_one(
                "SELECT COALESCE(MAX(version), 0) FROM hangwatch_schema",
                &[],
            )
            .map_err(migrate_err(found + 1))?
            .get(0);
        if found > SCHEMA_VERSION {
            return Err(ConnectError::NewerSchema {
                database: database.clone(),
                found,
                known: SCHEMA_VERSION,
            });
        }
        for (from, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
            let version = from as i32 + 1;
            tx.batch_execute(sql).map_err(migrate_err(version))?;
            tx.execute("DELETE FROM hangwatch_schema", &[])
                .map_err(migrate_err(version))?;
            tx.execute(
                "INSERT INTO hangwatch_schema (version) VALUES ($1)",
                &[&version],
            )
            .map_err(migrate_err(version))?;
        }
        tx.commit().map_err(migrate_err(SCHEMA_VERSION))?;
        tracing::info!(database = %database, from = found, to = SCHEMA_VERSION, "fleet database schema updated");
        Ok(())
    }

    /// The version, 0 when the version table does not exist yet.
    fn read_version(&mut self) -> Result<i32, postgres::Error> {
        let exists: bool = self
            .client
            .query_one("SELECT to_regclass('hangwatch_schema') IS NOT NULL", &[])?
            .get(0);
        if !exists {
            return Ok(0);
        }
        Ok(self
            .client
            .query_one(
                "SELECT COALESCE(MAX(version), 0) FROM hangwatch_schema",
                &[],
            )?
            .get(0))
    }

    fn check_not_newer(&self, found: i32) -> Result<(), ConnectError> {
        if found > SCHEMA_VERSION {
            return Err(ConnectError::NewerSchema {
                database: self.database.clone(),
                found,
                known: SCHEMA_VERSION,
            });
        }
        Ok(())
    }

    fn query_error(&self, what: &'static str, source: postgres::Error) -> QueryError {
        QueryError {
            database: self.database.clone(),
            what,
            source,
        }
    }

    /// Stores `verdicts` in one transaction; a verdict already there (same [`ship_key`]) is left as it is.
    /// Returns how many were new.
    pub fn ship(&mut self, verdicts: &[PendingVerdict]) -> Result<u64, ShipError> {
        let database = self.database.clone();
        let err = |source| ShipError {
            database: database.clone(),
            source,
        };
        let mut tx = self.client.transaction().map_err(err)?;
        let stmt = tx
            .prepare(
                "INSERT INTO fleet_verdicts (ship_key, at_unix_s, fingerprint, kind, syscall, fstype, mount,
                    kernel_wait, python_frame, mount_point, mount_source, summary, node, culprit_nodes, job_id,
                    bundle, stalled_for_s, filesystem)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
                 ON CONFLICT (ship_key) DO NOTHING",
            )
            .map_err(err)?;
        let mut new = 0;
        for v in verdicts {
            let bundle = v.bundle.as_ref().map(|b| b.to_string_lossy().into_owned());
            new += tx
                .execute(
                    &stmt,
                    &[
                        &ship_key(v),
                        &v.at_unix_s,
                        &v.fingerprint,
                        &v.fields.kind.as_str(),
                        &v.fields.syscall,
                        &v.fields.fstype,
                        &v.fields.mount,
                        &v.fields.kernel_wait,
                        &v.fields.python_frame,
                        &v.mount_point,
                        &v.mount_source,
                        &v.summary,
                        &v.node,
                        &v.culprit_nodes,
                        &v.job_id,
                        &bundle,
                        &v.stalled_for_s,
                        &v.filesystem,
                    ],
                )
                .map_err(err)?;
        }
        tx.commit().map_err(err)?;
        Ok(new)
    }

    /// How often `verdict`'s cause was seen before it across the fleet, and the incident it belongs to: other
    /// jobs or nodes blocked on the same mount within `window_s` before it. `verdict` itself (already shipped or
    /// not) is never counted.
    pub fn lookup(
        &mut self,
        verdict: &PendingVerdict,
        window_s: f64,
    ) -> Result<Recurrence, QueryError> {
        let own_key = ship_key(verdict);
        let counted = self
            .client
            .query_one(
                "SELECT COUNT(DISTINCT COALESCE(job_id, 'row:' || id)), MIN(at_unix_s), MAX(at_unix_s)
                 FROM fleet_verdicts
                 WHERE fingerprint = $1 AND at_unix_s <= $2 AND ship_key <> $3
                   AND NOT ($4::text IS NOT NULL AND job_id = $4 AND at_unix_s >= $2::float8 - $5::float8)",
                &[
                    &verdict.fingerprint,
                    &verdict.at_unix_s,
                    &own_key,
                    &verdict.job_id,
                    &window_s,
                ],
            )
            .map_err(|e| self.query_error("look a cause up in", e))?;
        let seen_before: i64 = counted.get(0);
        let earlier = self
            .client
            .query(
                "SELECT node, culprit_nodes, job_id, at_unix_s FROM fleet_verdicts
                 WHERE fingerprint = $1 AND at_unix_s <= $2 AND ship_key <> $3
                   AND NOT ($4::text IS NOT NULL AND job_id = $4 AND at_unix_s >= $2::float8 - $5::float8)
                 ORDER BY at_unix_s DESC LIMIT $6",
                &[
                    &verdict.fingerprint,
                    &verdict.at_unix_s,
                    &own_key,
                    &verdict.job_id,
                    &window_s,
                    &SIGHTING_ROWS,
                ],
            )
            .map_err(|e| self.query_error("look a cause up in", e))?
            .into_iter()
            .map(|row| EarlierRow {
                node: row.get(0),
                culprit_nodes: row.get(1),
                job_id: row.get(2),
                at_unix_s: row.get(3),
            })
            .collect::<Vec<_>>();
        let sightings = sightings_from(&earlier, MAX_SIGHTINGS);
        let mut last_nodes: Vec<String> = Vec::new();
        for s in &sightings {
            if !last_nodes.contains(&s.node) {
                last_nodes.push(s.node.clone());
            }
        }
        let incident = match (&verdict.mount_point, verdict.fields.kind) {
            (Some(mount), VerdictKind::BlockedInKernel) => {
                let nearby = self
                    .client
                    .query(
                        "SELECT node, culprit_nodes, job_id, at_unix_s FROM fleet_verdicts
                         WHERE kind = 'blocked_in_kernel'
                           AND (CASE WHEN $8::text IS NOT NULL AND filesystem IS NOT NULL THEN filesystem = $8
                                     ELSE mount_point = $1 END)
                           AND fstype IS NOT DISTINCT FROM $2
                           AND ($3::text IS NULL OR mount_source IS NULL OR mount_source = $3)
                           AND at_unix_s >= $4::float8 - $5::float8 AND at_unix_s <= $4 AND ship_key <> $6
                         ORDER BY at_unix_s LIMIT $7",
                        &[
                            mount,
                            &verdict.fields.fstype,
                            &verdict.mount_source,
                            &verdict.at_unix_s,
                            &window_s,
                            &own_key,
                            &INCIDENT_ROWS,
                            &verdict.filesystem,
                        ],
                    )
                    .map_err(|e| self.query_error("look an incident up in", e))?
                    .into_iter()
                    .map(|row| NearbyRow {
                        node: row.get(0),
                        culprit_nodes: row.get(1),
                        job_id: row.get(2),
                        at_unix_s: row.get(3),
                    })
                    .collect::<Vec<_>>();
                incident_from(verdict, mount, &nearby, window_s)
            }
            _ => None,
        };
        Ok(Recurrence {
            fingerprint: verdict.fingerprint.clone(),
            seen_before: seen_before.max(0) as u64,
            last_nodes,
            last_at_unix_s: counted.get(2),
            first_at_unix_s: counted.get(1),
            source: RecurrenceSource::Fleet,
            sightings,
            node: Some(verdict.node.clone()),
            at_unix_s: Some(verdict.at_unix_s),
            mount: verdict.fields.mount.clone(),
            incident,
            fleet_unavailable: None,
            placeless: hangwatch_history::is_placeless_key(&verdict.fingerprint),
        })
    }

    /// Verdicts, newest first, each with the count of its cause.
    pub fn list(&mut self, query: &FleetQuery) -> Result<Vec<FleetEntry>, QueryError> {
        let rows = self
            .client
            .query(
                "SELECT v.at_unix_s, v.kind, v.summary, v.fingerprint, v.syscall, v.fstype, v.mount, v.kernel_wait,
                    v.python_frame, v.mount_point, v.node, v.culprit_nodes, v.job_id, v.bundle,
                    (SELECT COUNT(*) FROM fleet_verdicts w WHERE w.fingerprint = v.fingerprint)
                 FROM fleet_verdicts v
                 WHERE $1::float8 IS NULL OR v.at_unix_s >= $1
                 ORDER BY v.at_unix_s DESC, v.id DESC
                 LIMIT $2",
                &[&query.since_unix_s, &sql_limit(query)],
            )
            .map_err(|e| self.query_error("list the verdicts of", e))?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let fields = fingerprint_at(&row, 1, 4);
                let at_unix_s: f64 = row.get(0);
                FleetEntry {
                    at_unix_s,
                    at: utc_time(at_unix_s),
                    kind: fields.kind,
                    summary: row.get(2),
                    fingerprint: row.get(3),
                    cause: fields.describe(),
                    fields,
                    mount_point: row.get(9),
                    node: row.get(10),
                    culprit_nodes: row.get(11),
                    job_id: row.get(12),
                    bundle: row.get(13),
                    count: row.get::<_, i64>(14).max(0) as u64,
                }
            })
            .collect())
    }

    /// One row per cause, the most recently seen first.
    pub fn by_cause(&mut self, query: &FleetQuery) -> Result<Vec<FleetCause>, QueryError> {
        let rows = self
            .client
            .query(
                "SELECT v.fingerprint, MIN(v.kind), MIN(v.syscall), MIN(v.fstype), MIN(v.mount), MIN(v.kernel_wait),
                    MIN(v.python_frame), COUNT(DISTINCT v.id), COUNT(DISTINCT v.job_id), MIN(v.at_unix_s),
                    MAX(v.at_unix_s), ARRAY_REMOVE(ARRAY_AGG(DISTINCT n.node ORDER BY n.node), NULL)
                 FROM fleet_verdicts v LEFT JOIN LATERAL unnest(v.culprit_nodes) AS n(node) ON true
                 WHERE $1::float8 IS NULL OR v.at_unix_s >= $1
                 GROUP BY v.fingerprint
                 ORDER BY MAX(v.at_unix_s) DESC
                 LIMIT $2",
                &[&query.since_unix_s, &sql_limit(query)],
            )
            .map_err(|e| self.query_error("list the causes of", e))?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let fields = fingerprint_at(&row, 1, 2);
                FleetCause {
                    fingerprint: row.get(0),
                    cause: fields.describe(),
                    fields,
                    count: row.get::<_, i64>(7).max(0) as u64,
                    jobs: row.get::<_, i64>(8).max(0) as u64,
                    first_at_unix_s: row.get(9),
                    last_at_unix_s: row.get(10),
                    nodes: row.get(11),
                }
            })
            .collect())
    }

    /// One row per mount that blocked a verdict, the most recent first.
    pub fn by_mount(&mut self, query: &FleetQuery) -> Result<Vec<FleetMount>, QueryError> {
        let rows = self
            .client
            .query(
                "SELECT v.mount_point, v.fstype, COUNT(DISTINCT v.id), COUNT(DISTINCT v.job_id), MIN(v.at_unix_s),
                    MAX(v.at_unix_s), ARRAY_REMOVE(ARRAY_AGG(DISTINCT n.node ORDER BY n.node), NULL)
                 FROM fleet_verdicts v LEFT JOIN LATERAL unnest(v.culprit_nodes) AS n(node) ON true
                 WHERE v.mount_point IS NOT NULL AND v.kind = 'blocked_in_kernel'
                   AND ($1::float8 IS NULL OR v.at_unix_s >= $1)
                 GROUP BY v.mount_point, v.fstype
                 ORDER BY MAX(v.at_unix_s) DESC
                 LIMIT $2",
                &[&query.since_unix_s, &sql_limit(query)],
            )
            .map_err(|e| self.query_error("list the mounts of", e))?;
        Ok(rows
            .into_iter()
            .map(|row| FleetMount {
                mount_point: row.get(0),
                fstype: row.get(1),
                count: row.get::<_, i64>(2).max(0) as u64,
                jobs: row.get::<_, i64>(3).max(0) as u64,
                first_at_unix_s: row.get(4),
                last_at_unix_s: row.get(5),
                nodes: row.get(6),
            })
            .collect())
    }

    /// The client, for tests and measurements that load or inspect rows directly.
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }
}

/// A failed TLS connection in words: the server offers no TLS, its certificate is not vouched for, or another
/// failure.
fn tls_error(
    database: &str,
    ca: Option<&std::path::Path>,
    source: postgres::Error,
) -> ConnectError {
    let database = database.to_string();
    if chain_says(&source, "server does not support TLS") {
        return ConnectError::ServerWithoutTls { database, source };
    }
    if let Some(rustls::Error::InvalidCertificate(_)) = crate::tls::rustls_cause(&source) {
        let trusted = match ca {
            Some(path) => format!("the CA file {}", path.display()),
            None => "the default roots (webpki-roots; no history_ca is set)".to_string(),
        };
        return ConnectError::Certificate {
            database,
            trusted,
            source,
        };
    }
    ConnectError::Connect { database, source }
}

/// Whether `error` or one of its causes says `needle` (tokio-postgres keeps these kinds private).
fn chain_says(error: &postgres::Error, needle: &str) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        if e.to_string().contains(needle) {
            return true;
        }
        next = e.source();
    }
    false
}

/// The fleet database's key for a node's row: the same row shipped twice is stored once. The node and its
/// local id name the row; the time and fingerprint keep two users' databases on one node apart.
pub fn ship_key(verdict: &PendingVerdict) -> String {
    format!(
        "{}/{}/{:.6}/{}",
        verdict.node, verdict.id, verdict.at_unix_s, verdict.fingerprint
    )
}

/// PostgreSQL reads `LIMIT NULL` as no limit.
fn sql_limit(query: &FleetQuery) -> Option<i64> {
    query.limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX))
}

/// The fingerprint fields of a row: the kind at `kind`, then syscall, fstype, mount, kernel wait and Python
/// frame from `first` on.
fn fingerprint_at(row: &postgres::Row, kind: usize, first: usize) -> Fingerprint {
    let name: String = row.get(kind);
    Fingerprint {
        kind: VerdictKind::from_name(&name).unwrap_or(VerdictKind::Unknown),
        syscall: row.get(first),
        fstype: row.get(first + 1),
        mount: row.get(first + 2),
        kernel_wait: row.get(first + 3),
        python_frame: row.get(first + 4),
        collective: None,
    }
}
