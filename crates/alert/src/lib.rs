//! Alerts: telling people about a hang where they look — a chat webhook (Slack/Mattermost-compatible JSON), a
//! Prometheus Alertmanager (v2 API), a command — each retried with backoff under a deadline, in threads of their
//! own so that detection and termination never wait on them; the exit waits for them, bounded. The same alert
//! goes out once per window ([`dedup`]), and what is in flight or kept is bounded.

pub mod dedup;
mod payload;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use dedup::{alert_key, Admit, Dedup, DEDUP_WINDOW};
use hangwatch_model::{unix_now, Verdict};
pub use hangwatch_model::{NotSentReason, TargetKind};
pub use payload::{
    alertmanager_alerts, alertmanager_body, alertmanager_endpoint, chat_message, chat_text,
    rfc3339, Alert, AlertmanagerAlert, ChatMessage, Stage, ALERT_NAME,
};
use serde::Serialize;

/// Where alerts go, as the user gave it.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    /// `http://` or `https://` URL that takes a Slack-style JSON POST.
    pub webhook: Option<String>,
    /// Alertmanager's URL (`http://am:9093`); `/api/v2/alerts` is added.
    pub alertmanager: Option<String>,
    /// Run with `sh -c`; the alert JSON on stdin, `HANGWATCH_KIND`, `HANGWATCH_STAGE`, `HANGWATCH_SUMMARY` and
    /// `HANGWATCH_EVIDENCE` in its environment.
    pub command: Option<String>,
    /// PEM certificates to trust for HTTPS instead of the built-in (Mozilla) roots: a site's own CA.
    pub ca_file: Option<PathBuf>,
}

impl Targets {
    pub fn is_empty(&self) -> bool {
        self.webhook.is_none() && self.alertmanager.is_none() && self.command.is_none()
    }
}

/// How hard to try.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// All attempts of one alert to one target, backoff included.
    pub deadline: Duration,
    /// One attempt (connect, TLS, request, response).
    pub attempt_timeout: Duration,
    /// Deliveries in flight at once (each is a thread until its deadline); one more is dropped, counted and
    /// logged, never queued: a receiver that hangs must not pile up threads.
    pub max_in_flight: usize,
}

/// Far more than one run sends (3 receivers, a few stages), few enough threads to never matter.
const MAX_IN_FLIGHT: usize = 64;

/// Deliveries kept for `alerts.json`; older ones are forgotten (and counted) first.
const MAX_KEPT_DELIVERIES: usize = 256;

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
            max_in_flight: MAX_IN_FLIGHT,
        }
    }
}

/// What became of one alert to one target: `alerts.json` in the evidence keeps these.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delivery {
    pub target: TargetKind,
    /// The receiver without secrets: `https://hooks.example.com/…` (a webhook's path is its password), or the
    /// command.
    pub to: String,
    pub stage: Stage,
    pub ok: bool,
    pub attempts: u32,
    /// The last HTTP status, when one came back.
    pub status: Option<u16>,
    /// Why the last attempt failed.
    pub error: Option<String>,
    pub took_ms: u64,
    /// Seconds since the Unix epoch when it was finished with.
    pub at_unix_s: f64,
}

/// A bad `--webhook`, `--alertmanager` or `--alert-ca-file`.
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    #[error("{flag} `{url}` {problem}")]
    BadUrl {
        flag: &'static str,
        url: String,
        problem: &'static str,
    },
    #[error("cannot read the CA file {path}")]
    CaFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the CA file {path} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)")]
    NoCertificates { path: PathBuf },
}

/// Called for every finished delivery (metrics count them).
pub type DeliveryHook = Box<dyn Fn(&Delivery) + Send + Sync>;

/// Called for every alert (or delivery) not sent (metrics count them).
pub type NotSentHook = Box<dyn Fn(NotSentReason) + Send + Sync>;

/// What makes two verdicts the same cause, for [`dedup`]: `hangwatch_history::Fingerprint`'s key where the caller
/// has it (this crate does not depend on the history for it).
pub type FingerprintFn = Box<dyn Fn(&Verdict) -> String + Send + Sync>;

