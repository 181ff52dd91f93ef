//! The connection settings as libpq would make them: the URL, then the `PG*` environment (`PGHOST`, `PGPORT`,
//! `PGDATABASE`, `PGUSER`, `PGPASSWORD`), then the password file (`PGPASSFILE`, else `~/.pgpass`), so that a site's
//! existing PostgreSQL setup works unchanged. `--history-password-file` comes first of all.
//!
//! The `postgres` crate parses URLs but reads neither the environment nor `.pgpass` (that is libpq's), and no
//! maintained crate reads `.pgpass`; its format is five fields and two escapes, so it is parsed here
//! ([`parse_pgpass`], pure) and, as libpq does, ignored with a warning when group or others can read it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use hangwatch_history::FleetTarget;
use postgres::config::Host;

use crate::target::{read_password_file, TargetError};

/// libpq's default socket directory on Debian and most distributions, used when neither the URL nor `PGHOST`
/// names a host.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

/// The environment, read through a trait so that tests pass a map.
pub trait Environment {
    fn var(&self, name: &str) -> Option<String>;
}

/// The process's own environment.
pub struct ProcessEnv;

impl Environment for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Environment for std::collections::HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// Why the connection settings could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("the fleet database URL is not a PostgreSQL URL (postgresql://user@host:port/dbname)")]
    BadUrl {
        #[source]
        source: postgres::Error,
    },
    #[error("no user for the fleet database: put one in the URL (postgresql://USER@host/db) or in PGUSER")]
    NoUser,
    #[error("PGPORT={value} is not a port number")]
    BadPort { value: String },
    #[error(transparent)]
    PasswordFile(#[from] TargetError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

/// One line of a password file: `hostname:port:database:username:password`, each of the first four `*` for any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgpassEntry {
    pub host: String,
    pub port: String,
    pub database: String,
    pub user: String,
    pub password: String,
}

impl PgpassEntry {
    /// Whether this line is for that server, database and user (libpq's rule: `*` matches anything; a Unix
    /// socket's host is `localhost`).
    pub fn matches(&self, host: &str, port: u16, database: &str, user: &str) -> bool {
        let field = |pattern: &str, value: &str| pattern == "*" || pattern == value;
        field(&self.host, host)
            && field(&self.port, &port.to_string())
            && field(&self.database, database)
            && field(&self.user, user)
    }
}

/// The lines of a `.pgpass` file: comments (`#`) and lines with fewer than five fields are skipped; `\:` and `\\`
/// are a literal colon and backslash.
pub fn parse_pgpass(text: &str) -> Vec<PgpassEntry> {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| {
            let mut fields = Vec::with_capacity(5);
            let mut current = String::new();
            let mut chars = line.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => current.extend(chars.next()),
                    // The password is everything after the fourth colon, colons included.
                    ':' if fields.len() < 4 => fields.push(std::mem::take(&mut current)),
                    c => current.push(c),
                }
            }
            fields.push(current);
            let [host, port, database, user, password]: [String; 5] = fields.try_into().ok()?;
            Some(PgpassEntry {
                host,
                port,
                database,
                user,
                password,
            })
        })
        .collect()
}

/// The client configuration for `target`: its URL (without its TLS parameters: [`crate::tls::split`]) completed
/// from `env` as libpq would, the password from the password file, the URL, `PGPASSWORD` or `.pgpass`, in that
/// order; `connect_timeout` bounds each TCP connect.
pub fn client_config(
    target: &FleetTarget,
    env: &dyn Environment,
    connect_timeout: Duration,
) -> Result<postgres::Config, CredentialsError> {
    settings(target, env, connect_timeout, true)
}

/// [`client_config`] without any password: for a link that is not encrypted, where none is ever sent.
pub fn client_config_without_password(
    target: &FleetTarget,
    env: &dyn Environment,
    connect_timeout: Duration,
) -> Result<postgres::Config, CredentialsError> {
    settings(target, env, connect_timeout, false)
}

