//! The coordinator in process on 127.0.0.1:0 with fake agents speaking the real protocol: registration, the
//! token, duplicates, silence, and the job-wide roll call.

mod common;

use std::time::{Duration, Instant};

use common::fixtures::incident_node;
use common::{
    config, register_request, secret, token, wait_for, with_logs, Answer, FakeAgent, Server,
};
use hangwatch_model::VerdictKind;
use hangwatch_rpc::pb::order;
use hangwatch_rpc::{
    with_deadline, ConnectError, JobSecret, JobToken, Refusal, RefusalKind, REGISTER_DEADLINE,
};

const PER_NODE: u32 = 4;
const FAST: Duration = Duration::from_millis(100);

async fn agents(server: &Server, n: u32, answer: impl Fn(u32) -> Answer) -> Vec<FakeAgent> {
    common::join_agents(server, n, PER_NODE, FAST, answer).await
}

#[tokio::test]
async fn agents_register_attach_and_report_progress() {
    let server = Server::start(config()).await;
    let _agents = agents(&server, 3, |_| Answer::Never).await;
    let members = server.coordinator.members();
    let nodes: Vec<(&str, u32, &[u32])> = members
        .iter()
        .map(|m| (m.node.as_str(), m.node_rank, m.ranks.as_slice()))
        .collect();
    assert_eq!(
        nodes,
        vec![
            ("n1", 0, &[0, 1, 2, 3][..]),
            ("n2", 1, &[4, 5, 6, 7][..]),
            ("n3", 2, &[8, 9, 10, 11][..])
        ]
    );
    assert!(
        wait_for(Duration::from_secs(20), || server
            .coordinator
            .members()
            .iter()
            .all(|m| m.progress.len() == PER_NODE as usize))
        .await,
        "every node's progress arrives: {:?}",
        server.coordinator.members()
    );
    let m = &server.coordinator.members()[1];
    assert_eq!((m.progress[0].rank, m.progress[0].step), (4, Some(7)));
    assert!(server.coordinator.unreachable_nodes().is_empty());
    server.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn an_agent_with_another_token_or_another_jobs_id_cannot_connect_changes_nothing_and_is_logged(
) {
    let (_, logs) = with_logs(async {
        let server = Server::start(config()).await;
        let wrong_token = JobSecret::new(
            JobToken::new("5d2e8a41c09b7f36e1a4d8c25b90f7e3").expect("token"),
            common::JOB,
        )
        .expect("key");
        let other_job = JobSecret::new(token(), "job-43").expect("key");
        for secret in [&wrong_token, &other_job] {
            let err = server
                .try_client(secret)
                .await
                .expect_err("the handshake fails: the coordinator holds another key");
            assert!(
                matches!(err, ConnectError::NotTheJobs { .. }),
                "{}",
                hangwatch_model::error_chain(&err)
            );
            let text = err.to_string();
            assert!(
                text.contains("did not prove that it holds this job's key")
                    && text.contains(&secret.key().id()),
                "{text}"
            );
        }
        assert!(
            server.coordinator.members().is_empty(),
            "nothing registered"
        );
        // The right secret still works afterwards.
        let _a = agents(&server, 1, |_| Answer::Never).await;
        assert_eq!(server.coordinator.members().len(), 1);
        server.shutdown().await;
    })
    .await;
    let refused: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("refused connections that did not prove the job's key"))
        .collect();
    assert_eq!(refused.len(), 1, "one summary line a minute: {logs}");
    assert!(
        refused[0].contains("WARN")
            && refused[0].contains("peer=127.0.0.1:")
            && refused[0].contains("another token file or job id"),
        "the log says the likely cause: {logs}"
    );
    assert!(
        !logs.contains(common::TOKEN),
        "the token is never logged: {logs}"
    );
}

