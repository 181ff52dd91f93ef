//! What an alert says, for each kind of receiver: pure functions from an [`Alert`] to the bytes that are sent.

use std::collections::BTreeMap;

use hangwatch_model::Verdict;
use serde::Serialize;

/// When in a hang the alert is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// A roll call found something (the soft tier, or before hangwatch acts): look now.
    Suspected,
    /// hangwatch acted on the hang (ended the job, requeued it); the alert says what was done.
    Acted,
    /// Nothing reports progress, but the ranks compute (a silent evaluation, rank 0 preparing data): hangwatch
    /// does not end the job for it, and says so once per stall (docs/false-alarms.md).
    Computing,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Suspected => "suspected",
            Stage::Acted => "acted",
            Stage::Computing => "computing",
        }
    }

    /// Alertmanager's `severity` label: a suspected hang warns, an acted one is critical (a job was ended).
    fn severity(self) -> &'static str {
        match self {
            Stage::Suspected | Stage::Computing => "warning",
            Stage::Acted => "critical",
        }
    }
}

/// One alert about one verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Alert {
    pub stage: Stage,
    /// The job's id (Slurm job id, `--job-id`), when known.
    pub job: Option<String>,
    /// The node that sends the alert (the agent's, or the coordinator's host).
    pub node: Option<String>,
    /// Where the evidence is: `NODE:DIR`.
    pub evidence: Option<String>,
    /// Seconds since the Unix epoch when the alert was made.
    pub at_unix_s: f64,
    /// The verdict without its roll-call table (`ranks`): culprits, groups, filesystems, actions and
    /// recommendations are all there; the table of a 10,000-rank job would not fit a chat message.
    pub verdict: Verdict,
}

impl Alert {
    pub fn new(stage: Stage, verdict: &Verdict, at_unix_s: f64) -> Self {
        Self {
            stage,
            job: None,
            node: None,
            evidence: None,
            at_unix_s,
            verdict: verdict.without_ranks(),
        }
    }

    /// The mount that blocks a rank (and its filesystem type), for a verdict blocked in the kernel.
    fn blocking_mount(&self) -> Option<(&str, Option<&str>)> {
        if self.verdict.kind != hangwatch_model::VerdictKind::BlockedInKernel {
            return None;
        }
        self.verdict
            .culprits
            .iter()
            .find_map(|c| Some((c.mount.as_deref()?, c.fstype.as_deref())))
    }

    /// The node to name: the first culprit's, else the one that sends.
    fn culprit_node(&self) -> Option<&str> {
        self.verdict
            .culprits
            .iter()
            .find_map(|c| c.node.as_deref())
            .or(self.node.as_deref())
    }

    /// The one line a person reads first, e.g. `hangwatch: job 4242 hung and was ended — blocked in kernel: rank 0
    /// ... Evidence: n1:/var/tmp/hangwatch-0/run-... Done: terminate ranks 1-7: ok.`
    pub fn one_line(&self) -> String {
        let job = self
            .job
            .as_deref()
            .map(|j| format!("job {j}"))
            .unwrap_or_else(|| "the job".into());
        let head = match self.stage {
            Stage::Suspected => format!("hangwatch: {job} looks hung"),
            Stage::Acted => format!("hangwatch: {job} hung and hangwatch acted"),
            Stage::Computing => format!(
                "hangwatch: {job} makes no progress but its ranks compute; hangwatch is not ending it"
            ),
        };
        let mut line = format!(
            "{head} — {}: {}",
            self.verdict.kind.words(),
            self.verdict.summary.trim_end_matches('.')
        );
        if let Some(scope) = self.verdict.scope {
            line.push_str(&format!(". Scope: {}", scope.as_str()));
            if let Some((mount, fstype)) = self.blocking_mount() {
                line.push_str(&format!(
                    " ({mount}{})",
                    fstype.map(|t| format!(", {t}")).unwrap_or_default()
                ));
            }
        }
        if self.stage == Stage::Acted && !self.verdict.actions.is_empty() {
            let done: Vec<String> = self
                .verdict
                .actions
                .iter()
                .map(|a| {
                    let outcome = if a.ok { "ok" } else { "FAILED" };
                    match &a.detail {
                        Some(detail) => format!("{} ({outcome}: {detail})", a.action),
                        None => format!("{} ({outcome})", a.action),
                    }
                })
                .collect();
            line.push_str(&format!(". Done: {}", done.join("; ")));
        }
        if let Some(news) = self.verdict.recurrence.as_ref().and_then(|r| r.news()) {
            let mut chars = news.chars();
            let capitalized: String = chars
                .next()
                .map(|c| c.to_ascii_uppercase())
                .into_iter()
                .chain(chars)
                .collect();
            line.push_str(&format!(". {capitalized}"));
        }
        if let Some(evidence) = &self.evidence {
            line.push_str(&format!(". Evidence: {evidence}"));
        }
        line
    }
}

