//! The fleet database against a real PostgreSQL server started by the test (testkit's `PostgresServer`): two
//! nodes with their own local histories see each other's hang and one incident; a stopped server and one that
//! accepts and never answers cost no more than the deadline, and what waited ships when the server is back; a
//! database from a newer hangwatch is refused and left alone; a role with only INSERT and SELECT can ship.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hangwatch_fleet::{
    record_child_main, ConnectError, FleetDb, FleetQuery, FleetTarget, ProcessEnv, SCHEMA_VERSION,
};
use hangwatch_history::{HistoryDb, HistoryRequest, DB_FILE_NAME};
use hangwatch_model::{unix_now, Recurrence, RecurrenceSource, Verdict};
use hangwatch_testkit::{require, PostgresServer};

fn verdict(node: &str, mount: &str) -> Verdict {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../history/tests/fixtures/blocked-write-n1.json"
    );
    let mut v: Verdict =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("a verdict");
    v.culprits[0].at.node = Some(node.into());
    v.culprits[0].at.mount = Some(mount.into());
    v
}

fn target(server: &PostgresServer, deadline_s: f64) -> FleetTarget {
    FleetTarget {
        url: server.url(),
        password_file: Some(server.password_file().expect("password file")),
        incident_window_s: 900.0,
        deadline_s,
    }
}

/// Records as the `__record-history` child does; every answer it gave, and how long it took.
fn record(
    state: &Path,
    node: &str,
    job: &str,
    at: f64,
    fleet: Option<FleetTarget>,
    mount: &str,
) -> (Vec<Recurrence>, Duration) {
    let request = HistoryRequest::new(&verdict(node, mount), node, Some(job.into()), None, at)
        .with_fleet(fleet);
    let input = serde_json::to_vec(&request).expect("json");
    let mut answers = Vec::new();
    let started = Instant::now();
    record_child_main(&state.join(DB_FILE_NAME), input.as_slice(), |r| {
        answers.push(r.clone());
        Ok(())
    })
    .expect("recorded");
    (answers, started.elapsed())
}

fn state_dir(root: &Path, node: &str) -> PathBuf {
    root.join(node)
}

#[test]
fn two_nodes_see_each_others_hang_and_one_incident() {
    let server = require!(PostgresServer::start());
    let root = tempfile::tempdir().expect("tempdir");
    let fleet = target(&server, 10.0);
    let now = unix_now();
    let (first, _) = record(
        &state_dir(root.path(), "n1"),
        "n1",
        "1234",
        now - 300.0,
        Some(fleet.clone()),
        "/gpfs",
    );
    let first = first.last().expect("an answer");
    assert_eq!(first.source, RecurrenceSource::Fleet, "{first:?}");
    assert_eq!(first.seen_before, 0);
    assert!(first.incident.is_none());

    let (second, _) = record(
        &state_dir(root.path(), "n2"),
        "n2",
        "1240",
        now,
        Some(fleet.clone()),
        "/gpfs",
    );
    assert_eq!(second.len(), 2, "the local answer first, then the fleet's");
    assert_eq!(second[0].source, RecurrenceSource::Local);
    assert_eq!(
        second[0].seen_before, 0,
        "n2's own history has never seen it"
    );
    let second = &second[1];
    assert_eq!(second.source, RecurrenceSource::Fleet, "{second:?}");
    assert!(second.seen_before >= 1);
    assert_eq!(second.last_nodes, ["n1"]);
    assert_eq!(second.fingerprint, first.fingerprint);
    let incident = second.incident.as_ref().expect("an incident");
    assert_eq!(incident.mount, "/gpfs");
    assert_eq!(incident.others.len(), 1);
    assert_eq!(incident.others[0].node, "n1");
    assert_eq!(incident.others[0].job_id.as_deref(), Some("1234"));
    let sentence = second.sentence();
    assert!(
        sentence.starts_with("seen 1 time before on other nodes: n1 (job 1234, 5 min ago)"),
        "{sentence}"
    );
    assert!(
        sentence.contains("storage incident: /gpfs (ext4) also blocked job 1234 on n1"),
        "{sentence}"
    );

    // Outside the window, or on another mount: a recurrence, no incident.
    let (later, _) = record(
        &state_dir(root.path(), "n3"),
        "n3",
        "1300",
        now + 3600.0,
        Some(fleet.clone()),
        "/gpfs",
    );
    let later = later.last().expect("an answer");
    assert_eq!(later.seen_before, 2);
    assert_eq!(later.last_nodes, ["n2", "n1"]);
    assert!(later.incident.is_none());
    let (other, _) = record(
        &state_dir(root.path(), "n4"),
        "n4",
        "1301",
        now + 3601.0,
        Some(fleet),
        "/lustre",
    );
    assert!(other.last().expect("an answer").incident.is_none());

    // Nothing waits locally: every row was shipped.
    for node in ["n1", "n2", "n3", "n4"] {
        let db =
            HistoryDb::open_existing(&state_dir(root.path(), node).join(DB_FILE_NAME)).expect("db");
        assert_eq!(db.pending_count().expect("count"), 0, "{node}");
    }
    assert_eq!(
        server
            .psql("SELECT COUNT(*) FROM fleet_verdicts")
            .expect("psql"),
        "4"
    );

    let mut db = FleetDb::connect(&target(&server, 10.0), &ProcessEnv, Duration::from_secs(10))
        .expect("connect");
    let listed = db.list(&FleetQuery::default()).expect("list");
    assert_eq!(listed.len(), 4);
    assert_eq!(listed[0].node, "n4");
    let causes = db.by_cause(&FleetQuery::default()).expect("causes");
    assert_eq!(causes.len(), 2, "/gpfs and /lustre are two causes");
    assert_eq!(causes[1].count, 3);
    assert_eq!(causes[1].nodes, ["n1", "n2", "n3"]);
    let mounts = db.by_mount(&FleetQuery::default()).expect("mounts");
    let gpfs = mounts
        .iter()
        .find(|m| m.mount_point == "/gpfs")
        .expect("/gpfs");
    assert_eq!((gpfs.count, gpfs.jobs), (3, 3));
    let recent = db
        .list(&FleetQuery {
            since_unix_s: Some(now + 1.0),
            limit: Some(1),
        })
        .expect("list");
    assert_eq!(recent.len(), 1);
}

