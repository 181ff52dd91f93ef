//! The alert flags `run` and `coordinator` share, and what happens to alerts when a run ends: the acted alert
//! (what was done), a bounded wait for alerts in flight, failures said and kept in the evidence (`alerts.json`).

use std::path::Path;
use std::time::Duration;

use hangwatch_agent::evidence::{write_abandonable, EvidenceFile};
use hangwatch_agent::human::say;
use hangwatch_alert::{Alert, Alerter, Limits, Stage, Targets};
use hangwatch_model::{unix_now, Verdict};

use crate::exit::usage;
use hangwatch_model::parse_nonzero_duration;

/// How long the exit waits for alerts still in flight: long enough for a retry or two, short enough for a
/// scheduler's kill timeout (Slurm's KillWait is 30 s by default).
const EXIT_WAIT: Duration = Duration::from_secs(10);

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
            Some(file) => Some(crate::secret::read_private_file(file, "webhook file")?),
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

/// `alerts.json`: what became of every alert of the run.
#[derive(Debug, serde::Serialize)]
pub struct AlertsRecord {
    pub deliveries: Vec<hangwatch_alert::Delivery>,
    /// Alerts still being sent when hangwatch exited (their outcome is unknown).
    pub in_flight_at_exit: usize,
    /// Alerts not sent: repeats within the window, dropped past the in-flight bound, forgotten deliveries.
    pub not_sent: hangwatch_alert::NotSent,
}

/// Who and where, for the alerts of one run.
pub struct AlertContext<'a> {
    pub job: Option<&'a str>,
    pub node: Option<&'a str>,
    pub report_dir: &'a Path,
}

/// Counts every delivery of `alerter` in metrics: `sent(target)` or `failed(target)`, and every alert not sent:
/// `not_sent(reason)`.
pub fn count_deliveries(
    alerter: &Alerter,
    sent: impl Fn(hangwatch_alert::TargetKind) + Send + Sync + 'static,
    failed: impl Fn(hangwatch_alert::TargetKind) + Send + Sync + 'static,
    not_sent: impl Fn(hangwatch_alert::NotSentReason) + Send + Sync + 'static,
) {
    alerter.on_not_sent(Box::new(not_sent));
    alerter.on_delivery(Box::new(move |d| {
        if d.ok {
            sent(d.target)
        } else {
            failed(d.target)
        }
    }));
}

/// Sends the acted alert for `verdict` (with what was done).
pub fn send_acted(alerter: &Alerter, verdict: &Verdict, context: &AlertContext) {
    let mut alert = Alert::new(Stage::Acted, verdict, unix_now());
    alert.job = context.job.map(str::to_string);
    alert.node = context.node.map(str::to_string);
    alert.evidence = Some(format!(
        "{}:{}",
        context.node.unwrap_or("this node"),
        context.report_dir.display()
    ));
    alerter.send(&alert);
}

/// At the end of a run: waits (bounded) for alerts in flight, says which failed, and keeps every delivery in
/// `alerts.json` in the report directory (written by an abandonable child).
pub fn finish(alerter: &Alerter, report_dir: &Path) {
    if alerter.targets().is_empty() {
        return;
    }
    let left = alerter.wait(EXIT_WAIT);
    if left > 0 {
        say(format!(
            "hangwatch: {left} alert(s) still being sent after {:.0}s: not waiting longer",
            EXIT_WAIT.as_secs_f64()
        ));
    }
    let deliveries = alerter.deliveries();
    let not_sent = alerter.not_sent();
    if deliveries.is_empty() && left == 0 && not_sent == hangwatch_alert::NotSent::default() {
        return;
    }
    if not_sent.dropped > 0 {
        say(format!(
            "hangwatch: warning: {} alert(s) dropped: too many were still being sent",
            not_sent.dropped
        ));
    }
    for failed in deliveries.iter().filter(|d| !d.ok) {
        say(format!(
            "hangwatch: warning: the {} alert to {} failed after {} attempt(s): {}",
            failed.stage.as_str(),
            failed.to,
            failed.attempts,
            failed.error.as_deref().unwrap_or("unknown error")
        ));
    }
    let program =
        hangwatch_child::self_exe().unwrap_or_else(|_| std::path::PathBuf::from("hangwatch"));
    let record = AlertsRecord {
        deliveries,
        in_flight_at_exit: left,
        not_sent,
    };
    let files = [EvidenceFile::json("alerts.json", &record)];
    if let Err(e) = write_abandonable(&program, report_dir, &files, Duration::from_secs(5)) {
        say(format!(
            "hangwatch: warning: alerts.json could not be saved: {e}"
        ));
    }
}
