//! System tests of where `hangwatch run` writes on a node that several users share: root and an unprivileged
//! user run with the default report directory one after the other and at the same time; a symlink planted where a
//! report file goes is refused and its target left untouched; old run directories are pruned to `--keep-runs`;
//! zero thresholds are usage errors; no fd of hangwatch leaks into the ranks; a per-user root that someone else
//! took first (their directory, a symlink; for root too, in a mount namespace of its own) moves the evidence to a
//! private directory with a random name. Real processes throughout; users are switched with `setpriv`
//! (util-linux).

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use hangwatch_testkit::{require_root, wait_with_deadline, ChildGuard};
use serde_json::Value;

/// Generous: a loaded 2-core machine starts Python slowly.
const DEADLINE: Duration = Duration::from_secs(90);
/// The unprivileged user of the two-users test.
const NOBODY: u32 = 65_534;

macro_rules! root_or_skip {
    () => {
        if let Err(reason) = require_root() {
            assert!(!hangwatch_testkit::strict_mode(), "{reason}");
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
}

/// A copy of the hangwatch binary that any user may execute (target/ may not be reachable for them).
struct SharedBinary {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl SharedBinary {
    fn new() -> SharedBinary {
        let dir = tempfile::Builder::new()
            .prefix("hangwatch-bin-")
            .tempdir()
            .expect("temporary directory");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("test setup");
        let path = dir.path().join("hangwatch");
        std::fs::copy(env!("CARGO_BIN_EXE_hangwatch"), &path).expect("copy the binary");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("test setup");
        SharedBinary { _dir: dir, path }
    }

    /// `hangwatch ARGS` as `uid` (`None`: as the test, root), with a clean per-user environment: no
    /// `XDG_RUNTIME_DIR`/`SLURM_TMPDIR`/`XDG_STATE_HOME`, so the default report root is `/var/tmp/hangwatch-<uid>`.
    fn command(&self, uid: Option<u32>, args: &[&str]) -> Command {
        let mut cmd = match uid {
            None => Command::new(&self.path),
            Some(uid) => {
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"))
                    .arg("--clear-groups")
                    .arg(&self.path);
                cmd
            }
        };
        cmd.args(args)
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("SLURM_TMPDIR")
            .env_remove("XDG_STATE_HOME")
            .env("HOME", "/")
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

/// A started `hangwatch`, killed by pid if the test fails before it ends.
struct Started {
    guard: ChildGuard,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
}

struct Ended {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ended {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!("stdout is not one JSON document ({e}): {}", self.describe())
        })
    }

    fn describe(&self) -> String {
        format!(
            "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn start(mut cmd: Command, label: &str) -> Started {
    let mut guard = ChildGuard::spawn(&mut cmd, label).expect("hangwatch starts");
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let child = guard.child_mut();
    let stdout = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    Started {
        guard,
        stdout,
        stderr,
    }
}

impl Started {
    fn wait(mut self) -> Ended {
        let status = wait_with_deadline(self.guard.child_mut(), DEADLINE);
        assert!(
            status.is_some(),
            "hangwatch did not end within {DEADLINE:?}"
        );
        Ended {
            code: status.and_then(|s| s.code()),
            stdout: self.stdout.join().unwrap_or_default(),
            stderr: self.stderr.join().unwrap_or_default(),
        }
    }
}

fn python() -> &'static str {
    "python3"
}

/// Mode bits and owner of `path` (not following a symlink).
fn mode_and_owner(path: &Path) -> (u32, u32) {
    let meta =
        std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.mode() & 0o7777, meta.uid())
}

/// The run's report directory (from `--json`), checked: a private `run-*` directory of `uid` under the private
/// per-user root `/var/tmp/hangwatch-<uid>`, with `output.log` 0600.
fn check_default_report_dir(ended: &Ended, uid: u32) -> PathBuf {
    assert_eq!(ended.code, Some(0), "{}", ended.describe());
    let json = ended.json();
    let dir = PathBuf::from(json["report_dir"].as_str().expect("report_dir in the JSON"));
    let root = PathBuf::from(format!("/var/tmp/hangwatch-{uid}"));
    assert_eq!(dir.parent(), Some(root.as_path()), "{}", ended.describe());
    let name = dir
        .file_name()
        .expect("test setup")
        .to_string_lossy()
        .into_owned();
    assert!(name.starts_with("run-"), "{name}");
    assert_eq!(mode_and_owner(&root), (0o700, uid), "{}", root.display());
    assert_eq!(mode_and_owner(&dir), (0o700, uid), "{}", dir.display());
    assert_eq!(mode_and_owner(&dir.join("output.log")), (0o600, uid));
    dir
}

const QUICK_JOB: &str = "import time; time.sleep(1.5); print('step 1 done')";

#[test]
fn root_and_an_unprivileged_user_run_with_the_default_report_dir_one_after_the_other_and_together()
{
    root_or_skip!();
    let bin = SharedBinary::new();
    let run =
        |uid: Option<u32>| bin.command(uid, &["run", "--json", "--", python(), "-c", QUICK_JOB]);

    // One after the other, each order: the first user's directories never stop the second.
    for order in [[None, Some(NOBODY)], [Some(NOBODY), None]] {
        for uid in order {
            let ended = start(run(uid), "hangwatch run").wait();
            check_default_report_dir(&ended, uid.unwrap_or(0));
        }
    }

    // At the same time.
    let root_run = start(run(None), "hangwatch run (root)");
    let user_run = start(run(Some(NOBODY)), "hangwatch run (nobody)");
    let root_dir = check_default_report_dir(&root_run.wait(), 0);
    let user_dir = check_default_report_dir(&user_run.wait(), NOBODY);
    assert_ne!(root_dir, user_dir);

    // The unprivileged user cannot read root's report, nor root's files through its own directory.
    let peek = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(root_dir.join("output.log"))
        .output()
        .expect("setpriv runs");
    assert!(
        !peek.status.success(),
        "nobody could read root's output.log"
    );
}

#[test]
fn a_symlink_planted_where_a_report_file_goes_is_refused_before_the_job_starts() {
    let scratch = tempfile::tempdir().unwrap();
    let report = scratch.path().join("report");
    std::fs::create_dir(&report).unwrap();
    let target = scratch.path().join("precious.txt");
    std::fs::write(&target, "do not overwrite\n").unwrap();
    let marker = scratch.path().join("job-ran");
    for planted in ["verdict.json", "output.log"] {
        let link = report.join(planted);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let bin = SharedBinary::new();
        let ended = start(
            bin.command(
                None,
                &[
                    "run",
                    "--report-dir",
                    &report.to_string_lossy(),
                    "--",
                    python(),
                    "-c",
                    &format!("open({:?}, 'w')", marker.to_string_lossy()),
                ],
            ),
            "hangwatch run",
        )
        .wait();
        assert_eq!(ended.code, Some(2), "{}", ended.describe());
        assert!(
            ended
                .stderr
                .contains(&format!("a symlink is planted at {}", link.display())),
            "{}",
            ended.describe()
        );
        assert!(ended.stderr.contains("remove it"), "{}", ended.describe());
        assert!(
            !marker.exists(),
            "the job ran although the report directory was refused"
        );
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "do not overwrite\n"
        );
        std::fs::remove_file(&link).unwrap();
    }
}

#[test]
fn a_symlink_planted_during_the_run_where_the_evidence_goes_is_refused_and_its_target_untouched() {
    let scratch = tempfile::tempdir().unwrap();
    let report = scratch.path().join("report");
    let target = scratch.path().join("precious.txt");
    std::fs::write(&target, "do not overwrite\n").unwrap();
    // The job plants the link once hangwatch has checked the directory, then hangs (no output, no progress).
    let job = format!(
        "import os, time\nprint('planting', flush=True)\nos.symlink({target:?}, {link:?})\ntime.sleep(120)\n",
        target = target.to_string_lossy(),
        link = report.join("verdict.json").to_string_lossy(),
    );
    let bin = SharedBinary::new();
    let ended = start(
        bin.command(
            None,
            &[
                "run",
                "--json",
                "--stall-after",
                "3s",
                "--grace",
                "1s",
                "--report-dir",
                &report.to_string_lossy(),
                "--",
                python(),
                "-c",
                &job,
            ],
        ),
        "hangwatch run",
    )
    .wait();
    assert_eq!(ended.code, Some(75), "{}", ended.describe());
    assert_eq!(ended.json()["version"], 1, "{}", ended.describe());
    assert!(
        ended.stderr.contains(&format!(
            "a symlink is planted at {}",
            report.join("verdict.json").display()
        )),
        "{}",
        ended.describe()
    );
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "do not overwrite\n"
    );
    // The rest of the evidence is there, private.
    assert_eq!(mode_and_owner(&report).0, 0o700);
    assert_eq!(mode_and_owner(&report.join("output.log")).0, 0o600);
}

/// `/var/tmp/hangwatch-<uid>` of a uid that no one else uses, removed before and after.
struct PerUserRoot {
    path: PathBuf,
}

impl PerUserRoot {
    fn new(uid: u32) -> PerUserRoot {
        let path = PathBuf::from(format!("/var/tmp/hangwatch-{uid}"));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).expect("test setup");
        std::os::unix::fs::chown(&path, Some(uid), Some(uid)).expect("test setup");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
            .expect("test setup");
        PerUserRoot { path }
    }

    /// A directory `name` with a file in it, owned by `uid`.
    fn add_dir(&self, name: &str, uid: u32) -> PathBuf {
        let dir = self.path.join(name);
        std::fs::create_dir(&dir).expect("test setup");
        std::fs::write(dir.join("verdict.json"), "{}\n").expect("test setup");
        for p in [dir.join("verdict.json"), dir.clone()] {
            std::os::unix::fs::chown(&p, Some(uid), Some(uid)).expect("test setup");
        }
        dir
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.path)
            .expect("read the root")
            .map(|e| {
                e.expect("test setup")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }
}

impl Drop for PerUserRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[test]
fn old_run_directories_are_pruned_to_keep_runs_and_nothing_else_is_touched() {
    root_or_skip!();
    const UID: u32 = 54_321;
    let root = PerUserRoot::new(UID);
    for day in 1..=5 {
        root.add_dir(&format!("run-2026010{day}T000000Z-100"), UID);
    }
    root.add_dir("state", UID);
    root.add_dir("run-notes", UID);
    root.add_dir("demo-20200101T000000Z-1", UID);
    // Not ours (root's): never removed, whatever its name.
    root.add_dir("run-20200101T000000Z-2", 0);
    // A symlink named like a run: neither followed nor removed.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep.txt"), "keep\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path.join("run-20200101T000000Z-3")).unwrap();
    // A run still going on (its directory locked, as a running hangwatch holds it): kept although old.
    let in_use = root.add_dir("run-20200101T000000Z-4", UID);
    let lock = std::fs::File::open(&in_use).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockShared).unwrap();

    let bin = SharedBinary::new();
    let ended = start(
        bin.command(
            Some(UID),
            &[
                "run",
                "--json",
                "--keep-runs",
                "3",
                "--",
                python(),
                "-c",
                "print('ok')",
            ],
        ),
        "hangwatch run",
    )
    .wait();
    let current = check_default_report_dir(&ended, UID);
    let current = current.file_name().unwrap().to_string_lossy().into_owned();
    let mut expected = vec![
        current,
        "demo-20200101T000000Z-1".to_owned(),
        "run-20200101T000000Z-2".to_owned(),
        "run-20200101T000000Z-3".to_owned(),
        "run-20200101T000000Z-4".to_owned(),
        "run-20260104T000000Z-100".to_owned(),
        "run-20260105T000000Z-100".to_owned(),
        "run-notes".to_owned(),
        "state".to_owned(),
    ];
    expected.sort();
    assert_eq!(root.names(), expected, "{}", ended.describe());
    assert!(outside.path().join("keep.txt").exists());
    drop(lock);

    // `--keep-runs 0` keeps everything.
    let before = root.names().len();
    let ended = start(
        bin.command(
            Some(UID),
            &[
                "run",
                "--json",
                "--keep-runs",
                "0",
                "--",
                python(),
                "-c",
                "print('ok')",
            ],
        ),
        "hangwatch run",
    )
    .wait();
    check_default_report_dir(&ended, UID);
    assert_eq!(root.names().len(), before + 1);
}