/// Sends alerts in the background and remembers what became of them. Cheap to share (`Arc`).
pub struct Alerter {
    targets: Targets,
    limits: Limits,
    http: ureq::Agent,
    shared: Arc<Shared>,
    fingerprint: FingerprintFn,
    dedup: Mutex<Dedup>,
}

/// What the alerts that were not sent add up to (for `alerts.json`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NotSent {
    /// Repeats of an alert sent within [`DEDUP_WINDOW`].
    pub repeats: u64,
    /// Deliveries dropped because [`Limits::max_in_flight`] were in flight.
    pub dropped: u64,
    /// Finished deliveries forgotten to keep the record bounded (the oldest first).
    pub forgotten: u64,
}

#[derive(Default)]
struct Shared {
    deliveries: Mutex<VecDeque<Delivery>>,
    in_flight: Mutex<usize>,
    finished: Condvar,
    hook: Mutex<Option<DeliveryHook>>,
    not_sent_hook: Mutex<Option<NotSentHook>>,
    repeats: AtomicU64,
    dropped: AtomicU64,
    forgotten: AtomicU64,
}

/// Without the caller's fingerprint: the kind and where the first culprit is stuck.
fn plain_fingerprint(verdict: &Verdict) -> String {
    let culprit = verdict.culprits.first();
    format!(
        "{}/{}/{}/{}",
        verdict.kind.as_str(),
        culprit.and_then(|c| c.node.as_deref()).unwrap_or("-"),
        culprit.and_then(|c| c.syscall.as_deref()).unwrap_or("-"),
        culprit.and_then(|c| c.mount.as_deref()).unwrap_or("-"),
    )
}

impl std::fmt::Debug for Alerter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alerter")
            .field("targets", &self.targets)
            .field("limits", &self.limits)
            .finish()
    }
}