/// The webhook body: `text` for Slack, Mattermost and anything compatible (they ignore the rest), and the whole
/// alert under `hangwatch` for receivers that read JSON.
#[derive(Debug, Serialize)]
pub struct ChatMessage<'a> {
    pub text: String,
    pub hangwatch: &'a Alert,
}

pub fn chat_message(alert: &Alert) -> Vec<u8> {
    let message = ChatMessage {
        text: chat_text(&alert.one_line()),
        hangwatch: alert,
    };
    serde_json::to_vec(&message).unwrap_or_default()
}

/// `text` made safe for a chat: the line names paths, files and commands that anyone who can create a file or
/// start a process chose, and Slack reads `<...>` in it as a link or a mention (`<!channel>`, `<http://x|click>`),
/// so `&`, `<` and `>` become `&amp;`, `&lt;`, `&gt;` (Slack's own escaping rules). Control characters (a newline
/// in a file name would fake a line of its own) and bidirectional overrides (which reorder what is shown) are
/// written as `\u{...}`. Mattermost, which takes the same body, mentions on `@channel` and links on `[x](url)`:
/// a word joiner (U+2060, invisible) after each `@` and between `](` keeps both plain text. The JSON under
/// `hangwatch` keeps the exact values.
pub fn chat_text(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut previous = None;
    for c in line.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '@' => out.push_str("@\u{2060}"),
            '(' if previous == Some(']') => out.push_str("\u{2060}("),
            c if c.is_control() || is_bidi_control(c) => {
                out.push_str(&format!("\\u{{{:04x}}}", u32::from(c)))
            }
            c => out.push(c),
        }
        previous = Some(c);
    }
    out
}

/// The characters that change the order in which text is shown (Unicode bidirectional embeddings, overrides
/// and isolates, and the marks).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// One alert of Alertmanager's v2 API (`POST /api/v2/alerts` takes a list of them).
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AlertmanagerAlert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// RFC 3339.
    pub starts_at: String,
}

/// The `alertname` label of every hangwatch alert.
pub const ALERT_NAME: &str = "HangwatchJobHang";

/// Alertmanager's body. The labels identify the hang (alertname, job, node, kind) and its stage, so that the
/// acted alert does not overwrite the suspected one and routes can page only on `severity="critical"`.
pub fn alertmanager_alerts(alert: &Alert) -> Vec<AlertmanagerAlert> {
    let mut labels = BTreeMap::new();
    labels.insert("alertname".to_string(), ALERT_NAME.to_string());
    labels.insert("kind".to_string(), alert.verdict.kind.as_str().to_string());
    labels.insert("stage".to_string(), alert.stage.as_str().to_string());
    labels.insert("severity".to_string(), alert.stage.severity().to_string());
    if let Some(job) = &alert.job {
        labels.insert("job".to_string(), job.clone());
    }
    if let Some(node) = alert.culprit_node() {
        labels.insert("node".to_string(), node.to_string());
    }
    // One incident per mount: a route that groups by `mount` pages storage once for a meltdown under 20 jobs.
    if let Some(scope) = alert.verdict.scope {
        labels.insert("scope".to_string(), scope.as_str().to_string());
    }
    if let Some((mount, fstype)) = alert.blocking_mount() {
        labels.insert("mount".to_string(), mount.to_string());
        if let Some(fstype) = fstype {
            labels.insert("fstype".to_string(), fstype.to_string());
        }
    }
    let mut annotations = BTreeMap::new();
    annotations.insert("summary".to_string(), alert.one_line());
    annotations.insert("description".to_string(), alert.verdict.summary.clone());
    if let Some(evidence) = &alert.evidence {
        annotations.insert("evidence".to_string(), evidence.clone());
    }
    if let Some(first) = alert.verdict.recommendations.first() {
        annotations.insert("action".to_string(), first.clone());
    }
    vec![AlertmanagerAlert {
        labels,
        annotations,
        starts_at: rfc3339(alert.at_unix_s),
    }]
}