fn settings(
    target: &FleetTarget,
    env: &dyn Environment,
    connect_timeout: Duration,
    with_password: bool,
) -> Result<postgres::Config, CredentialsError> {
    let (url, _) = crate::tls::split(&target.url);
    let mut config =
        postgres::Config::from_str(&url).map_err(|source| CredentialsError::BadUrl { source })?;
    if !with_password {
        // The URL's own password, if any, must not reach an unencrypted link either.
        let mut bare = postgres::Config::new();
        for host in config.get_hosts() {
            match host {
                Host::Tcp(name) => bare.host(name),
                Host::Unix(path) => bare.host_path(path),
            };
        }
        for addr in config.get_hostaddrs() {
            bare.hostaddr(*addr);
        }
        for port in config.get_ports() {
            bare.port(*port);
        }
        if let Some(user) = config.get_user() {
            bare.user(user);
        }
        if let Some(dbname) = config.get_dbname() {
            bare.dbname(dbname);
        }
        if let Some(options) = config.get_options() {
            bare.options(options);
        }
        if let Some(timeout) = config.get_tcp_user_timeout() {
            bare.tcp_user_timeout(*timeout);
        }
        bare.target_session_attrs(config.get_target_session_attrs())
            .load_balance_hosts(config.get_load_balance_hosts());
        config = bare;
    }
    if config.get_hosts().is_empty() {
        let host = env
            .var("PGHOST")
            .unwrap_or_else(|| DEFAULT_SOCKET_DIR.to_string());
        config.host(&host);
    }
    if config.get_ports().is_empty() {
        if let Some(value) = env.var("PGPORT") {
            let port = value
                .parse::<u16>()
                .map_err(|_| CredentialsError::BadPort { value })?;
            config.port(port);
        }
    }
    if config.get_user().is_none() {
        let user = ["PGUSER", "USER", "LOGNAME"]
            .iter()
            .find_map(|name| env.var(name))
            .ok_or(CredentialsError::NoUser)?;
        config.user(&user);
    }
    let user = config.get_user().unwrap_or_default().to_string();
    if config.get_dbname().is_none() {
        config.dbname(&env.var("PGDATABASE").unwrap_or_else(|| user.clone()));
    }
    if !with_password {
    } else if let Some(path) = &target.password_file {
        config.password(read_password_file(path)?);
    } else if config.get_password().is_none() {
        if let Some(password) = env.var("PGPASSWORD") {
            config.password(password);
        } else if let Some(password) = pgpass_password(&config, env) {
            config.password(password);
        }
    }
    config
        .connect_timeout(connect_timeout)
        .application_name("hangwatch")
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(30));
    Ok(config)
}

/// `user@host:port/dbname`: the database in words, never with its password.
pub fn describe(config: &postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            Host::Tcp(name) => name.clone(),
            Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_default();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgresql://{}@{host}:{port}/{}",
        config.get_user().unwrap_or_default(),
        config.get_dbname().unwrap_or_default()
    )
}

