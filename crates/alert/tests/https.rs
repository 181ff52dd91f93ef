//! Alerts reach real receivers over HTTPS: a webhook and an Alertmanager-shaped endpoint served by
//! `tests/python/alert_receiver.py` with a certificate from a CA made for the test (trusted with `ca_file`).

use std::time::Duration;

use hangwatch_alert::{Alert, Alerter, Limits, Stage, TargetKind, Targets, ALERT_NAME};
use hangwatch_model::Verdict;
use hangwatch_testkit::{require, AlertReceiver};

fn verdict() -> Verdict {
    serde_json::from_str(include_str!("fixtures/blocked-verdict.json")).expect("fixture parses")
}

#[test]
fn both_alerts_reach_an_https_webhook_and_alertmanager_after_a_503() {
    let receiver = require!(AlertReceiver::https(1));
    let alerter = Alerter::new(
        Targets {
            webhook: Some(format!("{}/hooks/T000/B000/secret", receiver.base_url())),
            alertmanager: Some(receiver.base_url()),
            ca_file: Some(receiver.ca_file()),
            ..Targets::default()
        },
        Limits {
            deadline: Duration::from_secs(20),
            attempt_timeout: Duration::from_secs(5),
            ..Limits::default()
        },
    )
    .unwrap();
    let mut suspected = Alert::new(Stage::Suspected, &verdict(), 1_764_600_000.0);
    suspected.job = Some("4242".into());
    suspected.evidence = Some("n1:/var/tmp/hangwatch-0/run-x".into());
    alerter.send(&suspected);
    let mut acted = suspected.clone();
    acted.stage = Stage::Acted;
    alerter.send(&acted);
    assert_eq!(
        alerter.wait(Duration::from_secs(60)),
        0,
        "alerts still in flight"
    );

    let delivered = |r: &serde_json::Value| r["answered"] == 200;
    let hooks = receiver.wait_for(2, Duration::from_secs(5), |r| {
        delivered(r) && r["path"] == "/hooks/T000/B000/secret"
    });
    assert_eq!(hooks.len(), 2, "{:#?}", receiver.requests());
    for hook in &hooks {
        assert_eq!(hook["content_type"], "application/json");
        let text = hook["body"]["text"].as_str().unwrap();
        assert!(
            text.contains("blocked in kernel: rank 0 (node n1"),
            "{text}"
        );
        assert!(
            text.contains("Evidence: n1:/var/tmp/hangwatch-0/run-x"),
            "{text}"
        );
        assert_eq!(
            hook["body"]["hangwatch"]["verdict"]["kind"],
            "blocked_in_kernel"
        );
    }
    let stages: Vec<&str> = hooks
        .iter()
        .map(|h| h["body"]["hangwatch"]["stage"].as_str().unwrap())
        .collect();
    assert!(
        stages.contains(&"suspected") && stages.contains(&"acted"),
        "{stages:?}"
    );

    let am = receiver.wait_for(2, Duration::from_secs(5), |r| {
        delivered(r) && r["path"] == "/api/v2/alerts"
    });
    assert_eq!(am.len(), 2, "{:#?}", receiver.requests());
    for post in &am {
        let alerts = post["body"].as_array().expect("v2 takes a list of alerts");
        let labels = &alerts[0]["labels"];
        assert_eq!(labels["alertname"], ALERT_NAME);
        assert_eq!(labels["job"], "4242");
        assert_eq!(labels["node"], "n1");
        assert_eq!(labels["kind"], "blocked_in_kernel");
        assert!(alerts[0]["startsAt"]
            .as_str()
            .unwrap()
            .starts_with("2025-12-01T"));
        assert!(alerts[0]["annotations"]["summary"].is_string());
    }

    // One 503 was retried; every delivery is recorded without the webhook's secret path.
    assert_eq!(receiver.requests().len(), 5, "{:#?}", receiver.requests());
    let deliveries = alerter.deliveries();
    assert_eq!(deliveries.len(), 4);
    assert!(deliveries.iter().all(|d| d.ok), "{deliveries:#?}");
    assert_eq!(deliveries.iter().map(|d| d.attempts).sum::<u32>(), 5);
    let hook = deliveries
        .iter()
        .find(|d| d.target == TargetKind::Webhook)
        .unwrap();
    assert!(!hook.to.contains("secret"), "{}", hook.to);
}

#[test]
fn an_untrusted_certificate_is_a_failed_alert_not_a_silent_one() {
    let receiver = require!(AlertReceiver::https(0));
    let alerter = Alerter::new(
        Targets {
            webhook: Some(format!("{}/hook", receiver.base_url())),
            ..Targets::default()
        },
        Limits {
            deadline: Duration::from_secs(2),
            attempt_timeout: Duration::from_secs(2),
            ..Limits::default()
        },
    )
    .unwrap();
    alerter.send(&Alert::new(Stage::Suspected, &verdict(), 0.0));
    assert_eq!(alerter.wait(Duration::from_secs(30)), 0);
    let d = &alerter.deliveries()[0];
    assert!(!d.ok);
    let error = d.error.as_deref().unwrap().to_lowercase();
    assert!(
        error.contains("certificate") || error.contains("issuer"),
        "{error}"
    );
    assert!(receiver.requests().is_empty());
}