impl Alerter {
    /// Checks the URLs and loads the CA file now, so that a typo is a usage error at start, not a lost alert.
    pub fn new(targets: Targets, limits: Limits) -> Result<Self, AlertError> {
        if let Some(url) = &targets.webhook {
            check_url("--webhook", url)?;
        }
        if let Some(url) = &targets.alertmanager {
            check_url("--alertmanager", url)?;
        }
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(path) = &targets.ca_file {
            tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&load_certs(path)?));
        }
        let http = ureq::Agent::config_builder()
            .timeout_global(Some(limits.attempt_timeout))
            .http_status_as_error(false)
            // A redirect is not followed: it could take the alert (and the webhook's secret path) from https to
            // http, or to a host nobody configured. The configured URL must be the final one.
            .max_redirects(0)
            .user_agent(concat!("hangwatch/", env!("CARGO_PKG_VERSION")))
            .tls_config(tls.build())
            .build()
            .into();
        Ok(Self {
            targets,
            limits,
            http,
            shared: Arc::default(),
            fingerprint: Box::new(plain_fingerprint),
            dedup: Mutex::default(),
        })
    }

    /// An alerter with no targets: `send` does nothing.
    pub fn none() -> Self {
        Self {
            targets: Targets::default(),
            limits: Limits::default(),
            http: ureq::Agent::new_with_defaults(),
            shared: Arc::default(),
            fingerprint: Box::new(plain_fingerprint),
            dedup: Mutex::default(),
        }
    }

    /// Tells the same cause by `fingerprint` (the history's), for sending each alert once per window.
    pub fn with_fingerprint(mut self, fingerprint: FingerprintFn) -> Self {
        self.fingerprint = fingerprint;
        self
    }

    /// The alerts not sent so far, and why.
    pub fn not_sent(&self) -> NotSent {
        NotSent {
            repeats: self.shared.repeats.load(Ordering::Relaxed),
            dropped: self.shared.dropped.load(Ordering::Relaxed),
            forgotten: self.shared.forgotten.load(Ordering::Relaxed),
        }
    }

    pub fn targets(&self) -> &Targets {
        &self.targets
    }

    /// `hook` is called for each delivery from then on.
    pub fn on_delivery(&self, hook: DeliveryHook) {
        *lock(&self.shared.hook) = Some(hook);
    }

    /// `hook` is called for each alert not sent (a repeat) or delivery dropped from then on.
    pub fn on_not_sent(&self, hook: NotSentHook) {
        *lock(&self.shared.not_sent_hook) = Some(hook);
    }

    /// Sends `alert` to every target, each in a thread of its own; returns at once. The same alert (job, stage,
    /// fingerprint, what was done) sent within [`DEDUP_WINDOW`] is a repeat: counted and logged, not sent.
    pub fn send(&self, alert: &Alert) -> Admit {
        if self.targets.is_empty() {
            return Admit::Send;
        }
        let key = alert_key(alert, &(self.fingerprint)(&alert.verdict));
        let admit = lock(&self.dedup).admit(&key, Instant::now());
        if let Admit::Repeat { sent_ago } = admit {
            self.shared.repeats.fetch_add(1, Ordering::Relaxed);
            self.shared.not_sent(NotSentReason::Repeat);
            tracing::info!(
                stage = alert.stage.as_str(),
                kind = alert.verdict.kind.as_str(),
                sent_ago_s = sent_ago.as_secs(),
                "alert not sent again: the same one went out within the window"
            );
            return admit;
        }
        let alert = Arc::new(alert.clone());
        if let Some(url) = &self.targets.webhook {
            let body = chat_message(&alert);
            self.spawn(TargetKind::Webhook, url.clone(), body, alert.stage);
        }
        if let Some(url) = &self.targets.alertmanager {
            let body = alertmanager_body(&alert);
            self.spawn(
                TargetKind::Alertmanager,
                alertmanager_endpoint(url),
                body,
                alert.stage,
            );
        }
        if let Some(command) = &self.targets.command {
            self.spawn_command(command.clone(), Arc::clone(&alert));
        }
        Admit::Send
    }

    /// Waits until no alert is in flight, at most `limit`; returns how many are still in flight.
    pub fn wait(&self, limit: Duration) -> usize {
        let end = Instant::now() + limit;
        let mut in_flight = lock(&self.shared.in_flight);
        while *in_flight > 0 {
            let now = Instant::now();
            if now >= end {
                break;
            }
            in_flight = match self.shared.finished.wait_timeout(in_flight, end - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        *in_flight
    }

    /// Every delivery finished so far, oldest first.
    pub fn deliveries(&self) -> Vec<Delivery> {
        lock(&self.shared.deliveries).iter().cloned().collect()
    }

    fn spawn(&self, target: TargetKind, url: String, body: Vec<u8>, stage: Stage) {
        let http = self.http.clone();
        let limits = self.limits;
        self.in_background(target, move || {
            let started = Instant::now();
            let attempt = |_: u32| post(&http, &url, &body);
            let (result, attempts) = with_retries(limits.deadline, attempt, retry_delay);
            delivery(target, redact(&url), stage, result, attempts, started)
        });
    }

    fn spawn_command(&self, command: String, alert: Arc<Alert>) {
        let deadline = self.limits.deadline;
        self.in_background(TargetKind::Command, move || {
            let started = Instant::now();
            let result = run_command(&command, &alert, deadline);
            delivery(
                TargetKind::Command,
                command,
                alert.stage,
                result,
                1,
                started,
            )
        });
    }

    fn in_background(&self, target: TargetKind, work: impl FnOnce() -> Delivery + Send + 'static) {
        {
            let mut in_flight = lock(&self.shared.in_flight);
            if *in_flight >= self.limits.max_in_flight {
                let dropped = self.shared.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                self.shared.not_sent(NotSentReason::Dropped);
                tracing::warn!(
                    target = target.as_str(),
                    in_flight = *in_flight,
                    dropped,
                    "alert dropped: too many alerts still being sent"
                );
                return;
            }
            *in_flight += 1;
        }
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(format!("hw-alert-{}", target.as_str()))
            .spawn(move || {
                let delivery = work();
                shared.finish(delivery);
            });
        if let Err(e) = spawned {
            self.shared.finish(Delivery {
                target,
                to: String::new(),
                stage: Stage::Suspected,
                ok: false,
                attempts: 0,
                status: None,
                error: Some(format!("cannot start the alert thread: {e}")),
                took_ms: 0,
                at_unix_s: unix_now(),
            });
        }
    }
}

impl Shared {
    fn not_sent(&self, reason: NotSentReason) {
        if let Some(hook) = lock(&self.not_sent_hook).as_ref() {
            hook(reason);
        }
    }

    fn finish(&self, delivery: Delivery) {
        if delivery.ok {
            tracing::info!(target = delivery.target.as_str(), to = %delivery.to, attempts = delivery.attempts, "alert delivered");
        } else {
            tracing::warn!(
                target = delivery.target.as_str(),
                to = %delivery.to,
                attempts = delivery.attempts,
                error = delivery.error.as_deref().unwrap_or(""),
                "alert failed"
            );
        }
        if let Some(hook) = lock(&self.hook).as_ref() {
            hook(&delivery);
        }
        {
            let mut kept = lock(&self.deliveries);
            if kept.len() >= MAX_KEPT_DELIVERIES {
                kept.pop_front();
                self.forgotten.fetch_add(1, Ordering::Relaxed);
            }
            kept.push_back(delivery);
        }
        let mut in_flight = lock(&self.in_flight);
        *in_flight = in_flight.saturating_sub(1);
        self.finished.notify_all();
    }
}

/// The outcome of one attempt: `Ok(status)` delivered; `Err((status, error, retry))`.
type Attempt = Result<u16, (Option<u16>, String, bool)>;

/// Tries until an attempt succeeds, fails for good, or the next try would start past `deadline`. Returns the last
/// outcome and the number of attempts.
fn with_retries(
    deadline: Duration,
    mut attempt: impl FnMut(u32) -> Attempt,
    delay: impl Fn(u32) -> Duration,
) -> (Attempt, u32) {
    let started = Instant::now();
    let mut n = 0;
    loop {
        n += 1;
        let outcome = attempt(n);
        match &outcome {
            Ok(_) | Err((_, _, false)) => return (outcome, n),
            Err((_, _, true)) => {
                let wait = delay(n);
                if started.elapsed() + wait >= deadline {
                    return (outcome, n);
                }
                std::thread::sleep(wait);
            }
        }
    }
}

/// Backoff before attempt `n + 1`: 0.5 s, 1 s, 2 s, 4 s, then every 8 s.
pub fn retry_delay(n: u32) -> Duration {
    Duration::from_millis(500u64 << n.saturating_sub(1).min(4))
}

/// Whether an HTTP status is worth another try: the receiver is overloaded or broken for now.
pub fn retryable_status(status: u16) -> bool {
    status == 408 || status == 429 || status >= 500
}

fn post(http: &ureq::Agent, url: &str, body: &[u8]) -> Attempt {
    match http
        .post(url)
        .header("Content-Type", "application/json")
        .send(body)
    {
        Ok(response) => {
            let status = response.status().as_u16();
            if (200..300).contains(&status) {
                Ok(status)
            } else {
                let redirect = if (300..400).contains(&status) {
                    " (a redirect, not followed: give the URL it points to)"
                } else {
                    ""
                };
                Err((
                    Some(status),
                    format!("{} answered HTTP {status}{redirect}", redact(url)),
                    retryable_status(status),
                ))
            }
        }
        // Connection refused, DNS, TLS, timeouts: the receiver may come back (a restart); a bad certificate will
        // not, but retrying it costs only the deadline, in a thread nobody waits on but the exit.
        Err(e) => Err((None, format!("{}: {e}", redact(url)), true)),
    }
}

fn run_command(command: &str, alert: &Alert, deadline: Duration) -> Attempt {
    use hangwatch_child::{input_from_bytes, run_with_deadline_and_input, ChildOutcome};
    let body = serde_json::to_vec(alert).unwrap_or_default();
    let stdin = input_from_bytes(c"hangwatch-alert", &body)
        .map_err(|e| (None, format!("cannot prepare the alert: {e}"), false))?;
    let mut child = hangwatch_child::external_command("sh");
    child
        .arg("-c")
        .arg(command)
        .env("HANGWATCH_KIND", alert.verdict.kind.as_str())
        .env("HANGWATCH_STAGE", alert.stage.as_str())
        .env("HANGWATCH_SUMMARY", &alert.verdict.summary)
        .env(
            "HANGWATCH_EVIDENCE",
            alert.evidence.as_deref().unwrap_or(""),
        );
    match run_with_deadline_and_input(child, stdin, deadline) {
        Ok(ChildOutcome::Finished { status, .. }) if status.success() => Ok(0),
        Ok(ChildOutcome::Finished { status, stderr, .. }) => Err((
            None,
            format!(
                "the alert command failed ({status}): {}",
                String::from_utf8_lossy(&stderr).trim()
            ),
            false,
        )),
        Ok(ChildOutcome::TimedOut { .. }) => Err((
            None,
            format!(
                "the alert command did not finish within {:.0}s (left running)",
                deadline.as_secs_f64()
            ),
            false,
        )),
        Err(e) => Err((None, format!("cannot run the alert command: {e}"), false)),
    }
}

fn delivery(
    target: TargetKind,
    to: String,
    stage: Stage,
    result: Attempt,
    attempts: u32,
    started: Instant,
) -> Delivery {
    let (ok, status, error) = match result {
        Ok(status) => (true, (status != 0).then_some(status), None),
        Err((status, error, _)) => (false, status, Some(error)),
    };
    Delivery {
        target,
        to,
        stage,
        ok,
        attempts,
        status,
        error,
        took_ms: started.elapsed().as_millis() as u64,
        at_unix_s: unix_now(),
    }
}

/// `scheme://host[:port]/…`: a webhook URL's path often is its secret (Slack, Teams), so it stays out of logs and
/// evidence.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "…".into();
    };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    // user:password@host
    let host = authority.rsplit('@').next().unwrap_or(authority);
    if rest.len() > authority.len() {
        format!("{scheme}://{host}/…")
    } else {
        format!("{scheme}://{host}")
    }
}