#[test]
fn zero_thresholds_and_timeouts_are_usage_errors() {
    let bin = SharedBinary::new();
    for args in [
        &["run", "--stall-after", "0", "--", "true"][..],
        &["run", "--min-stall", "0s", "--", "true"],
        &["run", "--max-stall", "0ms", "--", "true"],
        &["probe", "--timeout", "0", "/"],
        &["dump", "--window", "0", "--pid", "1"],
    ] {
        let ended = start(bin.command(None, args), "hangwatch").wait();
        assert_eq!(ended.code, Some(2), "{args:?}: {}", ended.describe());
        assert!(
            ended.stderr.contains("above zero"),
            "{args:?}: {}",
            ended.describe()
        );
    }
    // A zero grace is allowed: SIGKILL right after SIGTERM.
    let ended = start(
        bin.command(None, &["run", "--json", "--grace", "0", "--", "true"]),
        "hangwatch run",
    )
    .wait();
    assert_eq!(ended.code, Some(0), "{}", ended.describe());
}

/// Marks every fd of this test process above 2 close-on-exec, so that whatever reaches the ranks was opened by
/// hangwatch itself, not inherited from the test harness.
fn stop_inheriting_our_fds() {
    for entry in std::fs::read_dir("/proc/self/fd")
        .expect("test setup")
        .flatten()
    {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if fd > 2 {
            // The read_dir's own fd fails here once closed; that is fine.
            let _ = nix::fcntl::fcntl(
                fd,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            );
        }
    }
}

