//! Which fleet database to use, and the checks made before anything connects: a URL given on the command line
//! must not carry a password (argv is world-readable in /proc), and a password file must be private.
//!
//! The URL comes from `--history-url`, else `HANGWATCH_HISTORY_URL`, else the site configuration
//! ([`UrlSources::config`], the hook for `/etc/hangwatch/config.toml`, which another part of hangwatch reads).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use hangwatch_history::FleetTarget;

use crate::tls::{SslMode, TlsError};

/// How long a verdict waits for the fleet database by default (inside `run`'s 3 s for the whole recording).
pub const DEFAULT_DEADLINE_S: f64 = 2.0;

/// Verdicts blocked on the same mount within this many seconds make one incident, by default.
pub const DEFAULT_INCIDENT_WINDOW_S: f64 = 15.0 * 60.0;

/// The environment variable that sets the fleet database's URL.
pub const URL_ENV: &str = "HANGWATCH_HISTORY_URL";

/// Where the URL may come from, most specific first.
#[derive(Debug, Clone, Default)]
pub struct UrlSources {
    /// `--history-url` (argv: must carry no password).
    pub flag: Option<String>,
    /// `HANGWATCH_HISTORY_URL`.
    pub env: Option<String>,
    /// The site configuration's value: the hook for the configuration file (not read here).
    pub config: Option<String>,
}

/// Why the fleet database's settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("--history-url carries a password, and the command line is readable by every user of the node: put the password in ~/.pgpass (or the file PGPASSFILE names), in PGPASSWORD, or in a 0600 file given with --history-password-file, and leave it out of the URL")]
    PasswordInArgv,
    #[error("{from} is not a PostgreSQL URL ({url_shape}): {reason}")]
    BadUrl {
        from: &'static str,
        url_shape: &'static str,
        reason: String,
    },
    #[error("the password file {path} can be read by group or others (mode {mode:04o}): chmod 600 {path}")]
    PasswordFileMode { path: PathBuf, mode: u32 },
    #[error("cannot read the password file {path}")]
    PasswordFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--history-password-file is set but no fleet database is: give --history-url or HANGWATCH_HISTORY_URL")]
    PasswordFileWithoutUrl,
    #[error("the fleet database link in {from} would not be encrypted (sslmode={mode}): verdicts and the password would cross the network in the clear, and anyone on the path could forge the fleet's history. Give the server a certificate (ssl = on in postgresql.conf), name the CA that signed it with history_ca in the site configuration (or --history-ca FILE), and leave sslmode out of the URL (verify-full is the default); or, only on a network you trust, set insecure_history = true in the site configuration")]
    PlainLink { from: &'static str, mode: SslMode },
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// What the site says about the fleet database link's TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsPolicy {
    /// `history_ca` (`--history-ca`): a PEM file of the CA that signed the server's certificate; `None`: the
    /// URL's `sslrootcert`, else webpki-roots (Mozilla's roots).
    pub ca_file: Option<PathBuf>,
    /// `insecure_history`: the link may go unencrypted (`sslmode` disable, allow or prefer; `prefer` when the
    /// URL names none). No password is ever sent over such a link.
    pub insecure: bool,
}

/// The fleet database to use (`None`: none is set), from the first of `sources` that is set. Checks what can be
/// checked before connecting: no password in a URL from argv, a private password file, a link that would go
/// unencrypted only where `tls` allows it, a readable CA file. The target's URL then carries its `sslmode` and
/// `sslrootcert` (libpq's parameters), so that the recording children, which read no configuration, connect
/// as this process decided.
pub fn resolve(
    sources: &UrlSources,
    password_file: Option<PathBuf>,
    incident_window_s: f64,
    tls: &TlsPolicy,
) -> Result<Option<FleetTarget>, TargetError> {
    let (url, from) = match (&sources.flag, &sources.env, &sources.config) {
        (Some(url), _, _) => (url, "--history-url"),
        (None, Some(url), _) => (url, URL_ENV),
        (None, None, Some(url)) => (url, "the configuration's history_url"),
        (None, None, None) if password_file.is_some() => {
            return Err(TargetError::PasswordFileWithoutUrl)
        }
        (None, None, None) => return Ok(None),
    };
    let (bare, params) = crate::tls::split(url);
    let config = postgres::Config::from_str(&bare).map_err(|e| TargetError::BadUrl {
        from,
        url_shape: "postgresql://user@host:port/dbname",
        reason: e.to_string(),
    })?;
    if sources.flag.is_some() && config.get_password().is_some() {
        return Err(TargetError::PasswordInArgv);
    }
    if let Some(path) = &password_file {
        check_password_file(path)?;
    }
    let default_mode = if tls.insecure {
        SslMode::Prefer
    } else {
        SslMode::VerifyFull
    };
    let mode = params.mode(default_mode)?;
    if mode.may_be_plain() && !tls.insecure {
        return Err(TargetError::PlainLink { from, mode });
    }
    let ca = params.sslrootcert.or_else(|| tls.ca_file.clone());
    if let Some(path) = &ca {
        crate::tls::read_ca(path)?;
    }
    Ok(Some(FleetTarget {
        url: crate::tls::join(&bare, mode, ca.as_deref()),
        password_file,
        incident_window_s,
        deadline_s: DEFAULT_DEADLINE_S,
    }))
}