fn check_url(flag: &'static str, url: &str) -> Result<(), AlertError> {
    let bad = |problem| AlertError::BadUrl {
        flag,
        url: url.to_string(),
        problem,
    };
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| bad("must start with https:// or http://"))?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    if authority.rsplit('@').next().unwrap_or_default().is_empty() {
        return Err(bad("has no host"));
    }
    url.parse::<ureq::http::Uri>()
        .map_err(|_| bad("is not a valid URL"))?;
    Ok(())
}

fn load_certs(path: &std::path::Path) -> Result<Vec<ureq::tls::Certificate<'static>>, AlertError> {
    let pem = std::fs::read(path).map_err(|source| AlertError::CaFile {
        path: path.to_path_buf(),
        source,
    })?;
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert.to_owned()),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(AlertError::NoCertificates {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_at_start() {
        let bad = |url: &str| {
            Alerter::new(
                Targets {
                    webhook: Some(url.into()),
                    ..Targets::default()
                },
                Limits::default(),
            )
            .unwrap_err()
            .to_string()
        };
        assert!(bad("hooks.slack.com/x").contains("must start with https://"));
        assert!(bad("https:///x").contains("has no host"));
        assert!(Alerter::new(
            Targets {
                webhook: Some("https://hooks.example.com/services/T/B/secret".into()),
                alertmanager: Some("http://127.0.0.1:9093".into()),
                ..Targets::default()
            },
            Limits::default()
        )
        .is_ok());
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate").unwrap();
        let err = Alerter::new(
            Targets {
                ca_file: Some(path),
                ..Targets::default()
            },
            Limits::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("holds no PEM certificate"),
            "{err}"
        );
    }

    #[test]
    fn secrets_stay_out_of_the_record() {
        assert_eq!(
            redact("https://hooks.slack.com/services/T0/B0/XXXX"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(redact("http://u:pw@am:9093"), "http://am:9093");
        assert_eq!(redact("http://am:9093/api/v2/alerts"), "http://am:9093/…");
    }

    #[test]
    fn retries_back_off_until_the_deadline_and_stop_on_a_final_answer() {
        // Always 503: tried until the next delay would pass the deadline.
        let mut tries = 0;
        let (outcome, n) = with_retries(
            Duration::from_millis(100),
            |_| {
                tries += 1;
                Err((Some(503), "503".into(), true))
            },
            |_| Duration::from_millis(30),
        );
        assert!(outcome.is_err());
        assert!((3..=4).contains(&n), "{n}");
        assert_eq!(tries, n);
        // A 404 is final.
        let (_, n) = with_retries(
            Duration::from_secs(10),
            |_| Err((Some(404), "404".into(), false)),
            |_| Duration::from_millis(1),
        );
        assert_eq!(n, 1);
        // Success on the third try.
        let (outcome, n) = with_retries(
            Duration::from_secs(10),
            |k| {
                if k < 3 {
                    Err((None, "refused".into(), true))
                } else {
                    Ok(204)
                }
            },
            |_| Duration::from_millis(1),
        );
        assert_eq!((outcome.ok(), n), (Some(204), 3));
        assert_eq!(retry_delay(1), Duration::from_millis(500));
        assert_eq!(retry_delay(3), Duration::from_secs(2));
        assert_eq!(retry_delay(9), Duration::from_secs(8));
        assert!(retryable_status(503) && retryable_status(429) && !retryable_status(400));
    }

    /// A server on localhost that answers every request with `response`, counting connections.
    fn answering(response: &'static str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut stream = stream;
                let mut buf = [0u8; 8192];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(response.as_bytes());
            }
        });
        (url, seen)
    }

    #[test]
    fn a_redirect_is_not_followed_and_says_so() {
        let (elsewhere, followed) = answering("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        let redirect: &'static str = Box::leak(
            format!("HTTP/1.1 302 Found\r\nLocation: {elsewhere}\r\nContent-Length: 0\r\n\r\n")
                .into_boxed_str(),
        );
        let (url, _) = answering(redirect);
        let verdict: hangwatch_model::Verdict =
            serde_json::from_str(include_str!("../tests/fixtures/blocked-verdict.json")).unwrap();
        let alerter = Alerter::new(
            Targets {
                webhook: Some(url),
                ..Targets::default()
            },
            Limits::default(),
        )
        .unwrap();
        alerter.send(&Alert::new(Stage::Suspected, &verdict, 0.0));
        alerter.wait(Duration::from_secs(20));
        let d = &alerter.deliveries()[0];
        assert!(!d.ok, "{d:?}");
        assert_eq!(d.status, Some(302));
        assert!(
            d.error
                .as_deref()
                .unwrap_or_default()
                .contains("redirect, not followed"),
            "{d:?}"
        );
        assert_eq!(
            followed.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "nothing went where it pointed"
        );
    }

    #[test]
    fn a_command_gets_the_alert_on_stdin_and_a_failure_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("alert.json");
        let verdict: hangwatch_model::Verdict =
            serde_json::from_str(include_str!("../tests/fixtures/blocked-verdict.json")).unwrap();
        let alerter = Alerter::new(
            Targets {
                command: Some(format!(
                    "cat > {} && test \"$HANGWATCH_STAGE\" = suspected",
                    out.display()
                )),
                ..Targets::default()
            },
            Limits::default(),
        )
        .unwrap();
        alerter.send(&Alert::new(Stage::Suspected, &verdict, 0.0));
        assert_eq!(alerter.wait(Duration::from_secs(20)), 0);
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(doc["verdict"]["kind"], "blocked_in_kernel");
        assert!(alerter.deliveries()[0].ok);

        alerter.send(&Alert::new(Stage::Acted, &verdict, 0.0));
        assert_eq!(alerter.wait(Duration::from_secs(20)), 0);
        let failed = &alerter.deliveries()[1];
        assert!(!failed.ok);
        assert!(
            failed.error.as_deref().unwrap().contains("failed"),
            "{failed:?}"
        );
    }

    #[test]
    fn an_unreachable_webhook_fails_within_its_deadline_and_the_wait_is_bounded() {
        // A port nothing listens on: connection refused, retried until the deadline.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let alerter = Alerter::new(
            Targets {
                webhook: Some(format!("http://127.0.0.1:{port}/hook")),
                ..Targets::default()
            },
            Limits {
                deadline: Duration::from_millis(1200),
                attempt_timeout: Duration::from_secs(1),
                ..Limits::default()
            },
        )
        .unwrap();
        let verdict = hangwatch_model::Verdict::unknown("test");
        alerter.send(&Alert::new(Stage::Suspected, &verdict, 0.0));
        assert_eq!(alerter.wait(Duration::from_secs(20)), 0);
        let d = &alerter.deliveries()[0];
        assert!(!d.ok);
        assert!(d.attempts >= 2, "{d:?}");
        assert_eq!(d.to, format!("http://127.0.0.1:{port}/…"));
    }

    fn blocked() -> hangwatch_model::Verdict {
        serde_json::from_str(include_str!("../tests/fixtures/blocked-verdict.json")).unwrap()
    }

    #[test]
    fn a_verdict_decided_again_is_sent_once_and_the_acted_alert_still_goes_out() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sent");
        let alerter = Alerter::new(
            Targets {
                command: Some(format!("echo \"$HANGWATCH_STAGE\" >> {}", log.display())),
                ..Targets::default()
            },
            Limits::default(),
        )
        .unwrap()
        .with_fingerprint(Box::new(|v| format!("fp-{}", v.kind.as_str())));
        let counted = Arc::new(Mutex::new(0));
        let count = Arc::clone(&counted);
        alerter.on_not_sent(Box::new(move |reason| {
            assert_eq!(reason, NotSentReason::Repeat);
            *lock(&count) += 1;
        }));
        let verdict = blocked();
        // Three roll calls reach the same verdict (soft tier, hard tier, the coordinator's).
        assert_eq!(
            alerter.send(&Alert::new(Stage::Suspected, &verdict, 0.0)),
            Admit::Send
        );
        for _ in 0..2 {
            assert!(matches!(
                alerter.send(&Alert::new(Stage::Suspected, &verdict, 1.0)),
                Admit::Repeat { .. }
            ));
        }
        assert_eq!(
            alerter.send(&Alert::new(Stage::Acted, &verdict, 2.0)),
            Admit::Send
        );
        assert_eq!(alerter.wait(Duration::from_secs(20)), 0);
        // Each runs in its own thread: in either order.
        let mut sent: Vec<String> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        sent.sort();
        assert_eq!(sent, ["acted", "suspected"], "one alert per stage");
        assert_eq!(alerter.not_sent().repeats, 2);
        assert_eq!(*lock(&counted), 2, "the hook saw each repeat");
        assert_eq!(alerter.deliveries().len(), 2);
    }

    #[test]
    fn past_the_in_flight_bound_an_alert_is_dropped_and_counted_not_queued() {
        let alerter = Alerter::new(
            Targets {
                command: Some("sleep 3".into()),
                ..Targets::default()
            },
            Limits {
                deadline: Duration::from_secs(10),
                max_in_flight: 2,
                ..Limits::default()
            },
        )
        .unwrap();
        let mut verdict = blocked();
        let started = Instant::now();
        for i in 0..5 {
            // Distinct causes, so that none is a repeat.
            verdict.kind = [
                hangwatch_model::VerdictKind::BlockedInKernel,
                hangwatch_model::VerdictKind::Stopped,
                hangwatch_model::VerdictKind::Diverged,
                hangwatch_model::VerdictKind::Busy,
                hangwatch_model::VerdictKind::NodeUnreachable,
            ][i];
            assert_eq!(
                alerter.send(&Alert::new(Stage::Suspected, &verdict, 0.0)),
                Admit::Send
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "send blocked on a full queue"
        );
        assert_eq!(alerter.not_sent().dropped, 3);
        assert_eq!(alerter.wait(Duration::from_secs(20)), 0);
        assert_eq!(alerter.deliveries().len(), 2);
    }
}
