//! The fleet database's flags, shared by `run` and `history`: where it is (`--history-url`, else
//! `HANGWATCH_HISTORY_URL`, else the site configuration once there is one), its password file, the incident
//! window. Checked before anything starts: a password in a URL on the command line is a usage error.

use std::path::PathBuf;
use std::time::Duration;

use hangwatch_fleet::{FleetTarget, UrlSources, URL_ENV};

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
    /// Verdicts on any nodes blocked on the same mount within this time are one storage incident.
    #[arg(long, default_value = "15m", value_name = "DUR", value_parser = parse_duration)]
    incident_window: Duration,
}

impl FleetArgs {
    /// The fleet database to use, `None` when none is set; a usage error (exit 2) for a password on the command
    /// line or a password file others can read.
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
        )
        .map_err(|e| usage(e.to_string()))
    }
}
