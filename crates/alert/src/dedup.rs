//! Which alerts go out: one per verdict fingerprint and stage per window, so that a hang decided again at each
//! roll call, each tier, or by both the agent and its coordinator pages once. Pure: `now` is passed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::payload::{Alert, Stage};

/// How long the same alert is not sent again: longer than one hang takes from the first roll call through every
/// tier to its end (minutes at the defaults), so a hang pages once; short enough that a job still stuck after it
/// is said again, as a reminder, rather than forgotten.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(10 * 60);

/// At most this many alerts are remembered: a long-lived process (the node service) sees many jobs, and each
/// distinct alert is a key.
const MAX_REMEMBERED: usize = 1024;

/// What makes two alerts the same: the job, the stage, the verdict's fingerprint, and for an acted alert what was
/// done (the acted alert after a requeue says what became of the next attempt: news, not a repeat).
pub fn alert_key(alert: &Alert, fingerprint: &str) -> String {
    let mut key = format!(
        "{}\u{1f}{}\u{1f}{fingerprint}",
        alert.job.as_deref().unwrap_or("-"),
        alert.stage.as_str()
    );
    if alert.stage == Stage::Acted {
        for action in &alert.verdict.actions {
            key.push('\u{1f}');
            key.push_str(&action.action);
            key.push(if action.ok { '+' } else { '!' });
            key.push_str(action.detail.as_deref().unwrap_or(""));
        }
    }
    key
}

/// Whether an alert goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Send,
    /// The same alert went out this long ago, within the window.
    Repeat {
        sent_ago: Duration,
    },
}

/// The alerts sent within the window, by key.
#[derive(Debug)]
pub struct Dedup {
    window: Duration,
    sent: HashMap<String, Instant>,
}

impl Default for Dedup {
    fn default() -> Self {
        Self::new(DEDUP_WINDOW)
    }
}

impl Dedup {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            sent: HashMap::new(),
        }
    }

    /// Decides for the alert of `key` at `now`; one that is sent starts a new window for its key.
    pub fn admit(&mut self, key: &str, now: Instant) -> Admit {
        if let Some(at) = self.sent.get(key) {
            let ago = now.saturating_duration_since(*at);
            if ago < self.window {
                return Admit::Repeat { sent_ago: ago };
            }
        }
        if self.sent.len() >= MAX_REMEMBERED && !self.sent.contains_key(key) {
            let window = self.window;
            self.sent
                .retain(|_, at| now.saturating_duration_since(*at) < window);
            if self.sent.len() >= MAX_REMEMBERED {
                // All within the window: forget the oldest (at worst it is sent once more).
                if let Some(oldest) = self
                    .sent
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(k, _)| k.clone())
                {
                    self.sent.remove(&oldest);
                }
            }
        }
        self.sent.insert(key.to_string(), now);
        Admit::Send
    }

    pub fn remembered(&self) -> usize {
        self.sent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::{ActionRecord, Verdict};

    fn verdict() -> Verdict {
        serde_json::from_str(include_str!("../tests/fixtures/blocked-verdict.json"))
            .expect("fixture parses")
    }

    fn alert(stage: Stage) -> Alert {
        let mut a = Alert::new(stage, &verdict(), 0.0);
        a.job = Some("4242".into());
        a
    }

    #[test]
    fn the_same_verdict_again_within_the_window_is_one_alert() {
        let mut dedup = Dedup::default();
        let t0 = Instant::now();
        let key = alert_key(&alert(Stage::Suspected), "fp1");
        assert_eq!(dedup.admit(&key, t0), Admit::Send);
        // Each roll call, each tier decides it again.
        for s in [5, 30, 120, 599] {
            assert_eq!(
                dedup.admit(&key, t0 + Duration::from_secs(s)),
                Admit::Repeat {
                    sent_ago: Duration::from_secs(s)
                }
            );
        }
        // Still stuck past the window: said again, once, and the window starts over.
        assert_eq!(dedup.admit(&key, t0 + DEDUP_WINDOW), Admit::Send);
        assert!(matches!(
            dedup.admit(&key, t0 + DEDUP_WINDOW + Duration::from_secs(1)),
            Admit::Repeat { .. }
        ));
    }

    #[test]
    fn another_stage_cause_job_or_outcome_is_not_a_repeat() {
        let mut dedup = Dedup::default();
        let now = Instant::now();
        let suspected = alert_key(&alert(Stage::Suspected), "fp1");
        assert_eq!(dedup.admit(&suspected, now), Admit::Send);
        // Acted after suspected: news.
        let acted = alert(Stage::Acted);
        assert_eq!(dedup.admit(&alert_key(&acted, "fp1"), now), Admit::Send);
        // Another cause (another kind, another mount): another fingerprint.
        assert_eq!(
            dedup.admit(&alert_key(&alert(Stage::Suspected), "fp2"), now),
            Admit::Send
        );
        // Another job with the same cause.
        let mut other_job = alert(Stage::Suspected);
        other_job.job = Some("4243".into());
        assert_eq!(dedup.admit(&alert_key(&other_job, "fp1"), now), Admit::Send);
        // The acted alert after a requeue says more: it goes out.
        let mut requeued = acted.clone();
        requeued.verdict.actions.push(ActionRecord {
            action: "requeue".into(),
            ranks: Vec::new(),
            ok: true,
            detail: Some("attempt 2 submitted as job 4243".into()),
            outcomes: Vec::new(),
        });
        assert_eq!(dedup.admit(&alert_key(&requeued, "fp1"), now), Admit::Send);
        // The very same acted alert again is a repeat.
        assert!(matches!(
            dedup.admit(&alert_key(&requeued, "fp1"), now),
            Admit::Repeat { .. }
        ));
    }

    #[test]
    fn what_is_remembered_stays_bounded() {
        let mut dedup = Dedup::default();
        let t0 = Instant::now();
        for i in 0..(MAX_REMEMBERED * 3) {
            let at = t0 + Duration::from_millis(i as u64);
            assert_eq!(dedup.admit(&format!("k{i}"), at), Admit::Send);
            assert!(dedup.remembered() <= MAX_REMEMBERED);
        }
        // The newest are still known; the oldest were forgotten first.
        let last = MAX_REMEMBERED * 3 - 1;
        let at = t0 + Duration::from_millis(last as u64 + 1);
        assert!(matches!(
            dedup.admit(&format!("k{last}"), at),
            Admit::Repeat { .. }
        ));
        assert_eq!(dedup.admit("k0", at), Admit::Send);
        // Past the window, expired keys make room before anything recent is forgotten.
        let later = at + DEDUP_WINDOW;
        assert_eq!(dedup.admit("fresh", later), Admit::Send);
        assert!(dedup.remembered() <= 2, "{}", dedup.remembered());
    }
}
