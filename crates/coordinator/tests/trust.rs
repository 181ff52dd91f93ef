//! The coordinator trusts only what a node can know (docs/coordinator-protocol.md): a node speaks for its own
//! processes only, node names are hostnames, sessions are not guessable, and a node that answers a roll call late
//! while it still reports progress is slow, not unreachable.

mod common;

use std::time::Duration;

use common::fixtures::{node_name, stuck_node_claiming, waiting_node};
use common::{config, register_request, secret, wait_for, Answer, FakeAgent, Server};
use hangwatch_model::VerdictKind;
use hangwatch_rpc::{with_deadline, Refusal, RefusalKind, REGISTER_DEADLINE};

const PER_NODE: u32 = 4;
const FAST: Duration = Duration::from_millis(100);

async fn agents_on(server: &Server, n: u32, answer: impl Fn(u32) -> Answer) -> Vec<FakeAgent> {
    common::join_agents(server, n, PER_NODE, FAST, answer).await
}

#[tokio::test]
async fn an_answer_that_places_its_stuck_rank_on_another_node_blames_the_sender() {
    let server = Server::start(config()).await;
    // n3 is the one with a rank in D, but says that rank (and itself) is on n1.
    let _agents = agents_on(&server, 3, |r| match r {
        2 => Answer::Now(stuck_node_claiming(r, PER_NODE, "n1")),
        _ => Answer::Now(waiting_node(r, PER_NODE)),
    })
    .await;
    let outcome = server.coordinator.roll_call(Duration::from_secs(20)).await;
    assert_eq!(outcome.answered, vec!["n1", "n2", "n3"]);
    let v = &outcome.verdict;
    assert!(!v.culprits.is_empty(), "{}", v.summary);
    for c in &v.culprits {
        assert_eq!(c.node.as_deref(), Some("n3"), "{}", v.summary);
    }
    for r in &v.ranks {
        let sender = r.rank.map(|rank| node_name(rank / PER_NODE));
        assert_eq!(r.node, sender, "rank {:?}: {}", r.rank, v.summary);
    }
    assert!(
        !v.summary.contains("n1,") && !v.summary.contains("node n1"),
        "{}",
        v.summary
    );
    let bad = hangwatch_diagnosis::requeue::bad_nodes(v);
    assert!(
        bad.iter().all(|n| n == "n3"),
        "only the sender may be kept out: {bad:?}"
    );
    for o in &outcome.observations {
        let node = o.node.as_deref();
        assert!(o.processes().all(|p| p.node.as_deref() == node), "{node:?}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_node_name_that_is_not_a_hostname_is_refused_at_join_with_the_rule() {
    let server = Server::start(config()).await;
    let mut client = server.client(&secret()).await;
    for bad in ["n[1-8]", "n1,n7", "n1 n7", ""] {
        let status = client
            .register(with_deadline(
                register_request(bad, 0, PER_NODE),
                REGISTER_DEADLINE,
            ))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{bad:?}");
        let refusal = Refusal::from_status(&status).expect("a typed refusal");
        assert_eq!(refusal.kind, RefusalKind::BadRequest);
        if !bad.is_empty() {
            assert!(
                refusal
                    .message
                    .contains(&format!("node name {bad:?} is not a hostname"))
                    && refusal.message.contains("letters, digits, '.', '_' or '-'"),
                "{}",
                refusal.message
            );
        }
    }
    assert!(server.coordinator.members().is_empty());
    server.shutdown().await;
}

#[tokio::test]
async fn a_node_that_answers_late_but_still_reports_progress_is_late_not_unreachable_and_not_excluded(
) {
    let mut cfg = config();
    cfg.silence = Duration::from_secs(2);
    cfg.progress_interval = FAST;
    let server = Server::start(cfg).await;
    let deadline = Duration::from_secs(3);
    // Every rank seen waits in the barrier (no rank stands out); n3 is loaded: its answer comes after the
    // deadline while its progress reports keep coming; n4's agent hangs and falls silent.
    let mut agents = agents_on(&server, 4, |r| match r {
        2 => Answer::After(Duration::from_secs(5), waiting_node(r, PER_NODE)),
        3 => Answer::Never,
        _ => Answer::Now(waiting_node(r, PER_NODE)),
    })
    .await;
    agents[3].fall_silent();
    let outcome = server.coordinator.roll_call(deadline).await;
    assert_eq!(outcome.not_answered, vec!["n3", "n4"]);
    assert_eq!(outcome.answered_late, vec!["n3"]);
    let v = &outcome.verdict;
    assert_eq!(v.nodes_late, vec!["n3"], "{}", v.summary);
    assert_eq!(v.nodes_not_seen, vec!["n4"], "{}", v.summary);
    assert_eq!(v.kind, VerdictKind::NodeUnreachable, "n4 is: {}", v.summary);
    assert!(v.summary.contains("node n3 answered late"), "{}", v.summary);
    assert!(!v.summary.contains("n3 was not seen"), "{}", v.summary);
    let bad = hangwatch_diagnosis::requeue::bad_nodes(v);
    assert_eq!(bad, vec!["n4"], "the silent node, never the late one");

    // Without the silent node, the late one alone makes no node_unreachable and nothing conclusive.
    drop(agents.pop());
    let server2 = Server::start({
        let mut c = config();
        c.silence = Duration::from_secs(2);
        c.progress_interval = FAST;
        c
    })
    .await;
    let _three = agents_on(&server2, 3, |r| match r {
        2 => Answer::After(Duration::from_secs(5), waiting_node(r, PER_NODE)),
        _ => Answer::Now(waiting_node(r, PER_NODE)),
    })
    .await;
    let outcome = server2.coordinator.roll_call(deadline).await;
    let v = &outcome.verdict;
    assert_ne!(v.kind, VerdictKind::NodeUnreachable, "{}", v.summary);
    assert!(v.nodes_not_seen.is_empty(), "{}", v.summary);
    assert_eq!(v.nodes_late, vec!["n3"], "{}", v.summary);
    assert!(
        !hangwatch_diagnosis::is_conclusive_for_job(v),
        "{}",
        v.summary
    );
    assert!(hangwatch_diagnosis::requeue::bad_nodes(v).is_empty());
    assert!(
        wait_for(Duration::from_secs(20), || server2
            .coordinator
            .unreachable_nodes()
            .is_empty())
        .await,
        "n3 is never unreachable"
    );
    server2.shutdown().await;
    server.shutdown().await;
}

#[tokio::test]
async fn session_ids_are_128_random_bits_and_a_guessed_one_is_refused() {
    let server = Server::start(config()).await;
    let agents = agents_on(&server, 2, |_| Answer::Never).await;
    let ids: Vec<&str> = agents.iter().map(|a| a.session_id.as_str()).collect();
    for id in &ids {
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    }
    assert_ne!(ids[0], ids[1]);
    let mut client = server.client(&secret()).await;
    for guess in ["1", "2", &"0".repeat(32)] {
        let status = client
            .report_roll_call(with_deadline(
                hangwatch_rpc::pb::RollCallReport {
                    session_id: guess.to_string(),
                    roll_call_id: 1,
                    observations_json: Vec::new(),
                },
                REGISTER_DEADLINE,
            ))
            .await
            .expect_err("an unknown session is refused");
        assert_eq!(
            Refusal::from_status(&status).map(|r| r.kind),
            Some(RefusalKind::UnknownSession)
        );
    }
    server.shutdown().await;
}