#[test]
fn a_stopped_database_costs_the_deadline_and_what_waited_ships_when_it_is_back() {
    let mut server = require!(PostgresServer::start());
    let root = tempfile::tempdir().expect("tempdir");
    let state = state_dir(root.path(), "n1");
    let fleet = target(&server, 2.0);
    let now = unix_now();
    record(&state, "n1", "1", now - 10.0, Some(fleet.clone()), "/gpfs");
    server.stop().expect("stopped");

    let (answers, took) = record(&state, "n1", "2", now - 5.0, Some(fleet.clone()), "/gpfs");
    println!("recording with the database stopped took {took:?}");
    assert!(took < Duration::from_millis(2500), "{took:?}");
    let answer = answers.last().expect("an answer");
    assert_eq!(answer.source, RecurrenceSource::Local);
    assert_eq!(answer.seen_before, 1, "the node's own history answers");
    let why = answer.fleet_unavailable.as_deref().expect("says why");
    assert!(why.contains("cannot connect"), "{why}");
    let db = HistoryDb::open_existing(&state.join(DB_FILE_NAME)).expect("db");
    assert_eq!(db.pending_count().expect("count"), 1);

    server.start_again().expect("started again");
    let (answers, _) = record(&state, "n1", "3", now, Some(fleet), "/gpfs");
    let answer = answers.last().expect("an answer");
    assert_eq!(answer.source, RecurrenceSource::Fleet, "{answer:?}");
    assert_eq!(
        answer.seen_before, 2,
        "the verdict that waited was shipped first"
    );
    assert_eq!(db.pending_count().expect("count"), 0);
    assert_eq!(
        server
            .psql("SELECT string_agg(job_id, ',' ORDER BY at_unix_s) FROM fleet_verdicts")
            .expect("psql"),
        "1,2,3"
    );
}

#[test]
fn a_database_that_accepts_and_never_answers_costs_no_more_than_the_deadline() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    let root = tempfile::tempdir().expect("tempdir");
    let fleet = FleetTarget {
        url: format!("postgresql://hw@127.0.0.1:{port}/fleet"),
        password_file: None,
        incident_window_s: 900.0,
        deadline_s: 1.0,
    };
    let (answers, took) = record(root.path(), "n1", "1", unix_now(), Some(fleet), "/gpfs");
    println!("recording against a silent database took {took:?} (deadline 1 s)");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    let answer = answers.last().expect("an answer");
    assert_eq!(answer.source, RecurrenceSource::Local);
    assert!(answer
        .fleet_unavailable
        .as_deref()
        .unwrap_or_default()
        .contains("did not answer within 1.0s"));
}

#[test]
fn a_newer_schema_is_refused_and_left_alone() {
    let server = require!(PostgresServer::start());
    let fleet = target(&server, 10.0);
    let mut db = FleetDb::connect(&fleet, &ProcessEnv, Duration::from_secs(10)).expect("connect");
    assert_eq!(db.schema_version().expect("version"), SCHEMA_VERSION);
    drop(db);
    server
        .psql("UPDATE hangwatch_schema SET version = 99")
        .expect("psql");
    let err = FleetDb::connect(&fleet, &ProcessEnv, Duration::from_secs(10))
        .err()
        .expect("refused");
    assert!(
        matches!(err, ConnectError::NewerSchema { found: 99, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("newer than this hangwatch knows"),
        "{err}"
    );
    assert_eq!(
        server
            .psql("SELECT version FROM hangwatch_schema")
            .expect("psql"),
        "99"
    );
}

#[test]
fn a_role_with_only_insert_and_select_ships_and_looks_up() {
    let server = require!(PostgresServer::start());
    // The owner creates the schema once (what `hangwatch history --fleet` as the owner does).
    FleetDb::connect(&target(&server, 10.0), &ProcessEnv, Duration::from_secs(10)).expect("owner");
    server
        .psql(
            "CREATE ROLE hw_node LOGIN PASSWORD 'node-pw';
             GRANT SELECT, INSERT ON fleet_verdicts TO hw_node;
             GRANT SELECT ON hangwatch_schema TO hw_node;",
        )
        .expect("role");
    let root = tempfile::tempdir().expect("tempdir");
    let pw = root.path().join("pw");
    std::fs::write(&pw, "node-pw\n").expect("pw");
    std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let fleet = FleetTarget {
        url: format!("postgresql://hw_node@127.0.0.1:{}/postgres", server.port()),
        password_file: Some(pw),
        incident_window_s: 900.0,
        deadline_s: 10.0,
    };
    let now = unix_now();
    record(
        &root.path().join("a"),
        "n1",
        "1",
        now - 1.0,
        Some(fleet.clone()),
        "/gpfs",
    );
    let (answers, _) = record(&root.path().join("b"), "n2", "2", now, Some(fleet), "/gpfs");
    let answer = answers.last().expect("an answer");
    assert_eq!(answer.source, RecurrenceSource::Fleet, "{answer:?}");
    assert_eq!(answer.seen_before, 1);
}