#[test]
fn no_fd_of_hangwatch_leaks_into_the_ranks() {
    stop_inheriting_our_fds();
    let scratch = tempfile::tempdir().unwrap();
    let out = scratch.path().join("fds");
    std::fs::create_dir(&out).unwrap();
    // Each rank lists its open fds (the listing's own fd is closed again by then and is skipped).
    let job = format!(
        "import os, json\n\
         fds = {{}}\n\
         for name in os.listdir('/proc/self/fd'):\n\
         \x20   try:\n\
         \x20       fds[int(name)] = os.readlink('/proc/self/fd/' + name)\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         open(os.path.join({out:?}, 'rank-' + os.environ['RANK'] + '.json'), 'w').write(json.dumps(fds))\n",
        out = out.to_string_lossy()
    );
    // hangwatch's own stdout and stderr are files (as under Slurm), so their protection is part of the test.
    let stdout = std::fs::File::create(scratch.path().join("stdout.txt")).unwrap();
    let stderr = std::fs::File::create(scratch.path().join("stderr.txt")).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_hangwatch"))
        .args(["run", "--json", "--nproc", "2", "--report-dir"])
        .arg(scratch.path().join("report"))
        .arg("--log-file")
        .arg(scratch.path().join("job.log"))
        .args(["--", python(), "-c", &job])
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map(|child| ChildGuard::new(child, "hangwatch run"))
        .map(|mut guard| wait_with_deadline(guard.child_mut(), DEADLINE))
        .expect("hangwatch starts");
    let stderr = std::fs::read_to_string(scratch.path().join("stderr.txt")).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
    for rank in 0..2 {
        let listing = std::fs::read_to_string(out.join(format!("rank-{rank}.json")))
            .unwrap_or_else(|e| panic!("rank {rank} did not list its fds ({e}): {stderr}"));
        let fds: serde_json::Map<String, Value> = serde_json::from_str(&listing).unwrap();
        let extra: Vec<String> = fds
            .iter()
            .filter(|(fd, _)| !["0", "1", "2"].contains(&fd.as_str()))
            .map(|(fd, target)| format!("{fd} -> {target}"))
            .collect();
        assert!(
            extra.is_empty(),
            "rank {rank} inherited fds beyond 0, 1, 2: {extra:?}"
        );
    }
}

