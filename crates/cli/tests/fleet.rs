//! The fleet database as `run` and a user meet it, against a PostgreSQL server of the test's own: two nodes
//! (separate state directories) record the same frozen-mount verdict through the `__record-history` child that
//! `run` uses, and the second hears about the first (source fleet, an incident on the same mount); a database
//! that accepts and never answers costs the verdict no more than its deadline, and what waited ships at the
//! next `run` start (`__ship-history`); `history --fleet` lists it all; a password on the command line and a
//! password file others can read are refused before anything runs.
//!
//! The link: the test's server takes TCP connections through TLS only (`hostssl`, its own CA), and its log says
//! that hangwatch's connections were encrypted; the site's CA comes from the configuration file (`history_ca`); a
//! server without TLS is refused with what to do, and used only where the site says `insecure_history = true`,
//! never with the password.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hangwatch_history::{FleetTarget, HistoryDb, HistoryRequest, Recurrence};
use hangwatch_model::{unix_now, RecurrenceSource, Verdict};
use hangwatch_testkit::{require, PostgresServer};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_hangwatch");
/// `run`'s own deadline for a recording.
const RUN_DEADLINE: Duration = Duration::from_secs(3);

fn verdict(node: &str) -> Verdict {
    let path = format!(
        "{}/../history/tests/fixtures/blocked-write-n1.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut v: Verdict =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("a verdict");
    v.culprits[0].at.node = Some(node.into());
    v.culprits[0].at.mount = Some("/gpfs".into());
    v.culprits[0].at.fstype = Some("gpfs".into());
    v
}

fn fleet(server: &PostgresServer) -> FleetTarget {
    FleetTarget {
        url: server.url(),
        password_file: Some(server.password_file().expect("password file")),
        incident_window_s: 900.0,
        deadline_s: 2.0,
    }
}

/// Records as `run` does (the abandonable child, `run`'s 3 s deadline); the answer and how long it took.
fn record(
    state: &Path,
    node: &str,
    job: &str,
    fleet: Option<FleetTarget>,
) -> (Recurrence, Duration) {
    let request = HistoryRequest::new(&verdict(node), node, Some(job.into()), None, unix_now())
        .with_fleet(fleet);
    let started = Instant::now();
    let answer = hangwatch_agent::history::record_abandonable(
        Path::new(BIN),
        &state.join("history.sqlite"),
        &request,
        RUN_DEADLINE,
    )
    .expect("recorded");
    (answer, started.elapsed())
}

fn hangwatch(args: &[&str], state: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .env("HANGWATCH_STATE_DIR", state)
        .env_remove("HANGWATCH_HISTORY_URL")
        .output()
        .expect("run hangwatch")
}

/// `hangwatch` with `site` (TOML) as the site's configuration file, and no user file.
fn hangwatch_with_site(args: &[&str], state: &Path, site: &str) -> Output {
    let dir = state.join("etc");
    std::fs::create_dir_all(&dir).expect("etc");
    let file = dir.join("config.toml");
    std::fs::write(&file, site).expect("site configuration");
    Command::new(BIN)
        .args(args)
        .env("HANGWATCH_STATE_DIR", state)
        .env("HANGWATCH_CONFIG", &file)
        .env("XDG_CONFIG_HOME", &dir)
        .env_remove("HANGWATCH_HISTORY_URL")
        .output()
        .expect("run hangwatch")
}

/// The fleet target `run` makes from these settings (`--history-url`, `history_ca`, `insecure_history`).
fn resolved(
    url: &str,
    password_file: Option<PathBuf>,
    ca: Option<PathBuf>,
    insecure: bool,
) -> FleetTarget {
    hangwatch_fleet::resolve(
        &hangwatch_fleet::UrlSources {
            flag: Some(url.into()),
            ..Default::default()
        },
        password_file,
        900.0,
        &hangwatch_fleet::TlsPolicy {
            ca_file: ca,
            insecure,
        },
    )
    .expect("allowed")
    .expect("a target")
}

/// The server log's "connection authorized" lines of hangwatch's own connections.
fn hangwatch_connections(server: &PostgresServer) -> Vec<String> {
    server
        .log()
        .expect("server log")
        .lines()
        .filter(|l| l.contains("connection authorized") && l.contains("application_name=hangwatch"))
        .map(str::to_string)
        .collect()
}

fn stdout_json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "exit {:?}, stderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON document")
}

