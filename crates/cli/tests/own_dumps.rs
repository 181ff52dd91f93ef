//! The job's own Flight Recorder dumps read the way a roll call reads them: by the real reader child
//! (`hangwatch __inspect-child --serve`) under its deadline. A dump nested 2 MB deep, which would overflow the
//! stack of whatever decodes it, is an error there and the watcher (this test process) goes on; a dump someone
//! else planted, or a link at the dump's path, is not read.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hangwatch_inspect::own_dumps::{read_own_dumps, OwnDumpsRequest};
use hangwatch_testkit::{require, TestkitError};

const DEADLINE: Duration = Duration::from_secs(10);
/// The job's user and a stranger (numeric uids: owning a file needs no account).
const JOB: u32 = 4201;
const STRANGER: u32 = 4202;
const DECODE_ENV: &str = "HANGWATCH_TEST_DECODE_UNCHECKED";

fn need_root() -> hangwatch_testkit::Result<()> {
    hangwatch_testkit::require_root().map_err(|_| TestkitError::NotRoot {
        what: "files owned by other users",
        uid: rustix::process::geteuid().as_raw(),
    })
}

/// `{"entries": [[[[...]]]]}`: a million lists, one inside the other, 2 MB of pickle.
fn nested_dump() -> Vec<u8> {
    const DEPTH: usize = 1_000_000;
    let mut p = vec![0x80, 2, b'}', b'X', 7, 0, 0, 0];
    p.extend_from_slice(b"entries");
    p.extend(std::iter::repeat_n(b']', DEPTH));
    p.extend(std::iter::repeat_n(b'a', DEPTH - 1));
    p.extend([b's', b'.']);
    p
}

fn real_dump() -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../diagnosis/tests/fixtures/flight_recorder/pickled/rank2.pickle"),
    )
    .expect("recorded pickle")
}

/// A directory like /tmp (root's, 1777) in a fresh test directory.
fn shared_tmp() -> (tempfile::TempDir, PathBuf) {
    let top = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let shared = top.path().join("tmp");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    (top, shared)
}

fn write_owned(path: &Path, bytes: &[u8], uid: u32) {
    std::fs::write(path, bytes).expect("write");
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
}

fn request(prefix: &Path, ranks: Vec<u32>) -> OwnDumpsRequest {
    OwnDumpsRequest {
        prefix_from: Vec::new(),
        prefix: prefix.display().to_string(),
        ranks,
        since_unix_s: hangwatch_model::unix_now() as u64 - 60,
        owner_uid: JOB,
        keep: 8,
    }
}

/// Not a test: decodes the file named in the environment without the shape check, as the watcher did before
/// (as a normal test run, with nothing in the environment, it returns at once).
#[test]
fn decode_unchecked_entry_point() {
    let Ok(path) = std::env::var(DECODE_ENV) else {
        return;
    };
    let bytes = std::fs::read(path).expect("dump");
    let decoded = hangwatch_model::CollectiveRecord::from_flight_recorder_pickle(2, &bytes, 8);
    println!("decoded: {}", decoded.is_ok());
}

#[test]
fn a_two_megabyte_nested_dump_is_an_error_in_the_reader_child_and_the_watcher_lives_on() {
    require!(need_root());
    let (_top, shared) = shared_tmp();
    let nested = nested_dump();
    assert!(nested.len() > 2_000_000);
    write_owned(&shared.join("fr_1"), &nested, JOB);
    write_owned(&shared.join("fr_2"), &real_dump(), JOB);

    // What it would have done to the process that decodes it.
    let unchecked = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "decode_unchecked_entry_point",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DECODE_ENV, shared.join("fr_1"))
        .output()
        .expect("run the unchecked decoder");
    assert!(
        !unchecked.status.success()
            && std::os::unix::process::ExitStatusExt::signal(&unchecked.status).is_some(),
        "decoding the nested dump without the check should kill the decoder: {:?}\n{}",
        unchecked.status,
        String::from_utf8_lossy(&unchecked.stderr)
    );

    let started = Instant::now();
    let found = read_own_dumps(
        Path::new(env!("CARGO_BIN_EXE_hangwatch")),
        &request(&shared.join("fr_"), vec![1, 2]),
        DEADLINE,
    );
    assert!(started.elapsed() < DEADLINE, "answered, not abandoned");
    let said = found.problems.join("; ");
    assert!(
        said.contains("rank 1's own Flight Recorder dump")
            && said.contains("nests containers more than 64 deep"),
        "{said}"
    );
    assert!(
        !said.contains("before it read them all"),
        "the child finished: {said}"
    );
    let ranks: Vec<u32> = found.records.iter().map(|r| r.rank).collect();
    assert_eq!(
        ranks,
        vec![2],
        "the good dump beside it is still read: {said}"
    );
}

#[test]
fn the_reader_child_reads_no_planted_dump_and_follows_no_link() {
    require!(need_root());
    let (top, shared) = shared_tmp();
    let prefix = shared.join("nccl_trace_rank_");
    // Rank 0: the job's own dump. Rank 1: planted by a stranger. Rank 2: a link to a genuine dump of the job.
    write_owned(&shared.join("nccl_trace_rank_0"), &real_dump(), JOB);
    write_owned(&shared.join("nccl_trace_rank_1"), &real_dump(), STRANGER);
    let elsewhere = top.path().join("elsewhere");
    write_owned(&elsewhere, &real_dump(), JOB);
    symlink(&elsewhere, shared.join("nccl_trace_rank_2")).expect("symlink");
    let found = read_own_dumps(
        Path::new(env!("CARGO_BIN_EXE_hangwatch")),
        &request(&prefix, vec![0, 1, 2]),
        DEADLINE,
    );
    let said = found.problems.join("; ");
    let ranks: Vec<u32> = found.records.iter().map(|r| r.rank).collect();
    assert_eq!(ranks, vec![0], "{said}");
    assert!(
        said.contains(&format!(
            "nccl_trace_rank_1: owned by uid {STRANGER}, not by the job's user"
        )),
        "{said}"
    );
    assert!(
        said.contains("nccl_trace_rank_2: a symbolic link, not followed"),
        "{said}"
    );
}
