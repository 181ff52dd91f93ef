//! The fleet database's flags, shared by `run` and `history`: where it is (`--history-url`, else
//! `HANGWATCH_HISTORY_URL`, else the site configuration once there is one), its password file, its CA, whether
//! the site lets the link go unencrypted, the incident window. Checked before anything starts: a password in a
//! URL on the command line, or an unencrypted link the site did not allow, is a usage error.

use std::path::PathBuf;
use std::time::Duration;

use hangwatch_fleet::{FleetTarget, TlsPolicy, UrlSources, URL_ENV};

use crate::exit::usage;
use hangwatch_model::parse_duration;

#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// The fleet database (PostgreSQL), postgresql://USER@HOST:PORT/DB, with no password in it (libpq's
    /// ~/.pgpass, PGPASSFILE, PGPASSWORD, or --history-password-file) [env: HANGWATCH_HISTORY_URL].
    #[arg(long, value_name = "URL")]
    history_url: Option<String>,
    /// A file holding the fleet database's password, readable by its owner only (chmod 600).
    #[arg(long, value_name = "FILE")]
    history_password_file: Option<PathBuf>,
    /// The PEM file of the CA that signed the fleet database's certificate, which must also name the URL's host
    /// (default: the URL's sslrootcert, else Mozilla's roots). Usually set once for the site: history_ca in
    /// /etc/hangwatch/config.toml.
    #[arg(long, value_name = "FILE")]
    history_ca: Option<PathBuf>,
    /// Let the link to the fleet database go unencrypted (sslmode=disable, or prefer: TLS when the server
    /// offers it), never with a password: for a network the site trusts, set by the site (insecure_history =
    /// true in /etc/hangwatch/config.toml). Without it, only a verified TLS link is used.
    #[arg(long)]
    insecure_history: bool,
    /// Verdicts on any nodes blocked on the same mount within this time are one storage incident.
    #[arg(long, default_value = "15m", value_name = "DUR", value_parser = parse_duration)]
    incident_window: Duration,
}

impl FleetArgs {
    /// The fleet database to use, `None` when none is set; a usage error (exit 2) for a password on the command
    /// line, a password file others can read, an unreadable CA file, or a link that would go unencrypted where
    /// the site does not allow it.
    pub fn target(&self) -> anyhow::Result<Option<FleetTarget>> {
        let sources = UrlSources {
            flag: self.history_url.clone(),
            env: std::env::var(URL_ENV).ok().filter(|v| !v.trim().is_empty()),
            // The hook for the site configuration (/etc/hangwatch/config.toml's history_url): not read yet.
            config: None,
        };
        hangwatch_fleet::resolve(
            &sources,
            self.history_password_file.clone(),
            self.incident_window.as_secs_f64(),
            &TlsPolicy {
                ca_file: self.history_ca.clone(),
                insecure: self.insecure_history,
            },
        )
        .map_err(|e| usage(e.to_string()))
    }
}