/// The password `.pgpass` holds for this configuration's first host, port, database and user.
fn pgpass_password(config: &postgres::Config, env: &dyn Environment) -> Option<String> {
    let path = env
        .var("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| env.var("HOME").map(|home| Path::new(&home).join(".pgpass")))?;
    let meta = std::fs::metadata(&path).ok()?;
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(path = %path.display(), "password file has group or world access: ignored, as libpq does (chmod 600 it)");
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let host = match config.get_hosts().first()? {
        Host::Tcp(name) => name.clone(),
        Host::Unix(_) => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let database = config.get_dbname().unwrap_or_default();
    let user = config.get_user().unwrap_or_default();
    parse_pgpass(&text)
        .into_iter()
        .find(|e| e.matches(&host, port, database, user))
        .map(|e| e.password)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn target(url: &str) -> FleetTarget {
        FleetTarget {
            url: url.into(),
            password_file: None,
            incident_window_s: 900.0,
            deadline_s: 2.0,
        }
    }

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn pgpass_lines_with_wildcards_and_escapes() {
        let text = "# comment\ndb1:5432:fleet:hw:s3cret\n*:*:*:admin:a\\:b:c\nshort:line\nh\\\\x:1:d:u:p\n";
        let entries = parse_pgpass(text);
        assert_eq!(entries.len(), 3);
        assert!(entries[0].matches("db1", 5432, "fleet", "hw"));
        assert!(!entries[0].matches("db1", 5433, "fleet", "hw"));
        assert_eq!(entries[1].password, "a:b:c");
        assert!(entries[1].matches("anything", 1, "x", "admin"));
        assert_eq!(entries[2].host, "h\\x");
    }

    #[test]
    fn the_environment_completes_the_url_as_libpq_does() {
        let e = env(&[
            ("PGHOST", "db.example"),
            ("PGPORT", "6543"),
            ("PGUSER", "hw"),
            ("PGPASSWORD", "pw"),
        ]);
        let config =
            client_config(&target("postgresql:///fleet"), &e, Duration::from_secs(1)).unwrap();
        assert_eq!(describe(&config), "postgresql://hw@db.example:6543/fleet");
        assert_eq!(config.get_password(), Some(&b"pw"[..]));
        let config =
            client_config(&target("postgresql://me@h:1/d"), &e, Duration::from_secs(1)).unwrap();
        assert_eq!(describe(&config), "postgresql://me@h:1/d");
        let config = client_config(
            &target("postgresql://"),
            &env(&[("USER", "alice")]),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(
            describe(&config),
            "postgresql://alice@/var/run/postgresql:5432/alice"
        );
        assert!(matches!(
            client_config(
                &target("postgresql://h/d"),
                &env(&[]),
                Duration::from_secs(1)
            ),
            Err(CredentialsError::NoUser)
        ));
    }

    #[test]
    fn no_password_at_all_for_an_unencrypted_link() {
        let e = env(&[("PGPASSWORD", "pw"), ("PGPORT", "6543")]);
        let t = target("postgresql://hw:in-url@db.example/fleet?sslmode=disable&connect_timeout=9");
        let with = client_config(&t, &e, Duration::from_secs(1)).unwrap();
        assert_eq!(with.get_password(), Some(&b"in-url"[..]));
        let without = client_config_without_password(&t, &e, Duration::from_secs(1)).unwrap();
        assert_eq!(without.get_password(), None);
        assert_eq!(describe(&without), describe(&with));
        assert_eq!(without.get_connect_timeout(), with.get_connect_timeout());
        assert_eq!(without.get_application_name(), Some("hangwatch"));
    }

    #[test]
    fn pgpass_is_read_when_private_and_the_password_file_comes_first() {
        let dir = tempfile::tempdir().unwrap();
        let pgpass = dir.path().join("pgpass");
        std::fs::write(&pgpass, "h:5432:d:hw:from-pgpass\n").unwrap();
        std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = env(&[("PGPASSFILE", pgpass.to_str().unwrap())]);
        let url = "postgresql://hw@h/d";
        let config = client_config(&target(url), &e, Duration::from_secs(1)).unwrap();
        assert_eq!(config.get_password(), None, "a readable .pgpass is ignored");
        std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o600)).unwrap();
        let config = client_config(&target(url), &e, Duration::from_secs(1)).unwrap();
        assert_eq!(config.get_password(), Some(&b"from-pgpass"[..]));

        let file = dir.path().join("pw");
        std::fs::write(&file, "from-file\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut t = target(url);
        t.password_file = Some(file);
        let config = client_config(&t, &e, Duration::from_secs(1)).unwrap();
        assert_eq!(config.get_password(), Some(&b"from-file"[..]));
    }
}