pub fn alertmanager_body(alert: &Alert) -> Vec<u8> {
    serde_json::to_vec(&alertmanager_alerts(alert)).unwrap_or_default()
}

/// Alertmanager's alerts endpoint under the URL a user gives: the server (`http://am:9093`) or the endpoint itself.
pub fn alertmanager_endpoint(url: &str) -> String {
    let trimmed = url.trim_end_matches('/');
    if trimmed.ends_with("/api/v2/alerts") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/api/v2/alerts")
    }
}

pub use hangwatch_model::rfc3339;

#[cfg(test)]
mod tests {
    use super::*;
    use hangwatch_model::{ActionRecord, VerdictKind};

    fn verdict() -> Verdict {
        let json = include_str!("../tests/fixtures/blocked-verdict.json");
        serde_json::from_str(json).expect("fixture parses")
    }

    #[test]
    fn the_one_line_names_the_hang_and_the_evidence() {
        let mut alert = Alert::new(Stage::Suspected, &verdict(), 1_764_600_000.0);
        alert.job = Some("4242".into());
        alert.evidence = Some("n1:/var/tmp/hangwatch-0/run-1".into());
        let line = alert.one_line();
        assert!(
            line.starts_with("hangwatch: job 4242 looks hung — blocked in kernel: rank 0"),
            "{line}"
        );
        assert!(
            line.ends_with("Evidence: n1:/var/tmp/hangwatch-0/run-1"),
            "{line}"
        );
        assert!(
            alert.verdict.ranks.is_empty(),
            "the roll-call table stays out of alerts"
        );
    }

    #[test]
    fn the_acted_alert_says_what_was_done() {
        let mut v = verdict();
        v.actions = vec![ActionRecord {
            action: "terminate".into(),
            ranks: vec![1, 2],
            ok: true,
            detail: Some("2 ended by SIGTERM".into()),
            outcomes: Vec::new(),
        }];
        let alert = Alert::new(Stage::Acted, &v, 0.0);
        let line = alert.one_line();
        assert!(line.contains("hung and hangwatch acted"), "{line}");
        assert!(
            line.contains("Done: terminate (ok: 2 ended by SIGTERM)"),
            "{line}"
        );
    }

    #[test]
    fn chat_message_has_text_and_the_verdict() {
        let alert = Alert::new(Stage::Suspected, &verdict(), 0.0);
        let doc: serde_json::Value = serde_json::from_slice(&chat_message(&alert)).unwrap();
        assert!(doc["text"].as_str().unwrap().contains("blocked in kernel"));
        assert_eq!(doc["hangwatch"]["stage"], "suspected");
        assert_eq!(doc["hangwatch"]["verdict"]["kind"], "blocked_in_kernel");
    }

    /// A verdict whose summary names a file chosen by someone hostile.
    fn hostile(name: &str) -> Alert {
        let mut v = verdict();
        v.summary = format!("rank 0 is in write() on /scratch/{name}");
        Alert::new(Stage::Suspected, &v, 0.0)
    }

    #[test]
    fn a_hostile_file_name_cannot_ping_link_or_fake_a_line_in_slack() {
        for (name, must_not, shown) in [
            ("<!channel>", "<!channel>", "&lt;!channel&gt;"),
            ("<!here|here>", "<!here", "&lt;!here|here&gt;"),
            (
                "<http://x.example|click>",
                "<http",
                "&lt;http://x.example|click&gt;",
            ),
            ("<@U024BE7LH>", "<@", "&lt;@\u{2060}U024BE7LH&gt;"),
            ("a&b", "a&b", "a&amp;b"),
            ("x\n*fake line*", "\n", "x\\u{000a}*fake line*"),
            ("ok\u{1b}[31m", "\u{1b}", "ok\\u{001b}[31m"),
            ("evil\u{202e}txt.exe", "\u{202e}", "evil\\u{202e}txt.exe"),
            ("@channel", "@channel", "@\u{2060}channel"),
            (
                "[click](http://x.example)",
                "](",
                "[click]\u{2060}(http://x.example)",
            ),
        ] {
            let alert = hostile(name);
            let doc: serde_json::Value =
                serde_json::from_slice(&chat_message(&alert)).expect("json");
            let text = doc["text"].as_str().expect("text");
            assert!(!text.contains(must_not), "{name:?} is live in {text:?}");
            assert!(
                text.contains(shown),
                "{name:?} is not shown as {shown:?} in {text:?}"
            );
            // The machine-readable copy keeps the exact name.
            assert!(
                doc["hangwatch"]["verdict"]["summary"]
                    .as_str()
                    .expect("summary")
                    .ends_with(name),
                "{doc}"
            );
        }
    }