/// Refuses a password file that group or others can read (as ssh does with keys): the password would not be
/// a secret.
pub fn check_password_file(path: &Path) -> Result<(), TargetError> {
    let meta = std::fs::metadata(path).map_err(|source| TargetError::PasswordFile {
        path: path.to_path_buf(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(TargetError::PasswordFileMode {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// The password in a password file: its first line, without the line end.
pub fn read_password_file(path: &Path) -> Result<String, TargetError> {
    check_password_file(path)?;
    let text = std::fs::read_to_string(path).map_err(|source| TargetError::PasswordFile {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(text.lines().next().unwrap_or_default().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag(url: &str) -> UrlSources {
        UrlSources {
            flag: Some(url.into()),
            ..UrlSources::default()
        }
    }

    #[test]
    fn a_password_on_the_command_line_is_refused_with_where_to_put_it() {
        let err = resolve(
            &flag("postgresql://hw:secret@db:5432/fleet"),
            None,
            900.0,
            &TlsPolicy::default(),
        )
        .expect_err("refused");
        assert!(matches!(err, TargetError::PasswordInArgv));
        let text = err.to_string();
        assert!(text.contains("~/.pgpass") && text.contains("--history-password-file"));
        let err = resolve(
            &flag("host=db user=hw password=secret"),
            None,
            900.0,
            &TlsPolicy::default(),
        )
        .expect_err("refused");
        assert!(matches!(err, TargetError::PasswordInArgv));
    }

    #[test]
    fn the_environment_may_carry_a_password_and_the_flag_wins() {
        let sources = UrlSources {
            flag: None,
            env: Some("postgresql://hw:secret@db/fleet".into()),
            config: Some("postgresql://other@db/fleet".into()),
        };
        let target = resolve(&sources, None, 900.0, &TlsPolicy::default())
            .unwrap()
            .expect("a target");
        assert_eq!(
            target.url,
            "postgresql://hw:secret@db/fleet?sslmode=verify-full"
        );
        let sources = UrlSources {
            flag: Some("postgresql://hw@db2/fleet".into()),
            ..sources
        };
        let target = resolve(&sources, None, 60.0, &TlsPolicy::default())
            .unwrap()
            .expect("a target");
        assert_eq!(target.url, "postgresql://hw@db2/fleet?sslmode=verify-full");
        assert_eq!(target.incident_window_s, 60.0);
        assert!(
            resolve(&UrlSources::default(), None, 900.0, &TlsPolicy::default())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_password_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "secret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = resolve(
            &flag("postgresql://hw@db/fleet"),
            Some(path.clone()),
            900.0,
            &TlsPolicy::default(),
        )
        .expect_err("refused");
        assert!(err.to_string().contains("mode 0644"), "{err}");
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_password_file(&path).unwrap(), "secret");
        assert!(resolve(
            &flag("postgresql://hw@db/fleet"),
            Some(path),
            900.0,
            &TlsPolicy::default()
        )
        .is_ok());
    }

    #[test]
    fn an_unencrypted_link_is_refused_with_the_fix_unless_the_site_allows_it() {
        for url in [
            "postgresql://hw@db/fleet?sslmode=disable",
            "postgresql://hw@db/fleet?sslmode=prefer",
            "host=db user=hw sslmode=allow",
        ] {
            let err = resolve(&flag(url), None, 900.0, &TlsPolicy::default()).expect_err("refused");
            assert!(matches!(err, TargetError::PlainLink { .. }), "{url}: {err}");
            let text = err.to_string();
            assert!(
                text.contains("would not be encrypted")
                    && text.contains("history_ca")
                    && text.contains("insecure_history = true"),
                "{text}"
            );
        }
        let insecure = TlsPolicy {
            ca_file: None,
            insecure: true,
        };
        let target = resolve(
            &flag("postgresql://hw@db/fleet?sslmode=disable"),
            None,
            900.0,
            &insecure,
        )
        .unwrap()
        .expect("allowed");
        assert_eq!(target.url, "postgresql://hw@db/fleet?sslmode=disable");
        let target = resolve(&flag("postgresql://hw@db/fleet"), None, 900.0, &insecure)
            .unwrap()
            .expect("allowed");
        assert_eq!(
            target.url, "postgresql://hw@db/fleet?sslmode=prefer",
            "TLS when the server offers it"
        );
        let err = resolve(
            &flag("postgresql://hw@db/fleet?sslmode=verify_full"),
            None,
            900.0,
            &insecure,
        )
        .expect_err("unknown mode");
        assert!(err.to_string().contains("not a mode libpq knows"), "{err}");
    }

    #[test]
    fn the_sites_ca_goes_into_the_url_unless_the_url_names_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "no certificate here\n").unwrap();
        let site = TlsPolicy {
            ca_file: Some(ca.clone()),
            insecure: false,
        };
        let err =
            resolve(&flag("postgresql://hw@db/fleet"), None, 900.0, &site).expect_err("not a CA");
        assert!(
            err.to_string().contains("holds no PEM certificate"),
            "{err}"
        );
        let own = dir.path().join("own.pem");
        let err = resolve(
            &flag(&format!(
                "postgresql://hw@db/fleet?sslrootcert={}",
                own.display()
            )),
            None,
            900.0,
            &site,
        )
        .expect_err("the URL's file is read");
        assert!(err.to_string().contains("own.pem"), "{err}");
    }

    #[test]
    fn garbage_is_not_a_url() {
        let err = resolve(
            &flag("postgresql://db:notaport/x"),
            None,
            900.0,
            &TlsPolicy::default(),
        )
        .expect_err("bad");
        assert!(err.to_string().contains("--history-url"), "{err}");
    }
}
