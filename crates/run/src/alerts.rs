//! What happens to alerts when a run ends: the acted alert
//! (what was done), a bounded wait for alerts in flight, failures said and kept in the evidence (`alerts.json`).

use std::path::Path;
use std::time::Duration;

use hangwatch_agent::evidence::{write_abandonable, EvidenceFile};
use hangwatch_agent::human::say;
use hangwatch_alert::{Alert, Alerter, Stage};
use hangwatch_model::{unix_now, Verdict};

/// How long the exit waits for alerts still in flight: long enough for a retry or two, short enough for a
/// scheduler's kill timeout (Slurm's KillWait is 30 s by default).
const EXIT_WAIT: Duration = Duration::from_secs(10);

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