    #[test]
    fn ordinary_text_is_left_as_it_is() {
        let line = "hangwatch: job 4242 looks hung — blocked in kernel: rank 0 (node n1) in write() on /gpfs/a_b*c.txt";
        assert_eq!(chat_text(line), line);
    }

    #[test]
    fn json_receivers_get_hostile_names_exactly_and_well_formed() {
        let alert = hostile("<!channel>\"\n\u{0}");
        let alerts: serde_json::Value =
            serde_json::from_slice(&alertmanager_body(&alert)).expect("json");
        assert!(
            alerts[0]["annotations"]["description"]
                .as_str()
                .expect("description")
                .ends_with("<!channel>\"\n\u{0}"),
            "{alerts}"
        );
    }

    #[test]
    fn a_job_that_computes_is_a_warning_that_says_it_is_not_ended() {
        let alert = Alert::new(Stage::Computing, &verdict(), 0.0);
        assert!(
            alert.one_line().contains("hangwatch is not ending it"),
            "{}",
            alert.one_line()
        );
        let labels = &alertmanager_alerts(&alert)[0].labels;
        assert_eq!(labels["stage"], "computing");
        assert_eq!(
            labels["severity"], "warning",
            "nobody is paged for a healthy job"
        );
    }

    #[test]
    fn a_storage_incident_is_labelled_by_scope_mount_and_fstype() {
        let mut v = verdict();
        v.scope = Some(hangwatch_model::Scope::Filesystem);
        let alert = Alert::new(Stage::Suspected, &v, 0.0);
        let labels = &alertmanager_alerts(&alert)[0].labels;
        assert_eq!(labels["scope"], "filesystem");
        assert_eq!(labels["mount"], v.culprits[0].mount.clone().unwrap());
        assert_eq!(labels["fstype"], v.culprits[0].fstype.clone().unwrap());
        assert!(
            alert.one_line().contains(". Scope: filesystem ("),
            "{}",
            alert.one_line()
        );
    }

    #[test]
    fn alertmanager_labels_name_job_node_and_kind() {
        let mut alert = Alert::new(Stage::Acted, &verdict(), 1_764_600_000.5);
        alert.job = Some("4242".into());
        alert.node = Some("n9".into());
        let alerts = alertmanager_alerts(&alert);
        assert_eq!(alerts.len(), 1);
        let labels = &alerts[0].labels;
        assert_eq!(labels["alertname"], ALERT_NAME);
        assert_eq!(labels["job"], "4242");
        assert_eq!(labels["node"], "n1", "the culprit's node, not the sender's");
        assert_eq!(labels["kind"], VerdictKind::BlockedInKernel.as_str());
        assert_eq!(labels["severity"], "critical");
        assert_eq!(alerts[0].starts_at, "2025-12-01T14:40:00.5Z");
        let body: serde_json::Value = serde_json::from_slice(&alertmanager_body(&alert)).unwrap();
        assert!(body[0]["startsAt"].is_string(), "{body}");
    }

    #[test]
    fn alertmanager_endpoint_is_added_once() {
        assert_eq!(
            alertmanager_endpoint("http://am:9093"),
            "http://am:9093/api/v2/alerts"
        );
        assert_eq!(
            alertmanager_endpoint("http://am:9093/"),
            "http://am:9093/api/v2/alerts"
        );
        assert_eq!(
            alertmanager_endpoint("https://am/x/api/v2/alerts"),
            "https://am/x/api/v2/alerts"
        );
    }
}
