//! The alert flags `run` and `coordinator` share; what happens to alerts when a run ends is
//! `hangwatch_run::alerts`.

use std::time::Duration;

use hangwatch_alert::{Alerter, Limits, Targets};
use hangwatch_model::parse_nonzero_duration;

use crate::exit::usage;

#[derive(Debug, Clone, clap::Args)]
pub struct AlertArgs {
    /// POST alerts to this URL (https:// or http://) as Slack/Mattermost-compatible JSON: `text` (the verdict in one
    /// line, and where the evidence is) and `hangwatch` (the alert with the verdict). Sent when a hang is
    /// suspected and when hangwatch acted. A webhook's path is its password: prefer --webhook-file or
    /// HANGWATCH_WEBHOOK, which keep it out of `ps` and the shell history.
    #[arg(
        long,
        value_name = "URL",
        env = "HANGWATCH_WEBHOOK",
        hide_env_values = true
    )]
    webhook: Option<String>,
    /// Read the webhook URL from this file (mode 600: refused when its group or others may read it); wins over
    /// --webhook and HANGWATCH_WEBHOOK.
    #[arg(long, value_name = "FILE")]
    webhook_file: Option<std::path::PathBuf>,
    /// Send alerts to this Prometheus Alertmanager (its v2 API; e.g. http://alertmanager:9093), labelled
    /// alertname=HangwatchJobHang, job, node, kind, stage, severity.
    #[arg(long, value_name = "URL")]
    alertmanager: Option<String>,
    /// Run this shell command for each alert, with the alert JSON on stdin and HANGWATCH_KIND, HANGWATCH_STAGE,
    /// HANGWATCH_SUMMARY, HANGWATCH_EVIDENCE in its environment.
    #[arg(long, value_name = "CMD")]
    alert_command: Option<String>,
    /// Trust these PEM certificates for HTTPS alerts instead of the built-in roots (a site's own CA).
    #[arg(long, value_name = "FILE", env = "HANGWATCH_ALERT_CA_FILE")]
    alert_ca_file: Option<std::path::PathBuf>,
    /// How long one alert may take to one receiver, retries with backoff included.
    #[arg(long, default_value = "30s", value_name = "DUR", value_parser = parse_nonzero_duration)]
    alert_deadline: Duration,
}

impl AlertArgs {
    /// The alerter, or a usage error naming the bad flag.
    pub fn alerter(&self) -> anyhow::Result<Alerter> {
        let webhook = match &self.webhook_file {
            Some(file) => Some(hangwatch_run::secret::read_private_file(
                file,
                "webhook file",
            )?),
            None => self.webhook.clone(),
        };
        Alerter::new(
            Targets {
                webhook,
                alertmanager: self.alertmanager.clone(),
                command: self.alert_command.clone(),
                ca_file: self.alert_ca_file.clone(),
            },
            Limits {
                deadline: self.alert_deadline,
                attempt_timeout: self.alert_deadline.min(Duration::from_secs(10)),
                ..Limits::default()
            },
        )
        .map(|alerter| {
            // The history's fingerprint: the same cause on another rank, pid or log file is the same alert.
            alerter.with_fingerprint(Box::new(|verdict| {
                hangwatch_history::Fingerprint::of(verdict).key()
            }))
        })
        .map_err(|e| usage(hangwatch_model::error_chain(&e)))
    }
}
