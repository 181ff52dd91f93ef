//! A storage meltdown seen by two jobs on two nodes that share nothing but the storage and the fleet database (a
//! PostgreSQL server of the test's own): each `hangwatch run` alone cannot tell its node from the storage, but the
//! second one, blocked on the same frozen mount minutes after the first, learns from the fleet database that the
//! first was, and says storage incident (docs/storage-incidents.md).

mod common;

use std::time::Duration;

use common::*;
use hangwatch_testkit::{python, require, LoopExt4, PostgresServer};

#[test]
fn a_second_job_blocked_on_the_same_frozen_mount_is_a_storage_incident_from_the_fleet_memory() {
    let py = require!(python());
    let fs = require!(LoopExt4::new(64));
    let server = require!(PostgresServer::start());
    let url = server.url();
    let password = server.password_file().expect("password file");
    let password = password.to_string_lossy().into_owned();
    let flags = |node: &'static str, job: &'static str| -> Vec<String> {
        [
            "--nproc",
            "2",
            "--stall-after",
            STALL_AFTER,
            "--quiet",
            "--node-name",
            node,
            "--job-id",
            job,
            "--history-url",
            url.as_str(),
            "--history-password-file",
            password.as_str(),
        ]
        .map(String::from)
        .to_vec()
    };
    let first_flags = flags("n1", "1001");
    let first_flags: Vec<&str> = first_flags.iter().map(String::as_str).collect();
    // Job 1001 on n1 logs onto the storage, which freezes under it.
    let mut first = start_logging_onto(hangwatch(), &fs, 0, 3, &first_flags);
    let frozen = require!(fs.freeze());
    let one = first.finish(STALL + Duration::from_secs(40));
    one.assert_code(75);
    assert_eq!(one.json["kind"], "blocked_in_kernel", "{}", one.describe());
    assert!(
        one.json["scope"].is_null(),
        "one node alone does not guess: {}",
        one.describe()
    );
    assert!(
        one.json["scope_evidence"]
            .to_string()
            .contains("cannot tell the node from the storage"),
        "{}",
        one.describe()
    );

    // Job 1002 on n2 starts while the storage is still frozen: its rank 0 blocks at once on the same mount.
    let log = fs.path().join("job-1002-rank0.log");
    let log = log.to_string_lossy().into_owned();
    let second_flags = flags("n2", "1002");
    let second_flags: Vec<&str> = second_flags.iter().map(String::as_str).collect();
    let mut second = HangwatchRun::start(
        &second_flags,
        &rank_job(
            py,
            &["--step-time", "0.1", "--log", &log, "--only-rank", "0"],
        ),
    );
    let two = second.finish(STALL + Duration::from_secs(40));
    drop(frozen);
    two.assert_code(75);
    let v = &two.json;
    assert_eq!(v["kind"], "blocked_in_kernel", "{}", two.describe());
    assert_eq!(v["recurrence"]["source"], "fleet", "{}", two.describe());
    assert_eq!(
        v["recurrence"]["incident"]["mount"],
        fs.path().to_str().unwrap(),
        "{}",
        two.describe()
    );
    assert_eq!(v["scope"], "filesystem", "{}", two.describe());
    let evidence = v["scope_evidence"].to_string();
    assert!(
        evidence.contains("other jobs or nodes were blocked on")
            && evidence.contains("job 1001 on n1"),
        "{evidence}"
    );
    assert!(
        v["summary"]
            .as_str()
            .is_some_and(|s| s.starts_with("storage incident: ")),
        "{}",
        two.describe()
    );
}