#[test]
fn the_second_node_hears_of_the_first_and_history_lists_the_fleet() {
    let server = require!(PostgresServer::start());
    let root = tempfile::tempdir().expect("tempdir");
    let (n1, n2) = (root.path().join("n1"), root.path().join("n2"));
    let (first, _) = record(&n1, "n1", "1234", Some(fleet(&server)));
    assert_eq!(
        (first.source, first.seen_before),
        (RecurrenceSource::Fleet, 0)
    );
    let (second, took) = record(&n2, "n2", "1240", Some(fleet(&server)));
    println!("second node's recording through the child, fleet lookup included: {took:?}");
    assert_eq!(second.source, RecurrenceSource::Fleet, "{second:?}");
    assert!(second.seen_before >= 1);
    assert_eq!(second.last_nodes, ["n1"]);
    let incident = second.incident.as_ref().expect("one incident");
    assert_eq!(
        (incident.mount.as_str(), incident.others[0].node.as_str()),
        ("/gpfs", "n1")
    );
    let news = second.news().expect("news");
    assert!(
        news.starts_with("this cause was seen 1 time before on other nodes: n1 (job 1234,"),
        "{news}"
    );
    assert!(
        news.contains("storage incident: /gpfs (gpfs) also blocked job 1234 on n1"),
        "{news}"
    );

    let password_file = server.password_file().expect("password file");
    let fleet_args = [
        "--history-url",
        &server.url(),
        "--history-password-file",
        password_file.to_str().expect("utf-8"),
    ];
    let listed = stdout_json(&hangwatch(
        &[&["history", "--fleet", "--json"][..], &fleet_args].concat(),
        &n1,
    ));
    let verdicts = listed["verdicts"].as_array().expect("verdicts");
    assert_eq!(verdicts.len(), 2);
    assert_eq!(verdicts[0]["node"], "n2");
    assert_eq!(verdicts[0]["count"], 2);
    assert!(!listed["database"]
        .as_str()
        .expect("database")
        .contains(server.password()));
    let mounts = stdout_json(&hangwatch(
        &[
            &["history", "--fleet", "--by-mount", "--json"][..],
            &fleet_args,
        ]
        .concat(),
        &n1,
    ));
    assert_eq!(mounts["mounts"][0]["mount_point"], "/gpfs");
    assert_eq!(mounts["mounts"][0]["jobs"], 2);
    let causes = hangwatch(
        &[&["history", "--fleet", "--by-cause"][..], &fleet_args].concat(),
        &n1,
    );
    let table = String::from_utf8_lossy(&causes.stderr);
    assert!(
        table.contains("write() on /gpfs (gpfs)") && table.contains("n1,n2"),
        "{table}"
    );
}