#[tokio::test]
async fn a_duplicate_node_another_version_and_a_late_join_are_refused_with_a_clear_error() {
    let mut cfg = config();
    cfg.expected_nodes = Some(2);
    let server = Server::start(cfg).await;
    let first = agents(&server, 1, |_| Answer::Never).await;
    let mut client = server.client(&secret()).await;

    let status = client
        .register(with_deadline(
            register_request("n1", 0, PER_NODE),
            REGISTER_DEADLINE,
        ))
        .await
        .expect_err("duplicate refused");
    assert_eq!(status.code(), tonic::Code::AlreadyExists);
    let refusal = Refusal::from_status(&status).expect("a typed refusal");
    assert_eq!(refusal.kind, RefusalKind::DuplicateNode);
    assert!(
        refusal.message.contains("node n1 is already registered"),
        "{}",
        refusal.message
    );

    let mut old = register_request("n2", 1, PER_NODE);
    old.protocol_version = 99;
    let status = client
        .register(with_deadline(old, REGISTER_DEADLINE))
        .await
        .expect_err("version refused");
    assert_eq!(
        Refusal::from_status(&status).map(|r| r.kind),
        Some(RefusalKind::VersionMismatch)
    );
    assert!(
        status.message().contains("protocol 99"),
        "{}",
        status.message()
    );

    let members = server.coordinator.members();
    assert_eq!(members.len(), 1);
    assert_eq!(
        members[0].session_id, first[0].session_id,
        "the first n1 keeps its session"
    );

    client
        .register(with_deadline(
            register_request("n2", 1, PER_NODE),
            REGISTER_DEADLINE,
        ))
        .await
        .expect("n2 joins");
    let status = client
        .register(with_deadline(
            register_request("n3", 2, PER_NODE),
            REGISTER_DEADLINE,
        ))
        .await
        .expect_err("late join refused");
    assert_eq!(
        Refusal::from_status(&status).map(|r| r.kind),
        Some(RefusalKind::JobComplete)
    );
    assert!(
        status.message().contains("late join"),
        "{}",
        status.message()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn an_agent_that_stops_sending_progress_becomes_unreachable_within_the_silence() {
    let mut cfg = config();
    // Generous against a loaded machine: a healthy agent reports 30 times per silence.
    cfg.silence = Duration::from_secs(3);
    cfg.progress_interval = FAST;
    let server = Server::start(cfg).await;
    let mut agents = agents(&server, 3, |_| Answer::Never).await;
    assert!(server.coordinator.unreachable_nodes().is_empty());
    agents[1].fall_silent();
    let silent_at = Instant::now();
    assert!(
        wait_for(Duration::from_secs(30), || !server
            .coordinator
            .unreachable_nodes()
            .is_empty())
        .await,
        "n2 never became unreachable"
    );
    // Its last report left at most one interval before it fell silent.
    assert!(
        silent_at.elapsed() >= Duration::from_secs(3) - FAST,
        "not before the configured silence"
    );
    assert_eq!(
        server.coordinator.unreachable_nodes(),
        vec!["n2".to_string()],
        "only the silent node"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_roll_call_across_three_agents_gives_one_verdict_naming_the_node_and_rank() {
    let server = Server::start(config()).await;
    let agents = agents(&server, 3, |r| Answer::Now(incident_node(r, PER_NODE))).await;
    let outcome = server.coordinator.roll_call(Duration::from_secs(20)).await;
    assert_eq!(outcome.answered, vec!["n1", "n2", "n3"]);
    assert!(outcome.not_answered.is_empty());
    let v = &outcome.verdict;
    assert_eq!(v.kind, VerdictKind::BlockedInKernel, "{}", v.summary);
    assert_eq!(v.culprits.len(), 1, "{:?}", v.culprits);
    let c = &v.culprits[0];
    assert_eq!(
        (c.rank, c.node.as_deref(), c.state.as_str()),
        (Some(0), Some("n1"), "D")
    );
    assert_eq!(c.syscall.as_deref(), Some("write"));
    assert_eq!(c.path.as_deref(), Some("/gpfs/run/log.txt"));
    assert_eq!(c.mount.as_deref(), Some("/gpfs"));
    assert!(
        v.summary.contains("11 ranks on 3 nodes wait in barrier"),
        "{}",
        v.summary
    );
    assert!(v.nodes_not_seen.is_empty());

    // The same story goes back to every node with the order to end the job.
    let ordered = server
        .coordinator
        .terminate("rank 0 on n1 is hung", Some(v));
    assert_eq!(ordered.len(), 3);
    for a in &agents {
        assert!(
            wait_for(Duration::from_secs(20), || a
                .received
                .lock()
                .expect("lock")
                .iter()
                .any(|o| matches!(&o.kind, Some(order::Kind::Terminate(t)) if !t.verdict_json.is_empty())))
            .await,
            "{} got no terminate order",
            a.node
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn an_agent_that_does_not_answer_in_time_is_named_as_late_and_the_roll_call_still_returns() {
    let server = Server::start(config()).await;
    let deadline = Duration::from_secs(2);
    let agents = agents(&server, 3, |r| match r {
        2 => Answer::After(Duration::from_secs(4), incident_node(r, PER_NODE)),
        _ => Answer::Now(incident_node(r, PER_NODE)),
    })
    .await;
    let started = Instant::now();
    let outcome = server.coordinator.roll_call(deadline).await;
    let took = started.elapsed();
    assert!(
        took >= deadline,
        "it waited for the late node until the deadline ({took:?})"
    );
    assert!(
        took < deadline + Duration::from_secs(10),
        "it returned at the deadline, not when n3 answered ({took:?})"
    );
    assert_eq!(outcome.answered, vec!["n1", "n2"]);
    assert_eq!(outcome.not_answered, vec!["n3"]);
    assert_eq!(
        outcome.answered_late,
        vec!["n3"],
        "n3 still reports progress"
    );
    let v = &outcome.verdict;
    assert_eq!(v.nodes_late, vec!["n3"], "{}", v.summary);
    assert!(v.nodes_not_seen.is_empty(), "{}", v.summary);
    assert_eq!(
        v.culprits.first().and_then(|c| c.rank),
        Some(0),
        "{}",
        v.summary
    );
    assert_eq!(
        v.culprits.first().and_then(|c| c.node.as_deref()),
        Some("n1")
    );
    // n3's answer, when it finally comes, is acknowledged as not used.
    assert!(
        wait_for(Duration::from_secs(30), || !agents[2]
            .acks
            .lock()
            .expect("lock")
            .is_empty())
        .await,
        "n3 never answered"
    );
    assert!(matches!(agents[2].acks.lock().expect("lock")[0], Ok(false)));
    server.shutdown().await;
}