/// `/var/tmp/hangwatch-<victim>` taken first by `squatter`, and whatever the victim's runs leave under
/// `/var/tmp/hangwatch-<victim>-*`: removed before and after.
struct Squatted {
    usual: PathBuf,
    victim: u32,
}

impl Squatted {
    fn clean(victim: u32) {
        let prefix = format!("hangwatch-{victim}");
        for entry in std::fs::read_dir("/var/tmp").expect("test setup").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == prefix || name.starts_with(&format!("{prefix}-")) {
                let path = entry.path();
                let removed = match std::fs::symlink_metadata(&path) {
                    Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
                    _ => std::fs::remove_file(&path),
                };
                removed.expect("test setup");
            }
        }
    }

    /// Another user's directory, 0700, where the victim's per-user root goes.
    fn by_another_user(victim: u32, squatter: u32) -> Squatted {
        Self::clean(victim);
        let usual = PathBuf::from(format!("/var/tmp/hangwatch-{victim}"));
        std::fs::create_dir(&usual).expect("test setup");
        std::os::unix::fs::chown(&usual, Some(squatter), Some(squatter)).expect("test setup");
        std::fs::set_permissions(&usual, std::fs::Permissions::from_mode(0o700))
            .expect("test setup");
        Squatted { usual, victim }
    }

    /// A symlink there, to a directory of the victim's (which the symlink would have them write into).
    fn by_a_symlink(victim: u32, target: &Path) -> Squatted {
        Self::clean(victim);
        let usual = PathBuf::from(format!("/var/tmp/hangwatch-{victim}"));
        std::os::unix::fs::symlink(target, &usual).expect("test setup");
        Squatted { usual, victim }
    }
}

impl Drop for Squatted {
    fn drop(&mut self) {
        Self::clean(self.victim);
    }
}

