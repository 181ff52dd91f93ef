//! A root watcher of another user's job (what the node service runs: `run --attach` as root on ranks of another
//! uid) hands that user only the kernel-log lines about their job: a line another process wrote to the kernel log
//! while the job hung is not in the job's `kernel-log.txt`, and is in the root-only `kernel-log.root.txt` beside it
//! when the site asks (`--keep-kernel-log`). The same run reads the job's Flight Recorder prefix from a rank's
//! environment, reads the job's user's dump there and refuses the one another user planted.

mod common;

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use hangwatch_testkit::{require, wait_until, ChildGuard, TestkitError};

/// The job's user (made when the machine has none) and a stranger (a number is enough to own a file).
const JOB_UID: u32 = 4311;
const STRANGER: u32 = 4312;

fn need_root() -> hangwatch_testkit::Result<()> {
    hangwatch_testkit::require_root().map_err(|_| TestkitError::NotRoot {
        what: "writing /dev/kmsg and starting ranks as another user",
        uid: rustix::process::geteuid().as_raw(),
    })
}

fn euid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

#[test]
fn another_users_job_gets_only_its_kernel_log_lines_and_root_keeps_the_rest() {
    require!(need_root());
    let py = hangwatch_testkit::python().expect("python3");
    let user = slurm::user_with_uid(JOB_UID);
    // Where the ranks say torch dumps (their environment, as the TaskProlog would set it): rank 0's dump is the
    // job's user's, rank 1's was planted by a stranger.
    let dumps = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dumps.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    for (rank, owner) in [(0, JOB_UID), (1, STRANGER)] {
        let dump = dumps.path().join(format!("fr_{rank}"));
        std::fs::write(
            &dump,
            std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
                "../diagnosis/tests/fixtures/flight_recorder/pickled/rank{rank}.pickle"
            )))
            .expect("recorded pickle"),
        )
        .expect("dump");
        std::os::unix::fs::chown(&dump, Some(owner), Some(owner)).expect("chown");
    }

    let ranks: Vec<ChildGuard> = (0..2)
        .map(|rank| {
            let mut cmd = Command::new("setpriv");
            cmd.args([
                "--reuid",
                &JOB_UID.to_string(),
                "--regid",
                &JOB_UID.to_string(),
            ])
            .arg("--clear-groups")
            .arg(py)
            .args(["-c", "import time; time.sleep(600)"])
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", "2")
            .env(
                "TORCH_FR_DUMP_TEMP_FILE",
                dumps.path().join("fr_").display().to_string(),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
            ChildGuard::spawn(&mut cmd, format!("rank {rank} as {user}")).expect("rank starts")
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(10), POLL, || ranks
            .iter()
            .all(|r| euid(r.pid()) == Some(JOB_UID))),
        "the ranks never ran as {user}"
    );
    let mut flags: Vec<String> = ranks
        .iter()
        .flat_map(|r| ["--attach".to_string(), r.pid().to_string()])
        .collect();
    flags.extend([
        "--stall-after".into(),
        STALL_AFTER.into(),
        "--keep-kernel-log".into(),
    ]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut run = HangwatchRun::start(&flags, &[]);
    std::thread::sleep(Duration::from_secs(1));
    assert!(run.running(), "{}", run.stderr_text());
    let marker = format!("hangwatch-test-marker-XYZ-{}", std::process::id());
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .and_then(|mut kmsg| kmsg.write_all(format!("<3>{marker}\n").as_bytes()))
        .expect("write /dev/kmsg");

    let done = run.finish(Duration::from_secs(60));
    done.assert_code(75);
    let report = run.report_dir();
    let handed = std::fs::read_to_string(report.join("kernel-log.txt")).expect("kernel-log.txt");
    assert!(
        !handed.contains(&marker),
        "another process's line reached the job's kernel log:\n{handed}"
    );
    assert!(
        handed.starts_with("# the ")
            && handed.contains("kernel-log lines since the job started that concern it"),
        "{handed}"
    );
    let whole = report.join("kernel-log.root.txt");
    let text = std::fs::read_to_string(&whole).expect("kernel-log.root.txt");
    assert!(text.contains(&marker), "the marker was read: {text}");
    let meta = std::fs::metadata(&whole).expect("stat");
    assert_eq!((meta.mode() & 0o777, meta.uid()), (0o600, 0));

    // The dump prefix came from a rank's environment: the job's user's dump there was read, the one someone else
    // planted was not.
    assert!(
        !done.json["collectives"].is_null(),
        "rank 0's dump was read: {}",
        done.describe()
    );
    let verdict = done.json.to_string();
    assert!(
        verdict.contains(&format!(
            "fr_1: owned by uid {STRANGER}, not by the job's user (uid {JOB_UID})"
        )),
        "{}",
        done.describe()
    );
    drop(ranks);
}