#[test]
fn a_silent_database_costs_the_deadline_and_what_waited_ships_at_the_next_run() {
    let mut server = require!(PostgresServer::start());
    let root = tempfile::tempdir().expect("tempdir");
    let state = root.path().join("n1");
    // Up, then the server stopped and its port held by a listener that accepts and never answers.
    record(&state, "n1", "1", Some(fleet(&server)));
    server.stop().expect("stop");
    let listener = std::net::TcpListener::bind(("127.0.0.1", server.port())).expect("the port");
    let silent = std::thread::spawn(move || {
        let mut held = Vec::new();
        if let Ok((stream, _)) = listener.accept() {
            held.push(stream);
        }
        std::thread::sleep(Duration::from_secs(4));
    });
    let (answer, took) = record(&state, "n1", "2", Some(fleet(&server)));
    println!(
        "verdict's recording against a silent database: {took:?} (fleet deadline 2 s, run's 3 s)"
    );
    assert!(took < RUN_DEADLINE, "{took:?}");
    assert_eq!(
        (answer.source, answer.seen_before),
        (RecurrenceSource::Local, 1)
    );
    assert!(answer.fleet_unavailable.is_some());
    silent.join().expect("listener thread");
    let db = HistoryDb::open_existing(&state.join("history.sqlite")).expect("db");
    assert_eq!(db.pending_count().expect("count"), 1);

    server.start_again().expect("start again");
    let fleet_target = serde_json::to_vec(&fleet(&server)).expect("json");
    let mut child = Command::new(BIN)
        .args(["__ship-history", "--db"])
        .arg(state.join("history.sqlite"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("ship");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), &fleet_target)
        .expect("write");
    let shipped = child.wait_with_output().expect("shipped");
    assert!(shipped.status.success());
    let report: Value = serde_json::from_slice(&shipped.stdout).expect("a report");
    assert_eq!(
        (report["shipped"].as_u64(), report["pending"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(db.pending_count().expect("count"), 0);
    assert_eq!(
        server
            .psql("SELECT string_agg(job_id, ',' ORDER BY at_unix_s) FROM fleet_verdicts")
            .expect("psql"),
        "1,2"
    );
}

#[test]
fn a_password_on_the_command_line_or_in_a_readable_file_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let out = hangwatch(
        &[
            "run",
            "--history-url",
            "postgresql://hw:secret@db.example/fleet",
            "--",
            "true",
        ],
        root.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("carries a password") && err.contains("~/.pgpass"),
        "{err}"
    );

    let pw: PathBuf = root.path().join("pw");
    std::fs::write(&pw, "secret\n").expect("pw");
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = hangwatch(
        &[
            "history",
            "--fleet",
            "--history-url",
            "postgresql://hw@db.example/fleet",
            "--history-password-file",
            pw.to_str().expect("utf-8"),
        ],
        root.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mode 0644") && err.contains("chmod 600"),
        "{err}"
    );
    let out = hangwatch(&["history", "--fleet"], root.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HANGWATCH_HISTORY_URL"));
}

#[test]
fn fleet_history_ships_over_tls_with_the_sites_ca_and_the_server_sees_it_encrypted() {
    let server = require!(PostgresServer::start());
    let ca = server.ca_file().expect("a CA");
    let password_file = server.password_file().expect("password file");
    let root = tempfile::tempdir().expect("tempdir");
    let state = root.path().join("n1");

    // As run records: the target from its settings (the site's CA, a URL without TLS parameters).
    let target = resolved(
        &server.bare_url(),
        Some(password_file.clone()),
        Some(ca.clone()),
        false,
    );
    assert!(target.url.contains("sslmode=verify-full"), "{}", target.url);
    let (answer, _) = record(&state, "n1", "1234", Some(target));
    assert_eq!(answer.source, RecurrenceSource::Fleet, "{answer:?}");

    // As an admin lists it: everything from the site's file.
    let site = format!(
        "history_url = {:?}\nhistory_ca = {:?}\nhistory_password_file = {:?}\n",
        server.bare_url(),
        ca.display().to_string(),
        password_file.display().to_string()
    );
    let listed = stdout_json(&hangwatch_with_site(
        &["history", "--fleet", "--json"],
        &state,
        &site,
    ));
    assert_eq!(listed["verdicts"][0]["job_id"], "1234", "{listed}");

    let connections = hangwatch_connections(&server);
    assert!(connections.len() >= 2, "{connections:?}");
    for line in &connections {
        assert!(line.contains("SSL enabled (protocol=TLSv1."), "{line}");
    }
}

#[test]
fn a_plain_link_is_refused_with_the_fix_unless_the_site_says_insecure_history() {
    let server = require!(PostgresServer::start_without_tls());
    server.set_host_lines("host", "trust").expect("trust");
    let root = tempfile::tempdir().expect("tempdir");
    let state = root.path().join("n1");
    let bare = server.bare_url();

    // The default, verify-full: the server offers no TLS.
    let out = hangwatch(&["history", "--fleet", "--history-url", &bare], &state);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not offer TLS")
            && err.contains("history_ca")
            && err.contains("insecure_history = true"),
        "{err}"
    );
    // Asking for a plain link is refused before anything connects.
    let disable = format!("{bare}?sslmode=disable");
    let out = hangwatch(&["history", "--fleet", "--history-url", &disable], &state);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("would not be encrypted (sslmode=disable)")
            && err.contains("insecure_history = true"),
        "{err}"
    );

    // The site allows it: the same commands work, unencrypted.
    let site = "insecure_history = true\n";
    for url in [&bare, &disable] {
        let listed = stdout_json(&hangwatch_with_site(
            &["history", "--fleet", "--json", "--history-url", url],
            &state,
            site,
        ));
        assert!(listed["verdicts"].is_array(), "{listed}");
    }
    let (answer, _) = record(&state, "n1", "1", Some(resolved(&bare, None, None, true)));
    assert_eq!(answer.source, RecurrenceSource::Fleet, "{answer:?}");
    let connections = hangwatch_connections(&server);
    assert!(connections.len() >= 3, "{connections:?}");
    assert!(connections.iter().all(|l| !l.contains("SSL enabled")));

    // A server that wants a password gets none over that link.
    server
        .set_host_lines("host", "scram-sha-256")
        .expect("passwords");
    let password_file = server.password_file().expect("password file");
    let out = hangwatch_with_site(
        &[
            "history",
            "--fleet",
            "--history-url",
            &bare,
            "--history-password-file",
            password_file.to_str().expect("utf-8"),
        ],
        &state,
        site,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("asks for a password over an unencrypted link")
            && err.contains("never sends one there"),
        "{err}"
    );
}