/// The run's report directory, checked: a private `run-*` directory in a private `hangwatch-<uid>-<random>` root
/// of `uid` under /var/tmp, announced in one line naming the squatted directory.
fn check_fallback_report_dir(ended: &Ended, uid: u32, squat: &str) -> PathBuf {
    assert_eq!(ended.code, Some(0), "{}", ended.describe());
    let dir = PathBuf::from(
        ended.json()["report_dir"]
            .as_str()
            .expect("report_dir in the JSON"),
    );
    let root = dir.parent().expect("a root").to_path_buf();
    let root_name = root.file_name().expect("named").to_string_lossy();
    let random = root_name
        .strip_prefix(&format!("hangwatch-{uid}-"))
        .unwrap_or_else(|| panic!("{}: {}", root.display(), ended.describe()));
    assert!(random.len() >= 8, "{root_name}");
    assert_eq!(root.parent(), Some(Path::new("/var/tmp")));
    assert_eq!(mode_and_owner(&root), (0o700, uid), "{}", root.display());
    assert_eq!(mode_and_owner(&dir), (0o700, uid), "{}", dir.display());
    assert_eq!(mode_and_owner(&dir.join("output.log")), (0o600, uid));
    let said = format!(
        "hangwatch: warning: /var/tmp/hangwatch-{uid} {squat}: someone else took that name; evidence goes to {} instead",
        dir.display()
    );
    let lines: Vec<&str> = ended
        .stderr
        .lines()
        .filter(|l| l.contains("someone else"))
        .collect();
    assert_eq!(lines, [said.as_str()], "{}", ended.describe());
    dir
}

#[test]
fn a_per_user_root_squatted_by_another_user_or_a_symlink_moves_the_evidence_to_a_private_random_directory(
) {
    root_or_skip!();
    const VICTIM: u32 = 54_325;
    const SQUATTER: u32 = 54_326;
    let bin = SharedBinary::new();
    let run = || {
        bin.command(
            Some(VICTIM),
            &["run", "--json", "--", python(), "-c", "print('ok')"],
        )
    };

    let squat = Squatted::by_another_user(VICTIM, SQUATTER);
    let first = check_fallback_report_dir(
        &start(run(), "hangwatch run").wait(),
        VICTIM,
        "belongs to uid 54326, not to you",
    );
    // The next run finds the same private root (its runs are pruned together), never the squatter's directory.
    let second = check_fallback_report_dir(
        &start(run(), "hangwatch run").wait(),
        VICTIM,
        "belongs to uid 54326, not to you",
    );
    assert_ne!(first, second);
    assert_eq!(first.parent(), second.parent());
    assert_eq!(
        std::fs::read_dir(&squat.usual).expect("read").count(),
        0,
        "nothing was written into the squatter's directory"
    );
    assert_eq!(mode_and_owner(&squat.usual), (0o700, SQUATTER));
    drop(squat);

    // A symlink to a directory the victim can write: never followed.
    let target = tempfile::tempdir().expect("test setup");
    std::os::unix::fs::chown(target.path(), Some(VICTIM), Some(VICTIM)).expect("test setup");
    let squat = Squatted::by_a_symlink(VICTIM, target.path());
    check_fallback_report_dir(
        &start(run(), "hangwatch run").wait(),
        VICTIM,
        "is a symlink, which hangwatch never follows",
    );
    assert_eq!(
        std::fs::read_dir(target.path()).expect("read").count(),
        0,
        "nothing was written through the symlink"
    );
    drop(squat);
}

#[test]
fn roots_per_user_root_squatted_by_another_user_moves_the_evidence_too() {
    root_or_skip!();
    // Root's own /var/tmp/hangwatch-0 is in use by other tests and runs: the squat is made in a private mount
    // namespace with a tmpfs of its own on /var/tmp, where hangwatch then runs as root.
    let bin = SharedBinary::new();
    let script = format!(
        "mount -t tmpfs tmpfs /var/tmp && mkdir -m 700 /var/tmp/hangwatch-0 && chown 54326:54326 /var/tmp/hangwatch-0 \
         && exec {} run --json -- {} -c \"print('ok')\"",
        bin.path.display(),
        python()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("SLURM_TMPDIR")
        .env_remove("XDG_STATE_HOME")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let ended = start(cmd, "hangwatch run (root, in a mount namespace)").wait();
    assert_eq!(ended.code, Some(0), "{}", ended.describe());
    let dir = ended.json()["report_dir"]
        .as_str()
        .expect("report_dir")
        .to_owned();
    assert!(dir.starts_with("/var/tmp/hangwatch-0-"), "{dir}");
    assert!(
        ended.stderr.contains(&format!(
            "hangwatch: warning: /var/tmp/hangwatch-0 belongs to uid 54326, not to you: someone else took that name; evidence goes to {dir} instead"
        )),
        "{}",
        ended.describe()
    );
}
